"""simbridge/console.py: a console survives its reader leaving, and says so once."""
import io
import os
import subprocess
import sys
import threading
import time

from simbridge.console import Console, StopEvent


def test_a_pipe_whose_reader_left_is_taken_as_gone_once_and_later_lines_are_dropped():
    r, w = os.pipe()
    stream = os.fdopen(w, "w")
    gone = []
    console = Console(stream, on_gone=lambda: gone.append(1))
    print("read", file=console, flush=True)
    assert os.read(r, 100) == b"read\n"
    os.close(r)   # `| head` has read its lines and left
    for _ in range(3):
        print("nobody reads this", file=console, flush=True)   # BrokenPipeError before
    assert console.gone and gone == [1]
    # the descriptor now leads to /dev/null: the interpreter's flush at exit, or a child process
    # that inherited it, writes without the broken pipe
    assert os.write(stream.fileno(), b"x") == 1
    stream.write("buffered")
    stream.flush()
    stream.close()


def test_a_stream_that_is_no_file_keeps_its_lines_and_a_closed_one_is_gone():
    buf = io.StringIO()
    console = Console(buf)
    print("kept", file=console, flush=True)
    assert buf.getvalue() == "kept\n" and not console.gone
    buf.close()
    print("after close", file=console, flush=True)   # ValueError before
    assert console.gone


# A signal handler that sets the event while the main thread holds the event's own lock: the
# handler runs in the main thread right after os.kill returns, as it does after a wait that timed
# out when the signal went to another thread.
_HANDLER_INSIDE_THE_LOCK = """
import os, signal, sys, threading
from simbridge.console import StopEvent
ev = StopEvent() if sys.argv[1] == "stop" else threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: ev.set())
with ev._cond:
    os.kill(os.getpid(), signal.SIGUSR1)
    x = 1   # the handler has run by here
print(ev.is_set())
"""


def test_a_stop_event_set_by_a_signal_handler_inside_its_own_lock_does_not_hang():
    """simbridge-server ran on after SIGHUP once (a fresh clone's run): its handler's set() waited
    for the lock the interrupted Event.wait held. A threading.Event hangs here; a StopEvent does not."""
    def run(kind, timeout):
        return subprocess.run([sys.executable, "-c", _HANDLER_INSIDE_THE_LOCK, kind], capture_output=True,
                              text=True, timeout=timeout)
    out = run("stop", 30)
    assert out.returncode == 0 and out.stdout.strip() == "True", out
    try:
        run("threading", 1.5)
    except subprocess.TimeoutExpired:
        pass   # the deadlock the StopEvent avoids
    else:
        raise AssertionError("a threading.Event no longer deadlocks here: the test no longer shows the fault")


def test_a_stop_event_notices_a_set_it_was_not_woken_for_within_a_slice():
    """A handler that runs between wait's look at the flag and its sleep sets the flag without
    waking it (the lost wake-up): the wait sees it within SLICE_S, not at its timeout."""
    ev = StopEvent()

    def set_behind_its_back():
        time.sleep(0.1)
        ev._flag = True   # as the handler's set() does, its notify missed
    threading.Thread(target=set_behind_its_back, daemon=True).start()
    t0 = time.monotonic()
    assert ev.wait(20) is True
    assert time.monotonic() - t0 < 5 * StopEvent.SLICE_S
    ev2 = StopEvent()
    t0 = time.monotonic()
    assert ev2.wait(0.3) is False and 0.25 <= time.monotonic() - t0 < 2


def test_exit_within_ends_a_process_that_a_thread_would_hold_at_exit():
    """A second Ctrl-C's backstop: a non-daemon thread that never ends holds the interpreter's exit
    for good; exit_within ends the process with its code anyway, and what was printed is kept."""
    code = ("import threading, time\n"
            "from simbridge.console import exit_within\n"
            "threading.Thread(target=time.sleep, args=(60,)).start()\n"
            "exit_within(0.5, 7)\n"
            "print('said before', flush=False)\n")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 7 and "said before" in out.stdout
    assert time.monotonic() - t0 < 15   # interpreter start included; 60 s without the backstop


def test_the_backstop_says_the_last_words_the_way_out_had_no_time_to_say():
    """A second Ctrl-C's way out (the trainer's abort) can outlast the backstop's second on a loaded
    machine: its line ("interrupted again: ...") was lost. The backstop says it then, and only then."""
    code = ("import sys, threading, time\n"
            "from simbridge.console import exit_within\n"
            "said = exit_within(0.3, 130, 'interrupted again')\n"
            "if sys.argv[1] == 'slow':\n"
            "    time.sleep(30)\n"   # an abort that never ends in time
            "said.set()\n"
            "print('interrupted again', file=sys.stderr)\n"
            "threading.Thread(target=time.sleep, args=(30,)).start()\n")   # the exit held: the backstop ends it
    for mode in ("slow", "quick"):
        out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=30)
        assert out.returncode == 130 and out.stderr.count("interrupted again") == 1, (mode, out.stderr)
