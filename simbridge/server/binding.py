"""Binding the bridge's address (HOST:PORT or unix:PATH, simbridge.wire.addresses) the way a user
can reason about: a busy port or socket is found before gRPC tries, and refused in words naming
the fix; a Unix socket is created owner-only (0600), and a stale socket file (its server died)
is replaced, while one that a live server listens on never is.

Why the checks are ours: gRPC binds TCP with SO_REUSEPORT by default (the server turns it off), and
on a Unix path it unlinks whatever socket file is there before binding, so a second server would
silently take the first one's socket away from it.
"""
import errno
import logging
import os
import socket
import stat
from typing import Callable, Tuple

from simbridge.wire.addresses import address_problem, is_unix, unix_path

log = logging.getLogger("simbridge")

SOCKET_MODE = 0o600   # connect(2) on a Unix socket needs write permission on its file


def _host_port(address: str) -> Tuple[str, str]:
    """HOST:PORT's host (IPv6 brackets off; "" for none) and port, as text."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


def address_in_use(address: str) -> bool:
    """Whether some socket holds HOST:PORT now, a server listening there or a connection's local
    end (as gRPC binds: SO_REUSEADDR, so sockets in TIME_WAIT do not count), or a process listens on
    unix:PATH. False for port 0 and for addresses this cannot resolve or test, and for a stale
    socket file."""
    if is_unix(address):
        return _unix_listening(unix_path(address))
    host, port = _host_port(address)
    if not port.isdigit() or int(port) == 0:
        return False
    try:
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        return False
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(sockaddr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
    return False


def in_use_message(address: str) -> str:
    """The words for a busy address, with the fix (the CLIs add what was not done)."""
    if is_unix(address):
        return (f"could not bind {address}: another process is listening on that socket: stop it, or pick another "
                f"path with --address unix:PATH")
    if not _accepts(address):
        # An outgoing connection's local end: the kernel gives ports of its ephemeral range (32768-60999
        # on Linux, 50051 among them) to connections it opens, and a bind fails while one holds it.
        return (f"could not bind {address}: the port is the local end of a connection (one this machine opened "
                f"was given it), not a server's: try again when that connection ends, or pick another port "
                f"with --address HOST:PORT")
    return (f"could not bind {address}: another process is listening on that port: stop it, or pick another port "
            f"with --address HOST:PORT")


def _accepts(address: str) -> bool:
    """Whether a server accepts connections at HOST:PORT (a wildcard host: on loopback)."""
    host, port = _host_port(address)
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def _unix_listening(path: str) -> bool:
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return False
    except OSError:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
            return True
        except ConnectionRefusedError:
            return False
        except OSError as e:   # EACCES: someone else's live socket; EAGAIN: a full backlog, still live
            return e.errno in (errno.EACCES, errno.EPERM, errno.EAGAIN)


def bind(address: str, add_port: Callable[[str], int]) -> int:
    """Bind `address` with `add_port` (the gRPC server's add_insecure_port or add_secure_port bound
    to its credentials); the port (1 for a Unix socket). RuntimeError in words when it cannot."""
    problem = address_problem(address)
    if problem:
        raise RuntimeError(problem)
    if address_in_use(address):   # before gRPC tries: its failure is a raw C++ log line (or a theft)
        raise RuntimeError(in_use_message(address))
    if not is_unix(address):
        try:
            port = add_port(address)
        except RuntimeError:   # grpcio raises on a port in use (no SO_REUSEPORT)
            port = 0
        if port == 0:
            raise RuntimeError(f"could not bind {address}: is another server using that port? Pick another with "
                               f"--address HOST:PORT")
        return port
    path = unix_path(address)
    _replace_stale(path)
    # Owner-only from its creation (no moment when others could connect): gRPC creates the file
    # with the process's umask. The umask is process-wide; a server binds once, at start-up.
    old = os.umask(0o177)
    try:
        port = add_port(address)
    except RuntimeError:
        port = 0
    finally:
        os.umask(old)
    if port == 0 or not os.path.exists(path):
        raise RuntimeError(f"could not bind {address}: check that the directory exists and is writable")
    os.chmod(path, SOCKET_MODE)
    return port


def _replace_stale(path: str) -> None:
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise RuntimeError(f"could not bind unix:{path}: directory {directory!r} does not exist: create it "
                           f"(mkdir -m 700 {directory}) or pick another path")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise RuntimeError(f"could not bind unix:{path}: that path exists and is not a socket: pick another path "
                           f"(nothing was removed)")
    log.info("replacing the stale socket file %s (nothing listens on it)", path)
    os.unlink(path)
