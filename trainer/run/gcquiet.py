"""The cyclic garbage collector kept out of a process's start-up imports.

Importing torch makes some 170,000 objects that live as long as the process. While they come,
CPython's collector runs whenever allocations pass its threshold, 360-400 times during `import
torch`, and its older generations walk all of them again: 0.17-0.24 of the 2.2 CPU-seconds the
import costs here (docs/benchmarks.md, "The test suite's cost"), in every trainer daemon and
every learner process. Imports make no garbage cycles worth collecting, so the collector is off
while they run; the survivors are then frozen (`gc.freeze`: moved to a generation that no later
collection walks), and the collector is on again for the process's own work.
"""
import contextlib
import gc
import importlib
import signal


@contextlib.contextmanager
def imports_without_gc():
    """Around a process's heavy imports (torch and what needs it). Nests; leaves the collector
    as it found it (a caller that turned it off keeps it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def run_imported(module: str, function: str, *args):
    """A trainer's spawned child's target: `module` imported with the collector off, then its
    `function(*args)` called. (A target in the heavy module itself would be imported while
    multiprocessing unpickles it, before any code of ours could run.)

    Ctrl-C in a terminal signals the whole process group, the child too; its parent stops in
    order and ends it (a stop message, or the pipe closing). So the child ignores SIGINT and
    SIGTERM from here, before its imports: set after them, a Ctrl-C during `import torch`
    (seconds, on a busy machine) killed the child with a traceback, and the run lost its final
    checkpoint."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with imports_without_gc():
        mod = importlib.import_module(module)
    return getattr(mod, function)(*args)
