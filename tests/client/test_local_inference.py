"""Local inference end to end: real servers on loopback, LocalPolicyClient, raw uploads, simulator and
trainer processes.

What is checked: the client's policy follows the server's versions without a step waiting for it;
every uploaded transition carries the version that acted (and the action that version takes);
a simulator process in local mode never imports torch; a learner that stops taking experience
makes the server refuse chunks and the client wait, and once it takes experience again every
step arrives exactly once; every malformed upload is refused with a precise message and no
effect; DQN learns CartPole through the daemon from a local-mode simulator.
"""
import json
import subprocess
import sys
import threading
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.errors import BridgeError
from simbridge.client.local_client import LocalPolicyClient
from simbridge.server.policies import Policy
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.trainer.run.launch import child_env
from simbridge.server.sample_batch import SampleBatch
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc
from support.raw import create_request

OBS = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


class FixedActionPolicy(Policy):
    """A portable policy whose greedy action is chosen per version (one linear layer, bias only),
    so a transition's action tells which version acted. `export_delay_s` makes GetPolicy slow."""

    def __init__(self, obs_space=OBS, act_space=ACT):
        super().__init__(obs_space, act_space)
        self.export_delay_s = 0.0
        self.exports = 0
        self.set(1, favoured=0)

    def set(self, version: int, favoured: int) -> None:
        msg = pb.PortablePolicy(version=version, preprocessor="flatten",
                                observation_space=sb_spaces.space_to_proto(self.observation_space),
                                action_space=sb_spaces.space_to_proto(self.action_space))
        layer = msg.layers.add(op="linear")
        tensors.fill_tensor(layer.weight, np.zeros((2, 4), np.float32))
        tensors.fill_tensor(layer.bias, np.eye(2, dtype=np.float32)[favoured])
        msg.head.kind = "q_argmax"
        msg.head.branch_sizes.append(2)
        msg.head.params["epsilon"] = 0.0
        self._msg, self.version = msg, version

    def portable(self, include_onnx=False):
        time.sleep(self.export_delay_s)
        self.exports += 1
        return self._msg

    def compute_actions(self, obs_batch):
        raise AssertionError("a local client never asks the server for actions")


def _runtime(policy=None, **config):
    return BridgeRuntime(BridgeConfig(**config),
                         policy_factory=(lambda pid, o, a: policy) if policy is not None else None)


def _rows(runtime) -> SampleBatch:
    batches = runtime.experience.get_all()
    return SampleBatch.concat_samples([b.policy_batches["default_policy"] for b in batches])


def _obs(rng):
    return rng.uniform(-1, 1, 4).astype(np.float32)


# ---------------------------------------------------------------- refresh and version tags

def test_policy_refreshes_without_blocking_steps_and_tags_every_transition(make_server):
    policy = FixedActionPolicy()
    rt = _runtime(policy)
    server = make_server(rt)
    client = LocalPolicyClient(server.address, OBS, ACT, update_interval_s=0.1, chunk_steps=16,
                               max_buffered_steps=64, flush_interval_s=0.05)
    rng = np.random.default_rng(0)
    assert client.policy_version == 1                     # fetched at construction
    eid = client.start_episode()
    actions = [client.get_action(eid, _obs(rng)) for _ in range(50)]
    assert set(actions) == {0}

    policy.export_delay_s = 0.3                            # a slow export: no step may wait for it
    policy.set(2, favoured=1)
    t0 = time.monotonic()
    slowest = 0.0
    while client.policy_version != 2:
        assert time.monotonic() - t0 < 5.0, "the client never picked up version 2"
        s = time.perf_counter()
        client.get_action(eid, _obs(rng))
        client.log_returns(eid, 1.0)
        slowest = max(slowest, time.perf_counter() - s)
        time.sleep(0.001)
    latency = time.monotonic() - t0
    print(f"refresh latency {latency * 1e3:.0f} ms (interval 100 ms, export 300 ms); slowest step "
          f"{slowest * 1e3:.2f} ms")
    assert slowest < 0.1 and latency < 1.5
    after = [client.get_action(eid, _obs(rng)) for _ in range(30)]
    assert set(after) == {1}
    for _ in range(5):                                     # the simulator's own choices: version -1
        client.log_action(eid, _obs(rng), 0)
    client.end_episode(eid, _obs(rng), truncated=True)
    assert client.flush()
    stats = client.stats()
    client.close()

    rows = _rows(rt)
    assert len(rows) == stats["transitions"] == stats["uploaded_steps"] == stats["actions"]
    v, a = rows["policy_version"], rows["actions"]
    assert set(v.tolist()) == {-1, 1, 2}
    assert (a[v == 1] == 0).all() and (a[v == 2] == 1).all()   # the version that acted, for every row
    assert (v == -1).sum() == 5 and np.isnan(rows["action_logp"][v == -1]).all()
    assert (rows["action_logp"][v >= 0] == 0.0).all()            # greedy with epsilon 0: p = 1
    np.testing.assert_array_equal(rows["t"], np.arange(len(rows)))
    assert rows["truncateds"][-1] and not rows["terminateds"][-1] and rows["truncateds"].sum() == 1
    np.testing.assert_array_equal(rows["obs"][1:], rows["new_obs"][:-1])  # consecutive transitions chain
    assert rt.snapshot()["episodes"] == 1 and rt.snapshot()["uploaded_steps"] == len(rows)


def test_an_upload_answer_with_a_newer_version_triggers_a_refresh(make_server):
    policy = FixedActionPolicy()
    server = make_server(_runtime(policy))
    # Polling alone would take a minute: the answer to an upload is what brings version 2.
    client = LocalPolicyClient(server.address, OBS, ACT, update_interval_s=60.0, chunk_steps=4,
                               max_buffered_steps=16)
    rng = np.random.default_rng(1)
    eid = client.start_episode()
    policy.set(2, favoured=1)
    t0 = time.monotonic()
    while client.policy_version != 2:
        assert time.monotonic() - t0 < 5.0, "no refresh after an upload reported version 2"
        client.get_action(eid, _obs(rng))
        time.sleep(0.002)
    assert client.stats()["policy_updates"] == 1
    client.close()


def test_onnx_travels_with_the_policy_and_matches_numpy(make_server):
    import onnxruntime as ort
    from simbridge.client.local_client import make_policy_client
    from simbridge.trainer.learners.dqn import DQNLearner
    rt = _runtime(DQNLearner(OBS, ACT, config={"hidden": [16, 16], "seed": 0}, device="cpu"))
    server = make_server(rt)
    client = make_policy_client(server.address, OBS, ACT, inference_mode="local", include_onnx=True)
    assert isinstance(client, LocalPolicyClient) and client.onnx_model
    flat = np.random.default_rng(5).uniform(-1, 1, (8, 4)).astype(np.float32)
    sess = ort.InferenceSession(client.onnx_model, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(["out"], {"obs": flat})[0], client.policy.forward(flat), rtol=1e-5, atol=1e-6)
    client.close()
    with pytest.raises(ValueError, match="inference_mode"):
        make_policy_client(server.address, OBS, ACT, inference_mode="hybrid")


def test_policy_without_portable_form_is_refused(make_server):
    class Opaque(Policy):
        def compute_actions(self, obs_batch):
            raise AssertionError
    server = make_server(_runtime(Opaque(OBS, ACT)))
    with pytest.raises(BridgeError) as e:
        LocalPolicyClient(server.address, OBS, ACT)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "no portable form" in e.value.message


# ---------------------------------------------------------------- the client side: no torch

def test_local_simulator_process_never_imports_torch(make_server):
    from simbridge.trainer.learners.dqn import DQNLearner
    rt = _runtime(policy=None)
    rt.policy_factory = lambda pid, o, a: DQNLearner(o, a, config={"hidden": [32, 32], "seed": 0}, device="cpu")
    server = make_server(rt)
    code = f"""
import json, sys
from simbridge.sims import gym_sim
rc = gym_sim.main(["--inference", "local", "--episodes", "20", "--address", "{server.address}", "--quiet",
                   "--seed", "0"])
assert rc == 0, rc
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not loaded, loaded
print("NO_TORCH")
"""
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "NO_TORCH" in out.stdout, out.stdout + out.stderr
    summary = json.loads(out.stdout.splitlines()[0])
    assert summary["episodes"] == 20 and summary["inference"] == "local"
    assert summary["local"]["uploaded_steps"] == summary["steps"]
    snap = rt.snapshot()
    assert snap["episodes"] == 20 and snap["uploaded_steps"] == summary["steps"] == snap["env_steps"]
    assert snap["policy_return_mean"]["default_policy"] == pytest.approx(summary["return_mean"])
    rows = _rows(rt)
    assert len(rows) == summary["steps"] and set(rows["policy_version"].tolist()) == {0}


# ---------------------------------------------------------------- backpressure

def test_slow_consumer_refusals_blocking_and_nothing_lost(make_server):
    rt = _runtime(experience_queue_size=1, upload_queue_wait_s=0.05)
    server = make_server(rt)
    client = LocalPolicyClient(server.address, OBS, ACT, chunk_steps=8, max_buffered_steps=32,
                               flush_interval_s=0.05)
    total, ep_len = 400, 25
    taken = [0]

    def simulate():
        rng = np.random.default_rng(2)
        eid = client.start_episode()
        for i in range(total):
            client.get_action(eid, _obs(rng))
            client.log_returns(eid, 1.0)
            taken[0] += 1
            if (i + 1) % ep_len == 0:
                client.end_episode(eid, _obs(rng))
                eid = client.start_episode()
        client.end_episode(eid, _obs(rng))

    sim = threading.Thread(target=simulate, daemon=True)
    sim.start()
    deadline = time.monotonic() + 10
    while not (client.stats()["refusals"] and client.stats()["buffered_steps"] == 32):
        assert time.monotonic() < deadline, client.stats()  # nobody takes experience: the client fills up
        time.sleep(0.02)
    stalled = taken[0]
    time.sleep(0.3)
    # 8 steps in the queue + 32 buffered + the action whose transition waits for room
    assert taken[0] == stalled == 41 < total               # the simulator waits instead of running on
    assert client.stats()["blocked_calls"] >= 1
    snap = rt.snapshot()
    assert snap["upload_refused_chunks"] > 0 and snap["upload_refused_steps"] >= 8 * snap["upload_refused_chunks"]
    assert snap["experience_queue"] == 1

    batches, done = [], threading.Event()

    def drain():                                           # the learner catches up
        while not done.is_set():
            b = rt.experience.get(timeout=0.02)
            if b is not None:
                batches.append(b)
    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    sim.join(20)
    assert not sim.is_alive()
    client.close()
    done.set()
    drainer.join()
    batches += rt.experience.get_all()

    stats = client.stats()
    assert stats["blocked_s"] > 0.2 and stats["lost_steps"] == 0 and stats["rejected_steps"] == 0
    assert stats["uploaded_steps"] == stats["transitions"] == total
    rows = SampleBatch.concat_samples([b.policy_batches["default_policy"] for b in batches])
    assert len(rows) == total and sum(b.env_steps() for b in batches) == total
    keys = set(zip(rows["eps_id"].tolist(), rows["t"].tolist()))
    assert len(keys) == total                              # every step once
    for eps in np.unique(rows["eps_id"]):
        np.testing.assert_array_equal(np.sort(rows["t"][rows["eps_id"] == eps]), np.arange(ep_len))
    assert len(np.unique(rows["eps_id"])) == total // ep_len
    assert rows["terminateds"].sum() == total // ep_len and (rows["rewards"] == 1.0).all()
    snap = rt.snapshot()
    assert snap["uploaded_steps"] == snap["env_steps"] == total and snap["episodes"] == total // ep_len
    assert snap["empty_episodes"] == 1   # the one the client started last, closed with no steps
    assert stats["refusals"] > 0 and snap["upload_refused_chunks"] >= stats["refusals"]


def test_server_restart_raises_session_lost_and_counts_what_could_not_arrive():
    from simbridge.client.policy_client import SessionLost
    from simbridge.server.service import BridgeServer
    first = BridgeServer(BridgeRuntime(), "127.0.0.1:0").start()
    address = first.address
    client = LocalPolicyClient(address, OBS, ACT, chunk_steps=8, max_buffered_steps=32, flush_interval_s=0.05,
                               update_interval_s=0.1)
    rng = np.random.default_rng(4)
    eid = client.start_episode()
    for _ in range(20):
        client.get_action(eid, _obs(rng))
    assert client.flush()
    first.stop(grace=0)
    for _ in range(10):                                    # the server is away: steps go on, buffered
        client.get_action(eid, _obs(rng))
    second = BridgeServer(BridgeRuntime(), address).start()  # a fresh server: the session is gone
    try:
        deadline = time.monotonic() + 10
        with pytest.raises(SessionLost, match="buffered steps could not be delivered") as e:
            while time.monotonic() < deadline:
                client.get_action(eid, _obs(rng))
                time.sleep(0.01)
        stats = client.stats()
        assert stats["uploaded_steps"] == 19 and stats["lost_steps"] == stats["transitions"] - 19 > 0
        e.value.close_connection()
    finally:
        second.stop(grace=0)


# ---------------------------------------------------------------- the raw protocol

class Raw:
    """A session on the ExternalEnv service, for hand-made uploads."""

    def __init__(self, address, obs=OBS, act=ACT):
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.ExternalEnvStub(self.channel)
        self.sid = self.stub.CreateSession(create_request(obs, act)).session_id

    def chunk(self, eid="e1", n=3, t0=0, seq=0, terminal=False, summary=False) -> pb.UploadExperienceRequest:
        rng = np.random.default_rng(t0)
        req = pb.UploadExperienceRequest(header=pb.RequestHeader(session_id=self.sid, seq=seq), episode_ids=[eid])
        term = np.zeros(n, bool)
        term[-1] = terminal
        for field, value in [("episode_index", np.zeros(n, np.int32)), ("t", np.arange(t0, t0 + n, dtype=np.int32)),
                             ("rewards", np.ones(n, np.float32)), ("terminated", term),
                             ("truncated", np.zeros(n, bool)), ("policy_versions", np.zeros(n, np.int64)),
                             ("action_logp", np.full(n, np.log(0.5), np.float32))]:
            tensors.fill_tensor(getattr(req, field), value)
        tensors.fill_tensor(req.observations.tensor, rng.uniform(-1, 1, (n, 4)).astype(np.float32))
        tensors.fill_tensor(req.next_observations.tensor, rng.uniform(-1, 1, (n, 4)).astype(np.float32))
        tensors.fill_tensor(req.actions.tensor, rng.integers(0, 2, n))
        if summary:
            req.finished_episodes.add(episode_id=eid, total_reward=float(t0 + n), length=t0 + n)
        return req

    def upload(self, req):
        return self.stub.UploadExperience(req, timeout=10)

    def refused(self, req):
        with pytest.raises(grpc.RpcError) as e:
            self.upload(req)
        return e.value.code(), e.value.details()


def _set(req, field, value):
    tensors.fill_tensor(getattr(req, field), value)
    return req


def _set_value(req, field, value):
    tensors.fill_tensor(getattr(req, field).tensor, value)
    return req


def test_bad_uploads_are_refused_precisely_and_change_nothing(make_server):
    rt = _runtime(max_rows_per_request=64)
    server = make_server(rt)
    raw = Raw(server.address)
    c = raw.chunk
    nan_obs = np.zeros((3, 4), np.float32)
    nan_obs[1, 2] = np.nan
    twice = c(terminal=True, summary=True)
    twice.episode_ids.append("e1")
    no_versions = c(terminal=True, summary=True)
    no_versions.ClearField("policy_versions")
    bad_summary = c(summary=True)
    bad_summary.finished_episodes[0].total_reward = float("nan")
    unknown = c()
    unknown.header.session_id = "nope"
    INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    cases = [  # each with a terminal row and/or summary for e1 that must not take effect
        (_set_value(c(terminal=True, summary=True), "observations", np.zeros((3, 4))), INVALID,
         "observations: dtype float64, expected float32"),
        (_set_value(c(terminal=True), "observations", np.zeros((3, 3), np.float32)), INVALID,
         "observations: shape (3, 3), expected (3, 4)"),
        (_set_value(c(terminal=True, summary=True), "next_observations", nan_obs), INVALID,
         "next_observations: contains NaN at row 1"),
        (_set_value(c(terminal=True), "actions", np.array([0, 2, 1])), INVALID, "actions row 1: 2 is outside Discrete(2)"),
        (_set(c(terminal=True), "rewards", np.ones(2, np.float32)), INVALID, "episode_index: shape (3,), expected (2,)"),
        (_set(c(terminal=True), "rewards", np.array([1, np.nan, 1], np.float32)), INVALID,
         "rewards row 1: nan is not a finite number"),
        (_set(c(terminal=True), "rewards", np.ones(3, np.int32)), INVALID, "rewards: dtype int32, expected float32"),
        (_set(c(terminal=True), "rewards", np.ones(3, np.float64)), INVALID, "rewards: dtype float64, expected float32"),
        (_set(c(terminal=True), "episode_index", np.array([0, 1, 0], np.int32)), INVALID,
         "episode_index row 1: 1 is not an index into the 1 episode_ids"),
        (_set(c(terminal=True), "policy_versions", np.array([0, 5, 0])), INVALID,
         "policy_versions row 1: 5 is newer than the policy's current version 0"),
        (_set(c(terminal=True), "policy_versions", np.array([-2, 0, 0])), INVALID, "policy_versions row 0: -2"),
        (no_versions, INVALID, "no policy_versions"),
        (_set(c(terminal=True), "t", np.array([0, 2, 1], np.int32)), INVALID,
         "row 2: t 1 of episode 'e1' does not come after t 2"),
        (_set(c(), "terminated", np.array([True, False, False])), INVALID, "row 1 of episode 'e1' follows its terminal row 0"),
        (_set(c(terminal=True), "truncated", np.array([False, False, True])), INVALID,
         "row 2 is both terminated and truncated"),
        (_set(c(terminal=True), "action_logp", np.array([0, np.inf, 0], np.float32)), INVALID, "action_logp row 1: inf"),
        (c(n=65, terminal=True), INVALID, "65 transitions exceed the server limit of 64"),
        (twice, INVALID, "episode_ids repeat"),
        (bad_summary, INVALID, "finished_episodes[0]: total_reward nan is not a finite number"),
        (unknown, NOT_FOUND, "unknown session 'nope'"),
    ]
    for req, code, words in cases:
        got_code, details = raw.refused(req)
        assert got_code == code and words in details, (words, got_code, details)
    snap = rt.snapshot()
    assert (snap["uploaded_steps"], snap["env_steps"], snap["episodes"], snap["experience_queue"]) == (0, 0, 0, 0)

    # Nothing of the above happened: e1 starts at t 0, is not ended, accepts rows.
    assert raw.upload(c()).accepted_steps == 3
    code, details = raw.refused(c())                       # the same rows under another seq
    assert code == INVALID and "t 0 of episode 'e1' was already uploaded (last t 2)" in details
    assert raw.upload(c(t0=3, terminal=True, summary=True)).accepted_steps == 3
    code, details = raw.refused(c(t0=6))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "episode 'e1' already ended (terminated)" in details
    code, details = raw.refused(_summary_only(raw, "e1"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "already ended" in details
    rows = _rows(rt)
    assert len(rows) == 6 and rows["terminateds"].tolist() == [False] * 5 + [True]
    snap = rt.snapshot()
    assert snap["episodes"] == 1 and snap["policy_return_mean"] == {"default_policy": 6.0}
    raw.channel.close()


def _summary_only(raw, eid):
    req = pb.UploadExperienceRequest(header=pb.RequestHeader(session_id=raw.sid))
    req.finished_episodes.add(episode_id=eid, total_reward=1.0, length=1)
    return req


def test_refused_chunk_is_applied_once_when_resent(make_server):
    rt = _runtime(experience_queue_size=1, upload_queue_wait_s=0.05)
    ended = []
    rt.episode_end_callbacks.append(ended.append)
    server = make_server(rt)
    raw = Raw(server.address)
    first = raw.chunk(eid="a", seq=1)
    assert raw.upload(first).accepted_steps == 3           # fills the queue
    second = raw.chunk(eid="a", t0=3, seq=2, terminal=True, summary=True)
    t0 = time.monotonic()
    code, details = raw.refused(second)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "experience queue full" in details
    assert time.monotonic() - t0 >= 0.05                   # it waited for room first
    snap = rt.snapshot()
    assert (snap["upload_refused_chunks"], snap["upload_refused_steps"]) == (1, 3)
    assert snap["episodes"] == 0 and snap["uploaded_steps"] == 3 and not ended   # no effect
    assert len(rt.experience.get_all()) == 1               # the learner catches up
    resp = raw.upload(second)                              # resent under the same seq: applied
    assert resp.accepted_steps == 3
    again = raw.upload(second)                             # and once only: the cached answer
    assert again == resp
    batches = rt.experience.get_all()
    assert len(batches) == 1 and batches[0].policy_batches["default_policy"]["t"].tolist() == [3, 4, 5]
    assert rt.snapshot()["episodes"] == 1 and len(ended) == 1
    s = ended[0]
    assert s["agent_policies"] == {"agent0": "default_policy"} and s["total_reward"] == 6.0 and s["length"] == 6
    raw.channel.close()


def test_get_policy_unchanged_and_training_disabled_episodes(make_server):
    policy = FixedActionPolicy()
    rt = _runtime(policy)
    server = make_server(rt)
    raw = Raw(server.address)
    header = pb.RequestHeader(session_id=raw.sid)
    got = raw.stub.GetPolicy(pb.GetPolicyRequest(header=header, known_version=-1))
    assert not got.unchanged and got.policy.version == 1 and got.policy.policy_id == "default_policy"
    exports = policy.exports
    assert raw.stub.GetPolicy(pb.GetPolicyRequest(header=header, known_version=1)).unchanged
    assert policy.exports == exports                       # a client up to date costs no export
    raw.channel.close()

    client = LocalPolicyClient(server.address, OBS, ACT, chunk_steps=4, max_buffered_steps=8)
    rng = np.random.default_rng(3)
    eid = client.start_episode(training_enabled=False)    # metrics only, no transitions
    for _ in range(10):
        client.get_action(eid, _obs(rng))
        client.log_returns(eid, 2.0)
    client.end_episode(eid, _obs(rng))
    with pytest.raises(BridgeError, match="already"):
        client.start_episode(eid)
    client.close()
    snap = rt.snapshot()
    assert snap["episodes"] == 1 and snap["uploaded_steps"] == 0 and snap["env_steps"] == 10
    assert snap["policy_return_mean"] == {"default_policy": 20.0} and rt.experience.qsize() == 0
