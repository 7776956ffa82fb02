"""The runtime on its own: request messages in, answers and experience out, no gRPC.

Everything goes through the runtime's public calls (create_session, session,
handle, settle, close_session, reap, flush, snapshot, policies).
"""
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from simbridge.wire.columns import SINGLE_AGENT_ID
from simbridge.server.mapping import DEFAULT_POLICY
from simbridge.server.policies import ActionBatch, Policy, RandomPolicy
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.sample_batch import MultiAgentBatch
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.errors import BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb

OBS = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
ACT = gym.spaces.Discrete(3)
SUMMARY_TYPES = {"episode_id": str, "eps_id": int, "session_id": str, "total_reward": float, "length": int,
                 "agent_rewards": dict, "agent_policies": dict, "policy_rewards": dict,
                 "custom_metrics": dict, "training_enabled": bool, "evaluation": bool, "end_reason": str,
                 "duration_s": float}


class PlusOne(Policy):
    """Action = int(first observation value) + 1 (mod 3), logp -0.25: transitions are predictable."""

    def compute_actions(self, obs_batch):
        a = (obs_batch[:, 0].astype(np.int64) + 1) % 3
        return ActionBatch(a, np.full(len(a), -0.25, np.float32))


def make(**config) -> BridgeRuntime:
    config.setdefault("rollout_fragment_length", 1000)
    return BridgeRuntime(BridgeConfig(**config), policy_factory=lambda pid, o, a: PlusOne(o, a))


def create(rt, name="sim", num_slots=0, resume=""):
    req = pb.CreateSessionRequest(client_name=name, observation_space=sb_spaces.space_to_proto(OBS),
                                  action_space=sb_spaces.space_to_proto(ACT), num_slots=num_slots,
                                  resume_session_id=resume)
    return rt.create_session(req, False)


def call(rt, method, req, sid, seq=0, bound=None):
    req.header.session_id = sid
    req.header.seq = seq
    return rt.handle(method, req, False, bound=bound)


def agent_rows(eid, obs):
    m = pb.AgentRows(episode_ids=[eid])
    sb_spaces.fill_value(m.observations, OBS, np.asarray(obs, np.float32)[None])
    return m


def reward_rows(eid, r):
    return pb.RewardRows(episode_ids=[eid], rewards=tensors.to_tensor(np.float32([r])))


def get_action(rt, sid, eid, obs, reward=None, **kw):
    req = pb.GetActionRequest(rows=[agent_rows(eid, obs)])
    if reward is not None:
        req.rewards.append(reward_rows(eid, reward))
    resp = call(rt, "get_action", req, sid, **kw)
    return int(tensors.from_tensor(resp.actions[0].actions.tensor)[0])


def drain(rt) -> MultiAgentBatch:
    rt.flush()
    return MultiAgentBatch.concat_samples(rt.experience.get_all())


def check_summary(s: dict) -> None:
    assert set(s) == set(SUMMARY_TYPES)
    for k, t in SUMMARY_TYPES.items():
        assert type(s[k]) is t, (k, type(s[k]))


# ---------------------------------------------------------------- sessions


def test_create_resume_and_look_up_sessions():
    rt = make()
    out = create(rt)
    assert not out.resumed and out.session_id in rt.session_ids()
    assert out.limits.max_rows_per_request == rt.config.max_rows_per_request
    s = rt.session(out.session_id, False)
    call(rt, "start_episode", pb.StartEpisodeRequest(episode_ids=["e"]), out.session_id, seq=1)
    again = create(rt, resume=out.session_id)
    assert again.resumed and again.session_id == out.session_id and again.last_seq == 1
    assert rt.session(out.session_id, False) is s and "e" in s.episodes
    # A session that is gone is not resumed: a new one is made.
    fresh = create(rt, resume="no-such-session")
    assert not fresh.resumed and fresh.session_id != out.session_id
    assert sorted(rt.session_ids()) == sorted([out.session_id, fresh.session_id])
    with pytest.raises(BridgeError) as info:
        rt.session(out.session_id, True)
    assert info.value.reason == Reason.WRONG_SESSION
    with pytest.raises(BridgeError) as info:
        rt.session("nope", False)
    assert info.value.reason == Reason.SESSION_UNKNOWN


def test_after_end_training_every_call_but_close_is_training_over():
    """The trainer's run reached its end: simulators hear a normal end, not a server gone away."""
    rt = make()
    sid = create(rt).session_id
    call(rt, "start_episode", pb.StartEpisodeRequest(episode_ids=["e"]), sid, seq=1)
    get_action(rt, sid, "e", [0.0, 0.0], seq=2)
    rt.end_training("total_env_steps 1 reached")
    refused = [lambda: get_action(rt, sid, "e", [1.0, 0.0], seq=3),
               lambda: call(rt, "end_episode", pb.EndEpisodeRequest(episode_ids=["e"]), sid, seq=4),
               lambda: create(rt), lambda: create(rt, resume=sid)]
    for attempt in refused:
        with pytest.raises(BridgeError) as info:
            attempt()
        assert info.value.reason == Reason.TRAINING_OVER and "total_env_steps 1 reached" in str(info.value)
    call(rt, "close_session", pb.CloseSessionRequest(), sid, seq=5)
    assert sid not in rt.session_ids()


# ---------------------------------------------------------------- row calls


def test_row_calls_produce_exact_transitions():
    rt = make()
    summaries = []
    rt.episode_end_callbacks.append(summaries.append)
    sid = create(rt).session_id
    call(rt, "start_episode", pb.StartEpisodeRequest(episode_ids=["e"]), sid)
    acts = [get_action(rt, sid, "e", [0, 0])]
    call(rt, "log_returns", pb.LogReturnsRequest(rows=[reward_rows("e", 1.5)]), sid)
    acts.append(get_action(rt, sid, "e", [1, 1]))
    acts.append(get_action(rt, sid, "e", [2, 2], reward=2.5))   # the reward rides along
    end = pb.EndEpisodeRequest(episode_ids=["e"], rewards=[reward_rows("e", 4.0)])
    end.final_observations.append(agent_rows("e", [9, 9]))
    call(rt, "end_episode", end, sid)
    assert acts == [1, 2, 0]

    b = drain(rt).policy_batches[DEFAULT_POLICY]
    assert b.count == 3
    np.testing.assert_array_equal(b["obs"], np.float32([[0, 0], [1, 1], [2, 2]]))
    np.testing.assert_array_equal(b["new_obs"], np.float32([[1, 1], [2, 2], [9, 9]]))
    assert b["actions"].tolist() == acts
    assert b["rewards"].tolist() == [1.5, 2.5, 4.0]
    assert b["terminateds"].tolist() == [False, False, True] and not b["truncateds"].any()
    assert b["t"].tolist() == [0, 1, 2] and len(set(b["eps_id"].tolist())) == 1
    assert b["action_logp"].tolist() == [-0.25] * 3 and b["policy_version"].tolist() == [0] * 3

    (s,) = summaries
    check_summary(s)
    assert s == {**s, "episode_id": "e", "session_id": sid, "total_reward": 8.0, "length": 3,
                 "agent_rewards": {SINGLE_AGENT_ID: 8.0}, "agent_policies": {SINGLE_AGENT_ID: DEFAULT_POLICY},
                 "policy_rewards": {DEFAULT_POLICY: 8.0}, "training_enabled": True, "end_reason": "terminated",
                 "eps_id": int(b["eps_id"][0])}
    assert list(rt.metrics.recent) == [s]
    snap = rt.snapshot()
    assert (snap["episodes"], snap["env_steps"], snap["agent_steps"], snap["open_episodes"]) == (1, 3, 3, 0)
    assert snap["episode_return_mean"] == 8.0 and snap["policy_versions"] == {DEFAULT_POLICY: 0}


def test_answered_get_action_is_settled_later():
    rt = make()
    sid = create(rt).session_id
    s = rt.session(sid, False)
    call(rt, "start_episode", pb.StartEpisodeRequest(episode_ids=["e"]), sid)
    get_action(rt, sid, "e", [0, 0], bound=s)            # a stream's call: answered, not applied
    assert s.pending is not None and s.episodes["e"].length == 0
    rt.settle(s)
    assert s.pending is None and s.episodes["e"].length == 1
    get_action(rt, sid, "e", [1, 1], reward=3.0, bound=s)
    assert rt.snapshot()["agent_steps"] == 2            # a snapshot counts answered calls
    b = drain(rt).policy_batches[DEFAULT_POLICY]
    assert b["rewards"].tolist() == [3.0] and b["new_obs"].tolist() == [[1, 1]]


def test_a_resent_seq_gets_the_cached_answer_and_changes_nothing():
    rt = make(response_cache_size=2)
    sid = create(rt).session_id
    first = call(rt, "start_episode", pb.StartEpisodeRequest(count=1), sid, seq=1)
    again = call(rt, "start_episode", pb.StartEpisodeRequest(count=1), sid, seq=1)
    assert again is first and rt.snapshot()["open_episodes"] == 1
    eid = first.episode_ids[0]
    get_action(rt, sid, eid, [0, 0], seq=2)
    first_answer = get_action(rt, sid, eid, [1, 1], seq=3)
    assert get_action(rt, sid, eid, [1, 1], seq=3) == first_answer   # the kept answer, not a new step
    with pytest.raises(BridgeError) as reused:            # the same seq with another body
        get_action(rt, sid, eid, [2, 2], seq=3)
    assert reused.value.reason == Reason.SEQ_REUSED
    assert rt.snapshot()["agent_steps"] == 2
    with pytest.raises(BridgeError) as info:             # seq 1 fell out of the cache (size 2)
        call(rt, "start_episode", pb.StartEpisodeRequest(count=1), sid, seq=1)
    assert info.value.reason == Reason.ALREADY_APPLIED
    assert rt.snapshot()["open_episodes"] == 1


def test_unknown_call_is_refused():
    rt = make()
    sid = create(rt).session_id
    with pytest.raises(BridgeError):
        rt.handle("_start_episode", pb.StartEpisodeRequest(header=pb.RequestHeader(session_id=sid)), False)


# ---------------------------------------------------------------- slots


def step_request(obs=None, rewards=None, terminated=None, truncated=None, finals=None):
    req = pb.StepRequest()
    if obs is not None:
        sb_spaces.fill_value(req.observations, OBS, np.float32(obs))
    if rewards is not None:
        req.rewards.CopyFrom(tensors.to_tensor(np.float32(rewards)))
    if terminated is not None:
        req.terminated.CopyFrom(tensors.to_tensor(np.asarray(terminated, bool)))
    if truncated is not None:
        req.truncated.CopyFrom(tensors.to_tensor(np.asarray(truncated, bool)))
    if finals is not None:
        sb_spaces.fill_value(req.final_observations, OBS, np.float32(finals))
    return req


def test_step_on_slots():
    rt = make()
    sid = create(rt, num_slots=2).session_id
    r0 = call(rt, "step", step_request([[0, 0], [1, 1]]), sid)
    assert tensors.from_tensor(r0.actions.tensor).tolist() == [1, 2] and r0.policy_id == DEFAULT_POLICY
    call(rt, "step", step_request([[2, 2], [5, 5]], rewards=[1, 2], terminated=[False, True]), sid)
    assert rt.snapshot()["open_episodes"] == 2 and rt.metrics.episodes == 1
    (s,) = rt.metrics.recent
    check_summary(s)
    assert (s["total_reward"], s["length"], s["end_reason"], s["agent_policies"]) == (
        2.0, 1, "terminated", {SINGLE_AGENT_ID: DEFAULT_POLICY})
    b = drain(rt).policy_batches[DEFAULT_POLICY]
    np.testing.assert_array_equal(b["obs"], np.float32([[0, 0], [1, 1]]))
    np.testing.assert_array_equal(b["new_obs"], np.float32([[2, 2], [1, 1]]))  # terminated: its last obs
    assert b["actions"].tolist() == [1, 2] and b["rewards"].tolist() == [1.0, 2.0]
    assert b["terminateds"].tolist() == [False, True]


def test_step_refuses_flag_bytes_other_than_0_and_1():
    rt = make()
    sid = create(rt, num_slots=2).session_id
    call(rt, "step", step_request([[0, 0], [1, 1]]), sid)
    bad = step_request([[2, 2], [3, 3]], rewards=[1, 1], terminated=[False, False])
    bad.terminated.data = b"\x00\x02"
    with pytest.raises(BridgeError) as info:
        call(rt, "step", bad, sid)
    assert "Step terminated row 1: byte 2 is not a bool" in info.value.message
    assert rt.snapshot()["env_steps"] == 2   # nothing applied


# ---------------------------------------------------------------- close and reap


def test_close_and_reap():
    rt = make(session_timeout_s=5.0)
    ended = []
    rt.episode_end_callbacks.append(ended.append)
    closing = create(rt, "closing").session_id
    idle = create(rt, "idle").session_id
    for sid in (closing, idle):
        call(rt, "start_episode", pb.StartEpisodeRequest(episode_ids=["a", "b"]), sid)
        get_action(rt, sid, "a", [0, 0])
        call(rt, "log_returns", pb.LogReturnsRequest(rows=[reward_rows("a", 1.0)]), sid)
        get_action(rt, sid, "a", [1, 1])
    out = call(rt, "close_session", pb.CloseSessionRequest(), closing)
    assert sorted(out.truncated_episode_ids) == ["a", "b"]
    assert rt.session_ids() == [idle]
    with pytest.raises(BridgeError) as info:
        get_action(rt, closing, "a", [2, 2])
    assert info.value.reason == Reason.SESSION_UNKNOWN
    assert rt.reap(now=time.monotonic()) == []           # not idle long enough yet
    assert rt.reap(now=time.monotonic() + 6.0) == [idle]
    assert rt.session_ids() == []
    ends = {(s["session_id"], s["episode_id"]): s for s in ended}
    assert not rt.metrics.returns()   # cut short: not returns of the policy (issue 27 #5)
    assert ends[(closing, "a")]["end_reason"] == "session_closed"
    assert ends[(idle, "a")]["end_reason"] == "client_lost"
    assert ends[(idle, "a")]["length"] == 2 and (idle, "b") not in ends   # no steps: not an episode
    # The answered last actions never got an outcome: dropped. One transition per session.
    b = drain(rt).policy_batches[DEFAULT_POLICY]
    assert b["rewards"].tolist() == [1.0, 1.0] and b["t"].tolist() == [0, 0]
    snap = rt.snapshot()
    assert (snap["sessions"], snap["open_episodes"], snap["episodes"], snap["empty_episodes"]) == (0, 0, 2, 2)
    assert snap["episodes_cut"] == 2


# ---------------------------------------------------------------- policies


def test_policies_is_a_read_only_mapping():
    rt = make()
    p = RandomPolicy(OBS, ACT)
    rt.add_policy("mine", p)
    assert rt.policies["mine"] is p and rt.policy("mine") is p and "mine" in rt.policies
    assert len(rt.policies) == 1 and list(rt.policies) == ["mine"] and dict(rt.policies.items()) == {"mine": p}
    assert rt.policies.get("other") is None and rt.batcher("mine").policy is p
    with pytest.raises(TypeError):
        rt.policies["x"] = p


def test_the_factory_runs_without_the_runtime_lock():
    """While one session's new policy is being built, another session's calls go on."""
    building, release = threading.Event(), threading.Event()
    calls = []

    def factory(pid, o, a):
        calls.append(pid)
        if pid == "slow":
            building.set()
            assert release.wait(10), "the other session's call never completed"
        return PlusOne(o, a)

    rt = BridgeRuntime(BridgeConfig(), policy_factory=factory,
                       policy_mapping_fn=lambda aid, ep: "slow" if ep.episode_id.startswith("slow") else "fast")
    other = create(rt, "other").session_id
    call(rt, "start_episode", pb.StartEpisodeRequest(episode_ids=["fast"]), other)
    get_action(rt, other, "fast", [0, 0])
    slow = [create(rt, f"slow{i}").session_id for i in range(2)]
    errors = []

    def first_use(sid):
        try:
            call(rt, "start_episode", pb.StartEpisodeRequest(episode_ids=["slow"]), sid)
            get_action(rt, sid, "slow", [0, 0])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=first_use, args=(sid,)) for sid in slow]
    for t in threads:
        t.start()
    assert building.wait(10)
    # The factory is blocked: a call of another session, and a snapshot, still complete.
    assert get_action(rt, other, "fast", [1, 1]) == 2
    assert rt.snapshot()["sessions"] == 3
    release.set()
    for t in threads:
        t.join(10)
    assert not errors
    assert calls == ["fast", "slow"]   # two sessions raced on "slow": one policy, one factory call
    assert sorted(rt.policies) == ["fast", "slow"]


def test_a_failing_factory_changes_nothing():
    def factory(pid, o, a):
        raise ValueError("no such algorithm")

    rt = BridgeRuntime(BridgeConfig(), policy_factory=factory)
    sid = create(rt).session_id
    call(rt, "start_episode", pb.StartEpisodeRequest(episode_ids=["e"]), sid)
    with pytest.raises(ValueError):
        get_action(rt, sid, "e", [0, 0])
    assert len(rt.policies) == 0 and rt.snapshot()["agent_steps"] == 0
    rt.policy_factory = lambda pid, o, a: PlusOne(o, a)   # replaceable after construction
    assert get_action(rt, sid, "e", [0, 0]) == 1
