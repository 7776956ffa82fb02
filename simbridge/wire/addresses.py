"""The two kinds of bridge address, for the server that binds one and the clients that dial it:

  * HOST:PORT        TCP, e.g. "127.0.0.1:50051" or "[::1]:50051";
  * unix:PATH        a Unix domain socket on this machine, e.g. "unix:/run/simbridge/bridge.sock"
                     ("unix:///abs/path" and a relative "unix:bridge.sock" are gRPC's spellings too);
  * shm+unix:PATH    the same Unix socket for the session and everything else, and a shared-memory
                     channel for the step messages, handed over on the socket PATH.shm
                     (simbridge.wire.shm_ring, docs/transports.md).

A Unix socket skips TCP and the loopback device: same-host simulators take one step less on every
round trip (docs/transports.md). Its file's permissions say who may connect, so the server
creates it owner-only. Linux's abstract sockets ("unix-abstract:") have no file and so no
permissions: any local user could connect, and they are refused.
"""
from typing import Optional

UNIX = "unix:"
SHM = "shm+unix:"
SHM_SUFFIX = ".shm"   # the handover socket beside the gRPC one
_ABSTRACT = "unix-abstract:"
MAX_SOCKET_PATH = 107   # bytes: Linux's sun_path holds 108 with the terminating NUL


def is_shm(address: str) -> bool:
    return address.startswith(SHM)


def grpc_address(address: str) -> str:
    """What gRPC binds or dials: "shm+unix:PATH" -> "unix:PATH"; any other address as it is."""
    return address[len("shm+"):] if is_shm(address) else address


def shm_handover_path(address: str) -> str:
    """"shm+unix:PATH" -> the handover socket's path, PATH.shm."""
    return unix_path(grpc_address(address)) + SHM_SUFFIX


def is_unix(address: str) -> bool:
    return address.startswith(UNIX)


def unix_path(address: str) -> str:
    """"unix:/a/b" and "unix:///a/b" -> "/a/b"; "unix:rel.sock" -> "rel.sock"."""
    path = address[len(UNIX):]
    if path.startswith("//"):      # the URI form: unix://<empty authority>/abs/path
        path = path[2:]
    return path


def address_problem(address: str) -> Optional[str]:
    """What is wrong with an address, in words naming the fix; None when it is HOST:PORT,
    unix:PATH or shm+unix:PATH."""
    if address.startswith(_ABSTRACT):
        return (f"address {address!r}: abstract Unix sockets have no file permissions (any local user could "
                f"connect): use unix:PATH, e.g. unix:/tmp/simbridge/bridge.sock")
    given, longest, why = address, MAX_SOCKET_PATH, ""
    if is_shm(address):
        address = grpc_address(address)
        longest -= len(SHM_SUFFIX)
        why = f" ({MAX_SOCKET_PATH} less {len(SHM_SUFFIX)} for the handover socket PATH{SHM_SUFFIX})"
    if is_unix(address):
        path = unix_path(address)
        if not path:
            return (f"address {given!r} names no socket file: pass unix:PATH, "
                    f"e.g. unix:/tmp/simbridge/bridge.sock")
        size = len(path.encode("utf-8", "surrogateescape"))
        if size > longest:
            return (f"address {given!r}: the socket path is {size} bytes, longer than the {longest} a Unix "
                    f"socket allows{why}: pick a shorter path, e.g. unix:/tmp/simbridge/bridge.sock")
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return (f"address {address!r} has no port: pass HOST:PORT, e.g. 127.0.0.1:50051, or unix:PATH for a "
                f"Unix socket on this machine")
    if int(port) > 65535:   # gRPC took 99999 as 99999 - 65536 and bound (or dialled) that port
        return f"address {address!r}: port {int(port)} is past 65535: pass a port from 1 to 65535, e.g. 50051"
    return None
