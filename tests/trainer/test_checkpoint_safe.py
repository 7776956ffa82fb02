"""checkpoint.pt is read with torch's safe loader only: a crafted, truncated or foreign file is
refused with a message naming it (exit 2, no traceback) and nothing in it runs; everything
the trainer writes (learner state, replay buffers, counters, episode summaries) loads safely.
"""
import os
import subprocess

import gymnasium as gym
import numpy as np
import pytest
import torch

from simbridge.server.episodes import episode_summary
from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.run import checkpoint
from simbridge.trainer.config.trainer_config import ConfigError
from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.trainer.run.launch import ROOT, child_env, free_port, python_module
from simbridge.trainer.learners.sac import SACLearner
from support.crafted import RunsACommand


def _config(tmp_path, logdir) -> str:
    cfg = tmp_path / "c.toml"
    # A free port of its own: 127.0.0.1:1 is where other tests expect nothing to listen.
    cfg.write_text(f'[server]\naddress = "127.0.0.1:{free_port()}"\n[run]\nlogdir = "{logdir}"\n'
                   f'[policies.p]\nalgorithm = "random"\n')
    return str(cfg)


def _resume(cfg: str) -> subprocess.CompletedProcess:
    return subprocess.run(python_module("simbridge.trainer.cli", "run", "--config", cfg, "--resume"),
                          capture_output=True, text=True, timeout=90, env=child_env(), cwd=str(ROOT))


def test_crafted_pickle_checkpoint_is_refused_and_runs_nothing(tmp_path):
    # Fails on the code before the fix: load_checkpoint retried the file with weights_only=False,
    # which ran the command (the marker file appeared) before the format check.
    logdir = tmp_path / "run"
    logdir.mkdir()
    marker = tmp_path / "pwned"
    torch.save({"format": checkpoint.CHECKPOINT_FORMAT, "policies": {}, "counters": {},
                "payload": RunsACommand(f"touch {marker}")}, logdir / "checkpoint.pt")
    r = _resume(_config(tmp_path, logdir))
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert not marker.exists(), "the checkpoint's code ran"
    assert "Traceback" not in out
    assert f"{logdir / 'checkpoint.pt'} is not a valid simbridge-trainer checkpoint" in r.stderr
    assert "never unpickled" in r.stderr and "another --logdir" in r.stderr


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not_ours"])
def test_damaged_or_foreign_checkpoints_are_refused(tmp_path, damage):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_checkpoint(path, {"format": checkpoint.CHECKPOINT_FORMAT, "policies": {},
                                      "counters": {"env_steps": 1}, "w": torch.zeros(1000)})
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(os.urandom(4096))
    else:
        torch.save({"weights": torch.ones(3)}, path)   # a valid torch file, not a checkpoint
    with pytest.raises(ConfigError) as e:
        checkpoint.load_checkpoint(path)
    assert str(path) in str(e.value)


def test_the_cli_refuses_a_truncated_checkpoint_without_a_traceback(tmp_path):
    logdir = tmp_path / "run"
    logdir.mkdir()
    checkpoint.save_checkpoint(logdir / "checkpoint.pt", {"format": checkpoint.CHECKPOINT_FORMAT,
                                                          "policies": {}, "counters": {}})
    data = (logdir / "checkpoint.pt").read_bytes()
    (logdir / "checkpoint.pt").write_bytes(data[:len(data) - 100])
    r = _resume(_config(tmp_path, logdir))
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert "is not a valid simbridge-trainer checkpoint" in r.stderr


@pytest.mark.parametrize("cls,act", [(DQNLearner, gym.spaces.Discrete(3)),
                                     (SACLearner, gym.spaces.Box(-1.0, 1.0, (2,), np.float32))])
def test_everything_the_trainer_saves_loads_safely(tmp_path, cls, act):
    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    learner = cls(obs, act, config={"learning_starts": 8, "batch_size": 8, "seed": 0, "hidden": [16],
                                    "n_step": 2}, device="cpu")
    n = 32
    rng = np.random.default_rng(0)
    learner.add(SampleBatch({
        "obs": rng.random((n, 4), np.float32), "new_obs": rng.random((n, 4), np.float32),
        "actions": np.array([act.sample() for _ in range(n)]), "rewards": np.ones(n, np.float32),
        "terminateds": np.zeros(n, bool), "truncateds": np.zeros(n, bool),
        "eps_id": np.ones(n, np.int64), "agent_index": np.zeros(n, np.int64)}))
    learner.train(max_updates=4)
    assert learner.updates == 4
    summary = episode_summary("e1", 1, "s", 10, {"agent0": 2.5}, {"agent0": "p"}, {"m": 1.0}, True,
                              "terminated", 0.5)
    ckpts = checkpoint.Checkpoints(tmp_path, keep_replay=True)
    ckpts.save({"p": checkpoint.policy_entry("x", learner, True, True)},
               {"env_steps": n, "agent_steps": n, "episodes": 1, "wall_s": 1.0, "recent": [summary],
                "eps_next": 2}, journal={"segment": 2, "rows": {"p": n}, "ingested": {"p": n}})
    state = checkpoint.load_checkpoint(ckpts.path)   # the safe loader, or a ConfigError
    assert state["counters"]["recent"] == [summary] and state["journal"]["ingested"] == {"p": n}
    restored = cls(obs, act, config=learner.config, device="cpu")
    restored.load_state_dict(state["policies"]["p"]["state"])
    assert restored.updates == 4 and len(restored.replay) == len(learner.replay) > 0
