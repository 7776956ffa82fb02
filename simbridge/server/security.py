"""Who may call the bridge: TLS, mutual TLS and bearer tokens, through gRPC's own mechanisms.

ServerSecurity is what the user asked for (files, flags); `load()` reads the files once and
gives a LoadedSecurity: the server credentials for `add_secure_port`, the token check
(`TokenInterceptor`, a grpc.ServerInterceptor) and `identity(context)`, the name under which a
caller's sessions and limits are kept:
  * "cert:<common name>" for a client certificate (mutual TLS),
  * "token:<first 12 hex of its SHA-256>" for a token (never the token itself),
  * both joined with "+" when both are present,
  * "host:<address>" when the call carries neither (a trusted network).

Tokens: one per non-empty line of --auth-token-file (lines starting with # are comments), so
fleets can hold different tokens and their sessions stay apart. A call carries one as
metadata `authorization: Bearer <token>`; it is compared in constant time with
hmac.compare_digest, never logged, and a call without a valid one gets UNAUTHENTICATED /
AUTH_FAILED and nothing else. The health service answers without a token (probes).

A server bound to anything but loopback refuses to start without TLS and an authentication
(a token or client certificates), unless told `insecure=True` (`--insecure`) in so many words.
"""
import hashlib
import hmac
import ipaddress
import ssl
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import grpc

from simbridge.wire.addresses import address_problem
from simbridge.wire.errors import BridgeError, Reason

HEALTH_PREFIX = "/grpc.health.v1.Health/"
AUTH_METADATA = "authorization"
BEARER = "Bearer "


class SecurityConfigError(ValueError):
    """A TLS or token setting that cannot work; the message names the flag and the fix."""


def auth_failed() -> BridgeError:
    return BridgeError(grpc.StatusCode.UNAUTHENTICATED,
                       "this server requires a token, and this call carried none it accepts (no token, or one "
                       "not in the server's --auth-token-file): pass --auth-token-file (or set SIMBRIDGE_AUTH_TOKEN) "
                       "with one of the tokens that file holds", Reason.AUTH_FAILED)


@dataclass
class ServerSecurity:
    tls_cert: str = ""          # PEM certificate chain of the server
    tls_key: str = ""           # PEM private key of the server
    tls_client_ca: str = ""     # PEM roots: clients must present a certificate they signed (mTLS)
    auth_token_file: str = ""   # one accepted token per line
    insecure: bool = False      # allow a non-loopback address without TLS and authentication

    def load(self, address: str) -> "LoadedSecurity":
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SecurityConfigError("TLS needs both --tls-cert and --tls-key")
        if self.tls_client_ca and not self.tls_cert:
            raise SecurityConfigError("--tls-client-ca (mutual TLS) needs server TLS: add --tls-cert and --tls-key")
        credentials = None
        if self.tls_cert:
            key_pem, cert_pem = _check_tls_files(self.tls_cert, self.tls_key, self.tls_client_ca)
            credentials = grpc.ssl_server_credentials(
                [(key_pem, cert_pem)],
                root_certificates=_read(self.tls_client_ca, "--tls-client-ca") if self.tls_client_ca else None,
                require_client_auth=bool(self.tls_client_ca))
        tokens = read_tokens(self.auth_token_file) if self.auth_token_file else {}
        # an address that is no address at all (unix-abstract:) is refused for what it is, where it binds
        if address_problem(address) is None and not is_loopback(address) and not self.insecure \
                and not (credentials and (tokens or self.tls_client_ca)):
            raise SecurityConfigError(
                f"refusing to serve {address} beyond this machine without TLS and authentication: pass "
                f"--tls-cert/--tls-key and --auth-token-file (or --tls-client-ca), bind 127.0.0.1, or pass "
                f"--insecure to serve a network you trust in plain text")
        return LoadedSecurity(credentials, tokens, bool(self.tls_client_ca))


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise SecurityConfigError(f"cannot read {flag} file {path!r}: {e.strerror}") from None


def _check_tls_files(cert: str, key: str, client_ca: str) -> Tuple[bytes, bytes]:
    """What gRPC would refuse only as it binds, with a C++ log line and a failure that reads like a
    port in use: a file that is not PEM, the two swapped, a key not the certificate's, an
    encrypted key (gRPC takes none). Checked with Python's ssl, which reads the same PEM. Returns
    the key's and the certificate's PEM, read once."""
    key_pem, cert_pem = _read(key, "--tls-key"), _read(cert, "--tls-cert")
    swapped = " (--tls-cert and --tls-key look swapped)" \
        if b"PRIVATE KEY-----" in cert_pem and b"-----BEGIN CERTIFICATE-----" in key_pem else ""
    if b"-----BEGIN CERTIFICATE-----" not in cert_pem:
        raise SecurityConfigError(f"--tls-cert {cert!r} holds no PEM certificate (-----BEGIN CERTIFICATE-----): "
                                  f"pass the server's certificate (chain){swapped}")
    if b"PRIVATE KEY-----" not in key_pem:
        raise SecurityConfigError(f"--tls-key {key!r} holds no PEM private key (-----BEGIN ... PRIVATE KEY-----): "
                                  f"pass the key the certificate was made with{swapped}")

    def encrypted():
        raise SecurityConfigError(f"--tls-key {key!r} is encrypted, and gRPC takes no passphrase: write it "
                                  f"unencrypted (openssl pkey -in {key} -out server.key; chmod 600 server.key)")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=encrypted)
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise SecurityConfigError(f"--tls-key {key!r} is not the private key of the certificate in --tls-cert "
                                      f"{cert!r}: pass the key it was made with") from None
        raise SecurityConfigError(f"--tls-cert {cert!r} and --tls-key {key!r} do not load as a certificate "
                                  f"and its key ({e.reason or e})") from None
    if client_ca:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(client_ca)
        except ssl.SSLError:
            raise SecurityConfigError(f"--tls-client-ca {client_ca!r} holds no PEM certificate: pass the CA "
                                      f"certificate that signed the clients' certificates") from None
    return key_pem, cert_pem


def read_tokens(path: str) -> Dict[bytes, str]:
    """The tokens of an --auth-token-file: SHA-256 digest -> identity."""
    tokens = {}
    for line in _read(path, "--auth-token-file").decode("utf-8", "replace").splitlines():
        token = line.strip()
        if token and not token.startswith("#"):
            digest = hashlib.sha256(token.encode()).digest()
            tokens[digest] = "token:" + digest.hex()[:12]
    if not tokens:
        raise SecurityConfigError(f"--auth-token-file {path!r} holds no token (one per line)")
    return tokens


def is_loopback(address: str) -> bool:
    """Whether a listening address stays on this machine (loopback or a unix socket)."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False   # a name, 0.0.0.0, ::: reachable from elsewhere


def peer_host(peer: str) -> str:
    """"ipv4:127.0.0.1:5000" -> "127.0.0.1"; "ipv6:[::1]:5000" -> "::1"; others as they are."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer


class LoadedSecurity:
    def __init__(self, credentials: Optional[grpc.ServerCredentials], tokens: Dict[bytes, str],
                 client_certs: bool):
        self.credentials = credentials
        self.tokens = tokens
        self.client_certs = client_certs

    @property
    def tls(self) -> bool:
        return self.credentials is not None

    def interceptors(self) -> list:
        return [TokenInterceptor(self)] if self.tokens else []

    def token_identity(self, metadata) -> Optional[str]:
        """The identity of the call's valid token, else None (constant time per token)."""
        for key, value in metadata or ():
            if key == AUTH_METADATA and isinstance(value, str) and value.startswith(BEARER):
                digest = hashlib.sha256(value[len(BEARER):].strip().encode()).digest()
                found = None
                for known, identity in self.tokens.items():
                    if hmac.compare_digest(known, digest):
                        found = identity
                return found
        return None

    def identity(self, context) -> str:
        """Whose call this is: the key of its sessions and of the per-client limits."""
        parts = []
        if self.client_certs:
            names = context.auth_context().get("x509_common_name") or ()
            if names:
                parts.append("cert:" + names[0].decode("utf-8", "replace"))
        if self.tokens:
            token = self.token_identity(context.invocation_metadata())
            if token:
                parts.append(token)
        return "+".join(parts) or "host:" + peer_host(context.peer())


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call without a valid token before it reaches a servicer (health excepted)."""

    def __init__(self, security: LoadedSecurity, on_refused=None):
        self.security = security
        self.on_refused = on_refused or (lambda context: None)
        self._refuse = grpc.unary_unary_rpc_method_handler(self._abort)
        self._refuse_stream = grpc.stream_stream_rpc_method_handler(self._abort_stream)

    def intercept_service(self, continuation, details):
        if details.method.startswith(HEALTH_PREFIX) or \
                self.security.token_identity(details.invocation_metadata) is not None:
            return continuation(details)
        return self._refuse_stream if details.method.endswith("/Stream") else self._refuse

    def _abort(self, request, context):
        self.on_refused(context)
        auth_failed().abort(context)

    def _abort_stream(self, request_iterator, context):
        self.on_refused(context)
        auth_failed().abort(context)
        yield  # a generator: the stream handler's shape
