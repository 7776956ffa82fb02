"""SACLearner: action spaces, logp, targets, temperature, checkpoints, a learning check on a\ncontinuous bandit, and a short in-process Pendulum run through the daemon's add()/train() calls."""
import io
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.run.inprocess import run_inprocess
from simbridge.trainer.learners.heads import squashed_sample
from simbridge.trainer.learners.presets import SAC_PENDULUM
from simbridge.trainer.learners.sac import SACLearner

torch.set_num_threads(1)

# asymmetric, non-flat bounds: actions of shape (2, 2) are flattened to A = 4
LOW = np.array([[-1.0, 0.0], [-3.0, 10.0]], np.float32)
HIGH = np.array([[2.0, 5.0], [-1.0, 10.5]], np.float32)
ACT = gym.spaces.Box(LOW, HIGH, dtype=np.float32)
OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
SMALL = {"hidden": [32, 32], "batch_size": 32, "learning_starts": 0, "seed": 0}


def make(config=None, obs_space=OBS, act_space=ACT):
    return SACLearner(obs_space, act_space, {**SMALL, **(config or {})}, device="cpu")


def transitions(n, obs_dim=3, actions=None, rewards=None, terminated=False, rng=None):
    rng = rng or np.random.default_rng(0)
    if actions is None:
        actions = rng.uniform(LOW, HIGH, (n,) + LOW.shape).astype(np.float32)
    return SampleBatch(obs=rng.uniform(-1, 1, (n, obs_dim)).astype(np.float32),
                       new_obs=rng.uniform(-1, 1, (n, obs_dim)).astype(np.float32),
                       actions=actions, rewards=np.zeros(n, np.float32) if rewards is None else rewards,
                       terminateds=np.full(n, terminated), truncateds=np.zeros(n, bool),
                       eps_id=np.arange(n), agent_index=np.zeros(n, np.int64))


def test_action_scaling_round_trip_with_asymmetric_bounds():
    learner = make()
    norm = np.array([[-1, -1, -1, -1], [1, 1, 1, 1], [0, 0, 0, 0], [-0.5, 0.5, 0.25, -0.75]], np.float64)
    env = learner.to_env(norm)
    assert env.shape == (4, 2, 2) and env.dtype == np.float32
    np.testing.assert_allclose(env[0], LOW)
    np.testing.assert_allclose(env[1], HIGH)
    np.testing.assert_allclose(env[2], (LOW + HIGH) / 2)
    np.testing.assert_allclose(learner.store_actions(env[2:]), norm[2:], atol=1e-6)
    stored = learner.store_actions(env)                  # bounds land just inside [-1, 1]
    np.testing.assert_allclose(stored[:2], norm[:2] * (1 - 1e-6), atol=1e-6)
    assert np.abs(stored).max() < 1.0
    assert np.all(np.isfinite(np.arctanh(stored)))
    # everything the policy emits is inside the Box, exploring or not
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 3)).astype(np.float32)
    for explore in (True, False):
        a = learner.compute_actions(obs, explore=explore).actions
        assert a.shape == (64, 2, 2) and ACT.contains(a[0]) and np.all((a >= LOW) & (a <= HIGH))


def test_logged_env_actions_are_stored_normalised():
    learner = make()
    logged = np.stack([LOW, HIGH, (LOW + HIGH) / 2, LOW + 0.25 * (HIGH - LOW)]).astype(np.float32)
    learner.add(transitions(4, actions=logged))
    stored = learner.replay._data["actions"][:4].numpy()
    assert stored.shape == (4, 4) and stored.dtype == np.float32
    expected = np.array([[-1] * 4, [1] * 4, [0] * 4, [-0.5] * 4]) * np.array([[1 - 1e-6]] * 2 + [[1]] * 2)
    np.testing.assert_allclose(stored, expected, atol=1e-6)
    # out-of-bounds logged actions (a simulator's own controller) are clipped, never atanh-infinite
    over = learner.store_actions((HIGH + 100)[None])
    np.testing.assert_allclose(over, np.full((1, 4), 1 - 1e-6), atol=1e-7)


def test_logp_is_finite_and_matches_the_squashed_gaussian():
    learner = make({"random_warmup": False})
    obs = torch.as_tensor(np.random.default_rng(1).uniform(-1, 1, (256, 3)).astype(np.float32))
    out = learner.compute_actions(obs.numpy())
    assert out.logp.shape == (256,) and out.logp.dtype == np.float32 and np.all(np.isfinite(out.logp))
    # recompute log density of the returned env-space actions: u = atanh(normalised action)
    with torch.no_grad():
        mean, log_std = learner.acting(obs)
    a = torch.as_tensor(learner.store_actions(out.actions), dtype=torch.float64)
    u = torch.atanh(a)
    normal = torch.distributions.Normal(mean.double(), log_std.double().exp())
    logp = (normal.log_prob(u) - torch.log1p(-a.pow(2))).sum(-1) - np.log((HIGH - LOW) / 2).sum()
    np.testing.assert_allclose(out.logp, logp.numpy(), rtol=1e-3, atol=1e-2)
    # saturated tanh (|u| huge) stays finite, and the density integrates to 1 in the 1-D case
    a, lp = squashed_sample(torch.full((3, 1), 30.0), torch.full((3, 1), -5.0), torch.randn(3, 1))
    assert torch.all(torch.isfinite(lp)) and torch.all(a <= 1)
    u = torch.linspace(-12, 12, 200_001, dtype=torch.float64)[:, None]
    mean, log_std = torch.full_like(u, 0.7), torch.full_like(u, 0.3)
    a, lp = squashed_sample(mean, log_std, (u - mean) / log_std.exp())
    density_a = lp.exp().squeeze()                              # density over a in (-1, 1)
    assert abs(torch.trapezoid(density_a, a.squeeze()).item() - 1.0) < 1e-3


def test_explore_false_is_deterministic_mean_and_warmup_is_uniform():
    learner = make({"learning_starts": 1000, "random_warmup": True})
    obs = np.zeros((2000, 3), np.float32)
    greedy = learner.compute_actions(obs, explore=False)
    assert greedy.logp is None and np.all(greedy.actions == greedy.actions[0])
    with torch.no_grad():
        mean, _ = learner.acting(torch.zeros(1, 3))
    np.testing.assert_allclose(greedy.actions[0], learner.to_env(torch.tanh(mean).numpy())[0], rtol=1e-6)
    warm = learner.compute_actions(obs)                    # agent_steps 0 < learning_starts: uniform
    flat = learner.store_actions(warm.actions)
    assert np.all(np.abs(flat.mean(0)) < 0.08) and np.all(np.abs(flat.std(0) - 1 / math.sqrt(3)) < 0.05)
    np.testing.assert_allclose(warm.logp, -np.log(HIGH - LOW).sum(), rtol=1e-5)
    policy = make({"learning_starts": 1000, "random_warmup": False}).compute_actions(obs)
    assert np.all(np.isfinite(policy.logp)) and np.ptp(policy.logp) > 0.1   # the policy's own, not uniform
    with pytest.raises(ValueError):
        SACLearner(OBS, gym.spaces.Discrete(3), SMALL)
    with pytest.raises(ValueError):
        SACLearner(OBS, gym.spaces.Box(-np.inf, np.inf, (2,)), SMALL)


def test_discount_zero_rows_do_not_bootstrap():
    learner = make()
    n = 8
    rewards = torch.arange(n, dtype=torch.float32)
    new_obs = torch.randn(n, 3)
    next_a, next_logp = torch.rand(n, 4) * 2 - 1, torch.randn(n)
    alpha = torch.tensor(0.3)
    discounts = torch.tensor([0.0, 0.99] * (n // 2))
    y = learner.critic_target_values(rewards, discounts, new_obs, next_a, next_logp, alpha)
    with torch.no_grad():
        q_next = learner.critic_target(new_obs, next_a)          # (2, n): both target critics
    assert q_next.shape == (2, n) and not torch.allclose(q_next[0], q_next[1])
    soft_v = torch.minimum(q_next[0], q_next[1]) - alpha * next_logp
    torch.testing.assert_close(y[0::2], rewards[0::2])              # terminated: reward only
    torch.testing.assert_close(y[1::2], rewards[1::2] + 0.99 * soft_v[1::2])  # truncated / ongoing: bootstrap
    # end to end: the replay's discount column is 0 for terminated rows, gamma for truncated ones
    learner.add(transitions(4, terminated=True))
    trunc = transitions(4)
    trunc["truncateds"][:] = True
    learner.add(trunc)
    np.testing.assert_allclose(learner.replay._data["discounts"][:8].numpy(), [0] * 4 + [0.99] * 4)


@pytest.mark.parametrize("target_entropy, direction", [(-50.0, -1), (50.0, +1)])
def test_alpha_tuning_moves_log_alpha_toward_the_target_entropy(target_entropy, direction):
    # entropy of the policy (a few nats at most) vs a target far below / above it
    learner = make({"target_entropy": target_entropy})
    learner.add(transitions(256))
    before = learner.log_alpha.item()
    learner.train(max_updates=20)
    assert learner.updates == 20
    assert direction * (learner.log_alpha.item() - before) > 0.01
    assert learner.target_entropy == target_entropy
    assert make().target_entropy == -4.0                             # "auto": -|A| of the flattened Box


def test_version_bumps_with_updates_and_metrics_are_finite():
    learner = make({"learning_starts": 64})
    assert learner.version == 0
    learner.add(transitions(63))
    assert learner.train() == {} and learner.version == 0
    learner.add(transitions(10))
    metrics = learner.train()
    assert learner.updates == 9 and learner.version == 9
    assert set(metrics) >= {"critic_loss", "actor_loss", "alpha", "alpha_loss", "q_mean", "entropy"}
    assert all(np.isfinite(v) for v in metrics.values())
    before = learner.compute_actions(np.zeros((1, 3), np.float32), explore=False).actions
    learner.add(transitions(5))
    learner.train()
    assert learner.version == 14
    after = learner.compute_actions(np.zeros((1, 3), np.float32), explore=False).actions
    assert not np.array_equal(before, after)                        # acting copy was refreshed


def test_state_dict_round_trip_gives_identical_actions():
    learner = make()
    learner.add(transitions(200))
    learner.train(max_updates=30)
    buf = io.BytesIO()        # through bytes, as a checkpoint: in memory, optimizer state tensors are shared
    torch.save(learner.state_dict(include_replay=True), buf)
    buf.seek(0)
    fresh = make({"seed": 123})
    fresh.load_state_dict(torch.load(buf, weights_only=False))
    obs = np.random.default_rng(2).uniform(-1, 1, (16, 3)).astype(np.float32)
    np.testing.assert_array_equal(learner.compute_actions(obs, explore=False).actions,
                                  fresh.compute_actions(obs, explore=False).actions)
    assert fresh.log_alpha.item() == learner.log_alpha.item() and fresh.version == learner.version == 30
    for a, b in zip(learner.critic_target.parameters(), fresh.critic_target.parameters()):
        assert torch.equal(a, b)
    # the optimizers came back too: the next update is the same in both
    learner.generator.manual_seed(7)
    fresh.generator.manual_seed(7)
    learner.update(learner.replay.sample(32, learner.generator))
    fresh.update(fresh.replay.sample(32, fresh.generator))
    for a, b in zip(learner.actor.parameters(), fresh.actor.parameters()):
        torch.testing.assert_close(a, b)


def test_learns_a_continuous_bandit():
    """One-step episodes: obs x in [-1, 1], reward -(a - (0.5 + 1.5x))^2 on a Box [-2, 3]; terminated
    every step (discount 0), so Q(s, a) is the reward itself and the greedy action must track 0.5 + 1.5x."""
    obs_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    act_space = gym.spaces.Box(-2.0, 3.0, (1,), np.float32)
    learner = SACLearner(obs_space, act_space, {"hidden": [64, 64], "batch_size": 64, "learning_starts": 200,
                                                "seed": 0}, device="cpu")
    rng = np.random.default_rng(0)

    def best(x):
        return 0.5 + 1.5 * x

    for _ in range(60):                      # 60 fragments of 25 one-step episodes: 1300 updates
        x = rng.uniform(-1, 1, (25, 1)).astype(np.float32)
        a = learner.compute_actions(x).actions
        r = -((a[:, 0] - best(x[:, 0])) ** 2)
        batch = transitions(25, obs_dim=1, actions=a, rewards=r.astype(np.float32), terminated=True, rng=rng)
        batch["obs"][:] = x
        learner.add(batch)
        learner.train()
    x = np.linspace(-1, 1, 21, dtype=np.float32)[:, None]
    greedy = learner.compute_actions(x, explore=False).actions[:, 0]
    # seeds 0-5 gave max errors 0.05-0.08 and mean errors 0.02-0.04 (the range is 5 wide)
    assert np.max(np.abs(greedy - best(x[:, 0]))) < 0.2, greedy
    assert np.mean(np.abs(greedy - best(x[:, 0]))) < 0.1


def test_pendulum_runs_end_to_end_in_process():
    """The daemon's calls (fragments of 200 rows with the bridge's columns, then train()) on Pendulum:
    a plumbing check, too short to learn (SAC_PENDULUM's figures are in docs/benchmarks.md)."""
    env = gym.make("Pendulum-v1")
    learner = SACLearner(env.observation_space, env.action_space,
                         {**SAC_PENDULUM, "hidden": [32, 32], "learning_starts": 200, "seed": 0}, device="cpu")
    out = run_inprocess(learner, "Pendulum-v1", 600, seed=0, fragment=200)
    assert out["episodes"] == 3 and all(-2000 < r < 0 for r in out["returns"])
    assert out["updates"] == learner.version == 400
    assert np.all(np.isfinite(list(learner.last_metrics.values())))
    np.testing.assert_allclose(learner.replay._data["discounts"][:600].numpy(), 0.99)   # time limits bootstrap
    assert learner.replay._data["actions"][:600].abs().max() < 1.0
