"""The one retry policy every simbridge client follows: which failed calls are retried
(`RETRYABLE`), how long to wait between attempts (`Backoff`), and a failure in words
(`rpc_failure`, `call_unary`).

A failed call is retried when its status code says the request may never have
reached the server, or its answer never came back: the connection broke or was refused
(UNAVAILABLE), the call was cut off in flight (CANCELLED: a server shutting down, a stream
cancelled under the client; UNKNOWN: gRPC's code for a stream reset mid-call, since a
simbridge server itself reports its own failures as INTERNAL), or its deadline passed
(DEADLINE_EXCEEDED, unary calls with a timeout). Every other code is the server's answer to
this request (bad input, a full queue, an unknown session, a bug inside it): sending the same
request again would get the same answer, so it is raised instead. Retrying is safe because
every request carries RequestHeader.seq and the server applies each seq once, answering a
repeat from memory. Waits between attempts grow from 0.05 s to 1 s (`Backoff`), for at most
the client's reconnect_timeout_s; a stopping process (simbridge.client.stopping) waits no more.
"""
import time
from typing import Optional

import grpc

from simbridge.client.stopping import pause
from simbridge.wire.errors import BridgeError

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                       grpc.StatusCode.DEADLINE_EXCEEDED})


class Backoff:
    """Waits between attempts of one failing call: `first_s`, doubling up to `max_s`, for at most
    `patience_s` since the first failure."""

    def __init__(self, patience_s: float = float("inf"), first_s: float = 0.05, max_s: float = 1.0):
        self.patience_s = patience_s
        self._delay = first_s
        self._max_s = max_s
        self._since: Optional[float] = None

    def wait(self, patience_s: Optional[float] = None) -> bool:
        """Sleep before the next attempt; False (no sleep) once the patience is spent.
        `patience_s` overrides the patience for this attempt (a client that started closing)."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._since >= (self.patience_s if patience_s is None else patience_s):
            return False
        if not pause(self._delay):   # the process is stopping: no more attempts
            return False
        self._delay = min(self._delay * 2, self._max_s)
        return True


def rpc_failure(e: BaseException) -> str:
    """A failed call or stream in words ("UNAVAILABLE: Socket closed"), never gRPC's object text."""
    if isinstance(e, grpc.RpcError) and callable(getattr(e, "code", None)):
        details = e.details() if callable(getattr(e, "details", None)) else ""
        return f"{e.code().name}: {details or 'no details'}"
    if isinstance(e, StopIteration):
        return "the server ended the stream"
    return str(e) or type(e).__name__


def call_unary(method, request, timeout_s: Optional[float] = None):
    """One unary call; its failure as a BridgeError (reason included)."""
    try:
        return method(request, timeout=timeout_s)
    except grpc.RpcError as e:
        raise BridgeError.from_rpc_error(e) from None
