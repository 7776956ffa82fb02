"""Batched simulators on Step: N slots, per-slot auto-reset, against a real server on loopback.

What a batched simulator relies on: each slot's transitions end up in the
experience exactly as a one-episode-per-slot simulator's would (obs, new_obs =
the final observation at an episode end, terminated vs truncated, t restarting,
a new eps_id per episode), episode summaries per slot, and every bad Step
refused with a precise status and no effect, after which the simulator goes
on and loses nothing.
"""
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.errors import BridgeError
from simbridge.server.mapping import DEFAULT_POLICY
from simbridge.server.sample_batch import MultiAgentBatch
from simbridge.client.slot_client import SlotClient
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc
from support.raw import create_request
from simbridge.sims.vector_cartpole import VectorCartPole

OBS = gym.spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32)
ACT = gym.spaces.Discrete(3)
N = 3


def o(*rows):
    return np.asarray(rows, np.float32)


def drain(rt) -> MultiAgentBatch:
    rt.flush()
    got = rt.experience.get_all()
    return MultiAgentBatch.concat_samples(got) if got else None


@pytest.fixture(params=["stream", "unary"])
def transport(request):
    return request.param


@pytest.mark.nets("tcp", "uds", "shm")
def test_slots_make_per_slot_episodes_with_auto_reset(make_server, transport, net):
    srv = make_server(rollout_fragment_length=1000)
    rt = srv.runtime
    c = SlotClient(srv.address, OBS, ACT, N, transport=transport)
    a0 = c.step(o([0, 0], [1, 1], [2, 2]))
    assert a0.shape == (N,) and ACT.contains(int(a0[0]))
    assert c.policy_id == DEFAULT_POLICY and (c.policy_versions == 0).all()
    # Slot 1 ends terminated, slot 2 truncated; both already send their next episode's first obs.
    a1 = c.step(o([0.1, 0], [5, 5], [6, 6]), rewards=[1.0, 2.0, 3.0], terminated=[False, True, False],
                truncated=[False, False, True], final_observations=o([1.5, 1.5], [2.5, 2.5]))
    c.step(o([0.2, 0], [5.1, 5], [6.1, 6]), rewards=[10.0, 20.0, 30.0])
    snap = rt.snapshot()
    assert snap["episodes"] == 2 and snap["env_steps"] == 3 * N
    ends = {s["episode_id"].rsplit("-", 2)[1]: s for s in rt.metrics.recent}
    assert ends["slot1"]["total_reward"] == 2.0 and ends["slot1"]["length"] == 1
    assert ends["slot1"]["end_reason"] == "terminated"
    assert ends["slot2"]["end_reason"] == "truncated" and ends["slot2"]["total_reward"] == 3.0
    c.close()
    b = drain(rt).policy_batches[DEFAULT_POLICY]
    # Six transitions with an observed outcome; the last actions' outcome never came: dropped.
    assert b.count == 6
    rows = {(int(e), int(t)): i for i, (e, t) in enumerate(zip(b["eps_id"], b["t"]))}
    eps = sorted({int(e) for e in b["eps_id"]})
    assert len(eps) == 5   # three first episodes + the two that replaced the ended ones
    first_step = [i for i, t in enumerate(b["t"]) if t == 0][:N]
    by_obs = {tuple(b["obs"][i]): i for i in first_step}
    i1 = by_obs[(1.0, 1.0)]
    np.testing.assert_array_equal(b["new_obs"][i1], [1.5, 1.5])
    assert b["terminateds"][i1] and not b["truncateds"][i1] and b["rewards"][i1] == 2.0
    assert b["actions"][i1] == a0[1]
    i2 = by_obs[(2.0, 2.0)]
    np.testing.assert_array_equal(b["new_obs"][i2], [2.5, 2.5])
    assert b["truncateds"][i2] and not b["terminateds"][i2]
    i0 = by_obs[(0.0, 0.0)]
    np.testing.assert_array_equal(b["new_obs"][i0], o([0.1, 0.0])[0])
    assert not b["terminateds"][i0] and not b["truncateds"][i0]
    # Slot 0's second transition continues its episode (t=1); slot 1's new episode starts at t=0.
    e0 = int(b["eps_id"][i0])
    assert (e0, 1) in rows and b["rewards"][rows[(e0, 1)]] == 10.0
    j = [i for i in range(b.count) if tuple(b["obs"][i]) == (5.0, 5.0)][0]
    assert b["t"][j] == 0 and int(b["eps_id"][j]) not in (int(b["eps_id"][i1]),)
    assert b["actions"][j] == a1[1] and b["rewards"][j] == 20.0
    assert (b["policy_version"] == 0).all() and (b["agent_index"] == 0).all()


def test_final_step_ends_every_slot_with_its_last_observation(make_server):
    srv = make_server(rollout_fragment_length=1000)
    c = SlotClient(srv.address, OBS, ACT, N)
    c.step(o([0, 0], [1, 1], [2, 2]))
    c.close(rewards=[1.0, 1.0, 1.0], terminated=[True, False, False],
            last_observations=o([0, 9], [1, 9], [2, 9]))
    b = drain(srv.runtime).policy_batches[DEFAULT_POLICY]
    assert b.count == N
    assert b["terminateds"].tolist() == [True, False, False]
    assert b["truncateds"].tolist() == [False, True, True]
    np.testing.assert_array_equal(b["new_obs"][:, 1], [9, 9, 9])
    # The two the close cut short are not returns of the policy (issue 27 #5): counted apart.
    reasons = sorted(s["end_reason"] for s in srv.runtime.metrics.recent)
    assert reasons == ["simulator_stopped", "simulator_stopped", "terminated"]
    assert [s["end_reason"] for s in srv.runtime.metrics.returns()] == ["terminated"]
    snap = srv.runtime.snapshot()
    assert snap["open_episodes"] == 0 and snap["episodes"] == 3 and snap["episodes_cut"] == 2


def test_fragments_are_rollout_fragment_length_steps_of_every_slot(make_server):
    srv = make_server(rollout_fragment_length=4)
    env = VectorCartPole(8, seed=1)
    c = SlotClient(srv.address, env.observation_space, env.action_space, 8)
    a = c.step(env.reset())
    for _ in range(9):
        a = c.step(*env.step(a))
    srv.runtime.settle_all()   # a streamed Step's outcome is recorded just after its answer
    got = srv.runtime.experience.get_all()
    assert [g.env_steps() for g in got] == [32, 32]
    assert all(g.policy_batches[DEFAULT_POLICY].count == 32 for g in got)
    c.close()


def test_complete_episodes_mode_delivers_whole_episodes_only(make_server):
    srv = make_server(rollout_fragment_length=1, batch_mode="complete_episodes")
    c = SlotClient(srv.address, OBS, ACT, 2)
    c.step(o([0, 0], [1, 1]))
    c.step(o([0, 1], [1, 2]), rewards=[1, 1])
    c.step(o([0, 2], [5, 5]), rewards=[1, 1], terminated=[False, True])   # slot 1: 2 steps, ends
    srv.runtime.settle_all()   # a streamed Step's outcome is recorded just after its answer
    got = srv.runtime.experience.get_all()
    b = MultiAgentBatch.concat_samples(got).policy_batches[DEFAULT_POLICY]
    assert b.count == 2 and len(set(b["eps_id"].tolist())) == 1
    assert b["t"].tolist() == [0, 1] and b["terminateds"].tolist() == [False, True]
    assert sum(g.env_steps() for g in got) == 2
    c.step(o([0, 3], [5, 6]), rewards=[1, 1], terminated=[True, False])   # slot 0: 3 steps
    srv.runtime.settle_all()
    b = MultiAgentBatch.concat_samples(srv.runtime.experience.get_all()).policy_batches[DEFAULT_POLICY]
    assert b["t"].tolist() == [0, 1, 2] and b["terminateds"].tolist() == [False, False, True]
    c.close()


def test_training_disabled_slots_feed_metrics_only(make_server):
    srv = make_server(rollout_fragment_length=1)
    c = SlotClient(srv.address, OBS, ACT, 2, training_enabled=False)
    c.step(o([0, 0], [1, 1]))
    c.step(o([0, 1], [1, 2]), rewards=[1, 4], terminated=[True, True])
    c.close()
    assert drain(srv.runtime) is None
    assert sorted(s["total_reward"] for s in srv.runtime.metrics.recent) == [1.0, 4.0]
    assert all(not s["training_enabled"] for s in srv.runtime.metrics.recent)


def test_vector_cartpole_matches_gymnasium_dynamics():
    env = VectorCartPole(1, seed=0)
    ref = gym.make("CartPole-v1").unwrapped
    obs = env.reset()
    ref.reset()
    ref.state = obs[0].astype(np.float64)
    env.state = obs.T.astype(np.float64)
    for action in [1, 0, 0, 1, 1, 1, 0]:
        o1, r, term, trunc, fin = env.step(np.array([action]))
        o2, r2, term2, _, _ = ref.step(action)
        if term[0]:
            np.testing.assert_allclose(fin[0], o2, rtol=1e-5)
            break
        np.testing.assert_allclose(o1[0], o2, rtol=1e-5)
        assert r[0] == r2 and term[0] == term2


# ---------------------------------------------------------------- bad input

class RawSlots:
    """Step requests sent as they are, on the unary RPC, to check the server's answers."""

    def __init__(self, address, n=N, **create):
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.ExternalEnvStub(self.channel)
        req = create_request(OBS, ACT, num_slots=n, **create)
        self.sid = self.stub.CreateSession(req).session_id
        self.n = n

    def request(self, obs=None, rewards=None, terminated=None, truncated=None, finals=None, final=False):
        req = pb.StepRequest(final=final)
        req.header.session_id = self.sid
        if obs is not None:
            sb_spaces.fill_value(req.observations, OBS, obs, batched=True)
        for name, v in (("rewards", rewards), ("terminated", terminated), ("truncated", truncated)):
            if v is not None:
                tensors.fill_tensor(getattr(req, name), v)
        if finals is not None:
            sb_spaces.fill_value(req.final_observations, OBS, finals, batched=True)
        return req

    def step(self, *args, **kwargs):
        return self.stub.Step(self.request(*args, **kwargs))

    def refused(self, req, code, *words):
        with pytest.raises(grpc.RpcError) as e:
            self.stub.Step(req)
        assert e.value.code() == code, e.value.details()
        for w in words:
            assert w in e.value.details(), e.value.details()
        return e.value.details()


OK_OBS = o([0, 0], [1, 1], [2, 2])
ONES = np.ones(N, np.float32)


def _bad_first_steps():
    yield "no observations", {}, "needs observations"
    yield "too few rows", {"obs": OK_OBS[:2]}, "shape (2, 2), expected (3, 2)"
    yield "NaN", {"obs": o([0, 0], [np.nan, 1], [2, 2])}, "NaN"
    yield "rewards on the first Step", {"obs": OK_OBS, "rewards": ONES}, "first Step"


@pytest.mark.parametrize("name,kwargs,words", list(_bad_first_steps()), ids=[x[0] for x in _bad_first_steps()])
def test_bad_first_step_is_refused_without_effect(server, name, kwargs, words):
    sim = RawSlots(server.address)
    sim.refused(sim.request(**kwargs), grpc.StatusCode.INVALID_ARGUMENT, words)
    assert server.runtime.snapshot()["env_steps"] == 0
    sim.step(OK_OBS)   # the simulator corrects it and goes on
    assert server.runtime.snapshot()["env_steps"] == N


def _bad_later_steps():
    f, t = np.zeros(N, bool), np.array([False, True, False])
    yield "no rewards", {"obs": OK_OBS}, "needs rewards"
    yield "rewards shape", {"obs": OK_OBS, "rewards": ONES[:2]}, "shape (2,), expected (3,)"
    yield "rewards NaN", {"obs": OK_OBS, "rewards": np.array([1, np.nan, 1], np.float32)}, "slot 1"
    yield "rewards int", {"obs": OK_OBS, "rewards": np.ones(N, np.int32)}, "expected float32"
    yield "rewards float64", {"obs": OK_OBS, "rewards": np.ones(N, np.float64)}, "dtype float64, expected float32"
    yield "rewards +Inf", {"obs": OK_OBS, "rewards": np.array([1, 1, np.inf], np.float32)}, "slot 2: inf"
    yield "observation -Inf", {"obs": np.array([[0, -np.inf], [1, 1], [2, 2]], np.float32), "rewards": ONES}, \
        "contains -Inf at row 0"
    yield "flags dtype", {"obs": OK_OBS, "rewards": ONES, "terminated": np.ones(N, np.int32)}, "expected BOOL"
    yield "flags shape", {"obs": OK_OBS, "rewards": ONES, "truncated": np.zeros(2, bool)}, "one per slot"
    yield "truncated without finals", {"obs": OK_OBS, "rewards": ONES, "truncated": t}, "slots [1] are truncated"
    yield "finals count", {"obs": OK_OBS, "rewards": ONES, "terminated": t, "finals": OK_OBS}, \
        "one per ended slot: 1"
    yield "observations on a final Step", {"obs": OK_OBS, "rewards": ONES, "terminated": f, "final": True}, \
        "no observations"


@pytest.mark.parametrize("name,kwargs,words", list(_bad_later_steps()), ids=[x[0] for x in _bad_later_steps()])
def test_bad_step_is_refused_and_nothing_is_lost(make_server, name, kwargs, words, net):
    srv = make_server(rollout_fragment_length=1000)
    sim = RawSlots(srv.address)
    first = sim.step(OK_OBS)
    sim.refused(sim.request(**kwargs), grpc.StatusCode.INVALID_ARGUMENT, words)
    snap = srv.runtime.snapshot()
    assert snap["env_steps"] == N and snap["episodes"] == 0
    # Corrected, the same step goes through and its transitions are whole.
    sim.step(o([3, 3], [4, 4], [5, 5]), rewards=np.array([1, 2, 3], np.float32))
    b = drain(srv.runtime).policy_batches[DEFAULT_POLICY]
    assert b.count == N and b["rewards"].tolist() == [1, 2, 3]
    np.testing.assert_array_equal(b["obs"], OK_OBS)
    np.testing.assert_array_equal(b["actions"], tensors.from_tensor(first.actions.tensor))


def test_step_on_a_session_without_slots_names_the_fix(server):
    sim = RawSlots(server.address)
    row_session = sim.stub.CreateSession(create_request(OBS, ACT))
    req = sim.request(OK_OBS)
    req.header.session_id = row_session.session_id
    sim.refused(req, grpc.StatusCode.FAILED_PRECONDITION, "num_slots")


@pytest.mark.parametrize("create,words", [
    ({"num_slots": -1}, "num_slots must be in 1..65536"),
    ({"num_slots": 100_000}, "num_slots must be in"),
    ({"num_slots": 0, "slots_training_enabled": False}, "needs num_slots > 0"),
])
def test_bad_num_slots(server, create, words):
    stub = pb_grpc.ExternalEnvStub(grpc.insecure_channel(server.address))
    with pytest.raises(grpc.RpcError) as e:
        stub.CreateSession(create_request(OBS, ACT, **create))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.value.details()
    assert server.runtime.snapshot()["sessions"] == 0


def test_slots_on_the_multi_agent_service_are_refused(server):
    stub = pb_grpc.ExternalMultiAgentEnvStub(grpc.insecure_channel(server.address))
    with pytest.raises(grpc.RpcError) as e:
        stub.CreateSession(create_request(OBS, ACT, num_slots=4))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ExternalEnv" in e.value.details()


def test_step_after_the_final_step_is_refused(server):
    sim = RawSlots(server.address)
    sim.step(OK_OBS)
    sim.step(rewards=ONES, finals=OK_OBS, final=True)
    sim.refused(sim.request(OK_OBS, rewards=ONES), grpc.StatusCode.FAILED_PRECONDITION, "final Step")


def test_a_resent_step_is_applied_once(make_server, net):
    srv = make_server(rollout_fragment_length=1000)
    sim = RawSlots(srv.address)
    req = sim.request(OK_OBS)
    req.header.seq = 1
    first = sim.stub.Step(req)
    again = sim.stub.Step(req)   # e.g. the answer was lost on a broken connection
    assert again == first
    assert srv.runtime.snapshot()["env_steps"] == N


def test_closing_a_slot_session_files_its_episodes(make_server):
    srv = make_server(rollout_fragment_length=1000)
    ended = []
    srv.runtime.episode_end_callbacks.append(ended.append)
    c = SlotClient(srv.address, OBS, ACT, N)
    c.step(OK_OBS)
    c.step(OK_OBS, rewards=ONES)
    assert srv.runtime.snapshot()["open_episodes"] == N
    c.close()
    snap = srv.runtime.snapshot()
    assert snap["open_episodes"] == 0 and snap["episodes"] == N and snap["episodes_cut"] == N
    assert {s["end_reason"] for s in ended} == {"session_closed"}
    assert not srv.runtime.snapshot()["policy_return_mean"]   # cut short by the close: not returns (issue 27 #5)
    assert drain(srv.runtime).policy_batches[DEFAULT_POLICY].count == N   # the observed step only


def test_slot_client_reports_server_errors_as_bridge_errors(server):
    c = SlotClient(server.address, OBS, ACT, N)
    with pytest.raises(BridgeError) as e:
        c.step(OK_OBS[:1])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    c.step(OK_OBS)   # the stream stays usable
    c.close()


def test_a_second_server_on_a_busy_port_is_refused(server, net):
    from simbridge.server.service import BridgeServer
    with pytest.raises(RuntimeError) as e:
        BridgeServer(address=server.address)
    assert "could not bind" in str(e.value)


def test_a_policy_failure_changes_nothing_and_the_step_can_be_sent_again(make_server):
    from simbridge.server.policies import RandomPolicy
    from simbridge.server.runtime import BridgeConfig, BridgeRuntime

    class FlakyPolicy(RandomPolicy):
        fail = False

        def compute_actions(self, obs_batch):
            if FlakyPolicy.fail:
                FlakyPolicy.fail = False
                raise RuntimeError("out of GPU memory")
            return super().compute_actions(obs_batch)

    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=1000),
                       policy_factory=lambda pid, o, a: FlakyPolicy(o, a))
    srv = make_server(runtime=rt)
    sim = RawSlots(srv.address)
    first = sim.step(OK_OBS)
    FlakyPolicy.fail = True
    req = sim.request(o([3, 3], [4, 4], [5, 5]), rewards=np.array([1, 2, 3], np.float32))
    sim.refused(req, grpc.StatusCode.INTERNAL, "out of GPU memory")
    assert rt.snapshot()["env_steps"] == N
    sim.stub.Step(req)   # the same Step again: applied once, with the first step's actions
    b = drain(rt).policy_batches[DEFAULT_POLICY]
    assert b.count == N and b["rewards"].tolist() == [1, 2, 3]
    np.testing.assert_array_equal(b["actions"], tensors.from_tensor(first.actions.tensor))


def test_the_server_log_counts_a_step_sessions_open_slot_episodes(make_server, caplog):
    """The lost-stream and gone lines counted row-call episodes only: 0 for a Step session."""
    srv = make_server(reconnect_grace_s=0.0)
    c = SlotClient(srv.address, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2), num_slots=3,
                   reconnect_timeout_s=0.5)
    c.step(np.zeros((3, 2), np.float32))
    assert srv.runtime.session(c.session_id).open_episodes() == 3
    with caplog.at_level("WARNING", logger="simbridge"):
        c._conn._stream.cancel()   # the stream breaks; the session waits for a reconnect that never comes
        deadline = time.monotonic() + 10
        while not any("is gone" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            srv.runtime.reap()
            time.sleep(0.05)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "lost its stream with 3 open episodes" in text and "ending its 3 open episodes" in text, text
