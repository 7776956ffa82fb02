"""`simbridge-trainer serve` and `export` on a run directory: the checkpoint's weights, served
greedily and never updated; its ONNX model equal to torch; a tampered checkpoint refused.

The run directory is made here: a learner with some updates, saved as the daemon saves it
(checkpoint.policy_entry, Checkpoints.save) beside the config that names its learner.
"""
import os
import subprocess
import time

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch

from simbridge.client import PolicyClient
from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.run import checkpoint
from simbridge.trainer import cli
from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.trainer.run.launch import free_port, python_module, start_server
from simbridge.trainer.learners.sac import SACLearner
from simbridge.wire.preprocess import flatten
from support.crafted import RunsACommand
from support.daemon import daemon_env, kill, metrics, start_sim
from support.waits import wait

CARTPOLE = gym.make("CartPole-v1")
PENDULUM = gym.make("Pendulum-v1")


def _run_dir(tmp_path, cls, env, algorithm: str, extra: str = ""):
    """A run directory with a trained-ish learner of `cls`; returns (dir, the learner)."""
    run = tmp_path / "trained"
    run.mkdir()
    learner = cls(env.observation_space, env.action_space, config={"hidden": [32, 16], "seed": 0,
                                                                   "learning_starts": 64, "batch_size": 32},
                  device="cpu")
    rng = np.random.default_rng(0)
    n = 200
    obs = rng.standard_normal((n,) + env.observation_space.shape).astype(np.float32)
    acts = np.array([env.action_space.sample() for _ in range(n)])
    learner.add(SampleBatch({"obs": obs, "new_obs": obs[::-1].copy(), "actions": acts,
                             "rewards": rng.standard_normal(n).astype(np.float32),
                             "terminateds": np.zeros(n, bool), "truncateds": np.zeros(n, bool),
                             "eps_id": np.zeros(n, np.int64), "agent_index": np.zeros(n, np.int64),
                             "t": np.arange(n)}))
    learner.train(max_updates=50)
    assert learner.version == 50
    (run / "config.toml").write_text(f'[server]\naddress = "127.0.0.1:{free_port()}"\n[run]\nlogdir = "{run}"\n'
                                     f'[policies.default_policy]\nalgorithm = "{algorithm}"\n'
                                     f'config = {{ hidden = [32, 16], learning_starts = 64, batch_size = 32{extra} }}\n')
    checkpoint.Checkpoints(run, keep_replay=False).save(
        {"default_policy": checkpoint.policy_entry(algorithm, learner, True, False)},
        {"env_steps": n, "agent_steps": n, "episodes": 0, "wall_s": 1.0, "recent": [], "eps_next": 1})
    return run, learner


@pytest.mark.parametrize("algorithm", ["dqn", "sac"])
def test_export_writes_the_onnx_model_equal_to_torch(tmp_path, algorithm, capsys):
    cls, env = (DQNLearner, CARTPOLE) if algorithm == "dqn" else (SACLearner, PENDULUM)
    run, learner = _run_dir(tmp_path, cls, env, algorithm)
    out = tmp_path / "engine" / "policy.onnx"
    assert cli.main(["export", "--checkpoint", str(run), "--onnx", str(out)]) == 0
    report = capsys.readouterr().out
    assert '"ok": true' in report and '"greedy_actions_equal": 1.0' in report and '"version": 50' in report
    # Independently of the command's own check: the file against the trained learner's networks.
    obs = np.stack([env.observation_space.sample() for _ in range(64)]).astype(np.float32)
    flat = flatten(env.observation_space, obs)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(["out"], {"obs": flat})[0]
    with torch.no_grad():
        if algorithm == "dqn":
            want = learner.acting(torch.as_tensor(flat)).reshape(len(flat), -1).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            assert np.array_equal(got.argmax(1), learner.compute_actions(obs, explore=False).actions)
        else:   # the head's mean, squashed and scaled, is the greedy action
            mean = got[:, :env.action_space.shape[0]]
            low, high = env.action_space.low, env.action_space.high
            greedy = low + (np.tanh(mean) + 1) / 2 * (high - low)
            np.testing.assert_allclose(greedy, learner.compute_actions(obs, explore=False).actions, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no CUDA device")
def test_a_run_trained_on_a_gpu_exports_where_there_is_none(tmp_path, capsys):
    """The run's config says [run] device = "cuda" (trained on a GPU machine); export and serve on a
    machine without one pick "auto": nothing they do needs the training device."""
    run, _ = _run_dir(tmp_path, DQNLearner, CARTPOLE, "dqn")
    text = (run / "config.toml").read_text()
    (run / "config.toml").write_text(text.replace("[run]\n", '[run]\ndevice = "cuda"\n'))
    assert 'device = "cuda"' in (run / "config.toml").read_text()
    assert cli.main(["export", "--checkpoint", str(run), "--onnx", str(tmp_path / "x.onnx")]) == 0
    assert '"ok": true' in capsys.readouterr().out


def test_export_errors_name_the_fix(tmp_path, capsys):
    assert cli.main(["export", "--checkpoint", str(tmp_path / "none"), "--onnx", str(tmp_path / "x.onnx")]) == 2
    assert "no checkpoint.pt there" in capsys.readouterr().err
    run, _ = _run_dir(tmp_path, DQNLearner, CARTPOLE, "dqn")
    assert cli.main(["export", "--checkpoint", str(run), "--onnx", str(tmp_path / "x.onnx"), "--policy", "p9"]) == 2
    assert "the checkpoint's policies are ['default_policy']" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


def test_export_refuses_a_crafted_checkpoint_and_runs_nothing(tmp_path):
    run, _ = _run_dir(tmp_path, DQNLearner, CARTPOLE, "dqn")
    marker = tmp_path / "ran"
    torch.save({"format": checkpoint.CHECKPOINT_FORMAT, "x": RunsACommand(f"touch {marker}")}, run / "checkpoint.pt")
    res = subprocess.run(python_module("simbridge.trainer.cli", "export", "--checkpoint", str(run), "--onnx",
                                       str(tmp_path / "x.onnx")), capture_output=True, text=True, env=daemon_env(),
                         timeout=120)
    assert res.returncode == 2 and "is not a valid simbridge-trainer checkpoint" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not marker.exists() and not (tmp_path / "x.onnx").exists()


def test_serve_answers_greedily_with_the_checkpoints_weights_and_never_updates(tmp_path):
    run, learner = _run_dir(tmp_path, DQNLearner, CARTPOLE, "dqn", ", epsilon_initial = 1.0, epsilon_final = 1.0")
    before = (run / "checkpoint.pt").read_bytes()
    logdir = tmp_path / "served"
    daemon = start_server("serve", python_module("simbridge.trainer.cli", "serve", "--checkpoint", str(run),
                                                 "--address", "127.0.0.1:0", "--logdir", str(logdir)),
                          "127.0.0.1:0", timeout=60, env=daemon_env(), keep=2000)
    address = daemon.address   # the port it took (a port picked beforehand could be taken meanwhile)
    sim = None
    try:
        # Epsilon is 1 in training: only greedy serving gives the network's argmax every time.
        obs = np.stack([CARTPOLE.observation_space.sample() for _ in range(32)]).astype(np.float32)
        want = learner.compute_actions(obs, explore=False).actions
        client = PolicyClient(address, CARTPOLE.observation_space, CARTPOLE.action_space)
        for _ in range(2):
            eid = client.start_episode()
            got = [client.get_action(eid, o) for o in obs]
            client.end_episode(eid, obs[-1])
            assert np.array_equal(np.asarray(got), want)
        client.close()
        sim = start_sim("gym_sim", "simbridge.sims.gym_sim", address, "--slots", "4", "--seed", "2",
                        "--max-steps", "2000")
        wait(lambda: sim.poll() is not None, 60, "the simulator's 2,000 steps", [daemon])
        time.sleep(0.6)   # a metrics record after the last step
        assert daemon.stop(timeout=30) == 0, "\n".join(daemon.lines)
    finally:
        kill(*([sim] if sim else []), daemon)
    said = next(line for line in daemon.lines if "listening on" in line)
    assert f"(serving {run / 'checkpoint.pt'}, greedy, no training" in said, said   # issue 27 #13: not "fresh run"
    recs = metrics(logdir)
    assert recs[-1]["env_steps"] >= 2000
    assert {r["versions"]["default_policy"] for r in recs if r["versions"]} == {50}
    assert all(not r["updates"] for r in recs)
    assert (run / "checkpoint.pt").read_bytes() == before and sorted(os.listdir(run)) == ["checkpoint.pt",
                                                                                             "config.toml"]
    # served again into the same logdir: refused with the fix serve has (it takes no --resume)
    again = subprocess.run(python_module("simbridge.trainer.cli", "serve", "--checkpoint", str(run), "--address",
                                         "127.0.0.1:0", "--logdir", str(logdir)),
                           capture_output=True, text=True, timeout=120, env=daemon_env())
    assert again.returncode == 2 and "already holds a run" in again.stderr, again.stderr
    assert "choose another --logdir" in again.stderr and "--resume" not in again.stderr, again.stderr
