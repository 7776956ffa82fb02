"""Errors that travel back to the client as a gRPC status.

Code deep inside the bridge (decoding, validation, session bookkeeping) raises
BridgeError; the service layer turns it into a status code and message for a
unary call, or into `StreamResponse.error` on a stream, so the same check gives
the same answer on both paths.
"""

from __future__ import annotations

import grpc


class BridgeError(Exception):
    """A failure the client should see, with the gRPC status code to send."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        # Both go to Exception.args so that the error survives pickling
        # (e.g. when raised in a worker process).
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"BridgeError({self.code.name}, {self.message!r})"


def invalid_argument(msg: str) -> BridgeError:
    return BridgeError(grpc.StatusCode.INVALID_ARGUMENT, msg)


def not_found(msg: str) -> BridgeError:
    return BridgeError(grpc.StatusCode.NOT_FOUND, msg)


def failed_precondition(msg: str) -> BridgeError:
    return BridgeError(grpc.StatusCode.FAILED_PRECONDITION, msg)


def resource_exhausted(msg: str) -> BridgeError:
    return BridgeError(grpc.StatusCode.RESOURCE_EXHAUSTED, msg)


def already_exists(msg: str) -> BridgeError:
    return BridgeError(grpc.StatusCode.ALREADY_EXISTS, msg)


def unavailable(msg: str) -> BridgeError:
    return BridgeError(grpc.StatusCode.UNAVAILABLE, msg)
