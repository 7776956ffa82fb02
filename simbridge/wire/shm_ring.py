"""The shared-memory step channel's rings and wake-ups, for its two ends (docs/transports.md).

One memfd (no name in any file system: it reaches the simulator only as a file descriptor passed
over the owner-only handover socket, SCM_RIGHTS) holds two single-producer single-consumer rings:
requests (simulator -> bridge) and answers (bridge -> simulator). Each message is a 4-byte
little-endian length and the serialized protobuf envelope (the stream's StreamRequest /
StreamResponse bytes), wrapping around the ring's end. A ring has two cursors, `head` (bytes ever
written, moved by its producer) and `tail` (bytes ever read, moved by its consumer), each an
aligned 8-byte word stored with one store, on a cache line of its own.

Wake-ups: after each message the producer writes 1 to the ring's eventfd (a syscall, which also
orders the data before the cursor for the other side). The consumer spins on the cursor for up to
`spin_s`, then blocks in poll() on the eventfd and the handover socket, so a peer that dies (its
end of the socket closes) wakes it too. An eventfd counts: a wake-up for a message already taken
while spinning makes one spurious poll return, never a lost one.
"""
import mmap
import os
import select
import socket
import struct
import time
from typing import Optional

MAGIC = 0x53424D48_53484D31   # "SBMHSHM1"
HEADER = 64                   # magic, ring capacity
_CURSORS = 128                # head at +0, tail at +64: one cache line each
_LEN = struct.Struct("<I")
DEFAULT_RING_BYTES = 1 << 20  # per direction; SIMBRIDGE_SHM_RING_BYTES on the server
MIN_RING_BYTES = 4096


class PeerGone(Exception):
    """The other end closed its handover socket (it stopped, or its process died)."""


class TooBig(Exception):
    """A message that does not fit the ring at all."""


def region_bytes(capacity: int) -> int:
    return HEADER + 2 * (_CURSORS + capacity)


def make_region(capacity: int) -> int:
    """A fresh owner-only memfd sized for two rings of `capacity` bytes (the server's side)."""
    fd = os.memfd_create("simbridge-shm", os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)    # memfd starts 0777; only an fd passed on grants access anyway
        os.ftruncate(fd, region_bytes(capacity))
        return fd
    except BaseException:
        os.close(fd)
        raise


class Ring:
    """One direction of the channel, seen from one end (producer or consumer)."""

    def __init__(self, mm, words, base: int, capacity: int, efd: int, sock: socket.socket, spin_s: float):
        self._mv = memoryview(mm)
        self._words = words                    # the mapping as uint64s: cursor stores are single stores
        self._head = base // 8                 # word indexes of the cursors
        self._tail = (base + 64) // 8
        self._data = base + _CURSORS
        self.capacity = capacity
        self._efd = efd
        self._sock = sock
        self._spin_s = spin_s
        self._poll = select.poll()
        self._poll.register(efd, select.POLLIN)
        self._poll.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)

    # ---- producer
    def put(self, data, deadline: Optional[float] = None, while_full=None) -> None:
        """Append one message and wake the consumer. Waits for room (calling `while_full`, the
        producer's chance to drain its own incoming ring, between looks); TooBig when it can
        never fit; PeerGone when the consumer is gone; TimeoutError past `deadline`."""
        n = len(data)
        need = 4 + n
        cap = self.capacity
        if need > cap:
            raise TooBig(f"a message of {n} bytes does not fit the shared-memory ring of {cap} bytes")
        w = self._words
        head = w[self._head]
        pause = 20e-6
        while cap - (head - w[self._tail]) < need:
            if while_full is not None:
                while_full()
            self._check_peer()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("the shared-memory ring stayed full")
            time.sleep(pause)              # rare (a pipelined burst): no wake-up needed for room
            pause = min(pause * 2, 2e-3)
        self._copy_in(head, _LEN.pack(n))
        self._copy_in(head + 4, data)
        w[self._head] = head + need
        os.eventfd_write(self._efd, 1)

    def _copy_in(self, pos: int, data) -> None:
        cap, mv = self.capacity, self._mv
        at = pos % cap
        first = min(len(data), cap - at)
        mv[self._data + at:self._data + at + first] = data[:first]
        if first < len(data):
            mv[self._data:self._data + len(data) - first] = data[first:]

    # ---- consumer
    def ready(self) -> bool:
        w = self._words
        return w[self._head] != w[self._tail]

    def get(self, timeout_s: Optional[float] = None) -> Optional[bytes]:
        """The next message (None after `timeout_s` without one); PeerGone when the producer is gone."""
        w = self._words
        h, t = self._head, self._tail
        if w[h] == w[t]:
            if self._spin_s > 0:
                until = time.perf_counter() + self._spin_s
                while w[h] == w[t] and time.perf_counter() < until:
                    pass
            if w[h] == w[t] and not self._block(timeout_s):
                return None
        tail = w[t]
        n = _LEN.unpack(self._copy_out(tail, 4))[0]
        if n > self.capacity - 4:
            raise PeerGone(f"the shared-memory ring is corrupt (a length of {n} bytes)")
        data = self._copy_out(tail + 4, n)
        w[t] = tail + 4 + n
        return data

    def _block(self, timeout_s: Optional[float]) -> bool:
        """Wait for a message: True when one is there."""
        w, h, t = self._words, self._head, self._tail
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while w[h] == w[t]:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            events = self._poll.poll(None if left is None else left * 1000)
            for fd, ev in events:
                if fd == self._efd:
                    try:
                        os.eventfd_read(self._efd)
                    except BlockingIOError:
                        pass
            if w[h] != w[t]:
                return True
            if any(fd != self._efd for fd, _ in events):
                self._check_peer()
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def _copy_out(self, pos: int, n: int) -> bytes:
        cap, mv, base = self.capacity, self._mv, self._data
        at = pos % cap
        if at + n <= cap:
            return mv[base + at:base + at + n].tobytes()
        first = cap - at
        return mv[base + at:base + cap].tobytes() + mv[base:base + n - first].tobytes()

    def _check_peer(self) -> None:
        """PeerGone when the handover socket says the other end closed it."""
        try:
            if self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                raise PeerGone("the other end closed the shared-memory channel")
        except BlockingIOError:
            return
        except OSError as e:
            raise PeerGone(f"the shared-memory channel's socket failed: {e}") from None

    def release(self) -> None:
        self._mv.release()


class Region:
    """The mapped memfd and its two rings, from one end's point of view."""

    def __init__(self, fd: int, capacity: int, efd_req: int, efd_resp: int, sock: socket.socket,
                 server: bool, spin_s: float, fresh: bool = False):
        size = region_bytes(capacity)
        if os.fstat(fd).st_size < size:
            raise ValueError("the shared-memory region is smaller than its rings")
        self._mm = mmap.mmap(fd, size)
        self._words = memoryview(self._mm).cast("Q")
        if fresh:
            self._words[0], self._words[1] = MAGIC, capacity
        elif self._words[0] != MAGIC or self._words[1] != capacity:
            raise ValueError("the shared-memory region is not a simbridge channel of this version")
        req = Ring(self._mm, self._words, HEADER, capacity, efd_req, sock, spin_s)
        resp = Ring(self._mm, self._words, HEADER + _CURSORS + capacity, capacity, efd_resp, sock, spin_s)
        self.incoming, self.outgoing = (req, resp) if server else (resp, req)
        self.capacity = capacity

    def close(self) -> None:
        self.incoming.release()
        self.outgoing.release()
        self._words.release()
        self._mm.close()


# ---- the handover: the simulator names its session, the bridge answers with the region's fds
HELLO = b"SBSHM1\0"
_ANSWER = struct.Struct("<IIQ")   # status code (0: OK, else a grpc.StatusCode's number), reason, capacity


def hello(session_id: str) -> bytes:
    return HELLO + session_id.encode("ascii")


def parse_hello(data: bytes) -> Optional[str]:
    if not data.startswith(HELLO) or len(data) > len(HELLO) + 256:
        return None
    try:
        return data[len(HELLO):].decode("ascii")
    except UnicodeDecodeError:
        return None


def answer(code: int, reason: int, capacity: int, message: str = "") -> bytes:
    return _ANSWER.pack(code, reason, capacity) + message.encode("utf-8")[:2000]


def parse_answer(data: bytes):
    """(code, reason, capacity, message)."""
    if len(data) < _ANSWER.size:
        raise ValueError("a short answer on the shared-memory handover socket")
    code, reason, capacity = _ANSWER.unpack_from(data)
    return code, reason, capacity, data[_ANSWER.size:].decode("utf-8", "replace")


CLIENT_SPIN_ENV = "SIMBRIDGE_SHM_SPIN_US"          # the simulator, waiting for an answer
SERVER_SPIN_ENV = "SIMBRIDGE_SHM_SERVER_SPIN_US"   # the bridge, waiting for a request


def spin_seconds(env: str = CLIENT_SPIN_ENV, default_us: float = 0.0) -> float:
    try:
        return max(0.0, float(os.environ.get(env, default_us))) / 1e6
    except ValueError:
        return default_us / 1e6
