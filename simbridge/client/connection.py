"""The connection engine every simbridge client uses: a ready channel and (`Connection`) a
session whose numbered requests survive a broken connection, retried under the one retry policy
(simbridge.client.retry: which codes are retried, `Backoff` between attempts, for at most the
client's reconnect_timeout_s).

Several bridge hosts. A client may be given several addresses (a list, or "h1:p1,h2:p2"): it
connects to one (simbridge.client.channels says which). When the server it is on goes away
(nothing listens at its port any more, or its reconnect attempts fail for FAILOVER_AFTER_S; a
server that answers, restarted, is the same address's restart), the client moves to the next address that answers and opens a NEW
session there with the same CreateSessionRequest, then raises SessionLost, the same as when a
restarted trainer no longer knows the session: the open episodes ended with the old server
(which ends them truncated when it sees the session die), and the caller goes on with new
episodes. Exactly once across hosts: a request whose answer never came is NOT resent to the
new server (its seq belonged to the old session: the old server applied it or not, and counted
it or not, alone); it is dropped with the old session's episodes.

Stopping: once the process stops (simbridge.client.stopping: a simulator's Ctrl-C), a client
gives up connecting, reconnecting and an answer that does not come, with `Stopped`.

The engine knows nothing of what the requests carry: a client that wants to act when one of
its requests fails (the policy client logs the rewards it carried on their own) passes
`on_failed`, called with the failed request's kind and message before the error is raised.
"""
import collections
import logging
import threading
import time
from typing import Callable, Optional

import grpc

from simbridge.client.channels import (FAILOVER_AFTER_S, Addresses, close_in_background,  # noqa: F401
                                       close_unwatched, connect_any, connect_first, mark_down, open_channel,
                                       parse_addresses)
from simbridge.client.diagnosis import CLOSED, NOTHING_LISTENS, diagnose  # noqa: F401
from simbridge.client.retry import RETRYABLE, Backoff, rpc_failure
from simbridge.client.stopping import Stopped, check_stopping, stop_waiting, watch  # noqa: F401
from simbridge.client.direct_stream import open_stream
from simbridge.client.security import ClientSecurity
from simbridge.client.shm_channel import open_shm, split_address
from simbridge.wire.errors import SEQ_NOT_SPENT, BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc

log = logging.getLogger("simbridge.client")

_UNARY_NAMES = {k: "".join(p.title() for p in k.split("_")) for k in (
    "create_session", "start_episode", "get_action", "log_action", "log_returns", "end_episode",
    "close_session", "step")}
_FRAMING_BYTES = 1024  # request header + stream envelope, generously


class SessionLost(BridgeError):
    """The server no longer knows this client's session (it restarted or expired it).

    The client goes on with a new session (`new_session_id`; None: the client cannot, start over
    with a new one); `close_connection()` closes it instead."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: Optional[int] = None,
                 close_connection: Optional[Callable[[], None]] = None, new_session_id: Optional[str] = None):
        super().__init__(code, message, reason)
        self._close_connection = close_connection
        self.new_session_id = new_session_id

    def close_connection(self) -> None:
        """Close the client whose session was lost (for callers that start over with a new one)."""
        if self._close_connection is not None:
            self._close_connection()


class EarlierCallFailed(BridgeError):
    """A pipelined call (log_returns, end_episode, ...) failed; raised by a later call."""


class Connection:
    """Channel + session + numbered requests, with reconnect and resend.

    transport "stream": one bidirectional stream; `pipeline` lets calls with wait=False go
    without waiting for their answers (read, and their errors raised, by a later call).
    transport "unary": one RPC per call."""

    def __init__(self, address: Addresses, service: str, create: pb.CreateSessionRequest, transport: str,
                 connect_timeout_s: float, reconnect_timeout_s: float, pipeline: bool,
                 on_failed: Optional[Callable[[str, object], None]] = None,
                 security: Optional[ClientSecurity] = None,
                 on_session_lost: Optional[Callable[[], int]] = None):
        """address: one HOST:PORT, or several (a list, or "h1:p1,h2:p2"): see the module's doc.
        on_session_lost: called when the session is lost (a restarted server, or a move to another
        one); returns how many open episodes ended with it (for the log line)."""
        if transport not in ("stream", "unary"):
            raise ValueError(f"transport must be 'stream' or 'unary', got {transport!r}")
        self._service = service
        self._security = security or ClientSecurity.from_env()
        self._on_session_lost = on_session_lost or (lambda: 0)
        self.moves = 0
        self.transport = transport
        self.pipeline = pipeline and transport == "stream"
        self.reconnect_timeout_s = reconnect_timeout_s
        self._on_failed = on_failed or (lambda kind, msg: None)
        self._create = create
        self._seq = 0
        self._lock = threading.RLock()
        self._outstanding: "collections.deque" = collections.deque()  # (seq, kind, msg, bytes sent) unanswered
        self._deferred: Optional[BridgeError] = None
        self._closing = False
        self._broken = False
        address, self._shm_path = split_address(address)   # shm+unix:PATH: the stream through shared memory
        if transport != "stream":
            self._shm_path = None    # unary calls go on gRPC over the Unix socket
        self._waiting_since = None   # while a call waits for its answer: since when
        watch(self)
        self.addresses, self.address, self._channel = connect_first(address, connect_timeout_s, self._security)
        self._stub = self._make_stub()
        self._stream = None    # direct_stream's DirectStream (or IteratorStream): serialized messages
        try:
            self.session = self._open_session(resume=None)
        except BridgeError:
            check_stopping(f"opening a session with the simbridge trainer at {self.address}")
            raise
        self.session_id = self.session.session_id
        self.reconnects = 0

    # -------------------------------------------------------------- waits

    def _wait(self, answer, *args):
        """answer(*args): a call's answer; the stop watchdog may give up the wait (stopping.py)."""
        self._waiting_since = time.monotonic()
        try:
            return answer(*args)
        except grpc.RpcError:
            check_stopping(f"waiting for an answer from the simbridge trainer at {self.address}")
            raise
        finally:
            self._waiting_since = None

    def give_up_wait(self, cutoff: float) -> None:
        """The stop watchdog's (another thread's): cancel a wait that began before `cutoff`; a
        unary call by closing its channel (the client is done once stopped)."""
        since = self._waiting_since
        if since is not None and since < cutoff:
            try:
                if self.transport == "unary":
                    self._channel.close()
                else:
                    self._stream.cancel_from_another_thread()
            except Exception:   # a call that ended meanwhile
                pass

    # -------------------------------------------------------------- session

    def _make_stub(self):
        return (pb_grpc.ExternalMultiAgentEnvStub if self._service == "multi" else pb_grpc.ExternalEnvStub)(
            self._channel)

    def _open_session(self, resume: Optional[str]) -> pb.CreateSessionResponse:
        req = pb.CreateSessionRequest()
        req.CopyFrom(self._create)
        if resume:
            req.resume_session_id = resume
        if self.transport == "unary":
            try:
                return self._wait(self._stub.CreateSession, req)
            except grpc.RpcError as e:
                raise BridgeError.from_rpc_error(e) from None
        service = "ExternalMultiAgentEnv" if self._service == "multi" else "ExternalEnv"
        try:
            self._stream = open_stream(self._channel, f"/{pb.DESCRIPTOR.package}.{service}/Stream",
                                       self._security.metadata())
            self._stream.send(pb.StreamRequest(create_session=req).SerializeToString())
            resp = pb.StreamResponse.FromString(self._wait(self._stream.recv))
        except grpc.RpcError as e:
            raise BridgeError.from_rpc_error(e) from None
        if resp.HasField("error"):
            raise BridgeError.from_status(resp.error)
        if self._shm_path is not None:   # the session's calls go through shared memory from here on
            self._stream = open_shm(self._shm_path, self._stream, resp.create_session)
        return resp.create_session

    def _reconnect(self, cause: Exception) -> None:
        if self._closing:
            raise BridgeError(grpc.StatusCode.UNAVAILABLE, f"connection to {self.address} lost while closing")
        others = len(self.addresses) > 1
        backoff = Backoff(min(self.reconnect_timeout_s, FAILOVER_AFTER_S) if others else self.reconnect_timeout_s)
        doing = f"reconnecting to the simbridge trainer at {self.address}"
        check_stopping(doing)
        log.warning("connection to %s broke (%s); reconnecting", self.address, rpc_failure(cause))
        while True:
            if self._stream is not None:
                self._stream.cancel()
            try:
                resp = self._open_session(resume=self.session_id)
                break
            except BridgeError as e:
                check_stopping(doing)
                if e.code in RETRYABLE and others:
                    # A closed port has lost the session for good (a restarted server would not know
                    # it either): move at once; anything else gets FAILOVER_AFTER_S to come back.
                    what = diagnose(self.address, self._security.uses_tls)[0]
                    if what not in CLOSED and backoff.wait():
                        continue
                    self._move(what)
                if e.code in RETRYABLE and backoff.wait():
                    continue
                check_stopping(doing)
                why = e.message if e.code not in RETRYABLE else diagnose(self.address)[0]
                raise BridgeError(grpc.StatusCode.UNAVAILABLE,
                                  f"lost the simbridge trainer at {self.address} and could not reconnect "
                                  f"within {self.reconnect_timeout_s:.0f}s: {why}; restart it (`simbridge-"
                                  f"trainer run --resume --logdir DIR` goes on where it stopped)") from None
        self.reconnects += 1
        if not resp.resumed:
            old = self.session_id
            self.session_id = resp.session_id
            self._outstanding.clear()
            self._seq = 0
            self._on_session_lost()
            raise SessionLost(grpc.StatusCode.UNAVAILABLE,
                              f"the server no longer had session {old} (restarted or expired): its open "
                              f"episodes are gone; start new episodes (new session {resp.session_id})",
                              close_connection=self.close, new_session_id=resp.session_id)
        log.warning("resumed session %s; resending %d requests", self.session_id, len(self._outstanding))
        if self.transport == "stream":
            try:
                for _, _, _, data in self._outstanding:
                    self._stream.send(data)
            except grpc.RpcError:
                pass   # the next read finds the stream broken, and reconnects and resends again

    def _move(self, why: str) -> None:
        """The server at self.address went away: open a new session at the next address that
        answers and raise SessionLost (the unanswered requests are dropped, not resent: see the
        module's doc). A BridgeError naming every address when none answers."""
        old, old_session = self.address, self.session_id
        mark_down(old)
        close_unwatched(self._channel)
        i = self.addresses.index(old)
        order = self.addresses[i + 1:] + self.addresses[:i + 1]   # the lost one last: it may come back
        try:
            self.address, self._channel = connect_any(order, self.reconnect_timeout_s, security=self._security)
            self._stub = self._make_stub()
            self._outstanding.clear()
            self._seq = 0
            self.session = self._open_session(resume=None)
        except BridgeError as e:
            raise BridgeError(grpc.StatusCode.UNAVAILABLE,
                              f"lost the simbridge trainer at {old} ({why}) and found no other: {e.message}") from None
        self.session_id = self.session.session_id
        self.reconnects += 1
        self.moves += 1
        ended = self._on_session_lost()
        log.warning("bridge at %s went away (%s); moved to %s (new session %s, %d open episode(s) ended)",
                    old, why, self.address, self.session_id, ended)
        raise SessionLost(grpc.StatusCode.UNAVAILABLE,
                          f"the bridge at {old} went away ({why}); moved to {self.address} (new session "
                          f"{self.session_id}); the {ended} open episode(s) of session {old_session} ended with "
                          f"the old one: start new episodes", close_connection=self.close,
                          new_session_id=self.session_id)

    # -------------------------------------------------------------- calls

    def call(self, kind: str, msg, wait: bool = True, envelope: Optional[pb.StreamRequest] = None):
        """Send one request. wait=False pipelines it (stream only); returns the answer or None.
        `envelope`: a StreamRequest whose `kind` field is `msg` (built in place: no copy to send it)."""
        with self._lock:
            limit = self.session.limits.max_message_bytes
            data = None
            if self.transport == "stream":   # serialized once, sized and sent (and resent) as these bytes
                msg.header.seq = self._seq + 1
                data = (envelope if envelope is not None else _wrap(kind, msg)).SerializeToString()
            size = msg.ByteSize() if data is None else len(data)
            # Refused here (with room for header and framing): the server would end the stream.
            if limit and size + _FRAMING_BYTES > limit:
                self._on_failed(kind, msg)
                raise BridgeError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"{kind} request of {size} bytes exceeds the server's limit of "
                                  f"{limit} bytes: send fewer rows per call", Reason.MESSAGE_TOO_LARGE)
            if self._broken:
                self._broken = False
                self._reconnect(RuntimeError("the previous stream ended with an error"))
            self._seq += 1
            msg.header.seq = self._seq
            if self.transport == "unary":
                msg.header.session_id = self.session_id
                return self._unary(kind, msg)
            self._outstanding.append((self._seq, kind, msg, data))
            try:
                self._stream.send(data)
            except grpc.RpcError:
                pass   # the stream broke: reading its answer reconnects and resends it
            if wait or not self.pipeline:
                return self._read_until(self._seq)
            return None

    def flush(self) -> None:
        """Wait for every pipelined request's answer; raise the first error."""
        with self._lock:
            if self._outstanding:
                self._read_until(self._outstanding[-1][0])
            self._raise_deferred()

    def _unspend(self, seq: int, err: BridgeError) -> None:
        """The server kept `seq` unspent: the next request takes it again, when it was the last
        one numbered (a pipelined one after it would have its own answer to give)."""
        if err.reason in SEQ_NOT_SPENT and seq == self._seq:
            self._seq -= 1

    def _raise_failed(self, err: BridgeError, kind: str, msg) -> None:
        """Raise a failed request's error once the client's on_failed had its say (an error of
        on_failed's own comes first, caused by this one)."""
        self._unspend(msg.header.seq, err)
        try:
            self._on_failed(kind, msg)
        except BridgeError as hook_err:
            raise hook_err from err
        raise err from None

    def _unary(self, kind, msg):
        method = getattr(self._stub, _UNARY_NAMES[kind])
        while True:
            try:
                return self._wait(method, msg)
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE:
                    self._raise_failed(BridgeError.from_rpc_error(e), kind, msg)
                self._reconnect(e)
                msg.header.session_id = self.session_id

    def _read_until(self, seq: int):
        while True:
            try:
                resp = pb.StreamResponse.FromString(self._wait(self._stream.recv))
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE:
                    # The server ended the stream on purpose: resending would fail again. Say
                    # why; the next call reconnects and resends what is still unanswered.
                    self._broken = True
                    _, bad_kind, bad_msg, _ = self._outstanding.popleft()
                    err = BridgeError.from_rpc_error(e, prefix=f"{bad_kind} failed and ended the stream: ")
                    self._raise_failed(err, bad_kind, bad_msg)  # on_failed's calls reconnect first
                self._reconnect(e)
                continue
            got_seq, kind, sent, _ = self._outstanding.popleft()
            if resp.HasField("error"):
                err = BridgeError.from_status(resp.error)
                self._unspend(got_seq, err)
                self._on_failed(kind, sent)
                if got_seq == seq:
                    self._raise_deferred()
                    raise err
                if self._deferred is None:
                    self._deferred = EarlierCallFailed(err.code, f"an earlier {kind} failed: {err.message}", err.reason)
                continue
            if got_seq == seq:
                self._raise_deferred()
                return getattr(resp, resp.WhichOneof("payload"))

    def _raise_deferred(self):
        if self._deferred is not None:
            err, self._deferred = self._deferred, None
            raise err

    def close(self) -> None:
        self._closing = True  # a dead server is not worth reconnecting to now
        try:
            with self._lock:
                self.flush()
                self.call("close_session", pb.CloseSessionRequest())
        except BridgeError:
            pass
        finally:
            with self._lock:   # a DirectStream is read by one thread at a time
                if self._stream is not None:
                    self._stream.close()
            close_in_background(self._channel)


def _wrap(kind: str, msg) -> pb.StreamRequest:
    sr = pb.StreamRequest()
    getattr(sr, kind).CopyFrom(msg)
    return sr
