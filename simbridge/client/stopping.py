"""A process that is stopping waits for no server.

`stop_waiting()` (a simulator's Ctrl-C or SIGTERM calls it: simbridge.sims.common.StopFlag) marks
the process as stopping. From then on its clients' connecting, reconnecting and backoff give up
at once, and an answer that has not come within STOP_GRACE_S of the stop is given up (a watchdog
thread cancels the call that waits for it), each with `Stopped`, which says what the client was
waiting for. Answers that come at once still come: a simulator's last calls (ending its open
episodes, closing its session) go through to a server that answers.
"""
import threading
import time
import weakref

import grpc

from simbridge.console import StopEvent
from simbridge.wire.errors import BridgeError

STOP_GRACE_S = 0.5
_stopping = StopEvent()   # set from a signal handler (StopFlag): simbridge/console.py
_watched: "weakref.WeakSet" = weakref.WeakSet()   # objects with give_up_wait(cutoff): connections


class Stopped(BridgeError):
    """The process is stopping and the client was waiting for a server."""


def stop_waiting() -> None:
    """This process is stopping: its clients stop waiting for servers (see the module doc)."""
    if _stopping.is_set():
        return
    _stopping.set()
    threading.Thread(target=_give_up_waits, name="simbridge-stop", daemon=True).start()


def stopping() -> bool:
    return _stopping.is_set()


def pause(seconds: float) -> bool:
    """Sleep `seconds`, unless the process is stopping or starts to meanwhile; False then."""
    return not _stopping.wait(seconds)


def check_stopping(doing: str) -> None:
    """Stopped, saying what the client was doing ("reconnecting to ..."), once the process stops."""
    if _stopping.is_set():
        raise Stopped(grpc.StatusCode.CANCELLED, f"stopped while {doing}")


def watch(waiter) -> None:
    """Let the stop watchdog call `waiter.give_up_wait(cutoff)`: cancel a wait begun before cutoff."""
    _watched.add(waiter)


def _give_up_waits() -> None:
    """The stop watchdog. Bounded: a stopping process still alive after 10 minutes is not waiting
    on this."""
    for _ in range(6000):
        time.sleep(0.1)
        cutoff = time.monotonic() - STOP_GRACE_S
        for waiter in list(_watched):
            waiter.give_up_wait(cutoff)
