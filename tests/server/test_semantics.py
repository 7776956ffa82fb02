"""Episode, reward and batch semantics over a real server and real clients."""
import threading
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from simbridge.client.policy_client import MultiAgentPolicyClient, PolicyClient, SessionLost
from simbridge.wire.errors import BridgeError
from simbridge.server.policies import ActionBatch, Policy, RandomPolicy
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from support.experience import TRANSPORTS, collected, o

OBS = gym.spaces.Box(-10, 10, (2,), np.float32)
ACT = gym.spaces.Discrete(3)


class ConstPolicy(Policy):
    """Always action 1; logp -0.5; lets tests set .version."""

    def compute_actions(self, obs_batch):
        n = len(obs_batch)
        return ActionBatch(np.ones(n, np.int64), np.full(n, -0.5, np.float32))


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.nets("tcp", "uds", "shm")
def test_single_agent_transitions(make_server, transport, net):
    rt = BridgeRuntime(BridgeConfig(), policy_factory=lambda pid, o_, a: ConstPolicy(o_, a))
    srv = make_server(rt)
    c = PolicyClient(srv.address, OBS, ACT, transport=transport)
    eid = c.start_episode()
    assert c.get_action(eid, o(0)) == 1
    c.log_returns(eid, 1.0)
    c.log_returns(eid, 0.5)                     # rewards between actions add up
    rt.policy("default_policy").version = 7
    assert c.get_action(eid, o(1)) == 1
    assert c.last_policy_versions == [7]        # every reply carries its policy version
    c.log_returns(eid, 2.0)
    c.end_episode(eid, o(2), truncated=True)
    c.flush()
    b = collected(srv).policy_batches["default_policy"]
    assert b.count == 2
    np.testing.assert_array_equal(b["obs"], [o(0), o(1)])
    np.testing.assert_array_equal(b["new_obs"], [o(1), o(2)])   # truncated keeps the last obs
    np.testing.assert_allclose(b["rewards"], [1.5, 2.0])
    assert list(b["terminateds"]) == [False, False]
    assert list(b["truncateds"]) == [False, True]
    assert list(b["t"]) == [0, 1]
    assert list(b["policy_version"]) == [0, 7]
    np.testing.assert_allclose(b["action_logp"], [-0.5, -0.5])
    summary = srv.runtime.metrics.recent[-1]
    assert summary["total_reward"] == 3.5 and summary["length"] == 2 and summary["end_reason"] == "truncated"
    c.close()


def test_terminated_episode_and_log_action(server):
    c = PolicyClient(server.address, OBS, ACT)
    eid = c.start_episode("my-episode")
    assert eid == "my-episode"
    c.log_action(eid, o(0), 2)                 # the simulator chose this itself
    c.log_returns(eid, 1.0)
    c.get_action(eid, o(1))
    c.end_episode(eid, o(9))                   # terminated
    c.flush()
    b = collected(server).policy_batches["default_policy"]
    assert list(b["actions"]) [0] == 2
    assert list(b["policy_version"]) == [-1, 0]  # -1 marks off-policy actions
    assert np.isnan(b["action_logp"][0])
    assert list(b["terminateds"]) == [False, True] and not b["truncateds"].any()
    np.testing.assert_array_equal(b["new_obs"][1], o(9))
    c.close()


def test_training_disabled_feeds_metrics_only(server):
    c = PolicyClient(server.address, OBS, ACT)
    eid = c.start_episode(training_enabled=False)
    for i in range(5):
        c.get_action(eid, o(i))
        c.log_returns(eid, 1.0)
    c.end_episode(eid, o(5))
    c.flush()
    assert collected(server).agent_steps() == 0
    s = server.runtime.metrics.recent[-1]
    assert s["total_reward"] == 5.0 and s["length"] == 5 and not s["training_enabled"]


def test_batched_episodes_one_round_trip(server):
    c = PolicyClient(server.address, OBS, ACT)
    ids = c.start_episodes(count=64)
    assert len(set(ids)) == 64
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 2)).astype(np.float32)
    acts = c.get_actions(ids, obs)
    assert acts.shape == (64,) and acts.dtype == np.int64 and ((acts >= 0) & (acts < 3)).all()
    c.log_returns_batch(ids, np.arange(64, dtype=np.float32))
    c.get_actions(ids, obs + 1)
    c.end_episodes(ids, obs + 2, truncated=[i % 2 == 0 for i in range(64)])
    c.flush()
    b = collected(server)
    pb_ = b.policy_batches["default_policy"]
    assert pb_.count == 128 and b.env_steps() == 128
    first = pb_["t"] == 0
    np.testing.assert_allclose(np.sort(pb_["rewards"][first]), np.arange(64))
    assert pb_["truncateds"].sum() == 32 and pb_["terminateds"].sum() == 32
    assert len(np.unique(pb_["eps_id"])) == 64


def nim_turns(c, eid):
    """Turn-based: p0 moves, p1 moves, p0 moves and wins. Rewards as RLlib's rules."""
    c.get_action(eid, {"p0": o(0)})
    c.log_returns(eid, {"p0": 0.1})
    c.get_action(eid, {"p1": o(1)})
    c.log_returns(eid, {"p1": 0.2, "p0": 0.3})  # p0's reward accrues until p0 acts again
    c.get_action(eid, {"p0": o(2)})
    c.log_returns(eid, {"p0": 1.0, "p1": -1.0})
    c.end_episode(eid, {"p0": o(3), "p1": o(4)})


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_turn_based_reward_accumulation(make_server, transport):
    srv = make_server()
    c = MultiAgentPolicyClient(srv.address, OBS, ACT, transport=transport)
    eid = c.start_episode()
    nim_turns(c, eid)
    c.flush()
    b = collected(srv).policy_batches["default_policy"]
    rows = {(int(ai), int(t)): i for i, (ai, t) in enumerate(zip(b["agent_index"], b["t"]))}
    # t is the episode's step at which the agent acted: p0 at steps 0 and 2, p1 at step 1.
    p0_first, p1_first, p0_second = rows[(0, 0)], rows[(1, 1)], rows[(0, 2)]
    assert b["rewards"][p0_first] == pytest.approx(0.4)   # 0.1 + 0.3, until its next action
    np.testing.assert_array_equal(b["new_obs"][p0_first], o(2))  # its next observation
    assert b["rewards"][p1_first] == pytest.approx(-0.8)  # 0.2 - 1.0, credited at episode end
    np.testing.assert_array_equal(b["new_obs"][p1_first], o(4))
    assert b["rewards"][p0_second] == pytest.approx(1.0)
    assert b["terminateds"][p0_second] and b["terminateds"][p1_first]
    s = srv.runtime.metrics.recent[-1]
    assert s["agent_rewards"] == pytest.approx({"p0": 1.4, "p1": -0.8})
    assert s["length"] == 3
    c.close()


def test_t_is_the_episodes_step_as_in_rllib(make_server):
    """RLlib's SampleBatch t is the env step at which the agent acted, not the agent's own action
    count: in a turn-based game each player's t has gaps, and agents acting in one call share it."""
    srv = make_server()
    c = MultiAgentPolicyClient(srv.address, OBS, ACT)
    eid = c.start_episode()
    nim_turns(c, eid)                                   # steps: p0, p1, p0
    simultaneous = c.start_episode()
    c.get_action(simultaneous, {"a": o(0), "b": o(0)})  # step 0: both
    c.get_action(simultaneous, {"b": o(1)})             # step 1: b alone
    c.get_action(simultaneous, {"a": o(2), "b": o(2)})  # step 2: both
    c.end_episode(simultaneous, {"a": o(3), "b": o(3)})
    c.flush()
    b = collected(srv).policy_batches["default_policy"]
    t = {}
    for e, ai, step in zip(b["eps_id"].tolist(), b["agent_index"].tolist(), b["t"].tolist()):
        t.setdefault((e, ai), []).append(step)
    nim, sim = sorted(set(b["eps_id"].tolist()))
    assert t == {(nim, 0): [0, 2], (nim, 1): [1], (sim, 0): [0, 2], (sim, 1): [0, 1, 2]}
    c.close()


@pytest.mark.nets("tcp", "uds", "shm")
def test_policy_mapping_and_agent_steps(make_server, net):
    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=1000),
                       policy_mapping_fn=lambda aid, ep: "runner" if aid.startswith("r") else "tagger")
    srv = make_server(rt)
    c = MultiAgentPolicyClient(srv.address, OBS, ACT)
    eid = c.start_episode()
    for step in range(3):
        acts = c.get_action(eid, {"r1": o(step), "r2": o(step), "t1": o(step)})
        assert set(acts) == {"r1", "r2", "t1"}                 # only agents that observed act
        c.log_returns(eid, {"r1": 1.0, "r2": 1.0, "t1": -1.0})
    acts = c.get_action(eid, {"t1": o(9)})                    # agents come and go
    assert set(acts) == {"t1"}
    c.end_episode(eid, {"r1": o(10), "r2": o(10), "t1": o(10)})
    c.flush()
    b = collected(srv)
    assert set(b.policy_batches) == {"runner", "tagger"}
    assert b.policy_batches["runner"].count == 6 and b.policy_batches["tagger"].count == 4
    assert b.env_steps() == 4 and b.agent_steps() == 10
    assert set(rt.policies) == {"runner", "tagger"}
    s = rt.metrics.recent[-1]
    assert s["policy_rewards"] == pytest.approx({"runner": 6.0, "tagger": -3.0})


def test_agents_finish_early_and_all_done(server):
    c = MultiAgentPolicyClient(server.address, OBS, ACT)
    eid = c.start_episode()
    c.get_action(eid, {"a": o(0), "b": o(0)})
    c.log_returns(eid, {"a": 1.0, "b": 2.0}, multiagent_done_dict={"a": True})
    with pytest.raises(BridgeError) as e:
        c.get_action(eid, {"a": o(1), "b": o(1)})
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "already done" in e.value.message
    c.get_action(eid, {"b": o(1)})
    c.log_returns(eid, {"b": 3.0}, multiagent_done_dict={"__all__": True})
    c.flush()
    with pytest.raises(BridgeError) as e:
        c.get_action(eid, {"b": o(2)})
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "already ended" in e.value.message
    b = collected(server).policy_batches["default_policy"]
    assert b.count == 3
    done = {(int(a), int(t)): bool(d) for a, t, d in zip(b["agent_index"], b["t"], b["terminateds"])}
    assert done == {(0, 0): True, (1, 0): False, (1, 1): True}   # a ended early; b at "__all__"
    np.testing.assert_allclose(sorted(b["rewards"]), [1.0, 2.0, 3.0])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_reward_then_done_in_a_separate_call(server, transport):
    """A legal RLlib sequence: log A's reward, then end A in its own log_returns call. The client
    queues the reward; the done row must carry it, not repeat A in the same request."""
    c = MultiAgentPolicyClient(server.address, OBS, ACT, transport=transport)
    eid = c.start_episode()
    c.get_action(eid, {"a": o(0), "b": o(0)})
    c.log_returns(eid, {"a": 1.0, "b": 2.0}, info_dict={"a": {"k": 1}, "b": {"k": 2}})
    c.log_returns(eid, {"a": 0.5})
    c.log_returns(eid, {}, multiagent_done_dict={"a": True})
    c.get_action(eid, {"b": o(1)})                 # b's queued reward still rides here
    c.end_episode(eid, {"b": o(2)})
    c.flush()
    b = collected(server).policy_batches["default_policy"]
    got = sorted(zip(b["agent_index"].tolist(), b["t"].tolist(), b["rewards"].tolist(), b["terminateds"].tolist()))
    assert got == [(0, 0, 1.5, True), (1, 0, 2.0, False), (1, 1, 0.0, True)]
    assert server.runtime.metrics.recent[-1]["agent_rewards"] == {"a": 1.5, "b": 2.0}
    c.close()


def test_per_agent_spaces(make_server):
    rt = BridgeRuntime(policy_mapping_fn=lambda aid, ep: "drone_policy" if aid == "drone" else "walker")
    server = make_server(rt)
    cam = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (3,), np.float32),
                           "img": gym.spaces.Box(0, 255, (4, 4, 1), np.uint8)})
    arm = gym.spaces.Box(-1, 1, (2,), np.float32)
    c = MultiAgentPolicyClient(server.address, OBS, ACT, agents={"drone": (cam, arm)})
    eid = c.start_episode()
    drone_obs = {"pos": np.zeros(3, np.float32), "img": np.zeros((4, 4, 1), np.uint8)}
    acts = c.get_action(eid, {"walker": o(0), "drone": drone_obs})
    assert acts["drone"].shape == (2,) and acts["drone"].dtype == np.float32
    assert isinstance(acts["walker"], int)
    c.end_episode(eid, {"walker": o(1), "drone": drone_obs})
    c.flush()
    b = collected(server).policy_batches
    assert b["drone_policy"]["obs"]["img"].shape == (1, 4, 4, 1)   # nested columns stay nested
    assert b["drone_policy"]["actions"].shape == (1, 2)
    assert b["walker"]["obs"].shape == (1, 2)
    # The default mapping would put both on one policy: refused, with the reason.
    srv2 = make_server()
    c2 = MultiAgentPolicyClient(srv2.address, OBS, ACT, agents={"drone": (cam, arm)})
    eid = c2.start_episode()
    c2.get_action(eid, {"walker": o(0)})
    with pytest.raises(BridgeError) as e:
        c2.get_action(eid, {"drone": drone_obs})
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "maps to policy 'default_policy'" in e.value.message
    c.close()


def test_complete_episodes_mode(make_server):
    srv = make_server(rollout_fragment_length=5, batch_mode="complete_episodes")
    c = PolicyClient(srv.address, OBS, ACT)
    ids = c.start_episodes(count=2)
    for step in range(4):
        c.get_actions(ids, np.zeros((2, 2), np.float32))
    c.end_episodes(ids[:1], np.zeros((1, 2), np.float32), [False])
    c.flush()
    batches = srv.runtime.experience.get_all()
    assert batches == []            # 4 env steps of a complete episode < 5
    for step in range(3):
        c.get_actions(ids[1:], np.zeros((1, 2), np.float32))
    c.end_episodes(ids[1:], np.zeros((1, 2), np.float32), [True])
    c.flush()
    batches = srv.runtime.experience.get_all()
    assert len(batches) == 1 and batches[0].env_steps() == 11
    b = batches[0].policy_batches["default_policy"]
    for ep in b.split_by_episode():                         # whole episodes only
        assert ep["terminateds"][-1] or ep["truncateds"][-1]


def test_fragments_of_rollout_fragment_length(make_server):
    srv = make_server(rollout_fragment_length=10)
    c = PolicyClient(srv.address, OBS, ACT)
    eid = c.start_episode()
    for i in range(35):
        c.get_action(eid, o(0))
    c.flush()
    batches = srv.runtime.experience.get_all()
    assert [b.env_steps() for b in batches] == [10, 10, 10]
    # 35 actions complete 34 transitions (one step later); 29 of them fall in the first 30 env steps.
    assert sum(b.agent_steps() for b in batches) == 29


class SlowPolicy(RandomPolicy):
    def compute_actions(self, obs_batch):
        time.sleep(0.02)
        return super().compute_actions(obs_batch)


def test_dynamic_batcher_shares_forward_passes(make_server):
    rt = BridgeRuntime(BridgeConfig(), policy_factory=lambda pid, o_, a: SlowPolicy(o_, a))
    srv = make_server(rt)
    n_clients, steps = 6, 10
    errors = []

    def sim():
        try:
            c = PolicyClient(srv.address, OBS, ACT)
            eid = c.start_episode()
            for _ in range(steps):
                c.get_action(eid, o(0))
            c.close()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=sim) for _ in range(n_clients)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert not errors
    b = rt.batcher("default_policy")
    assert b.rows_served == n_clients * steps
    assert b.max_rows_seen > 1
    assert b.forward_passes < n_clients * steps * 0.6   # passes were shared


def test_batcher_max_wait_collects_rows(make_server):
    srv = make_server(max_wait_ms=200, max_batch_rows=4)
    n = 4
    barrier = threading.Barrier(n)
    clients = [PolicyClient(srv.address, OBS, ACT) for _ in range(n)]
    eids = [c.start_episode() for c in clients]

    def go(c, e):
        barrier.wait()
        c.get_action(e, o(0))

    threads = [threading.Thread(target=go, args=(c, e)) for c, e in zip(clients, eids)]
    [t.start() for t in threads]
    [t.join(10) for t in threads]
    b = srv.runtime.batcher("default_policy")
    assert b.rows_served == 4 and b.forward_passes <= 2 and b.max_rows_seen >= 2


def test_health_service(server):
    ch = grpc.insecure_channel(server.address)
    stub = health_pb2_grpc.HealthStub(ch)
    for svc in ("", "simbridge.v1.ExternalEnv", "simbridge.v1.ExternalMultiAgentEnv"):
        assert stub.Check(health_pb2.HealthCheckRequest(service=svc)).status == \
            health_pb2.HealthCheckResponse.SERVING
    ch.close()


@pytest.mark.nets("tcp", "uds", "shm")
def test_stream_reconnect_resumes_episode(server, net):
    """Break the client's stream for real; it resumes its session and the episode goes on."""
    c = PolicyClient(server.address, OBS, ACT, transport="stream")
    eid = c.start_episode()
    c.get_action(eid, o(0))
    c.log_returns(eid, 1.0)                 # pipelined, maybe not yet applied
    c._conn._stream.cancel()                # the stream dies under the client
    c.get_action(eid, o(1))                 # reconnects, resends, continues
    c.end_episode(eid, o(2))
    c.flush()
    assert c._conn.reconnects == 1
    b = collected(server).policy_batches["default_policy"]
    np.testing.assert_allclose(b["rewards"], [1.0, 0.0])   # the resent reward counted once
    assert server.runtime.metrics.recent[-1]["length"] == 2
    c.close()


@pytest.mark.nets("tcp", "uds", "shm")
def test_server_restart_reports_lost_session(make_server, net):
    srv = make_server()
    c = PolicyClient(srv.address, OBS, ACT, reconnect_timeout_s=20)
    eid = c.start_episode()
    c.get_action(eid, o(0))
    srv.stop(grace=0)
    from simbridge.server.service import BridgeServer
    srv2 = BridgeServer(BridgeRuntime(), srv.address).start()   # the same port or socket
    try:
        with pytest.raises(SessionLost) as e:
            c.get_action(eid, o(1))
        assert "start new episodes" in e.value.message
        eid2 = c.start_episode()                  # the client carries on with a new session
        c.get_action(eid2, o(1))
        c.close()
    finally:
        srv2.stop(grace=0)


def test_resent_request_applied_once(server, net):
    """A unary request resent with the same seq is answered from memory, not re-applied."""
    from simbridge.wire import spaces as sbs
    from simbridge.wire.v1 import simbridge_pb2 as pb, simbridge_pb2_grpc as pbg
    ch = grpc.insecure_channel(server.address)
    stub = pbg.ExternalEnvStub(ch)
    sid = stub.CreateSession(pb.CreateSessionRequest(observation_space=sbs.space_to_proto(OBS),
                                                     action_space=sbs.space_to_proto(ACT))).session_id
    eid = stub.StartEpisode(pb.StartEpisodeRequest(header=pb.RequestHeader(session_id=sid, seq=1))).episode_ids[0]
    req = pb.GetActionRequest(header=pb.RequestHeader(session_id=sid, seq=2))
    rows = req.rows.add(episode_ids=[eid])
    sbs.fill_value(rows.observations, OBS, o(0)[None])
    a1 = stub.GetAction(req)
    a2 = stub.GetAction(req)
    assert a1 == a2
    ep = server.runtime.session(sid, False).episodes[eid]
    assert ep.length == 1
    ch.close()


def test_reward_before_first_action_trains_nothing(server):
    """As in RLlib: a reward with no action before it is counted in the episode, not in a transition."""
    c = MultiAgentPolicyClient(server.address, OBS, ACT)
    eid = c.start_episode()
    c.get_action(eid, {"p0": o(0)})
    c.log_returns(eid, {"p0": 1.0, "p1": 5.0})       # p1 has not acted yet
    c.get_action(eid, {"p1": o(1)})
    c.end_episode(eid, {"p0": o(2), "p1": o(3)})
    c.flush()
    b = collected(server).policy_batches["default_policy"]
    by_agent = dict(zip(b["agent_index"].tolist(), b["rewards"].tolist()))
    assert by_agent == {0: 1.0, 1: 0.0}
    assert server.runtime.metrics.recent[-1]["agent_rewards"] == {"p0": 1.0, "p1": 5.0}


def test_env_steps_counted_once_per_call(make_server):
    """Agents of one episode split over several rows messages (different spaces) are one env step."""
    other = gym.spaces.Box(-1, 1, (5,), np.float32)
    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=1000),
                       policy_mapping_fn=lambda aid, ep: "big" if aid == "big" else "small")
    srv = make_server(rt)
    c = MultiAgentPolicyClient(srv.address, OBS, ACT, agents={"big": (other, ACT)})
    eid = c.start_episode()
    for i in range(3):
        c.get_action(eid, {"small": o(i), "big": np.zeros(5, np.float32)})
    c.end_episode(eid)
    c.flush()
    b = collected(srv)
    assert b.env_steps() == 3 and b.agent_steps() == 6
    assert rt.metrics.recent[-1]["length"] == 3


def test_truncated_agent_keeps_its_final_observation(make_server):
    other = gym.spaces.Box(-1, 1, (5,), np.float32)
    rt = BridgeRuntime(policy_mapping_fn=lambda aid, ep: "big" if aid == "big" else "small")
    srv = make_server(rt)
    c = MultiAgentPolicyClient(srv.address, OBS, ACT, agents={"big": (other, ACT)})
    eid = c.start_episode()
    c.get_action(eid, {"a": o(0), "b": o(0), "big": np.zeros(5, np.float32)})
    c.log_returns(eid, {"a": 1.0, "b": 1.0, "big": 2.0}, truncated_dict={"a": True, "big": True},
                  final_observation_dict={"a": o(7), "big": np.ones(5, np.float32)})
    c.get_action(eid, {"b": o(1)})
    c.end_episode(eid, {"b": o(2)})
    c.flush()
    b = collected(srv).policy_batches
    small = b["small"]
    a_row = int(np.flatnonzero(small["agent_index"] == 0)[0])
    assert small["truncateds"][a_row] and not small["terminateds"][a_row]
    np.testing.assert_array_equal(small["new_obs"][a_row], o(7))
    np.testing.assert_array_equal(b["big"]["new_obs"][0], np.ones(5, np.float32))
    assert b["big"]["truncateds"][0]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_reward_survives_a_failing_call_that_carried_it(server, transport):
    """log_returns rides on the next call; if that call is refused, the reward is logged alone."""
    c = PolicyClient(server.address, OBS, ACT, transport=transport)
    eid = c.start_episode()
    c.get_action(eid, o(0))
    c.log_returns(eid, 2.5)
    bad = np.array([np.nan, 0], np.float32)
    with pytest.raises(BridgeError) as e:
        c.get_action(eid, bad)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "nan" in e.value.message.lower()
    c.get_action(eid, o(1))
    c.log_returns(eid, 1.0)
    c.end_episode(eid, o(2))          # carries the 1.0
    c.flush()
    b = collected(server).policy_batches["default_policy"]
    np.testing.assert_allclose(b["rewards"], [2.5, 1.0])
    assert server.runtime.metrics.recent[-1]["total_reward"] == 3.5
    c.close()


@pytest.mark.nets("tcp", "uds", "shm")
def test_end_and_restart_in_one_message(server, net):
    """Per-slot auto-reset: end_episodes(..., start_episode_ids=...) ends and starts atomically."""
    c = PolicyClient(server.address, OBS, ACT)
    ids = c.start_episodes(["s0", "s1"])
    c.get_actions(ids, np.zeros((2, 2), np.float32))
    c.log_returns_batch(ids, [1.0, 2.0])
    c.end_episodes(["s0"], np.zeros((1, 2), np.float32), [False], start_episode_ids=["s0b"])
    acts = c.get_actions(["s0b", "s1"], np.ones((2, 2), np.float32))
    assert acts.shape == (2,)
    with pytest.raises(BridgeError) as e:   # all or nothing: s1 stays open when the new id is taken
        c.end_episodes(["s1"], np.zeros((1, 2), np.float32), [False], start_episode_ids=["s0b"])
        c.flush()
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert set(server.runtime.session(c.session_id, False).episodes) == {"s0b", "s1"}
    c.close()
