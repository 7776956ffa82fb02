"""The background half of LocalPolicyClient: the handoff of full chunks, its uploader thread
(experience chunks, exactly once under their seq, with the engine's retry policy) and its
policy refresher thread.

`ServerSync` is LocalPolicyClient's base class; the state it shares with the simulator's
calls (the chunk lists under `_cond`, `_fatal`, `_deferred`, the flags and counters) is set up
by LocalPolicyClient.__init__.
"""
import logging
import time
from typing import Optional

import grpc

from simbridge.client.connection import CLOSED, FAILOVER_AFTER_S, SessionLost, diagnose, mark_down
from simbridge.client.local_buffer import Chunk
from simbridge.client.local_policy import LocalPolicy
from simbridge.client.retry import RETRYABLE, Backoff, call_unary
from simbridge.client.stopping import Stopped, stopping
from simbridge.wire.errors import BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb

log = logging.getLogger("simbridge.local_client")

_MIN_REFRESH_GAP_S = 0.05  # upload answers may ask for a refresh this often at most
_CLOSING_RETRY_S = 2.0     # while closing, a server that stays unreachable is not waited for longer


class ServerSync:
    """The chunk handoff between the simulator's calls and the uploader, the uploads and the
    policy refreshes (LocalPolicyClient's two background threads)."""

    # ------------------------------------------------------------ handing chunks over

    def _writable(self) -> Chunk:
        """Cond held. The chunk to write into; blocks while every chunk waits for the server."""
        if self._current is not None:
            return self._current
        if self._free:
            self._current = self._free.pop()
            return self._current
        t0 = time.monotonic()
        self._n_blocked_calls += 1
        try:
            while not self._free:
                if self._fatal is not None:
                    raise self._fatal
                if self._abort:
                    raise BridgeError(grpc.StatusCode.UNAVAILABLE, "the client is closing")
                self._cond.wait(0.5)
        finally:
            self._count(blocked_s=time.monotonic() - t0)
        self._current = self._free.pop()
        return self._current

    def _rotate(self) -> None:
        """Cond held. The current chunk goes to the uploader; the next one comes from the free list."""
        self._ready.append(self._current)
        self._current = self._free.pop() if self._free else None
        self._cond.notify_all()

    # ------------------------------------------------------------ uploading

    def _header(self, seq: int) -> pb.RequestHeader:
        return pb.RequestHeader(session_id=self.session_id, seq=seq)

    def _upload_loop(self) -> None:
        while True:
            with self._cond:
                while not self._ready:
                    if self._closing or self._abort or self._fatal is not None:
                        return
                    c = self._current
                    if c is not None and not c.empty() and time.monotonic() - c.since >= self.flush_interval_s:
                        self._rotate()  # a partial chunk, so that a slow simulator's experience still flows
                        continue
                    self._cond.wait(min(0.1, self.flush_interval_s))
                chunk = self._ready[0]
                self._in_flight = 1
            try:
                self._send(chunk)
            except Exception as e:  # keep the simulator informed rather than dying silently
                log.exception("uploader failed")
                self._fatal = self._fatal or BridgeError(grpc.StatusCode.INTERNAL, f"experience uploader failed: {e!r}")
            with self._cond:
                self._in_flight = 0
                if self._fatal is not None:  # what is left stays buffered: stats() counts it lost
                    self._cond.notify_all()
                    return
                self._ready.popleft()
                chunk.reset()
                self._free.append(chunk)
                self._cond.notify_all()

    def _send(self, chunk: Chunk) -> None:
        """Uploads one chunk, resending it under the same seq until the server answers."""
        req = chunk.encode(self.observation_space, self.action_space)
        self._seq += 1
        req.header.CopyFrom(self._header(self._seq))
        n = chunk.n
        refused = Backoff(first_s=0.01, max_s=0.2)  # the server already waited for room before refusing
        broken = Backoff(self.reconnect_timeout_s)
        told = False
        while not self._abort:
            try:
                resp = call_unary(self._stub.UploadExperience, req, self.rpc_timeout_s)
            except BridgeError as err:
                code, details = err.code, err.message
                if err.reason == Reason.QUEUE_FULL:
                    self._count(refusals=1, refused_steps=n)
                    refused.wait()
                    continue
                if code in RETRYABLE:
                    others = len(self.addresses) > 1 and not self._closing
                    patience = min(self.reconnect_timeout_s, _CLOSING_RETRY_S) if self._closing else \
                        min(self.reconnect_timeout_s, FAILOVER_AFTER_S) if others else self.reconnect_timeout_s
                    what = diagnose(self.address)[0] if others else ""
                    if not told:   # as the connection engine says it
                        told = True
                        log.warning("connection to %s broke (%s: %s); reconnecting", self.address, code.name, details)
                    if what not in CLOSED and broken.wait(patience):
                        self._count(upload_retries=1)
                        continue
                    if stopping():   # the process is stopping (Ctrl-C): no more attempts
                        self._fatal = Stopped(grpc.StatusCode.CANCELLED, f"stopped while reconnecting to the "
                                                                         f"simbridge trainer at {self.address}")
                        return
                    if others:   # as the connection engine: a closed port at once, else after patience
                        mark_down(self.address)   # the next client of this process starts elsewhere
                        self._session_lost(f"the bridge at {self.address} went away ({what or details})")
                        return
                    self._fatal = BridgeError(grpc.StatusCode.UNAVAILABLE,
                                              f"lost the simbridge server at {self.address} for "
                                              f"{patience:.0f}s: {details}")
                    return
                if err.reason == Reason.SESSION_UNKNOWN:
                    self._session_lost()
                    return
                # The server refused the chunk itself: it would fail again. Say so on the next call.
                self._count(rejected_steps=n)
                self._deferred = BridgeError(code, f"the server refused an experience chunk of {n} steps, which "
                                                   f"is discarded: {details}", err.reason)
                log.error("experience chunk refused: %s: %s", code.name, details)
                return
            self._count(uploaded_steps=n, uploaded_chunks=1)
            if resp.policy_version > self._policy.version:
                self._refresh_now.set()
            return

    def _session_lost(self, why: str = "") -> None:
        with self._cond:
            lost = sum(c.n for c in self._ready) + (self._current.n if self._current else 0)
            why = why or f"the server no longer has session {self.session_id} (restarted or expired)"
            err = SessionLost(grpc.StatusCode.UNAVAILABLE,
                              f"{why}: {lost} buffered steps could not be delivered; start over with a new client",
                              close_connection=self._close_without_flush)
            self._fatal = self._fatal or err
            self._cond.notify_all()

    # ------------------------------------------------------------ policy refresh

    def _fetch_policy(self, known: int) -> Optional[LocalPolicy]:
        req = pb.GetPolicyRequest(header=self._header(0), known_version=known, include_onnx=self.include_onnx)
        resp = call_unary(self._stub.GetPolicy, req, self.rpc_timeout_s)
        if resp.unchanged:
            return None
        return LocalPolicy(resp.policy, seed=self._seeds.spawn(1)[0])

    def _refresh_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            # Every update_interval_s, or sooner when an upload's answer names a newer version,
            # but not more often than _MIN_REFRESH_GAP_S.
            self._refresh_now.wait(max(0.0, last + self.update_interval_s - time.monotonic()))
            self._refresh_now.clear()
            gap = last + _MIN_REFRESH_GAP_S - time.monotonic()
            if gap > 0:
                self._stop.wait(gap)
            if self._stop.is_set():
                return
            last = time.monotonic()
            try:
                new = self._fetch_policy(self._policy.version)
            except BridgeError as e:
                self._count(refresh_errors=1)
                if e.reason == Reason.SESSION_UNKNOWN:
                    self._session_lost()  # said here too: an idle simulator uploads nothing
                    return
                log.debug("policy refresh failed: %s", e)
            except ValueError as e:  # a policy this client cannot run: acting goes on with the old one
                self._count(refresh_errors=1)
                log.error("cannot run the server's new policy: %s", e)
            else:
                if new is not None:
                    self._policy = new
                    self._count(policy_updates=1)
                    with self._stats_lock:
                        self._stats["last_refresh_s"] = round(time.monotonic() - last, 6)
