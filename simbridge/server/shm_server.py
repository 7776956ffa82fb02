"""The bridge's end of the shared-memory step channel (`shm+unix:PATH`, docs/transports.md).

The session, health and everything else stay on gRPC over the Unix socket PATH. Beside it the
server listens on the handover socket PATH.shm (owner-only, as PATH). A simulator whose session
a gRPC stream opened connects there and names the session; the server checks that the caller is
its own user (SO_PEERCRED), that the session lives and has its gRPC stream open, and answers with
a fresh memfd (two rings, simbridge.wire.shm_ring) and two eventfds, passed with SCM_RIGHTS. No
name of the region exists anywhere: only the fds passed on reach it.

One thread per channel then reads requests from the ring and hands each to the servicer's own
code: the same `runtime.handle` with the session bound and the session owner's identity (the one
the gRPC handshake that created it established), the same refusal counting, error envelope and
settle-after-answer as a gRPC stream request (service._Servicer). Backpressure is the same too: a
full experience queue blocks this thread, the request ring fills, and the simulator waits.

A simulator that dies closes its end of the handover socket: the thread ends; the gRPC stream
that opened the channel dies with the process, and the session is detached and, after
reconnect_grace_s, closed with its episodes ended truncated, as on TCP.
"""
import logging
import os
import socket
import struct
import threading
from typing import Dict

import grpc

from simbridge.server.binding import SOCKET_MODE, _replace_stale, _unix_listening
from simbridge.wire import shm_ring
from simbridge.wire.errors import BridgeError, Reason, failed_precondition, invalid_argument
from simbridge.wire.v1 import simbridge_pb2 as pb

log = logging.getLogger("simbridge")

_PEERCRED = struct.Struct("3i")   # pid, uid, gid


def ring_bytes() -> int:
    try:
        n = int(os.environ.get("SIMBRIDGE_SHM_RING_BYTES", shm_ring.DEFAULT_RING_BYTES))
    except ValueError:
        n = shm_ring.DEFAULT_RING_BYTES
    return max(shm_ring.MIN_RING_BYTES, n)


class ShmListener:
    """The handover socket and the channels it opened. BridgeServer hands over its own pieces
    (service.py; passed, not imported, as service.py starts this): `servicers` by multi_agent,
    whose `answer` serves each request as the gRPC stream does, and its tolerant StreamRequest
    parser (an undecodable request comes out as service.Undecodable)."""

    def __init__(self, runtime, path: str, servicers: dict, parse):
        self.runtime = runtime
        self.path = path
        self.capacity = ring_bytes()
        # The bridge blocks by default: while it waits, the simulator steps its env on the core a
        # spinning bridge would take (docs/transports.md, measured).
        self.spin_s = shm_ring.spin_seconds(shm_ring.SERVER_SPIN_ENV)
        self.servicers = servicers
        self.parse = parse
        self._channels: Dict[str, "_Channel"] = {}
        self._closing: list = []   # the channels stop() closed, for join()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if _unix_listening(path):
            raise RuntimeError(f"could not bind shm+unix:{path[:-len('.shm')]}: another process is listening "
                               f"on {path}: stop it, or pick another path")
        _replace_stale(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)   # owner-only from its creation, as the gRPC socket (binding.py)
        try:
            self._sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, SOCKET_MODE)
        self._sock.listen(64)
        self._sock.settimeout(0.5)
        self._thread = threading.Thread(target=self._accept_loop, name="simbridge-shm-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No new channels; every open one told to close (its simulator sees it at once). The
        channels close first: waiting for the accept loop's timeout before closing them let a
        stopping server apply steps for another half second."""
        self._stop.set()
        self._close_channels()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)   # wakes the accept loop now
        except OSError:
            pass
        self._thread.join(5)
        self._sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._close_channels()   # one a handover in flight may have opened meanwhile

    def _close_channels(self) -> None:
        with self._lock:
            chans = [ch for ch in self._channels.values() if ch not in self._closing]
            self._closing += chans
        for ch in chans:
            ch.close()

    def join(self, timeout_s: float = 5.0) -> None:
        """Wait for the channels' threads (after the experience queue is closed: one may wait on it)."""
        for ch in self._closing:
            ch.thread.join(timeout_s)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                self._hand_over(conn)
            except OSError as e:   # the caller went away mid-handover, or sent nothing in time
                log.warning("shared-memory handover abandoned: %s", e)
                conn.close()
            except Exception:
                log.exception("shared-memory handover failed")
                conn.close()

    def _hand_over(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)
        try:
            session, servicer = self._admit(conn)
        except BridgeError as e:
            self.servicers[False]._refuse(e)
            conn.sendall(shm_ring.answer(e.code.value[0], e.reason or 0, 0, e.message))
            conn.close()
            return
        fds = []
        try:
            fds = [shm_ring.make_region(self.capacity), os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK),
                   os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)]
            region = shm_ring.Region(fds[0], self.capacity, fds[1], fds[2], conn, server=True,
                                     spin_s=self.spin_s, fresh=True)
            socket.send_fds(conn, [shm_ring.answer(0, 0, self.capacity)], fds)
        except BaseException:
            for fd in fds:
                os.close(fd)
            conn.close()
            raise
        os.close(fds[0])   # the mapping keeps the region; the simulator holds its own fd
        conn.settimeout(None)
        ch = _Channel(self, session, servicer, conn, region, fds[1:])
        with self._lock:
            old = self._channels.get(session.session_id)
            self._channels[session.session_id] = ch
        if old is not None:   # a reconnected simulator: its new channel replaces the old one
            old.close()
        if self._stop.is_set():   # stop() began during this handover: the simulator sees a closed channel
            ch.close()
        ch.thread.start()

    def _admit(self, conn: socket.socket):
        """The session the caller names, when the caller may open a channel for it."""
        _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        if uid not in (os.getuid(), 0):
            raise BridgeError(grpc.StatusCode.PERMISSION_DENIED, "the shared-memory channel is for the bridge's "
                              "own user", Reason.NOT_SESSION_OWNER)
        session_id = shm_ring.parse_hello(conn.recv(512))
        if session_id is None:
            raise invalid_argument("not a simbridge shared-memory hello: connect with a simbridge client")
        session = self.runtime.session(session_id)   # NOT_FOUND / SESSION_UNKNOWN when it is not live
        if session.streams < 1:
            raise failed_precondition("open the session's gRPC stream first: the shared-memory channel carries "
                                      "the steps of a session a stream created or resumed", Reason.WRONG_SESSION_KIND)
        with self._lock:
            if len(self._channels) >= self.runtime.config.max_concurrent_calls:
                raise BridgeError(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many shared-memory channels open",
                                  Reason.TOO_MANY_CALLS)
        return session, self.servicers[session.multi_agent]

    def _gone(self, ch: "_Channel") -> None:
        with self._lock:
            if self._channels.get(ch.session.session_id) is ch:
                del self._channels[ch.session.session_id]


class _Channel:
    """One simulator's ring, served by one thread."""

    def __init__(self, listener: ShmListener, session, servicer, conn, region, efds):
        self.listener = listener
        self.session = session
        self.servicer = servicer
        self.conn = conn
        self.region = region
        self.efds = efds
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="simbridge-shm", daemon=True)

    def close(self) -> None:
        self.closed.set()
        try:
            self.conn.shutdown(socket.SHUT_RDWR)   # wakes the thread's poll, and the simulator's
        except OSError:
            pass

    def _serve(self) -> None:
        session = self.session
        client = session.owner
        try:
            while not self.closed.is_set():
                data = self.region.incoming.get(timeout_s=1.0)
                if data is None:
                    continue
                resp = self.servicer.answer(self.listener.parse(data), client, session, where="channel")[0]
                out = resp.SerializeToString()
                try:
                    self.region.outgoing.put(out)
                except shm_ring.TooBig as e:
                    err = BridgeError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the answer does not fit: {e}: "
                                      f"raise SIMBRIDGE_SHM_RING_BYTES on the server, or send fewer rows per call",
                                      Reason.MESSAGE_TOO_LARGE)
                    self.servicer._refuse(err)
                    resp = pb.StreamResponse()
                    resp.error.CopyFrom(err.to_status())
                    self.region.outgoing.put(resp.SerializeToString())
                if session.pending is not None:
                    self.servicer.settle(session)   # after the answer, as the stream does
                if resp.HasField("close_session"):
                    break
        except shm_ring.PeerGone:
            pass
        except Exception:
            log.exception("shared-memory channel of session %s failed", session.session_id)
        finally:
            if session.pending is not None:
                self.servicer.settle(session)
            self.listener._gone(self)
            self.conn.close()
            self.region.close()
            for fd in self.efds:
                os.close(fd)
