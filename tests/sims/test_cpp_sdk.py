"""The C++ client SDK (sims/cpp): built once per session into build/cpp, its unit tests under ctest,
its CartPole examples against a real BridgeServer on loopback (lockstep and slots, episodes and
transitions counted on the server; on TCP, a Unix socket and the shared-memory step channel),
reconnect and resume with exactly-once resend across a server restart (TCP and shared memory),
SessionLost when the server forgot the session, a camera (Space::Image) that arrives as its bytes,
and local inference equal to simbridge.client.local_policy on a real learner's PortablePolicy.

Skipped only when the build tools are absent (Debian: cmake libgrpc++-dev protobuf-compiler-grpc
libprotobuf-dev)."""
import json
import os
import subprocess
import time

import gymnasium as gym
import numpy as np
import pytest

from simbridge.client.local_policy import LocalPolicy
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.sample_batch import SampleBatch
from simbridge.server.service import BridgeServer
from simbridge.trainer.run.launch import free_port
from support.waits import wait

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


@pytest.fixture(scope="module")
def build(cpp_build):
    return cpp_build


def _run(build, program, *args, timeout=120):
    out = subprocess.run([os.path.join(build, program), *map(str, args)], capture_output=True, text=True,
                         timeout=timeout)
    return out


def _summary(out):
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def handovers(monkeypatch):
    """The shared-memory channels the servers hand over: proof that the steps went through one."""
    from simbridge.server.shm_server import ShmListener
    seen = []
    real = ShmListener._hand_over

    def counted(self, conn):
        seen.append(conn)
        return real(self, conn)

    monkeypatch.setattr(ShmListener, "_hand_over", counted)
    return seen


def _transitions(rt) -> SampleBatch:
    rt.flush()
    batches = rt.experience.get_all()
    return SampleBatch.concat_samples([b.policy_batches["default_policy"] for b in batches])


def test_ctest_unit_tests_pass(build):
    out = subprocess.run(["ctest", "--test-dir", build, "--output-on-failure"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "100% tests passed" in out.stdout


# ---------------------------------------------------------------- examples against a real server

@pytest.mark.nets("tcp", "uds", "shm")
def test_lockstep_cartpole_episodes_and_transitions_arrive(build, make_server, handovers, net):
    srv = make_server(rollout_fragment_length=32)
    summary = _summary(_run(build, "cartpole", "--address", srv.address, "--episodes", 6, "--slots", 2))
    assert summary["episodes"] == 6 and summary["reconnects"] == 0
    assert len(handovers) == (net == "shm")
    rows = _transitions(srv.runtime)
    snap = srv.runtime.snapshot()
    assert snap["episodes"] == 6 and snap["env_steps"] == summary["steps"] == len(rows)
    assert snap["episode_return_mean"] == pytest.approx(summary["return_mean"], abs=1e-3)
    assert rows["rewards"].sum() == summary["steps"]       # each step's reward once, on its own step
    assert rows["terminateds"].sum() + rows["truncateds"].sum() == 6
    assert len(set(rows["eps_id"].tolist())) == 6
    assert snap["open_episodes"] == 0 and snap["sessions"] == 0


def test_the_cartpole_examples_declare_gymnasiums_spaces_and_share_its_policy(build, make_server):
    """The C++ examples are CartPole-v1: a trainer takes them and `simbridge-sim --env CartPole-v1`
    as one policy. They declared FLT_MAX for the velocities (gym 0.x's bound; gymnasium 1.x's is
    inf) and whichever came second was refused with SPACE_MISMATCH (newcomer audit)."""
    from simbridge.client import PolicyClient
    srv = make_server()
    env = gym.make("CartPole-v1")
    python_side = PolicyClient(srv.address, env.observation_space, env.action_space)
    try:
        obs, _ = env.reset(seed=0)
        python_side.get_action(python_side.start_episode(), obs)   # the policy's spaces are now gymnasium's
        for program, args in (("cartpole", ("--episodes", 2)), ("cartpole_slots", ("--steps", 20, "--slots", 2))):
            out = _run(build, program, "--address", srv.address, *args)
            assert out.returncode == 0, out.stdout + out.stderr
    finally:
        python_side.close()


@pytest.mark.nets("tcp", "uds", "shm")
def test_slot_cartpole_steps_all_slots_with_auto_reset(build, make_server, handovers, net):
    srv = make_server(rollout_fragment_length=64)
    summary = _summary(_run(build, "cartpole_slots", "--address", srv.address, "--steps", 200, "--slots", 4))
    assert summary["steps"] == 800 and summary["episodes"] > 4
    assert len(handovers) == (net == "shm") and summary["reconnects"] == 0
    rows = _transitions(srv.runtime)
    snap = srv.runtime.snapshot()
    assert snap["env_steps"] == len(rows) == 800                  # the final Step's outcome counts too
    assert snap["episodes"] == summary["episodes"] + summary["cut_short"]   # the final Step ends the rest
    assert rows["terminateds"].sum() == summary["episodes"]       # random CartPole never reaches 500
    assert snap["open_episodes"] == 0


def test_local_inference_from_a_real_learner_logs_the_actions(build, make_server):
    from simbridge.trainer.learners.dqn import DQNLearner
    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=16),
                       policy_factory=lambda pid, o, a: DQNLearner(o, a, config={"hidden": [16, 16], "seed": 0},
                                                                   device="cpu"))
    srv = make_server(rt)
    summary = _summary(_run(build, "cartpole", "--address", srv.address, "--episodes", 3, "--inference", "local"))
    rows = _transitions(rt)
    assert summary["policy_version"] == 0 and len(rows) == summary["steps"] == rt.snapshot()["env_steps"]
    assert (rows["policy_version"] == -1).all()                   # log_action: chosen by the simulator


@pytest.mark.nets("tcp", "shm")
def test_multi_agent_rows_reach_each_agents_policy(build, make_server, handovers, net):
    """Agent "a" (default spaces) and "b" (a Dict observation, a Box action: its own AgentRows)
    act each step; "b" is done one step early with its final observation; rewards add up per agent."""
    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=8),
                       policy_mapping_fn=lambda aid, episode: "pb" if aid == "b" else "default_policy")
    srv = make_server(rt)
    summary = _summary(_run(build, "multiagent_probe", "--address", srv.address, "--episodes", 3, "--steps", 5))
    assert summary == {"episodes": 3, "agent_steps": 3 * (5 + 4)}
    assert len(handovers) == (net == "shm")                       # the multi-agent service's channel too
    rt.flush()
    per_policy = {}
    for batch in rt.experience.get_all():
        for pid, rows in batch.policy_batches.items():
            per_policy.setdefault(pid, []).append(rows)
    a = SampleBatch.concat_samples(per_policy["default_policy"])
    b = SampleBatch.concat_samples(per_policy["pb"])
    assert (len(a), a["rewards"].sum(), a["terminateds"].sum()) == (15, 15.0, 3)
    assert (len(b), b["rewards"].sum(), b["terminateds"].sum()) == (12, 24.0, 3)
    np.testing.assert_allclose(b["new_obs"]["pos"][b["terminateds"]], [[0.3, 0.3]] * 3, rtol=1e-6)
    snap = rt.snapshot()
    assert snap["episodes"] == 3 and snap["policy_return_mean"] == {"default_policy": 5.0, "pb": 8.0}


@pytest.mark.nets("tcp", "shm")
def test_a_cpp_camera_arrives_as_its_bytes(build, make_server, handovers, net):
    """tools/camera_probe declares Dict{camera: Space::Image({6, 5, 3}), joints: Box(2)} and sends a
    known pattern: the server sees a uint8 box, and every transition holds exactly those bytes."""
    srv = make_server(rollout_fragment_length=8)
    steps, shape = 5, (6, 5, 3)
    assert _summary(_run(build, "camera_probe", "--address", srv.address, "--steps", steps, "--height", shape[0],
                         "--width", shape[1])) == {"steps": steps}
    assert len(handovers) == (net == "shm")
    assert srv.runtime.policy("default_policy").observation_space["camera"] == gym.spaces.Box(0, 255, shape, np.uint8)

    def camera(t):
        return ((7 * np.arange(np.prod(shape)) + 31 * t) % 256).astype(np.uint8).reshape(shape)

    rows = _transitions(srv.runtime)
    assert len(rows) == steps
    for key, first in (("obs", 0), ("new_obs", 1)):
        assert rows[key]["camera"].dtype == np.uint8
        np.testing.assert_array_equal(rows[key]["camera"], [camera(t) for t in range(first, first + steps)])
        np.testing.assert_allclose(rows[key]["joints"][:, 0], np.arange(first, first + steps) / steps, rtol=1e-6)


# ---------------------------------------------------------------- reconnect

# On shm the steps run several times faster, and a stopping server serves its open channels until
# its handover socket's accept loop ends (up to 0.5 s): more work there, so the stop lands mid-run.
@pytest.mark.nets("tcp", "shm")
@pytest.mark.parametrize("program,args", [
    ("cartpole", {"tcp": ("--episodes", 150), "shm": ("--episodes", 600)}),
    ("cartpole_slots", {"tcp": ("--steps", 1500, "--slots", 4), "shm": ("--steps", 20000, "--slots", 4)})])
def test_server_restart_resumes_the_session_and_applies_every_request_once(build, program, args, listen_address,
                                                                           handovers, net):
    """The server goes away mid-run and comes back on the same port (or socket path) with the same
    runtime: the client reconnects, resumes and resends what was unanswered (on shm: through a
    fresh channel); the server's counts equal the client's exactly (a request applied twice, or
    lost, would show)."""
    # Room for every row of the run: no learner drains the queue, and a full one holds the client.
    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=64, experience_queue_size=4096))
    address = f"127.0.0.1:{free_port()}" if net == "tcp" else listen_address()
    srv = BridgeServer(rt, address).start()
    proc = subprocess.Popen([os.path.join(build, program), "--address", address, *map(str, args[net])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        wait(lambda: rt.snapshot()["env_steps"] > 300 or proc.poll() is not None, 30, "300 env steps", every=0.02)
        assert proc.poll() is None, "the run ended before the restart"
        srv.stop(grace=0)
        time.sleep(0.3)
        second = BridgeServer(rt, address).start()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.stop(grace=0)
    try:
        assert proc.returncode == 0, stdout + stderr
        summary = json.loads(stdout.strip().splitlines()[-1])
        assert summary["reconnects"] >= 1 and "resumed session" in stderr
        assert len(handovers) == (0 if net == "tcp" else 1 + summary["reconnects"])
        rows = _transitions(rt)
        snap = rt.snapshot()
        assert snap["env_steps"] == summary["steps"] == len(rows)
        ended = summary["episodes"] + summary.get("cut_short", 0)
        assert snap["episodes"] == ended and snap["open_episodes"] == 0
        assert rows["rewards"].sum() == summary["steps"]
    finally:
        second.stop(grace=0)


def test_a_server_that_forgot_the_session_raises_session_unknown(build):
    """The example handles SessionLost as the Python simulators do: it says so and goes on with new
    episodes on the restarted server."""
    address = f"127.0.0.1:{free_port()}"
    rt = BridgeRuntime(BridgeConfig())
    srv = BridgeServer(rt, address).start()
    proc = subprocess.Popen([os.path.join(build, "cartpole"), "--address", address, "--episodes", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fresh = None
    try:
        wait(lambda: rt.snapshot()["env_steps"] > 100 or proc.poll() is not None, 30, "100 env steps", every=0.02)
        srv.stop(grace=0)
        fresh_rt = BridgeRuntime(BridgeConfig())
        fresh = BridgeServer(fresh_rt, address).start()   # a restart: no sessions
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if fresh is not None:
            fresh.stop(grace=0)
    assert proc.returncode == 0, stderr
    assert "(SESSION_UNKNOWN)" in stderr and "no longer had session" in stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["lost_sessions"] == 1 and summary["episodes"] == 300
    assert fresh_rt.snapshot()["env_steps"] > 0


# ---------------------------------------------------------------- local inference, equal to Python's

def _compare(build, tmp_path, msg, obs_rows, rtol=1e-5, atol=1e-5):
    (tmp_path / "policy.bin").write_bytes(msg.SerializeToString())
    (tmp_path / "obs.txt").write_text("\n".join(" ".join(repr(float(v)) for v in row) for row in obs_rows))
    out = _run(build, "local_policy_tool", tmp_path / "policy.bin", tmp_path / "obs.txt", tmp_path / "out.json")
    assert out.returncode == 0, out.stderr
    cpp = json.loads((tmp_path / "out.json").read_text())
    py = LocalPolicy(msg, seed=0)
    flat = py.preprocess(np.asarray(obs_rows, np.float32))
    np.testing.assert_allclose(np.array(cpp["outputs"]), py.forward(flat), rtol=rtol, atol=atol)
    actions, logp = py.compute_actions(np.asarray(obs_rows, np.float32))
    return np.array(cpp["actions"]), np.asarray(actions), cpp["logp"], logp


def test_local_q_policy_equals_python_on_a_dqn_learners_export(build, tmp_path):
    from simbridge.trainer.learners.dqn import DQNLearner
    learner = DQNLearner(OBS, gym.spaces.Discrete(3), config={"hidden": [32, 32], "seed": 1}, device="cpu")
    msg = type(learner.portable())()
    msg.CopyFrom(learner.portable())
    msg.head.params["epsilon"] = 0.0
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 4)).astype(np.float32)
    cpp_actions, py_actions, cpp_logp, py_logp = _compare(build, tmp_path, msg, obs)
    np.testing.assert_array_equal(cpp_actions[:, 0], py_actions)
    assert len(set(py_actions.tolist())) > 1                      # not one constant action
    np.testing.assert_allclose(cpp_logp, py_logp, atol=1e-6)


def test_local_gaussian_policy_equals_python_on_a_sac_learners_export(build, tmp_path):
    from simbridge.trainer.learners.sac import SACLearner
    act = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    learner = SACLearner(OBS, act, config={"hidden": [32, 32], "seed": 2, "random_warmup": False}, device="cpu")
    msg = type(learner.portable())()
    msg.CopyFrom(learner.portable())
    assert msg.head.kind == "tanh_gaussian"
    msg.head.params["deterministic"] = 1.0
    obs = np.random.default_rng(1).uniform(-1, 1, (64, 4)).astype(np.float32)
    cpp_actions, py_actions, _, _ = _compare(build, tmp_path, msg, obs)
    np.testing.assert_allclose(cpp_actions, py_actions, rtol=1e-5, atol=1e-5)
    assert np.ptp(py_actions[:, 0]) > 1e-3                          # the observations matter
