"""How a client proves itself and checks the server: TLS, mutual TLS and a bearer token.

    security = ClientSecurity.from_files(tls_ca="ca.pem", auth_token_file="token")
    client = PolicyClient("trainer.lan:50051", obs_space, act_space, security=security)

Every client takes `security=`; without it, `ClientSecurity.from_env()` applies: no TLS, and
the token of the environment variable SIMBRIDGE_AUTH_TOKEN if set. The token travels as call
metadata `authorization: Bearer <token>` (on a plain-text channel too, for a loopback server
that checks tokens); TLS uses gRPC's ssl_channel_credentials.
"""
import os
from dataclasses import dataclass
from typing import Optional

import grpc

TOKEN_ENV = "SIMBRIDGE_AUTH_TOKEN"


class SecuritySettingError(ValueError):
    """A TLS or token setting of the client that cannot work; the message names the fix."""


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise SecuritySettingError(f"cannot read {flag} file {path!r}: {e.strerror}") from None


@dataclass(frozen=True)
class ClientSecurity:
    tls_ca: Optional[bytes] = None          # PEM roots that signed the server's certificate
    tls_cert: Optional[bytes] = None        # PEM client certificate chain (mutual TLS)
    tls_key: Optional[bytes] = None         # PEM client private key
    tls_server_name: Optional[str] = None   # name to check in the server's certificate
    tls: bool = False                       # TLS with the system's roots when tls_ca is None
    auth_token: Optional[str] = None

    def __repr__(self) -> str:   # never print the token or the key
        return (f"ClientSecurity(tls={self.uses_tls}, client_cert={self.tls_cert is not None}, "
                f"token={'set' if self.auth_token else 'none'})")

    @classmethod
    def from_env(cls) -> "ClientSecurity":
        return cls(auth_token=os.environ.get(TOKEN_ENV, "").strip() or None)

    @classmethod
    def from_files(cls, tls_ca: str = "", tls_cert: str = "", tls_key: str = "", tls_server_name: str = "",
                   auth_token_file: str = "") -> "ClientSecurity":
        """Files as the command-line flags name them (empty: not set); the token falls back to
        SIMBRIDGE_AUTH_TOKEN."""
        if bool(tls_cert) != bool(tls_key):
            raise SecuritySettingError("a client certificate needs both --tls-cert and --tls-key")
        token = None
        if auth_token_file:
            token = _read(auth_token_file, "--auth-token-file").decode("utf-8", "replace").strip()
            if not token:
                raise SecuritySettingError(f"--auth-token-file {auth_token_file!r} is empty")
        return cls(tls_ca=_read(tls_ca, "--tls-ca") if tls_ca else None,
                   tls_cert=_read(tls_cert, "--tls-cert") if tls_cert else None,
                   tls_key=_read(tls_key, "--tls-key") if tls_key else None,
                   tls_server_name=tls_server_name or None,
                   tls=bool(tls_ca or tls_cert or tls_server_name),
                   auth_token=token or cls.from_env().auth_token)

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.tls_ca is not None or self.tls_cert is not None

    def channel(self, address: str, options: list) -> grpc.Channel:
        """A channel to `address` with these settings (the token rides on every call)."""
        if self.uses_tls:
            creds = grpc.ssl_channel_credentials(self.tls_ca, self.tls_key, self.tls_cert)
            if self.tls_server_name:
                options = options + [("grpc.ssl_target_name_override", self.tls_server_name)]
            channel = grpc.secure_channel(address, creds, options=options)
        else:
            channel = grpc.insecure_channel(address, options=options)
        return channel

    def metadata(self) -> tuple:
        """The token as call metadata, for a call made beneath the channel's interceptor."""
        return (_BearerToken.header(self.auth_token),) if self.auth_token else ()

    def wrap(self, channel: grpc.Channel) -> grpc.Channel:
        """The channel, adding the token to every call's metadata when there is one."""
        if not self.auth_token:
            return channel
        return grpc.intercept_channel(channel, _BearerToken(self.auth_token))


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, details, metadata):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str):
        self._metadata = (self.header(token),)

    @staticmethod
    def header(token: str) -> tuple:
        return ("authorization", f"Bearer {token}")

    def _details(self, details):
        return _CallDetails(details, tuple(details.metadata or ()) + self._metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)
