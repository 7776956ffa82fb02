"""Why no gRPC channel to an address gets ready, in words, and whether waiting is hopeless
(`diagnose`, `why_not_ready`): nothing listening, a host that does not answer, something that is
not a gRPC server, a socket file stale or missing, and with TLS a server certificate that the
client's roots or its checked name refuse (gRPC's own verdict)."""
import os
import socket
import ssl
import stat
from typing import List, Optional, Tuple

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from simbridge.client.security import ClientSecurity
from simbridge.wire.addresses import is_unix, unix_path

NOTHING_LISTENS = "nothing listens there (connection refused)"   # diagnose's words for a port closed
NO_SOCKET_FILE = "no socket file there (no server has created it, or it stopped)"   # ... for unix:PATH
STALE_SOCKET = "nothing listens there (a stale socket file: connection refused)"
CLOSED = (NOTHING_LISTENS, NO_SOCKET_FILE, STALE_SOCKET)   # nothing serves there: its sessions are gone
TLS_REFUSED = "the server's TLS certificate"   # how each verdict on a server's certificate begins


def why_not_ready(address: str, channel: grpc.Channel, security: ClientSecurity) -> Tuple[str, bool]:
    """diagnose's answer, and with TLS gRPC's own verdict on the server's name: a certificate
    that does not hold the name this client checks is refused at every handshake, so waiting for
    it is hopeless."""
    what, hopeless = diagnose(address, security.uses_tls, tls_ca=security.tls_ca,
                              client_cert=security.tls_cert is not None)
    if security.uses_tls and not hopeless:
        host = "localhost" if is_unix(address) else address.rpartition(":")[0].strip("[]")   # gRPC's default names
        refused = _name_refused(channel, address, security.tls_server_name or host, security)
        if refused:
            return refused, True
    return what, hopeless


# gRPC's words for a certificate without the checked name: grpc >= 1.5x's hostname verifier, and
# the older security connector's.
_NAME_REFUSALS = ("Hostname Verification Check failed", "is not in peer certificate")


def _name_refused(channel: grpc.Channel, address: str, name: str, security: ClientSecurity) -> Optional[str]:
    """Whether gRPC's handshake with the server refuses its certificate for the name this client
    checks. A call that does not wait for a channel ends at once with its last error while its
    connection attempts fail, and on a channel still connecting waits for that attempt (at most
    1 s: 0.2 s cut handshakes short on a loaded machine). A host of several addresses (gRPC
    resolves localhost to ::1 and 127.0.0.1) makes that last error whichever address failed last,
    the refusal of one without a server as often as the server's name check: so each address
    is asked on a channel of its own. Names follow gRPC's rules (Python's differ: a common-name
    fallback), so only gRPC judges them."""
    if is_unix(address):
        return _refusal(_last_error(channel), name)
    for target in _each_address(address):
        probe = security.channel(target, options=[("grpc.ssl_target_name_override", name)])
        try:
            said = _refusal(_last_error(probe), name)
        finally:
            probe.close()
        if said:
            return said
    return None


def _last_error(channel: grpc.Channel) -> str:
    """The details of a health call's failure on `channel` ("" when it answers)."""
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0,
                                                  wait_for_ready=False)
    except grpc.RpcError as e:
        return e.details() or ""
    return ""


def _refusal(details: str, name: str) -> Optional[str]:
    said = [part for part in details.split(": ") if any(w in part for w in _NAME_REFUSALS)]
    if not said:
        return None
    return (f"{TLS_REFUSED} does not hold the name {name!r} this client checks (gRPC: "
            f"{said[-1].rstrip('.')}): connect by a name the certificate holds, or pass it with "
            f"--tls-server-name")


def _each_address(address: str) -> List[str]:
    """gRPC targets for each address of HOST:PORT (_host_ips); none when the host does not resolve
    (diagnose says it)."""
    host, _, port = address.rpartition(":")
    try:
        ips = _host_ips(host.strip("[]"))
    except (OSError, UnicodeError):
        return []
    return [f"ipv6:[{ip}]:{port}" if ":" in ip else f"ipv4:{ip}:{port}"
            for ip in ips if "%" not in ip]   # a scoped link-local address: left to gRPC


def _host_ips(host: str) -> List[str]:
    """The addresses gRPC may try for `host`: the system resolver's, and for localhost both
    loopbacks (gRPC's own resolver adds ::1 where /etc/hosts names 127.0.0.1 only). Raises the
    resolver's error (socket.gaierror) for a host it cannot resolve."""
    ips = [info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]
    if host == "localhost":
        ips += ["::1", "127.0.0.1"]
    return list(dict.fromkeys(ips))


def _connect_tcp(host: str, port: int, timeout_s: float):
    """(a socket connected to the first of the host's addresses that accepts, None), or (None,
    (why, hopeless)) for diagnose."""
    try:
        ips = _host_ips(host)
    except socket.gaierror as e:
        return None, (f"cannot resolve host {host!r} ({e.strerror})", True)
    why = None
    for ip in ips:
        try:
            return socket.create_connection((ip, port), timeout=timeout_s), None
        except ConnectionRefusedError:
            why = why or (NOTHING_LISTENS, False)
        except OSError as e:
            why = (f"the host does not answer ({e.strerror or 'timed out'})", False)
    return None, why or (f"cannot resolve host {host!r} (no address)", True)


def diagnose(address: str, tls: bool = False, timeout_s: float = 1.0,
             tls_ca: Optional[bytes] = None, client_cert: Optional[bool] = None) -> Tuple[str, bool]:
    """Why no gRPC channel to `address` gets ready, in words, and whether waiting is hopeless:
    nothing listening (a trainer may still come), a host that does not answer, or something
    listening that is not a gRPC server (an HTTP/1 server answers the HTTP/2 preface with HTTP/1).
    unix:PATH: no socket file (yet), a stale one nobody listens on, or one this user may not open.
    tls_ca (the client's --tls-ca): a server whose certificate those roots do not verify.
    client_cert: whether the client presents one (None: not known, as in a reconnect's look); a
    client known to have none is told when the server asks for one."""
    if is_unix(address):
        def connect():
            return _connect_unix(unix_path(address), timeout_s)
    else:
        host, _, port = address.rpartition(":")

        def connect():   # each address gRPC may try, in turn: the resolver's first may have no server
            return _connect_tcp(host.strip("[]"), int(port), timeout_s)
    sock, why = connect()
    if sock is None:
        return why
    with sock:
        # Not hopeless: a trainer binds its port a few seconds before it serves (it writes its
        # run files in between), and that looks the same as a failed handshake from here.
        if tls:
            refused = _tls_refusal(sock, None if is_unix(address) else tls_ca, client_cert)
            if refused:
                return refused, True
            return "a server answers but the TLS handshake or the gRPC connection failed", False
        closed = False   # the peer closed the probe's connection without a byte (not a timeout: a hung host)
        try:
            sock.sendall(_HTTP1_PROBE)
            answer = sock.recv(64)
            closed = not answer
        except ConnectionResetError:
            answer, closed = b"", True
        except OSError:
            answer = b""
    if answer.startswith(b"HTTP/1"):
        line = answer.split(b"\r\n", 1)[0].decode("latin-1")
        return (f"an HTTP/1 server answers there ({line!r}), not a gRPC server (a web server, "
                f"TensorBoard?)"), True
    if len(answer) >= 9 and answer[3] == 0x04:   # an HTTP/2 SETTINGS frame: a gRPC server, not ready yet
        return "a gRPC server answers there but the connection did not get ready", False
    if answer[:1] in (b"\x15", b"\x16") or (closed and _answers_tls(connect()[0])):
        # gRPC's TLS server closes a plain-text connection without a byte: a handshake tells it
        return (TLS_SERVER, True)
    return "something listens there but does not answer as a gRPC server (yet: a trainer still starting?)", False


TLS_FIX = ("connect with TLS: --tls-ca CA.pem, and --tls-server-name NAME where the certificate names the host "
           "otherwise (docs/security.md)")
TLS_SERVER = f"a TLS server answers there, and this client speaks plain text: {TLS_FIX}"


def _handshake(sock: socket.socket, tls_ca: Optional[bytes], timeout_s: float) -> ssl.SSLSocket:
    """`sock` after a TLS handshake as gRPC's client makes it (ALPN h2), the chain checked against
    tls_ca (None: nothing verified), names never (gRPC's own rules judge them). Raises what
    ssl raises: ssl.SSLCertVerificationError for a chain the roots refuse, OSError otherwise."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    if tls_ca is None:
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.load_verify_locations(cadata=tls_ca.decode("ascii", "replace"))
    ctx.set_alpn_protocols(["h2"])
    sock.settimeout(timeout_s)
    return ctx.wrap_socket(sock, do_handshake_on_connect=True)


def _answers_tls(sock: Optional[socket.socket], timeout_s: float = 0.5) -> bool:
    """Whether a TLS handshake (nothing verified) completes with the server on `sock`: a TLS server
    that closed the plain-text probe without a byte. No answer in time: not a verdict (False)."""
    if sock is None:
        return False
    try:
        with _handshake(sock, None, timeout_s):
            return True
    except OSError:   # ssl.SSLError (not TLS: closed, or another protocol) and timeouts
        return False
    finally:
        sock.close()


CLIENT_CERT_WANTED = ("it closes the connection right after the TLS handshake, as a server that asks for a client "
                      "certificate (mutual TLS) does to a client without one: pass --tls-cert and --tls-key, a "
                      "certificate and key signed by the CA of the server's --tls-client-ca (docs/security.md)")


def _tls_refusal(sock: socket.socket, tls_ca: Optional[bytes], client_cert: Optional[bool],
                 timeout_s: float = 0.5) -> Optional[str]:
    """Why the server refuses this client at TLS, if it does: its certificate fails the roots of
    --tls-ca (tls_ca; None: not judged), or it hangs up right after the handshake to a client
    without a certificate. Else None (accepted, some other failure, or no answer within
    timeout_s: a trainer that has bound its port but not started serving does not answer yet, and
    may still come). Only the chain is judged, with the roots gRPC is given: names
    (--tls-server-name) follow gRPC's own rules."""
    try:
        with _handshake(sock, tls_ca, timeout_s) as tls:
            if client_cert is not False:
                return None   # this probe presents none: a hang-up says something only of a client without
            # A gRPC server speaks first once the handshake is done (HTTP/2 SETTINGS). TLS 1.3 ends
            # the client's handshake before the server judges the client's (empty) certificate;
            # a server that wants one then closes without a byte (grpc 1.51: no alert).
            return CLIENT_CERT_WANTED if tls.recv(1) == b"" else None
    except ssl.SSLCertVerificationError as e:
        return f"{TLS_REFUSED} is not signed by the CA of --tls-ca ({e.verify_message})"
    except (OSError, ValueError):   # roots Python cannot read (gRPC's own failure says it), other
        return None                 # ssl errors and timeouts: not a verdict


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
