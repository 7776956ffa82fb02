"""Admission: how many calls the server serves at once, and how it reports abuse without drowning.

CallGate counts open calls (a Stream is one for as long as it is open), server-wide and per
client identity (security.py). A call beyond either cap is refused at once with
RESOURCE_EXHAUSTED / TOO_MANY_CALLS instead of waiting for a thread: one client's idle
streams can fill its own share, never the server. The gRPC thread pool is sized above the
server-wide cap, so an admitted call never queues behind others. At a stop the gate closes:
gRPC's own stop returns while handlers still run (it cancels their calls, it cannot end their
threads), so the server waits here for them before its owner takes its last counts.

NoticeLog logs a repeated event (undecodable requests, refused tokens) once per client per
interval, with how many there were since, instead of once per request.
"""
import collections
import logging
import threading
import time
from typing import Dict, Tuple

from simbridge.wire.errors import Reason, resource_exhausted, unavailable


class CallGate:
    def __init__(self, max_calls: int, max_per_client: int):
        self.max_calls = max_calls
        self.max_per_client = max_per_client
        self._lock = threading.Lock()
        self._left = threading.Condition(self._lock)
        self._open = 0
        self._closed = False
        self._by_client: Dict[str, int] = collections.Counter()

    def enter(self, client: str) -> None:
        """Admit one call of `client`, or raise TOO_MANY_CALLS (SERVER_UNAVAILABLE once closed);
        admitted calls must `leave`."""
        with self._lock:
            if self._closed:
                raise unavailable("the server is stopping: retry (a restarted trainer takes the call)")
            if self._open >= self.max_calls:
                raise resource_exhausted(
                    f"the server is serving its maximum of {self.max_calls} calls at once: retry later",
                    Reason.TOO_MANY_CALLS)
            mine = self._by_client[client]
            if mine >= self.max_per_client:
                raise resource_exhausted(
                    f"this client already has {mine} calls open, the most one client may "
                    f"(max_calls_per_client): close idle streams or retry later", Reason.TOO_MANY_CALLS)
            self._open += 1
            self._by_client[client] = mine + 1

    def leave(self, client: str) -> None:
        with self._lock:
            self._open -= 1
            left = self._by_client[client] - 1
            if left:
                self._by_client[client] = left
            else:
                del self._by_client[client]   # the table holds clients with open calls only
            if not self._open:
                self._left.notify_all()

    def open_calls(self) -> int:
        return self._open

    def close(self, timeout_s: float) -> int:
        """Admit no more calls and wait up to `timeout_s` for the open ones to leave; the number
        still open then (a handler stuck past the bound is left to run, and said by the caller)."""
        with self._lock:
            self._closed = True
            self._left.wait_for(lambda: not self._open, timeout_s)
            return self._open


class NoticeLog:
    """`note(client, what)`: logs the first occurrence per client and interval, then a count."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, max_clients: int = 4096):
        self.log = logger
        self.interval_s = interval_s
        self.max_clients = max_clients
        self._lock = threading.Lock()
        self._seen: "collections.OrderedDict[Tuple[str, str], list]" = collections.OrderedDict()

    def note(self, client: str, kind: str, detail: str) -> None:
        now = time.monotonic()
        key = (client, kind)
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self.interval_s:
                entry[1] += 1
                return
            suppressed = entry[1] if entry is not None else 0
            self._seen[key] = [now, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_clients:   # bounded however many clients misbehave
                self._seen.popitem(last=False)
        more = f" ({suppressed} more since the last notice)" if suppressed else ""
        self.log.warning("%s from %s: %s%s; further ones from this client are counted, and logged "
                         "at most once a minute", kind, client, detail, more)
