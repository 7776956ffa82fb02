"""The error model: one BridgeError with a code and a reason that survive the wire both ways."""
import pickle

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from simbridge.wire import errors
from simbridge.wire.errors import DOMAIN, STATUS_DETAILS_KEY, BridgeError, Reason


@pytest.mark.parametrize(
    "make, code, reason",
    [
        (lambda m: errors.invalid_argument(m), grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_REQUEST),
        (lambda m: errors.invalid_value(m), grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_VALUE),
        (lambda m: errors.not_found(m, Reason.SESSION_UNKNOWN), grpc.StatusCode.NOT_FOUND, Reason.SESSION_UNKNOWN),
        (lambda m: errors.failed_precondition(m, Reason.EPISODE_ENDED), grpc.StatusCode.FAILED_PRECONDITION,
         Reason.EPISODE_ENDED),
        (lambda m: errors.resource_exhausted(m, Reason.QUEUE_FULL), grpc.StatusCode.RESOURCE_EXHAUSTED,
         Reason.QUEUE_FULL),
        (lambda m: errors.already_exists(m), grpc.StatusCode.ALREADY_EXISTS, Reason.EPISODE_EXISTS),
        (lambda m: errors.unavailable(m), grpc.StatusCode.UNAVAILABLE, Reason.SERVER_UNAVAILABLE),
    ],
)
def test_error_helpers(make, code, reason):
    e = make("boom")
    assert isinstance(e, BridgeError)
    assert (e.code, e.reason, e.message, str(e)) == (code, reason, "boom", "boom")
    with pytest.raises(BridgeError):
        raise e


def test_bridge_error_pickles_with_its_reason():
    e = pickle.loads(pickle.dumps(errors.not_found("no session x", Reason.SESSION_UNKNOWN)))
    assert e.code == grpc.StatusCode.NOT_FOUND
    assert e.reason == Reason.SESSION_UNKNOWN
    assert str(e) == "no session x"


def test_status_carries_error_info_and_round_trips():
    e = errors.resource_exhausted("learner behind", Reason.QUEUE_FULL)
    status = e.to_status()
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert status.message == "learner behind"
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.domain, info.reason) == (DOMAIN, "QUEUE_FULL")
    back = BridgeError.from_status(status)
    assert (back.code, back.reason, back.message) == (e.code, e.reason, e.message)


def test_a_status_without_details_gets_the_codes_default_reason():
    back = BridgeError.from_status(status_pb2.Status(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message="x"))
    assert back.reason == Reason.INVALID_REQUEST
    back = BridgeError.from_status(status_pb2.Status(code=grpc.StatusCode.NOT_FOUND.value[0], message="x"))
    assert back.reason == Reason.ERROR_REASON_UNSPECIFIED


def test_an_unknown_reason_or_foreign_domain_is_not_trusted():
    status = BridgeError(grpc.StatusCode.NOT_FOUND, "x", Reason.SESSION_UNKNOWN).to_status()
    info = error_details_pb2.ErrorInfo(reason="SESSION_UNKNOWN", domain="elsewhere")
    status.details[0].Pack(info)
    assert BridgeError.from_status(status).reason == Reason.ERROR_REASON_UNSPECIFIED
    status.details[0].Pack(error_details_pb2.ErrorInfo(reason="NO_SUCH_REASON", domain=DOMAIN))
    assert BridgeError.from_status(status).reason == Reason.ERROR_REASON_UNSPECIFIED


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, trailing):
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


def test_from_rpc_error_reads_the_standard_status_details_trailer():
    sent = errors.not_found("unknown session 'abc'", Reason.SESSION_UNKNOWN)
    e = _FakeRpcError(sent.code, sent.message, ((STATUS_DETAILS_KEY, sent.to_status().SerializeToString()),))
    got = BridgeError.from_rpc_error(e, prefix="get_action: ")
    assert (got.code, got.reason, got.message) == (sent.code, Reason.SESSION_UNKNOWN,
                                                   "get_action: unknown session 'abc'")
    garbled = _FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down", ((STATUS_DETAILS_KEY, b"\xff\xff"),))
    assert BridgeError.from_rpc_error(garbled).reason == Reason.SERVER_UNAVAILABLE
