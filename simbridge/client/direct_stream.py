"""The client's bidirectional stream without gRPC's helper threads (docs/transports.md).

grpcio's sync `stream_stream` takes a request iterator, which a thread of its own drains, and
hands answers over from the channel's polling thread: each lockstep step wakes three threads and
passes the GIL between them (about half of a simulator process's CPU per step, measured). A
`DirectStream` does what grpcio's own single-threaded unary-stream call does, for both
directions: one call on a completion queue of its own, whose events the calling thread reads
itself (`next_event`), so a send and its answer cost one thread and no hand-off.

It uses grpcio's Cython layer (`grpc._cython.cygrpc`: `segregated_call`, the operation
classes), which grpcio does not promise to keep: `open_stream` falls back to the public API (a
queue-fed request iterator, `IteratorStream`) when that layer is not there, and
SIMBRIDGE_GRPC_STREAM=iterator asks for the fallback (bench/throughput.py measures both).
Both kinds have the same five methods: send(bytes), recv() -> bytes, close(), cancel(), and
cancel_from_another_thread() (a recv waiting on the stream then fails, CANCELLED); a failed stream raises a grpc.RpcError with code(), details() and trailing_metadata().
"""
import logging
import os
import queue
from typing import Optional, Sequence, Tuple

import grpc

log = logging.getLogger("simbridge.client")

try:   # grpcio's internals: checked once; any difference and the public API serves instead
    from grpc import _common
    from grpc._cython import cygrpc

    _OP = cygrpc.OperationType
    _SEND, _RECV, _STATUS = _OP.send_message, _OP.receive_message, _OP.receive_status_on_client
    _STATUS_CODES = _common.CYGRPC_STATUS_CODE_TO_STATUS_CODE
    _DIRECT = all(hasattr(cygrpc, name) for name in (
        "SendInitialMetadataOperation", "ReceiveInitialMetadataOperation", "ReceiveStatusOnClientOperation",
        "SendMessageOperation", "ReceiveMessageOperation", "SendCloseFromClientOperation",
        "PropagationConstants", "build_census_context", "Channel"))
except (ImportError, AttributeError):
    _DIRECT = False

STREAM_ENV = "SIMBRIDGE_GRPC_STREAM"   # "iterator": grpcio's public stream API; "direct": even on
                                       # a grpcio release not in TESTED_GRPC
# The grpcio releases (major.minor) whose Cython layer DirectStream was tested against. On another
# release the same names may take other arguments: the public API serves unless asked for "direct".
TESTED_GRPC = ("1.85",)
_fallback_logged = False


class StreamFailed(grpc.RpcError):
    """A DirectStream that ended with a status other than OK (or OK before its answer came)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata=()):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details, self._trailer = code, details, trailing_metadata

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailer


def _cy_channel(channel: grpc.Channel):
    """The Cython channel under a grpc.Channel (and under an intercepted one), or None."""
    for _ in range(4):
        inner = getattr(channel, "_channel", None)
        if inner is None:
            return None
        if isinstance(inner, cygrpc.Channel):
            return inner
        channel = inner
    return None


def open_stream(channel: grpc.Channel, method: str, metadata: Sequence[Tuple[str, str]] = ()):
    """A stream of serialized messages for `method` ("/simbridge.v1.ExternalEnv/Stream"):
    a DirectStream where grpcio's internals allow, else an IteratorStream. `metadata`: sent by a
    DirectStream, which bypasses the channel's interceptors (the token's: ClientSecurity.wrap)."""
    if _direct_allowed():
        cy = _cy_channel(channel)
        if cy is not None:
            try:
                return DirectStream(cy, method, tuple(metadata))
            except (TypeError, AttributeError, ValueError) as e:   # a grpcio that changed under us
                _log_fallback(f"grpcio {grpc.__version__}'s internals differ ({type(e).__name__}: {e})")
    return IteratorStream(channel, method)


def _direct_allowed() -> bool:
    wanted = os.environ.get(STREAM_ENV, "")
    if not _DIRECT or wanted == "iterator":
        return False
    if wanted == "direct" or ".".join(grpc.__version__.split(".")[:2]) in TESTED_GRPC:
        return True
    _log_fallback(f"grpcio {grpc.__version__} is not one DirectStream was tested with {TESTED_GRPC}")
    return False


def _log_fallback(why: str) -> None:
    global _fallback_logged
    if not _fallback_logged:
        _fallback_logged = True
        log.info("streams use grpcio's public API: %s (%s=direct to try the faster path anyway)",
                 why, STREAM_ENV)


class IteratorStream:
    """grpcio's public bidirectional stream: a queue-fed request iterator."""

    def __init__(self, channel: grpc.Channel, method: str):
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._responses = channel.stream_stream(method)(iter(self._q.get, None))

    def send(self, data: bytes) -> None:
        self._q.put(data)

    def recv(self) -> bytes:
        try:
            return next(self._responses)
        except StopIteration:
            raise StreamFailed(grpc.StatusCode.UNAVAILABLE, "the server ended the stream") from None

    def close(self) -> None:
        self._q.put(None)

    def cancel(self) -> None:
        self._responses.cancel()
        self._q.put(None)

    def cancel_from_another_thread(self) -> None:
        self._responses.cancel()


class DirectStream:
    """One bidirectional call whose events the calling thread reads itself. Not thread-safe: a
    Connection calls it under its lock. gRPC allows one send and one receive in flight per call;
    waiting for a send to complete also reads (and keeps) answers, so a client that sends many
    requests before reading never stalls on flow control."""

    def __init__(self, cy_channel, method: str, metadata: tuple):
        ops = (((cygrpc.SendInitialMetadataOperation(metadata, 0),), "start"),
               ((cygrpc.ReceiveInitialMetadataOperation(0),), "metadata"),
               ((cygrpc.ReceiveStatusOnClientOperation(0),), "status"))
        self._call = cy_channel.segregated_call(cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS,
                                                method.encode(), None, None, metadata, None, ops,
                                                cygrpc.build_census_context(), None)
        self._due = {"start", "metadata", "status"}   # tags whose events are still to come
        self._answers: list = []
        self._failed: Optional[StreamFailed] = None

    def send(self, data: bytes) -> None:
        while "send" in self._due:
            self._next_event(keep_reading=True)
        self._check()
        if not self._call.operate((cygrpc.SendMessageOperation(data, 0),), "send"):
            self._finish_failed()
        self._due.add("send")

    def recv(self) -> bytes:
        while not self._answers:
            self._check()
            self._next_event(keep_reading=True)
        return self._answers.pop(0)

    def _post_receive(self) -> None:
        if "recv" not in self._due and self._failed is None and "status" in self._due:
            if self._call.operate((cygrpc.ReceiveMessageOperation(0),), "recv"):
                self._due.add("recv")

    def _next_event(self, keep_reading: bool) -> None:
        if keep_reading:
            self._post_receive()
        try:
            event = self._call.next_event()
        except BaseException:
            # Interrupted (Ctrl-C in the wait): grpcio has destroyed the call and its queue; no
            # event of it may be read again. The next use of the stream finds it cancelled.
            self._due.clear()
            if self._failed is None:
                self._failed = StreamFailed(grpc.StatusCode.CANCELLED, "interrupted while waiting")
            raise
        self._due.discard(event.tag)
        for op in event.batch_operations:
            kind = op.type()
            if kind == _RECV:
                message = op.message()
                if message is not None:
                    self._answers.append(message)
            elif kind == _STATUS:
                code = _STATUS_CODES.get(op.code(), grpc.StatusCode.UNKNOWN)
                details = op.details() or ""
                if code is grpc.StatusCode.OK:   # the server ended the stream: no answer will come
                    code, details = grpc.StatusCode.UNAVAILABLE, "the server ended the stream"
                self._failed = StreamFailed(code, details, op.trailing_metadata())

    def _check(self) -> None:
        if self._failed is not None and not self._answers:
            self._drain()
            raise self._failed

    def _finish_failed(self) -> None:
        """operate() refused: the call is over; its status says why."""
        while self._failed is None and self._due:
            self._next_event(keep_reading=False)
        if self._failed is None:
            self._failed = StreamFailed(grpc.StatusCode.UNAVAILABLE, "the stream ended")
        self._drain()
        raise self._failed

    def _drain(self) -> None:
        """Read the events still due, so the call and its completion queue are freed."""
        for _ in range(16):   # at most five are ever due
            if not self._due:
                return
            self._next_event(keep_reading=False)

    def close(self) -> None:
        """End the call. The caller has read every answer it wanted (a Connection closes its
        session first), so the server hears a cancelled stream, as from a client gone away."""
        self.cancel()

    def cancel_from_another_thread(self) -> None:
        """Cancel the call only (gRPC's cancel is thread-safe): the reading thread gets its status
        event and fails, as it would for a server's cancel, and drains the rest itself."""
        self._call.cancel(_common.STATUS_CODE_TO_CYGRPC_STATUS_CODE[grpc.StatusCode.CANCELLED],
                          "given up: the process is stopping")

    def cancel(self) -> None:
        if "status" in self._due:
            self._call.cancel(_common.STATUS_CODE_TO_CYGRPC_STATUS_CODE[grpc.StatusCode.CANCELLED],
                              "closed by the client")
        if self._failed is None:
            self._failed = StreamFailed(grpc.StatusCode.CANCELLED, "closed by the client")
        self._drain()
