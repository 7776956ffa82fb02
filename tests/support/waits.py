"""The one bounded wait of the tests: it names what it waited for, and a process the condition
depends on that dies fails the wait at once with that process's last output lines (a crashed
trainer shows its traceback in seconds instead of a bare timeout minutes later)."""
import time
from typing import Callable, Iterable


def wait(cond: Callable[[], object], timeout: float, what: str, procs: Iterable = (), every: float = 0.05,
         tail: int = 30) -> None:
    """Poll `cond` every `every` s until it is true; AssertionError naming `what` after `timeout` s,
    or as soon as one of `procs` (launch.Proc or subprocess.Popen) has exited."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{_name(p)} exited ({p.poll()}) while waiting for {what}:\n{_tail(p, tail)}")
        if time.monotonic() >= deadline:
            out = "".join(f"\n{_name(p)}:\n{_tail(p, tail)}" for p in procs)
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{out}")
        time.sleep(every)


def _name(proc) -> str:
    return getattr(proc, "name", None) or f"process {proc.pid}"


def _tail(proc, n: int) -> str:
    """A launch.Proc's last lines (all it wrote, once its reader is done); a Popen keeps none."""
    if not hasattr(proc, "lines"):
        return "(output not kept)"
    if proc.poll() is not None:
        proc.wait_output()
    return "\n".join(list(proc.lines)[-n:])
