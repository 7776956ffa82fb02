"""The simulator's end of the shared-memory step channel (`shm+unix:PATH`, docs/transports.md).

A Connection given an shm+unix: address opens its session as on unix:PATH (a gRPC stream, with
the same create and resume), then connects to the handover socket PATH.shm, names the session,
and receives the region's fds (simbridge.wire.shm_ring). From then on its requests and their
answers (the same serialized StreamRequest / StreamResponse bytes) go through the rings; the
gRPC stream stays open beside them, idle, as the session's stream.

`ShmStream` has the five methods of the client's gRPC streams (direct_stream.py): send(bytes),
recv() -> bytes, close(), cancel(), cancel_from_another_thread(); a failed channel raises StreamFailed (a grpc.RpcError,
UNAVAILABLE), so the Connection reconnects, resumes the session and resends what is unanswered,
exactly as after a broken gRPC stream.
"""
import collections
import os
import socket
from typing import Optional, Tuple

import grpc

from simbridge.client.direct_stream import StreamFailed
from simbridge.wire import shm_ring
from simbridge.wire.addresses import SHM_SUFFIX, grpc_address, is_shm, shm_handover_path
from simbridge.wire.errors import BridgeError
from simbridge.wire.v1 import simbridge_pb2 as pb

_CODES = {c.value[0]: c for c in grpc.StatusCode}


def split_address(address) -> Tuple[object, Optional[str]]:
    """(what gRPC dials, the handover socket's path or None). An shm+unix: address is one
    address: a list holding one is refused (a shared-memory channel has one host)."""
    items = address.split(",") if isinstance(address, str) else [str(a) for a in address]
    shm = [a.strip() for a in items if is_shm(a.strip())]
    if not shm:
        return address, None
    if len(items) > 1:
        raise BridgeError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{shm[0]!r}: a shared-memory address names one bridge on this host, not one of a "
                          f"list: pass it alone, or unix:PATH / HOST:PORT addresses in the list")
    return grpc_address(shm[0]), shm_handover_path(shm[0])


def open_shm(path: str, grpc_stream, session: pb.CreateSessionResponse, timeout_s: float = 10.0) -> "ShmStream":
    """The channel of `session` (just created or resumed on `grpc_stream`), which it keeps open.
    Caps session.limits.max_message_bytes at what the ring holds (Connection refuses bigger
    requests with RESOURCE_EXHAUSTED / MESSAGE_TOO_LARGE before sending). BridgeError when the
    server refuses (its status), UNAVAILABLE when the socket cannot be reached."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds = []
    try:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(shm_ring.hello(session.session_id))
        data, fds, _, _ = socket.recv_fds(sock, 4096, 3)
        code, reason, capacity, message = shm_ring.parse_answer(data)
        if code:
            raise BridgeError(_CODES.get(code, grpc.StatusCode.UNKNOWN), message, reason or None)
        if len(fds) != 3:
            raise BridgeError(grpc.StatusCode.UNAVAILABLE, "the shared-memory handover passed no region")
        sock.settimeout(None)
        region = shm_ring.Region(fds[0], capacity, fds[1], fds[2], sock, server=False,
                                 spin_s=shm_ring.spin_seconds())
    except BaseException as e:
        for fd in fds:
            os.close(fd)
        sock.close()
        grpc_stream.cancel()   # the session's stream goes with the channel it was to carry
        if isinstance(e, FileNotFoundError):   # the gRPC socket answered: its server serves no shm channel
            grpc_path = path[:-len(SHM_SUFFIX)]
            raise BridgeError(grpc.StatusCode.UNAVAILABLE, f"could not open the shared-memory channel at {path}: "
                              f"no such socket: the trainer serves one only when its own address is shm+unix:PATH "
                              f"(start it with --address shm+unix:{grpc_path}), or dial unix:{grpc_path}") from None
        if isinstance(e, (OSError, ValueError)):
            raise BridgeError(grpc.StatusCode.UNAVAILABLE, f"could not open the shared-memory channel at "
                              f"{path}: {e}") from None
        raise
    os.close(fds[0])   # mapped: the fd is no longer needed
    limit = capacity - 4
    if not session.limits.max_message_bytes or session.limits.max_message_bytes > limit:
        session.limits.max_message_bytes = limit
    return ShmStream(grpc_stream, sock, region, fds[1:])


class ShmStream:
    """Requests and answers through the rings; not thread-safe (a Connection holds its lock)."""

    def __init__(self, grpc_stream, sock: socket.socket, region: "shm_ring.Region", efds):
        self._grpc = grpc_stream
        self._sock = sock
        self._region = region
        self._efds = efds
        self._answers: "collections.deque" = collections.deque()
        self._failed: Optional[StreamFailed] = None

    def send(self, data: bytes) -> None:
        self._check()
        try:
            self._region.outgoing.put(data, while_full=self._drain)
        except (shm_ring.PeerGone, OSError) as e:
            self._fail(e)
        except shm_ring.TooBig as e:   # the Connection's size check keeps this from happening
            self._failed = StreamFailed(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
            raise self._failed from None

    def _drain(self) -> None:
        """While the request ring is full: take the answers waiting, so the bridge can go on."""
        incoming = self._region.incoming
        while incoming.ready():
            self._answers.append(incoming.get())

    def recv(self) -> bytes:
        if self._answers:
            return self._answers.popleft()
        self._check()
        try:
            return self._region.incoming.get()
        except (shm_ring.PeerGone, OSError) as e:
            self._fail(e)

    def _check(self) -> None:
        if self._failed is not None:
            raise self._failed

    def _fail(self, e: Exception):
        self._failed = StreamFailed(grpc.StatusCode.UNAVAILABLE, f"the shared-memory channel broke: {e}")
        raise self._failed from None

    def close(self) -> None:
        self.cancel()

    def cancel_from_another_thread(self) -> None:
        """A recv waiting on the rings wakes (its poll watches the socket) and fails."""
        sock = self._sock
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        if self._sock is None:
            return
        if self._failed is None:
            self._failed = StreamFailed(grpc.StatusCode.CANCELLED, "closed by the client")
        self._sock.close()
        self._sock = None
        self._region.close()
        for fd in self._efds:
            os.close(fd)
        self._grpc.cancel()
