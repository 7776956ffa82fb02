"""Every error the server sends names its reason in google.rpc.ErrorInfo, on both transports.

Read here the way a client in another language would: a unary call's
`grpc-status-details-bin` trailer and a stream answer's `StreamResponse.error`, each a
google.rpc.Status whose details hold one ErrorInfo (domain "simbridge.v1", reason an
ErrorReason name). The Python client rebuilds the same reason from either.
"""
import queue

import grpc
import gymnasium as gym
import numpy as np
import pytest
from google.rpc import error_details_pb2, status_pb2

from simbridge.client import PolicyClient
from simbridge.wire import spaces as sb_spaces
from simbridge.wire.errors import DOMAIN, STATUS_DETAILS_KEY, BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc

OBS = gym.spaces.Box(-1, 1, (2,), np.float32)
ACT = gym.spaces.Discrete(2)


def _create(stub) -> str:
    return stub.CreateSession(pb.CreateSessionRequest(observation_space=sb_spaces.space_to_proto(OBS),
                                                      action_space=sb_spaces.space_to_proto(ACT))).session_id


def _get_action(session_id: str, eid: str) -> pb.GetActionRequest:
    req = pb.GetActionRequest(header=pb.RequestHeader(session_id=session_id))
    rows = req.rows.add(episode_ids=[eid])
    sb_spaces.fill_value(rows.observations, OBS, np.zeros((1, 2), np.float32))
    return req


def _info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo:
    assert len(status.details) == 1, status
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info), status.details[0].type_url
    assert info.domain == DOMAIN
    return info


def _unary_status(e: grpc.RpcError) -> status_pb2.Status:
    trailer = dict(e.trailing_metadata() or ())
    assert STATUS_DETAILS_KEY in trailer, f"no {STATUS_DETAILS_KEY} trailer: {e}"
    status = status_pb2.Status.FromString(trailer[STATUS_DETAILS_KEY])
    assert (status.code, status.message) == (e.code().value[0], e.details())
    return status


@pytest.mark.parametrize("case, code, reason", [
    ("unknown session", grpc.StatusCode.NOT_FOUND, "SESSION_UNKNOWN"),
    ("unknown episode", grpc.StatusCode.NOT_FOUND, "EPISODE_UNKNOWN"),
    ("bad value", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_VALUE"),
    ("episode exists", grpc.StatusCode.ALREADY_EXISTS, "EPISODE_EXISTS"),
    ("step without slots", grpc.StatusCode.FAILED_PRECONDITION, "WRONG_SESSION_KIND"),
])
def test_unary_errors_carry_error_info_in_the_standard_trailer(server, case, code, reason):
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.ExternalEnvStub(channel)
        sid = _create(stub)
        stub.StartEpisode(pb.StartEpisodeRequest(header=pb.RequestHeader(session_id=sid), episode_ids=["e1"]))
        call = {
            "unknown session": lambda: stub.GetAction(_get_action("no-such-session", "e1")),
            "unknown episode": lambda: stub.GetAction(_get_action(sid, "e2")),
            "bad value": lambda: stub.GetAction(_bad_value(_get_action(sid, "e1"))),
            "episode exists": lambda: stub.StartEpisode(pb.StartEpisodeRequest(
                header=pb.RequestHeader(session_id=sid), episode_ids=["e1"])),
            "step without slots": lambda: stub.Step(pb.StepRequest(header=pb.RequestHeader(session_id=sid))),
        }[case]
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == code
        assert _info(_unary_status(err.value)).reason == reason
        rebuilt = BridgeError.from_rpc_error(err.value)
        assert (rebuilt.code, Reason.Name(rebuilt.reason)) == (code, reason)


@pytest.mark.parametrize("case, reason, words", [
    ("observation +Inf", "INVALID_VALUE", ["observations of rows 0", "+Inf"]),
    ("final observation -Inf", "INVALID_VALUE", ["final observations of rows 0", "-Inf"]),
    ("rewards FLOAT64", "INVALID_VALUE", ["rewards of rows 0", "float64", "expected float32"]),
    ("truncated end without final observation", "INVALID_REQUEST", ["ends truncated", "final_observations"]),
])
def test_the_contracts_value_rules_have_their_reasons(server, case, reason, words):
    """The proto's rules for finite floats, FLOAT32 rewards and truncated ends, as a client in
    another language reads them: INVALID_ARGUMENT and the ErrorInfo reason the proto names."""
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.ExternalEnvStub(channel)
        sid = _create(stub)
        header = pb.RequestHeader(session_id=sid)
        stub.StartEpisode(pb.StartEpisodeRequest(header=header, episode_ids=["e1"]))
        stub.GetAction(_get_action(sid, "e1"))                   # an action is pending
        inf_obs = pb.AgentRows(episode_ids=["e1"])
        sb_spaces.fill_value(inf_obs.observations, OBS, np.array([[0.0, -np.inf]], np.float32))
        call = {
            "observation +Inf": lambda: stub.GetAction(_bad_value(_get_action(sid, "e1"), np.inf)),
            "final observation -Inf": lambda: stub.EndEpisode(pb.EndEpisodeRequest(
                header=header, episode_ids=["e1"], final_observations=[inf_obs])),
            "rewards FLOAT64": lambda: stub.LogReturns(pb.LogReturnsRequest(header=header, rows=[pb.RewardRows(
                episode_ids=["e1"], rewards=pb.Tensor(dtype=pb.FLOAT64, shape=[1],
                                                      data=np.float64([1.0]).tobytes()))])),
            "truncated end without final observation": lambda: stub.EndEpisode(pb.EndEpisodeRequest(
                header=header, episode_ids=["e1"], truncated=[True])),
        }[case]
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _info(_unary_status(err.value)).reason == reason
        for w in words:
            assert w in err.value.details()
        # Nothing was applied: the episode is still open and ends with its final observation.
        final = pb.AgentRows(episode_ids=["e1"])
        sb_spaces.fill_value(final.observations, OBS, np.zeros((1, 2), np.float32))
        stub.EndEpisode(pb.EndEpisodeRequest(header=header, episode_ids=["e1"], truncated=[True],
                                             final_observations=[final]))


def _bad_value(req: pb.GetActionRequest, value: float = np.nan) -> pb.GetActionRequest:
    sb_spaces.fill_value(req.rows[0].observations, OBS, np.full((1, 2), value, np.float32))
    return req


def test_stream_errors_carry_error_info_and_the_stream_goes_on(server):
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.ExternalEnvStub(channel)
        q = queue.SimpleQueue()
        answers = stub.Stream(iter(q.get, None))
        q.put(pb.StreamRequest(get_action=_get_action("", "e1")))      # before create_session
        first = next(answers)
        assert _info(first.error).reason == "WRONG_SESSION_KIND"
        q.put(pb.StreamRequest(create_session=pb.CreateSessionRequest(
            observation_space=sb_spaces.space_to_proto(OBS), action_space=sb_spaces.space_to_proto(ACT))))
        assert not next(answers).HasField("error")
        q.put(pb.StreamRequest(get_action=_get_action("", "e9")))
        missing = next(answers)
        assert missing.error.code == grpc.StatusCode.NOT_FOUND.value[0]
        assert _info(missing.error).reason == "EPISODE_UNKNOWN"
        assert BridgeError.from_status(missing.error).reason == Reason.EPISODE_UNKNOWN
        q.put(pb.StreamRequest(start_episode=pb.StartEpisodeRequest(episode_ids=["e9"])))
        assert not next(answers).HasField("error")
        q.put(None)


def test_the_python_client_sees_the_reason(server):
    client = PolicyClient(server.address, OBS, ACT)
    eid = client.start_episode()
    client.start_episode(eid)        # pipelined: its error comes with the next answer read
    with pytest.raises(BridgeError) as err:
        client.flush()
    assert err.value.reason == Reason.EPISODE_EXISTS
    client.end_episode(eid, np.zeros(2, np.float32))
    with pytest.raises(BridgeError) as err:
        client.get_action(eid, np.zeros(2, np.float32))
    assert err.value.reason == Reason.EPISODE_ENDED
    client.close()


def test_grpcs_own_size_refusal_reads_as_message_too_large(make_server):
    srv = make_server(max_message_bytes=4096)
    with grpc.insecure_channel(srv.address) as channel:
        stub = pb_grpc.ExternalEnvStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.CreateSession(pb.CreateSessionRequest(client_name="x" * 10_000))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert BridgeError.from_rpc_error(err.value).reason == Reason.MESSAGE_TOO_LARGE
