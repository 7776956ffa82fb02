"""Admission: open calls are capped per client and server-wide and the excess is refused at
once (never queued behind idle streams); bytes that are not a message are INVALID_ARGUMENT /
UNDECODABLE, counted, and logged once a minute per client, not one traceback each."""
import logging
import queue
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.client import ClientSecurity, PolicyClient
from simbridge.server.security import ServerSecurity
from simbridge.wire import spaces as sb_spaces
from simbridge.wire.errors import BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc
from support.waits import wait

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


def _create():
    return pb.CreateSessionRequest(observation_space=sb_spaces.space_to_proto(OBS),
                                   action_space=sb_spaces.space_to_proto(ACT))


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("hostile-token\ngood-token\n")
    return str(path)


class IdleStreams:
    """Streams opened and left idle (no request sent), on `channels` connections."""

    def __init__(self, address, n, token=None, per_channel=60):
        md = (("authorization", f"Bearer {token}"),) if token else ()
        # Own connections: channels to one target otherwise share gRPC's global subchannel pool.
        self.channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                         for _ in range(-(-n // per_channel))]
        self.queues, self.calls = [], []
        for i in range(n):
            q = queue.SimpleQueue()
            stub = pb_grpc.ExternalEnvStub(self.channels[i // per_channel])
            self.calls.append(stub.Stream(iter(q.get, None), metadata=md))
            self.queues.append(q)

    def close(self):
        for q in self.queues:
            q.put(None)
        for c in self.calls:
            c.cancel()
        for ch in self.channels:
            ch.close()


def _one_episode(address, token=None, timeout=5.0):
    sec = ClientSecurity(auth_token=token)
    t0 = time.monotonic()
    with PolicyClient(address, OBS, ACT, connect_timeout_s=timeout, security=sec) as c:
        eid = c.start_episode()
        c.get_action(eid, np.zeros(3, np.float32))
        c.end_episode(eid, np.zeros(3, np.float32))
    return time.monotonic() - t0


@pytest.mark.timeout(90)
def test_300_idle_streams_do_not_block_another_client(make_server, tokens):
    """Before: a fixed pool of 256 threads and no cap, so 300 idle streams made every new
    call wait (time out). Now the idle client fills its own share and the rest is refused."""
    srv = make_server(security=ServerSecurity(auth_token_file=tokens))
    idle = IdleStreams(srv.address, 300, token="hostile-token")
    try:
        cap = srv.runtime.config.max_calls_per_client
        wait(lambda: srv.gate.open_calls() == cap, 20, "the idle client's share of calls open")
        # Past its share, the idle client's streams were refused at once, with the reason.
        wait(lambda: sum(call.done() for call in idle.calls) == 300 - cap, 5, "the calls past its share refused")
        assert all(BridgeError.from_rpc_error(call).reason == Reason.TOO_MANY_CALLS
                   for call in idle.calls if call.done())
        assert _one_episode(srv.address, token="good-token") < 3.0   # another client is served promptly
    finally:
        idle.close()


def test_excess_calls_are_refused_at_once_and_served_again_later(make_server):
    srv = make_server(max_concurrent_calls=12, max_calls_per_client=8)
    idle = IdleStreams(srv.address, 8)
    try:
        wait(lambda: srv.gate.open_calls() == 8, 20, "8 calls open")
        t0 = time.monotonic()
        with pytest.raises(BridgeError) as e:
            _one_episode(srv.address)
        assert time.monotonic() - t0 < 2.0, "refused, not queued"
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.reason == Reason.TOO_MANY_CALLS
        assert "max_calls_per_client" in e.value.message
        assert srv.runtime.metrics.refused["TOO_MANY_CALLS"] >= 1
    finally:
        idle.close()
    wait(lambda: srv.gate.open_calls() == 0, 20, "every call closed")
    assert _one_episode(srv.address) < 3.0


def test_server_wide_cap(make_server, tokens):
    srv = make_server(security=ServerSecurity(auth_token_file=tokens), max_concurrent_calls=10,
                      max_calls_per_client=10)
    idle = IdleStreams(srv.address, 10, token="hostile-token")
    try:
        wait(lambda: srv.gate.open_calls() == 10, 20, "10 calls open")
        with pytest.raises(BridgeError) as e:
            _one_episode(srv.address, token="good-token")
        assert e.value.reason == Reason.TOO_MANY_CALLS and "maximum of 10 calls" in e.value.message
    finally:
        idle.close()


def test_limits_are_in_the_handshake(server):
    with PolicyClient(server.address, OBS, ACT) as c:
        limits = c._conn.session.limits
    cfg = server.runtime.config
    assert (limits.max_concurrent_calls, limits.max_calls_per_client, limits.max_calls_per_connection) == (
        cfg.max_concurrent_calls, cfg.max_calls_per_client, cfg.max_calls_per_connection)
    assert limits.max_sessions_per_client == cfg.max_sessions_per_client
    assert limits.max_id_bytes == cfg.max_id_bytes and limits.max_space_elements == cfg.max_space_elements


@pytest.mark.parametrize("service", ["ExternalEnv", "ExternalMultiAgentEnv"])
def test_undecodable_unary_requests(server, service, caplog):
    """Before: gRPC's own INTERNAL ("Exception deserializing request!") and an ERROR traceback
    per request."""
    with grpc.insecure_channel(server.address) as ch:
        with caplog.at_level(logging.WARNING):
            methods = [m.name for m in pb.DESCRIPTOR.services_by_name[service].methods if m.name != "Stream"]
            for i, method in enumerate((methods * 50)[:200]):
                call = ch.unary_unary(f"/simbridge.v1.{service}/{method}")
                with pytest.raises(grpc.RpcError) as e:
                    call(b"\xff\xff\xff\x0f" + bytes([i % 256]), timeout=5)
                err = BridgeError.from_rpc_error(e.value)
                assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.reason == Reason.UNDECODABLE
                assert method in err.message
    assert server.runtime.metrics.refused["UNDECODABLE"] == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    notices = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(notices) == 1
    # The server is unharmed.
    with PolicyClient(server.address, OBS, ACT) as c:
        c.get_action(c.start_episode(), np.zeros(3, np.float32))


def test_undecodable_stream_request_is_answered_and_the_stream_goes_on(server):
    with grpc.insecure_channel(server.address) as ch:
        call = ch.stream_stream("/simbridge.v1.ExternalEnv/Stream")
        start = pb.StreamRequest(start_episode=pb.StartEpisodeRequest(
            header=pb.RequestHeader(seq=0), episode_ids=["e1"]))
        frames = [pb.StreamRequest(create_session=_create()).SerializeToString(), b"\xff\xff\xff",
                  start.SerializeToString()]
        out = [pb.StreamResponse.FromString(r) for r in call(iter(frames), timeout=10)]
    assert len(out) == 3
    assert out[0].HasField("create_session")
    assert out[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert BridgeError.from_status(out[1].error).reason == Reason.UNDECODABLE
    assert out[2].HasField("start_episode") and not out[2].HasField("error")
