"""The trainer's limits: a learner too large for its memory budget is refused at its first use,
with a status naming the budget, and the daemon trains on; [server] step_timeout_s and
max_policy_memory_mb parse and are checked; metrics.jsonl carries the health counters.

Reproduction (issue 13): a fresh trainer given a first client with Box(100000,) observations
built the network, failed to allocate a 40 GB replay, exited with code 1 and wrote no checkpoint.
"""
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.client.policy_client import PolicyClient
from simbridge.trainer.run.checkpoint import load_checkpoint
from simbridge.trainer.config.trainer_config import ConfigError, parse_config
from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.trainer.run.factory import PolicyFactory
from simbridge.wire.errors import BridgeError, Reason
from support.daemon import kill, metrics, start_sim, start_trainer
from support.waits import wait

HUGE = gym.spaces.Box(-1.0, 1.0, (100_000,), np.float32)
CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def test_server_section_limits_parse_and_are_checked(tmp_path):
    cfg = parse_config(f"""
        [run]
        logdir = "{tmp_path}"
        [policies.default_policy]
        algorithm = "dqn"
    """)
    assert cfg.server.step_timeout_s == 60.0 and cfg.server.max_policy_memory_mb == 4096
    for bad, words in (("step_timeout_s = -1.0", "step_timeout_s must be >= 0"),
                       ("max_policy_memory_mb = 0", "max_policy_memory_mb must be >= 1")):
        with pytest.raises(ConfigError, match=words):
            parse_config(f"""
                [server]
                {bad}
                [run]
                logdir = "{tmp_path}"
                [policies.default_policy]
                algorithm = "dqn"
            """)


def test_factory_refuses_a_learner_over_budget_before_building_it(tmp_path):
    cfg = parse_config(f"""
        [server]
        max_policy_memory_mb = 64
        [run]
        logdir = "{tmp_path}"
        [policies.default_policy]
        algorithm = "dqn"
        config = {{ buffer_size = 1000, hidden = [32] }}
    """)
    factory = PolicyFactory(cfg)
    with pytest.raises(BridgeError) as info:
        factory("default_policy", HUGE, gym.spaces.Discrete(2))
    e = info.value
    assert e.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.reason == Reason.SPACE_TOO_LARGE
    assert "64 MiB" in e.message and "[server] max_policy_memory_mb" in e.message and "buffer_size" in e.message
    # Within the budget: built. Two float32 observations per transition dominate the estimate.
    assert factory("default_policy", CARTPOLE_OBS, gym.spaces.Discrete(2)).trainable
    est = DQNLearner.memory_estimate(HUGE, gym.spaces.Discrete(2), {"buffer_size": 1000, "hidden": [32]})
    assert 800_000 <= est["transition"] <= 801_000 and est["replay"] == 1000 * est["transition"]


@pytest.mark.timeout(240)
def test_trainer_refuses_a_huge_first_client_then_trains_another_and_checkpoints(tmp_path):
    logdir = tmp_path / "run"
    cfg_path = tmp_path / "dqn.toml"
    # DQN's defaults: a 100,000-transition replay. For Box(100000,) that is ~80 GB: refused.
    cfg_path.write_text(f"""
        [server]
        address = "127.0.0.1:0"
        rollout_fragment_length = 50
        [run]
        logdir = "{logdir}"
        checkpoint_every_env_steps = 0
        print_every_s = 0.3
        seed = 0
        learner_process = false   # the refusal and the run after it, not where updates run
        [policies.default_policy]
        algorithm = "dqn"
        config = {{ learning_starts = 64, batch_size = 32 }}
    """)
    daemon = start_trainer(cfg_path, timeout=90)
    address = daemon.address
    sim = None
    try:
        huge = PolicyClient(address, HUGE, gym.spaces.Discrete(2), client_name="huge")
        eid = huge.start_episode()
        t0 = time.monotonic()
        with pytest.raises(BridgeError) as info:
            huge.get_action(eid, np.zeros(100_000, np.float32))
        assert time.monotonic() - t0 < 10   # refused from the estimate, nothing allocated
        e = info.value
        assert e.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.reason == Reason.SPACE_TOO_LARGE, e
        assert "4,096 MiB" in e.message and "max_policy_memory_mb" in e.message
        huge.close()
        assert daemon.poll() is None, "\n".join(daemon.lines)

        # A well-sized client then binds default_policy and the learner trains.
        sim = start_sim("gym_sim", "simbridge.sims.gym_sim", address, "--env", "CartPole-v1", "--seed", "1")

        def trained():
            recs = metrics(logdir)
            return recs and recs[-1]["updates"].get("default_policy", 0) > 0
        wait(trained, 120, "gradient updates from the second client", [daemon, sim])
        rec = metrics(logdir)[-1]
        assert rec["refused"].get("SPACE_TOO_LARGE", 0) >= 1
        assert rec["errors"].get("RESOURCE_EXHAUSTED", 0) >= 1
        for k in ("experience_blocked_s", "empty_episodes", "sessions_timed_out", "upload_refused_chunks",
                  "upload_refused_steps"):
            assert k in rec
        rc = daemon.stop(timeout=60)
        assert rc == 0, "\n".join(daemon.lines)
    finally:
        kill(sim, daemon)
    ckpt = load_checkpoint(logdir / "checkpoint.pt")
    assert ckpt["counters"]["env_steps"] > 0
