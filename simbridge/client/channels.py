"""Finding a bridge host: a ready channel to one address (`open_channel`), or to one of several
(`connect_any`), and why none gets ready, in words (`diagnose`).

Several addresses come as a list or "h1:p1,h2:p2" (`parse_addresses`). A client starts at
`start_index`: a hash of the host name and process id, plus one for each client this process made
before, so simulator processes spread over the addresses and the clients of one process go round
them. An address a client of this process moved away from (`mark_down`) is tried last for 30 s.

A process that is stopping (simbridge.client.stopping) gives up waiting for a server at once.
"""
import itertools
import logging
import math
import os
import socket
import ssl
import stat
import threading
import time
import zlib
from typing import Dict, List, Optional, Sequence, Tuple, Union

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from simbridge.client.security import ClientSecurity
from simbridge.client.stopping import Stopped, check_stopping
from simbridge.wire.addresses import address_problem, grpc_address, is_unix, unix_path
from simbridge.wire.errors import BridgeError
from simbridge.wire.grpc_tuning import RECONNECT_OPTIONS

log = logging.getLogger("simbridge.client")

# With other addresses to go to, how long a client tries to resume on the server it lost before
# it moves: a broken stream to a live server resumes in milliseconds; a server that stopped
# answering for this long has lost the session's open episodes anyway (they end at its timeout).
FAILOVER_AFTER_S = 2.0
_DOWN_FOR_S = 30.0
_down_since: Dict[str, float] = {}
_clients_made = itertools.count()


NOTHING_LISTENS = "nothing listens there (connection refused)"   # diagnose's words for a port closed
NO_SOCKET_FILE = "no socket file there (no server has created it, or it stopped)"   # ... for unix:PATH
STALE_SOCKET = "nothing listens there (a stale socket file: connection refused)"
CLOSED = (NOTHING_LISTENS, NO_SOCKET_FILE, STALE_SOCKET)   # nothing serves there: its sessions are gone
TLS_REFUSED = "the server's TLS certificate"   # how each verdict on a server's certificate begins


def mark_down(address: str) -> None:
    """A client moved away from `address`: the process's next clients try it last for a while."""
    _down_since[address] = time.monotonic()


Addresses = Union[str, Sequence[str]]


def parse_addresses(address: Addresses) -> List[str]:
    """One address, a list of them, or a comma-separated string "h1:p1,h2:p2", as a list of
    HOST:PORT or unix:PATH (each checked: simbridge.wire.addresses); a BridgeError naming the fix
    for a bad one."""
    items = address.split(",") if isinstance(address, str) else [str(a) for a in address]
    out = [a.strip() for a in items if a.strip()]
    if not out:
        raise BridgeError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"no address given ({address!r}): pass HOST:PORT, or several as \"h1:p1,h2:p2\"")
    for a in out:
        problem = address_problem(a)
        if problem:
            raise BridgeError(grpc.StatusCode.INVALID_ARGUMENT, f"{problem} (the trainer's [server] address)")
    return list(dict.fromkeys(out))


def start_index(n: int) -> int:
    """Where a new client starts in a list of n addresses: a hash of this host and process, plus
    the number of clients this process made before (deterministic for a given process; spreads
    processes over the addresses, and a process's clients round them)."""
    base = zlib.crc32(f"{socket.gethostname()}/{os.getpid()}".encode())
    return (base + next(_clients_made)) % n


def try_order(addresses: List[str], start: int) -> List[str]:
    """The addresses from `start` round, the ones a client of this process left recently last."""
    ring = addresses[start:] + addresses[:start]
    now = time.monotonic()
    recent = {a for a in ring if now - _down_since.get(a, -_DOWN_FOR_S) < _DOWN_FOR_S}
    return [a for a in ring if a not in recent] + [a for a in ring if a in recent]


def close_unwatched(channel: grpc.Channel) -> None:
    """Close a channel whose ready future was just cancelled or met: gRPC's polling thread goes
    on watching it for up to 0.2 s, and a channel closed under it raises in that thread."""
    timer = threading.Timer(0.5, channel.close)
    timer.daemon = True
    timer.start()


def close_in_background(channel: grpc.Channel) -> None:
    """Close a channel that was ready (open_channel's) without waiting: its ready future left gRPC's
    polling thread in a watch with a 0.2 s deadline, and gRPC's close waits for that watch
    (grpc/grpc#3064), so a client closed soon after it connected waited up to 0.2 s in close()
    (the 204 bad-input tests: 55 s, 24 s without). The caller has ended its session and cancelled
    its stream; the close itself cancels any call left, as before, a moment later."""
    threading.Thread(target=channel.close, name="simbridge-channel-close", daemon=True).start()


def _new_channel(address: str, security: ClientSecurity) -> grpc.Channel:
    return security.channel(address, options=[
        ("grpc.max_receive_message_length", 256 * 1024 * 1024),
        ("grpc.max_send_message_length", 256 * 1024 * 1024),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        *RECONNECT_OPTIONS])


def connect_any(addresses: List[str], connect_timeout_s: float, fix: Optional[str] = None,
                security: Optional[ClientSecurity] = None) -> Tuple[str, grpc.Channel]:
    """The first of `addresses`, in their order, whose server answers, and a ready channel to it.
    Each gets a short look in turn (one that cannot answer, an HTTP server say, is dropped at
    once) until connect_timeout_s is spent; then a BridgeError naming every address and why."""
    if len(addresses) == 1:
        return addresses[0], open_channel(addresses[0], connect_timeout_s, fix, security)
    security = security or ClientSecurity.from_env()
    fix = fix or "start a trainer at one of them, or pass the trainers' addresses"
    pending = dict.fromkeys(addresses)     # a channel each, made at its first turn
    ready = {}
    why: Dict[str, str] = {}
    deadline = time.monotonic() + connect_timeout_s
    told = False
    try:
        while True:
            for a in list(pending):
                check_stopping(f"waiting for a simbridge trainer at {', '.join(addresses)}")
                if pending[a] is None:
                    pending[a] = _new_channel(a, security)
                    ready[a] = grpc.channel_ready_future(pending[a])
                try:
                    ready[a].result(timeout=max(0.0, min(0.3, deadline - time.monotonic())))
                    say_if_starting(pending[a], a)
                    return a, security.wrap(pending.pop(a))
                except grpc.FutureTimeoutError:
                    pass
                why[a], hopeless = why_not_ready(a, pending[a], security)
                if hopeless:
                    ready[a].cancel()
                    close_unwatched(pending.pop(a))
            if not pending or time.monotonic() >= deadline:
                said = "; ".join(f"{a}: {why.get(a, 'not tried')}" for a in addresses)
                raise BridgeError(grpc.StatusCode.UNAVAILABLE,
                                  f"no simbridge trainer at any of {len(addresses)} addresses ({said}): {fix}")
            if not told:
                told = True
                log.warning("no simbridge trainer at any of %s yet; waiting up to %.0f s for one: %s",
                            ", ".join(addresses), connect_timeout_s, fix)
    finally:
        for a, ch in pending.items():
            if ch is not None:
                ready[a].cancel()
                close_unwatched(ch)


def connect_first(address: Addresses, connect_timeout_s: float,
                  security: Optional[ClientSecurity] = None) -> Tuple[List[str], str, grpc.Channel]:
    """A new client's connection: (all its addresses, the one it connected to, a ready channel)."""
    addresses = parse_addresses(address)
    chosen, channel = connect_any(try_order(addresses, start_index(len(addresses))), connect_timeout_s,
                                  security=security)
    return addresses, chosen, channel


def open_channel(address: Addresses, connect_timeout_s: float, fix: Optional[str] = None,
                 security: Optional[ClientSecurity] = None) -> grpc.Channel:
    """A channel to a simbridge server, ready; a BridgeError naming the fix when none answers
    (`fix`: what the caller's user should do instead of starting a trainer). An address without a
    port and one where something other than gRPC answers (an HTTP server) fail at once; with
    nothing listening it waits up to connect_timeout_s (a trainer may be starting), saying so once.
    Several addresses (a list or "h1:p1,h2:p2"): one of them, from start_index (connect_any).
    `security`: TLS and token (default: ClientSecurity.from_env())."""
    addresses = parse_addresses(address)
    if len(addresses) > 1:
        return connect_any(try_order(addresses, start_index(len(addresses))), connect_timeout_s, fix,
                           security)[1]
    given = addresses[0]
    address = grpc_address(given)   # shm+unix:PATH: its session and health are on gRPC at unix:PATH
    security = security or ClientSecurity.from_env()
    channel = _new_channel(address, security)
    fix = fix or f"start one with `simbridge-trainer run --address {given}`, or pass the trainer's address"
    ready = grpc.channel_ready_future(channel)
    deadline = time.monotonic() + connect_timeout_s
    told, wait_s = False, 0.3   # a first look soon: an HTTP server there fails at once
    while True:
        try:
            # In steps of at most 0.25 s: a process that stops gives up the wait within that.
            for _ in range(max(1, math.ceil(wait_s / 0.25))):
                check_stopping(f"waiting for the simbridge trainer at {address}")
                try:
                    ready.result(timeout=max(0.0, min(0.25, deadline - time.monotonic())))
                    say_if_starting(channel, address)
                    return security.wrap(channel)
                except grpc.FutureTimeoutError:
                    pass
        except Stopped:
            ready.cancel()
            close_unwatched(channel)
            raise
        what, hopeless = why_not_ready(address, channel, security)
        if hopeless or time.monotonic() >= deadline:
            ready.cancel()
            close_unwatched(channel)
            msg = f"no simbridge trainer at {address}: {what}: {fix}"
            if what.startswith(TLS_REFUSED):   # a server is there; its certificate is what fails, and `what` says the fix
                msg = f"this client refuses the server at {address}: {what}"
            elif security.uses_tls:
                msg += (" (this client uses TLS: a server without TLS, or a certificate that --tls-ca does not "
                        "verify or whose name does not match, fails the same way; see --tls-server-name)")
            raise BridgeError(grpc.StatusCode.UNAVAILABLE, msg) from None
        wait_s = 1.0
        if not told:
            told = True
            log.warning("no simbridge trainer at %s yet: %s; waiting up to %.0f s for one: %s", address, what,
                        connect_timeout_s, fix)


def say_if_starting(channel: grpc.Channel, address: str) -> None:
    """A trainer still starting listens and answers health NOT_SERVING, holding calls until it
    serves (trainer/run/listen.py): say so, since the client's first call will wait."""
    try:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2.0).status
    except grpc.RpcError:   # no health service, or an old server: nothing to say
        return
    if status == health_pb2.HealthCheckResponse.NOT_SERVING:
        log.warning("the simbridge trainer at %s is still starting (loading torch and its learners): this client "
                    "waits until it serves", address)


def why_not_ready(address: str, channel: grpc.Channel, security: ClientSecurity) -> Tuple[str, bool]:
    """diagnose's answer, and with TLS gRPC's own verdict on the server's name: a certificate
    that does not hold the name this client checks is refused at every handshake, so waiting for
    it is hopeless."""
    what, hopeless = diagnose(address, security.uses_tls, tls_ca=security.tls_ca)
    if security.uses_tls and not hopeless:
        host = "localhost" if is_unix(address) else address.rpartition(":")[0].strip("[]")   # gRPC's default names
        refused = _name_refused(channel, security.tls_server_name or host)
        if refused:
            return refused, True
    return what, hopeless


# gRPC's words for a certificate without the checked name: grpc >= 1.5x's hostname verifier, and
# the older security connector's.
_NAME_REFUSALS = ("Hostname Verification Check failed", "is not in peer certificate")


def _name_refused(channel: grpc.Channel, name: str) -> Optional[str]:
    """Whether gRPC's last handshake on `channel` refused the server's certificate for its name.
    A call that does not wait for the channel ends at once with the channel's last error while its
    connection attempts fail; on a channel still connecting it waits for that attempt (at most
    1 s: 0.2 s cut handshakes short on a loaded machine, and the verdict came only after 16 s).
    Names follow gRPC's rules (Python's differ: a common-name fallback), so only gRPC judges them."""
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0,
                                                  wait_for_ready=False)
    except grpc.RpcError as e:
        said = [part for part in (e.details() or "").split(": ") if any(w in part for w in _NAME_REFUSALS)]
        if said:
            return (f"{TLS_REFUSED} does not hold the name {name!r} this client checks (gRPC: "
                    f"{said[-1].rstrip('.')}): connect by a name the certificate holds, or pass it with "
                    f"--tls-server-name")
    return None


def diagnose(address: str, tls: bool = False, timeout_s: float = 1.0,
             tls_ca: Optional[bytes] = None) -> Tuple[str, bool]:
    """Why no gRPC channel to `address` gets ready, in words, and whether waiting is hopeless:
    nothing listening (a trainer may still come), a host that does not answer, or something
    listening that is not a gRPC server (an HTTP/1 server answers the HTTP/2 preface with HTTP/1).
    unix:PATH: no socket file (yet), a stale one nobody listens on, or one this user may not open.
    tls_ca (the client's --tls-ca): a server whose certificate those roots do not verify."""
    if is_unix(address):
        sock, why = _connect_unix(unix_path(address), timeout_s)
        if sock is None:
            return why
    else:
        host, _, port = address.rpartition(":")
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
        except ConnectionRefusedError:
            return NOTHING_LISTENS, False
        except socket.gaierror as e:
            return f"cannot resolve host {host!r} ({e.strerror})", True
        except OSError as e:
            return f"the host does not answer ({e.strerror or 'timed out'})", False
    with sock:
        # Not hopeless: a trainer binds its port a few seconds before it serves (it writes its
        # run files in between), and that looks the same as a failed handshake from here.
        if tls:
            refused = _certificate_refused(sock, tls_ca) if tls_ca and not is_unix(address) else None
            if refused:
                return refused, True
            return "a server answers but the TLS handshake or the gRPC connection failed", False
        try:
            sock.sendall(_HTTP1_PROBE)
            answer = sock.recv(64)
        except OSError:
            answer = b""
    if answer.startswith(b"HTTP/1"):
        line = answer.split(b"\r\n", 1)[0].decode("latin-1")
        return (f"an HTTP/1 server answers there ({line!r}), not a gRPC server (a web server, "
                f"TensorBoard?)"), True
    if len(answer) >= 9 and answer[3] == 0x04:   # an HTTP/2 SETTINGS frame: a gRPC server, not ready yet
        return "a gRPC server answers there but the connection did not get ready", False
    if answer[:1] in (b"\x15", b"\x16"):
        return "a TLS server answers there: connect with TLS (--tls-ca, docs/security.md)", True
    return "something listens there but does not answer as a gRPC server (yet: a trainer still starting?)", False


def _certificate_refused(sock: socket.socket, tls_ca: bytes, timeout_s: float = 0.5) -> Optional[str]:
    """Why the server's certificate fails the roots of --tls-ca, if it does; else None (verified,
    some other failure, or no answer within timeout_s: a trainer that has bound its port but not
    started serving does not answer a handshake yet, and may still come). Only the chain is
    judged, with the roots gRPC is given: names (--tls-server-name) follow gRPC's own rules."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    try:
        ctx.load_verify_locations(cadata=tls_ca.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError):
        return None   # roots Python cannot read: gRPC's own failure says it
    ctx.set_alpn_protocols(["h2"])
    sock.settimeout(timeout_s)
    try:
        with ctx.wrap_socket(sock, do_handshake_on_connect=True):
            return None
    except ssl.SSLCertVerificationError as e:
        return f"{TLS_REFUSED} is not signed by the CA of --tls-ca ({e.verify_message})"
    except OSError:   # ssl.SSLError and timeouts included: not a verdict on the certificate
        return None


def _connect_unix(path: str, timeout_s: float):
    """(a connected socket, None), or (None, (why, hopeless)) for diagnose."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return None, (f"{path} is not a socket (a regular file or directory): pass the path the trainer's "
                          f"--address unix:PATH names", True)
    except (FileNotFoundError, NotADirectoryError):
        return None, (NO_SOCKET_FILE, False)        # a trainer may still come and create it
    except OSError as e:
        return None, (f"cannot look at {path} ({e.strerror})", True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(path)
        return sock, None
    except FileNotFoundError:
        why = NO_SOCKET_FILE, False
    except ConnectionRefusedError:
        # A socket file whose server died without removing it: the next server there replaces it.
        why = STALE_SOCKET, False
    except PermissionError:
        why = (f"permission denied on {path} (the server makes its socket owner-only: run the simulator as the "
               f"trainer's user)"), True
    except OSError as e:
        why = f"the socket does not answer ({e.strerror or 'timed out'})", False
    sock.close()
    return None, why


# An HTTP/1 request: an HTTP/1 server answers with a status line; a gRPC server (HTTP/2 only) does not.
_HTTP1_PROBE = b"GET / HTTP/1.1\r\nHost: simbridge\r\n\r\n"
