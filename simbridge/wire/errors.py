"""The error model: one exception type, a status code and a machine-readable reason.

Code deep inside the bridge (decoding, validation, session bookkeeping) raises
BridgeError. The server sends it as a google.rpc.Status whose details hold one
google.rpc.ErrorInfo (domain "simbridge.v1", reason an ErrorReason name): as a
unary call's status (trailing metadata "grpc-status-details-bin") or as
`StreamResponse.error`. Clients rebuild the same BridgeError from either, so
code on both sides branches on `err.reason`, never on the message text.
"""

from __future__ import annotations

from typing import Optional

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from simbridge.wire.v1 import simbridge_pb2 as pb

DOMAIN = "simbridge.v1"
STATUS_DETAILS_KEY = "grpc-status-details-bin"

Reason = pb.ErrorReason   # Reason.QUEUE_FULL, Reason.Name(value), ...

# What an error means when its sender gave no reason (an older server, a gRPC failure).
_DEFAULT_REASONS = {
    grpc.StatusCode.INVALID_ARGUMENT: Reason.INVALID_REQUEST,
    # A simbridge server names its own RESOURCE_EXHAUSTED reasons: one without is gRPC's
    # refusal of a message over the size limit.
    grpc.StatusCode.RESOURCE_EXHAUSTED: Reason.MESSAGE_TOO_LARGE,
    grpc.StatusCode.UNAVAILABLE: Reason.SERVER_UNAVAILABLE,
    grpc.StatusCode.INTERNAL: Reason.SERVER_FAILURE,
    grpc.StatusCode.UNKNOWN: Reason.SERVER_FAILURE,
}
_CODES = {c.value[0]: c for c in grpc.StatusCode}


# Refusals after which nothing was applied and the request's seq stays unspent: the same request,
# under the same seq, may be sent again later (the proto's "Sequence numbers" rules). Every
# other failure spends its seq (a resend gets the same error), so the next seq is no gap.
SEQ_NOT_SPENT = frozenset({Reason.QUEUE_FULL, Reason.CALL_IN_PROGRESS, Reason.TOO_MANY_CALLS,
                           Reason.SERVER_UNAVAILABLE})


class BridgeError(Exception):
    """A failure the client should see: gRPC status code, message, and an ErrorReason."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: Optional[int] = None) -> None:
        reason = _DEFAULT_REASONS.get(code, Reason.ERROR_REASON_UNSPECIFIED) if reason is None else reason
        # All three go to Exception.args so that the error survives pickling
        # (e.g. when raised in a worker process).
        super().__init__(code, message, reason)
        self.code = code
        self.message = message
        self.reason = int(reason)

    @property
    def reason_name(self) -> str:
        return Reason.Name(self.reason)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"BridgeError({self.code.name}, {self.reason_name}, {self.message!r})"

    # ---------------------------------------------------------------- on the wire

    def to_status(self) -> status_pb2.Status:
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason=self.reason_name, domain=DOMAIN))
        return status_pb2.Status(code=self.code.value[0], message=self.message, details=[info])

    def abort(self, context: grpc.ServicerContext) -> None:
        """End a unary call with this error, reason included (raises, as context.abort does)."""
        context.set_trailing_metadata(((STATUS_DETAILS_KEY, self.to_status().SerializeToString()),))
        context.abort(self.code, self.message)

    @classmethod
    def from_status(cls, status: status_pb2.Status) -> "BridgeError":
        """The error a google.rpc.Status describes (StreamResponse.error)."""
        code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
        return cls(code, status.message, _reason_in(status))

    @classmethod
    def from_rpc_error(cls, e: grpc.RpcError, prefix: str = "") -> "BridgeError":
        """The error a failed unary call (or a stream that ended) reports."""
        code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
        details = e.details() if callable(getattr(e, "details", None)) else None
        reason = None
        trailer = e.trailing_metadata() if callable(getattr(e, "trailing_metadata", None)) else None
        for key, value in trailer or ():
            if key == STATUS_DETAILS_KEY:
                status = status_pb2.Status()
                try:
                    status.ParseFromString(value)
                except Exception:   # a malformed trailer: keep the code and message
                    break
                reason = _reason_in(status)
        return cls(code, prefix + (details or str(e)), reason)


def _reason_in(status: status_pb2.Status) -> Optional[int]:
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == DOMAIN and info.reason in Reason.keys():
                return Reason.Value(info.reason)
    return None


def invalid_argument(msg: str, reason: int = Reason.INVALID_REQUEST) -> BridgeError:
    return BridgeError(grpc.StatusCode.INVALID_ARGUMENT, msg, reason)


def invalid_value(msg: str) -> BridgeError:
    """A tensor, space or value that does not fit what was declared."""
    return BridgeError(grpc.StatusCode.INVALID_ARGUMENT, msg, Reason.INVALID_VALUE)


def not_found(msg: str, reason: int) -> BridgeError:
    return BridgeError(grpc.StatusCode.NOT_FOUND, msg, reason)


def failed_precondition(msg: str, reason: int) -> BridgeError:
    return BridgeError(grpc.StatusCode.FAILED_PRECONDITION, msg, reason)


def resource_exhausted(msg: str, reason: int) -> BridgeError:
    return BridgeError(grpc.StatusCode.RESOURCE_EXHAUSTED, msg, reason)


def already_exists(msg: str, reason: int = Reason.EPISODE_EXISTS) -> BridgeError:
    return BridgeError(grpc.StatusCode.ALREADY_EXISTS, msg, reason)


def unavailable(msg: str) -> BridgeError:
    return BridgeError(grpc.StatusCode.UNAVAILABLE, msg, Reason.SERVER_UNAVAILABLE)
