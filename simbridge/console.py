"""A console: the stream a program's own lines go to, whose reader can leave.

`simbridge-trainer run | head`, `simbridge-sim | head`, a terminal closed under either, or a parent
that read their output (the demo) killed: the next line written fails (EPIPE, or EIO from a
hung-up terminal). Unhandled, in the trainer that exception ended the learning loop, and the
daemon's shutdown, whose first act is to say so on the same stream, raised again before it stopped
the server: no final checkpoint, and the process hung at exit on RPC threads that waited for room
in an experience queue nobody drained. A simulator died with a traceback, its episodes open.

A `Console` takes the first failed write as the end of the show: it calls `on_gone` once (the
trainer and the simulators stop as on SIGTERM: the trainer drains and writes its final checkpoint
and stop record; a simulator ends its episodes), points the stream's file descriptor at /dev/null
(so neither the interpreter's flush at exit nor a child process that inherited it meets the broken
pipe), and drops every later line. The trainer's record is metrics.jsonl, TensorBoard and the
checkpoints; the console only shows it.

`on_hangup` is the other way a terminal goes: closed, it sends SIGHUP, whose default ends a process
at once (no final checkpoint, episodes left open, and the demo's children, sessions of their own,
running on). The programs take it as SIGTERM, unless it is ignored, as under nohup.

`StopEvent` is the event a stop signal's handler sets. Python runs a signal handler in the main
thread between two bytecodes, also while that thread is inside `threading.Event.wait` holding the
event's own lock (when the signal was delivered to another thread, the main thread takes it there,
just after its wait times out): the handler's `set()` then waited for that lock forever. Seen once:
`simbridge-server` ran on after SIGHUP in a fresh clone's test run.

`exit_within` is a second Ctrl-C's backstop: the program is out within a second, even where a thread
it does not own (an RPC handler whose stream a simulator keeps open) would hold the interpreter's
exit, which joins them.
"""
import os
import select
import signal
import sys
import threading
import time
from typing import Callable, Optional, TextIO


class Console:
    """A text stream (`print(..., file=console)`) that survives its reader leaving; see the module doc."""

    def __init__(self, stream: TextIO, on_gone: Optional[Callable[[], None]] = None):
        self.stream = stream
        self.on_gone = on_gone
        self.gone = False
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        return self._do(self.stream.write, text) or len(text)

    def flush(self) -> None:
        self._do(self.stream.flush)

    def check_reader(self) -> None:
        """Leaves now if the reader of a pipe has gone, without writing a line: poll reports an
        error on a pipe's write end whose read end is closed. An idle trainer (`run | head`, no
        simulator) printed its next line, and so noticed, only every 30 s."""
        if self.gone:
            return
        try:
            watch = select.poll()
            watch.register(self.stream.fileno(), 0)   # POLLERR and POLLHUP are reported whatever is asked
            gone = any(events & (select.POLLERR | select.POLLHUP) for _, events in watch.poll(0))
        except (OSError, ValueError, AttributeError):   # not a file (a StringIO), or closed
            return
        if gone:
            self._leave()

    def _do(self, op, *args):
        if self.gone:
            return None
        try:
            return op(*args)
        except (OSError, ValueError):   # EPIPE, EIO; ValueError: the stream was closed
            self._leave()
            return None

    def _leave(self) -> None:
        with self._lock:
            if self.gone:
                return
            self.gone = True
        try:
            fd = self.stream.fileno()
            target = os.fstat(fd)
            # stderr too where it is the same pipe or terminal (a child's stdout and stderr merged)
            fds = [fd] + [other for other in (1, 2) if other != fd and _same_file(other, target)]
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                for each in fds:
                    os.dup2(null, each)
            finally:
                os.close(null)
        except (OSError, ValueError, AttributeError):   # not a file (a StringIO), or already closed
            pass
        if self.on_gone is not None:
            self.on_gone()


def on_hangup(handler):
    """`handler(signum, frame)` on SIGHUP (the terminal closed), unless SIGHUP is ignored (nohup's
    choice stands). From the main thread, as signal.signal. Returns the handler it replaced, None
    where it installed none."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return None
    return signal.signal(signal.SIGHUP, handler)


def _same_file(fd: int, st: os.stat_result) -> bool:
    try:
        other = os.fstat(fd)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


class StopEvent(threading.Event):
    """A threading.Event that a signal handler may set while the main thread waits on it or sets
    it: its lock is reentrant (no deadlock when the handler runs inside `wait`), and `wait` looks
    at the flag at least every SLICE_S (a handler run between `wait`'s look at the flag and its
    sleep would otherwise go unnoticed until the timeout)."""

    SLICE_S = 0.25

    def __init__(self):
        super().__init__()
        self._cond = threading.Condition(threading.RLock())

    def wait(self, timeout: Optional[float] = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = self.SLICE_S if deadline is None else min(self.SLICE_S, deadline - time.monotonic())
            if super().wait(max(0.0, left)):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False


def exit_within(seconds: float, code: int, last_words: str = "") -> threading.Event:
    """From now on the process ends with `code` after `seconds` at most: a daemon thread flushes the
    standard streams and calls os._exit if the ordinary exit has not happened by then. `last_words`:
    what the way out says on stderr, said by the backstop too where it cuts the way short (on a
    loaded machine the way out can take longer than `seconds`, and its line was lost), unless the
    returned event is set: set it as the way out says them."""
    said = threading.Event()

    def backstop():
        time.sleep(seconds)
        if last_words and not said.is_set():
            try:
                print(last_words, file=sys.stderr)
            except (OSError, ValueError):
                pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    threading.Thread(target=backstop, name="exit-backstop", daemon=True).start()
    return said
