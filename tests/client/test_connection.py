"""The connection engine (simbridge.client.connection) and its one retry policy
(simbridge.client.retry): resend under the same seq, the on_failed hook (the engine knows nothing of rewards), SessionLost's close_connection."""
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.client import retry
from simbridge.client.connection import Connection, SessionLost
from simbridge.client.retry import RETRYABLE, Backoff, call_unary
from simbridge.wire import spaces as sb_spaces
from simbridge.wire.errors import STATUS_DETAILS_KEY, BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb

OBS = gym.spaces.Box(-1, 1, (2,), np.float32)
ACT = gym.spaces.Discrete(2)


def _create():
    return pb.CreateSessionRequest(observation_space=sb_spaces.space_to_proto(OBS),
                                   action_space=sb_spaces.space_to_proto(ACT))


def _get_action(eid, obs):
    msg = pb.GetActionRequest()
    rows = msg.rows.add(episode_ids=[eid])
    sb_spaces.fill_value(rows.observations, OBS, np.asarray(obs, np.float32)[None])
    return msg


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details="cut off"):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return ()


class AnswerLost:
    """A stub whose next `fail` calls of `method` reach the server but lose their answers."""

    def __init__(self, stub, method, codes):
        self._stub, self._method, self.codes = stub, method, list(codes)

    def __getattr__(self, name):
        real = getattr(self._stub, name)
        if name != self._method:
            return real

        def call(req, **kw):
            if self.codes:
                real(req, **kw)
                raise FakeRpcError(self.codes.pop(0))
            return real(req, **kw)
        return call


def test_one_retry_policy_connection_failures_only():
    """Retried: the request may not have reached the server, or its answer never came back.
    Raised: the server's answer to this very request."""
    assert RETRYABLE == {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                         grpc.StatusCode.DEADLINE_EXCEEDED}
    for answered in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                     grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INTERNAL,
                     grpc.StatusCode.ALREADY_EXISTS):
        assert answered not in RETRYABLE


def test_backoff_doubles_up_to_its_cap_within_its_patience(monkeypatch):
    slept, now = [], [100.0]
    monkeypatch.setattr(retry, "pause", lambda s: (slept.append(s), now.__setitem__(0, now[0] + s), True)[-1])
    monkeypatch.setattr(retry.time, "monotonic", lambda: now[0])
    b = Backoff(patience_s=2.0, first_s=0.25, max_s=1.0)
    while b.wait():
        pass
    assert slept == [0.25, 0.5, 1.0, 1.0]                  # 2.75 s > 2 s: no fifth attempt
    assert not Backoff(patience_s=0.0).wait()              # no patience: no retry
    b = Backoff(patience_s=60.0)
    assert b.wait() and not b.wait(patience_s=0.01)        # a client that started closing waits less


def test_call_unary_reports_a_bridge_error_with_its_reason():
    err = BridgeError(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", Reason.QUEUE_FULL)

    class Refused(FakeRpcError):
        def trailing_metadata(self):
            return ((STATUS_DETAILS_KEY, err.to_status().SerializeToString()),)

    def method(req, timeout=None):
        raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
    with pytest.raises(BridgeError) as e:
        call_unary(method, pb.GetPolicyRequest(), 1.0)
    assert e.value.reason == Reason.QUEUE_FULL and e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_session_lost_carries_close_connection_from_its_constructor():
    closed = []
    lost = SessionLost(grpc.StatusCode.UNAVAILABLE, "gone", close_connection=lambda: closed.append(1))
    lost.close_connection()
    assert closed == [1] and isinstance(lost, BridgeError) and lost.message == "gone"
    SessionLost(grpc.StatusCode.UNAVAILABLE, "gone").close_connection()   # none given: nothing to close


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_a_client_closed_right_after_it_connected_does_not_wait_for_grpcs_connectivity_poll(server, transport):
    """gRPC's close waited for the watch its ready future left (a 0.2 s timer, grpc/grpc#3064): every
    client closed within 0.2 s of connecting took ~0.18 s to close, whatever the load. Ten such
    clients took 1.8 s or more; each close is now the session's close call, and the server hears it."""
    t0 = time.monotonic()
    for _ in range(10):
        conn = Connection(server.address, "single", _create(), transport, 5.0, 5.0, pipeline=False)
        conn.close()
        assert conn.session_id not in server.runtime.session_ids()   # closed, not kept for a reconnect
    assert time.monotonic() - t0 < 1.5


@pytest.mark.parametrize("code", sorted(RETRYABLE, key=lambda c: c.name))
def test_unary_answer_lost_is_resent_under_its_seq_and_applied_once(server, code, net):
    conn = Connection(server.address, "single", _create(), "unary", 5.0, 5.0, pipeline=False)
    eid = conn.call("start_episode", pb.StartEpisodeRequest(count=1)).episode_ids[0]
    conn._stub = AnswerLost(conn._stub, "GetAction", [code])
    resp = conn.call("get_action", _get_action(eid, [0.1, 0.2]))
    assert len(resp.actions) == 1 and conn.reconnects == 1
    assert server.runtime.session(conn.session_id, False).episodes[eid].length == 1   # applied once
    conn.close()


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_on_failed_hears_of_every_failed_request_and_its_error_comes_first(server, transport):
    heard = []
    conn = Connection(server.address, "single", _create(), transport, 5.0, 5.0, pipeline=True,
                      on_failed=lambda kind, msg: heard.append((kind, msg.header.seq)))
    eid = conn.call("start_episode", pb.StartEpisodeRequest(count=1)).episode_ids[0]
    with pytest.raises(BridgeError) as e:
        conn.call("get_action", _get_action(eid, [np.nan, 0.0]))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and heard == [("get_action", 2)]

    def refuse(kind, msg):
        raise BridgeError(grpc.StatusCode.FAILED_PRECONDITION, "the hook's own failure")
    conn._on_failed = refuse
    with pytest.raises(BridgeError) as e:
        conn.call("get_action", _get_action(eid, [np.nan, 0.0]))
    assert e.value.message == "the hook's own failure"
    if transport == "unary":                               # raised while handling the call's error
        assert e.value.__cause__.code == grpc.StatusCode.INVALID_ARGUMENT
    conn._on_failed = lambda kind, msg: None
    assert len(conn.call("get_action", _get_action(eid, [0.0, 0.0])).actions) == 1
    conn.close()


@pytest.mark.nets("tcp", "uds", "shm")
def test_reconnect_gives_up_after_reconnect_timeout(make_server, net):
    srv = make_server()
    conn = Connection(srv.address, "single", _create(), "stream", 5.0, 0.5, pipeline=False)
    srv.stop(grace=0)
    t0 = time.monotonic()
    with pytest.raises(BridgeError, match="could not reconnect within") as e:
        conn.call("start_episode", pb.StartEpisodeRequest(count=1))
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and time.monotonic() - t0 < 5.0
    conn.close()
