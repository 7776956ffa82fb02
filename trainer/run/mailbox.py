"""A learner process's two ends of its pipe to the trainer, each served by a thread of its own
(trainer/run/learner_process.py): neither side's send ever waits for the other side's work."""
import queue
import threading
from typing import Optional


class Outbox:
    """The child's messages to the parent, sent by a thread of their own, so that the child keeps
    reading rows while a large message waits: with a CNN's weights (megabytes) going up and camera
    rows coming down, each side's send waited for the other's read and both pipes stayed full."""

    def __init__(self, conn):
        self._conn, self._queue = conn, queue.Queue()
        self._thread = threading.Thread(target=self._run, name="simbridge-learner-outbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                self._conn.send_bytes(data)
            except OSError:
                return   # the parent is gone

    def send(self, data: bytes) -> None:
        self._queue.put(data)

    def close(self) -> None:
        """Sends what is queued, then stops the thread (before anything else writes to the pipe)."""
        self._queue.put(None)
        self._thread.join()


class Inbox:
    """The parent's messages, read by a thread of their own, so that the parent's sends never wait
    for this process's updates: while torch.compile built the first update (6-26 s, up to a minute
    on a small CPU), a stopping trainer handed it the rows its rate limiter had held, filled the
    pipe and hung in a send, saying nothing, until the update was built. The rows wait here
    instead; the rate limiter bounds them while the trainer runs."""

    def __init__(self, conn, last: bytes):
        """last: the tag of the parent's last message (its stop), after which nothing is read."""
        self._conn, self._queue, self._last = conn, queue.Queue(), last
        self._thread = threading.Thread(target=self._run, name="simbridge-learner-inbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = self._conn.recv_bytes()
            except (EOFError, OSError):
                self._queue.put(None)   # the parent is gone
                return
            self._queue.put(data)
            if data[:1] == self._last:
                return

    def get(self, timeout: float) -> Optional[bytes]:
        """The next message, or None when none came within `timeout`; EOFError once the parent is gone."""
        try:
            data = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None
        if data is None:
            self._queue.put(None)   # every later get says so too
            raise EOFError
        return data
