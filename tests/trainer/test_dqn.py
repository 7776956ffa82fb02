"""DQNLearner: targets, action branching, epsilon-greedy logp, checkpoints, offline learning,
and one short in-process CartPole run through the same add()/train() calls as the daemon."""
import io

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn

from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.trainer.run.inprocess import run_inprocess

torch.set_num_threads(1)

BOX4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
SMALL = {"hidden": [16, 16], "batch_size": 8, "learning_starts": 0, "seed": 0}


def make(action_space=gym.spaces.Discrete(3), obs_space=BOX4, **config):
    return DQNLearner(obs_space, action_space, {**SMALL, **config})


def transitions(n, obs_space=BOX4, action_space=gym.spaces.Discrete(3), seed=0):
    """n random single-step episodes' worth of rows with the bridge's columns."""
    rng = np.random.default_rng(seed)
    obs, new_obs = rng.uniform(-1, 1, (2, n) + obs_space.shape).astype(np.float32)
    if isinstance(action_space, gym.spaces.Discrete):
        actions = rng.integers(action_space.n, size=n) + action_space.start
    else:
        actions = rng.integers(action_space.nvec, size=(n,) + action_space.shape) + action_space.start
    return SampleBatch(obs=obs, new_obs=new_obs, actions=actions, rewards=rng.normal(size=n).astype(np.float32),
                       terminateds=rng.random(n) < 0.3, truncateds=np.zeros(n, bool),
                       eps_id=np.arange(n), agent_index=np.zeros(n, np.int64), t=np.zeros(n, np.int64),
                       policy_version=np.full(n, -1), action_logp=np.full(n, np.nan, np.float32))


class Table(nn.Module):
    """Q-values by state: obs row i is one-hot of a state; output (B, branches, actions)."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.as_tensor(table, dtype=torch.float32)   # (states, branches, actions)

    def forward(self, obs):
        return self.table[obs.argmax(-1)]


def one_hot(states, n=3):
    return torch.eye(n)[torch.as_tensor(states)]


# ------------------------------------------------------------------ targets

def test_target_uses_discounts_and_zero_for_terminated_rows():
    learner = make(gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (3,), np.float32))
    learner.q = Table([[[0, 0]], [[1, 5]], [[2, 3]]])
    learner.q_target = Table([[[0, 0]], [[10, 20]], [[30, 40]]])
    batch = {"new_obs": one_hot([1, 2, 1]), "rewards": torch.tensor([1.0, 2.0, 3.0]),
             "discounts": torch.tensor([0.99, 0.97 ** 3, 0.0])}       # last row terminated
    y = learner.td_target(batch)
    # online argmax is action 1 in both states -> target Q(s', 1)
    torch.testing.assert_close(y, torch.tensor([1 + 0.99 * 20, 2 + 0.97 ** 3 * 40, 3.0]))


def test_double_q_takes_argmax_from_online_net_and_max_without_it():
    learner = make(gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (3,), np.float32))
    learner.q = Table([[[0, 0]], [[9, 1]], [[0, 0]]])                   # online prefers action 0
    learner.q_target = Table([[[0, 0]], [[2, 7]], [[0, 0]]])            # target's max is action 1
    batch = {"new_obs": one_hot([1]), "rewards": torch.tensor([0.0]), "discounts": torch.tensor([1.0])}
    assert learner.td_target(batch).item() == 2.0
    learner.config["double_q"] = False
    assert learner.td_target(batch).item() == 7.0


def test_branching_target_is_mean_over_branches_of_target_at_online_argmax():
    learner = make(gym.spaces.MultiDiscrete([2, 2]), gym.spaces.Box(0, 1, (3,), np.float32))
    learner.q = Table(np.zeros((3, 2, 2)) + np.array([[0, 1], [1, 0]]))      # online: a* = (1, 0)
    learner.q_target = Table(np.zeros((3, 2, 2)) + np.array([[5, 2], [4, 8]]))
    batch = {"new_obs": one_hot([0]), "rewards": torch.tensor([1.0]), "discounts": torch.tensor([0.5])}
    assert learner.td_target(batch).item() == pytest.approx(1 + 0.5 * (2 + 4) / 2)


def own_and_logged(n_own, n_logged):
    """Rows of transitions(): the first n_own acted by the learner (version 0, a logp), the rest logged."""
    batch = transitions(n_own + n_logged)
    batch["policy_version"] = np.where(np.arange(n_own + n_logged) < n_own, 0, -1)
    batch["action_logp"] = np.where(np.arange(n_own + n_logged) < n_own, -0.1, np.nan).astype(np.float32)
    return batch


def test_environment_target_values_next_state_as_the_mix_of_greedy_and_the_simulators_share():
    """logged_actions "environment": with a share p of logged rows, s' is worth
    (1 - p) Q'(s', a*) + p * mean_a Q'(s', a); with none, or "ignore", plain double DQN."""
    space, obs_space = gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (3,), np.float32)
    batch = {"new_obs": one_hot([1, 2]), "rewards": torch.tensor([1.0, 0.0]), "discounts": torch.tensor([0.5, 0.0])}
    for mode, own, logged, p in [("environment", 30, 10, 0.25), ("environment", 40, 0, 0.0), ("ignore", 30, 10, 0.0)]:
        learner = make(space, obs_space, logged_actions=mode, learning_starts=10 ** 6)
        learner.add(own_and_logged(own, logged))
        assert learner.logged_share() == p
        learner.q = Table([[[0, 0]], [[1, 5]], [[2, 3]]])            # online a* = 1 in both states
        learner.q_target = Table([[[0, 0]], [[10, 20]], [[30, 40]]])
        want = 1 + 0.5 * ((1 - p) * 20 + p * 15)                      # second row terminated: 0
        torch.testing.assert_close(learner.td_target(batch), torch.tensor([want, 0.0]), msg=mode)


def test_environment_target_averages_over_allowed_actions_only():
    learner = make(gym.spaces.Discrete(3), masked_space(3), logged_actions="environment", learning_starts=10 ** 6)
    rows = own_and_logged(1, 1)
    rows["obs"] = rows["new_obs"] = {"action_mask": np.ones((2, 3), np.int8), "obs_0": np.zeros((2, 2), np.float32)}
    learner.add(rows)
    assert learner.logged_share() == 0.5
    learner.q = Fixed([[0.0, 5.0, 9.0]])
    learner.q_target = Fixed([[1.0, 2.0, 30.0]])
    new_obs = learner.obs_tensor({"action_mask": np.array([[1, 1, 0]], np.int8), "obs_0": np.zeros((1, 2), np.float32)})
    y = learner.td_target({"new_obs": new_obs, "rewards": torch.zeros(1), "discounts": torch.ones(1)})
    torch.testing.assert_close(y, torch.tensor([0.5 * 2.0 + 0.5 * (1.0 + 2.0) / 2]))   # 30 is masked


def test_logged_share_survives_a_checkpoint_and_bad_modes_are_refused():
    learner = make(logged_actions="environment", learning_starts=10 ** 6)
    learner.add(own_and_logged(3, 1))
    other = make(logged_actions="environment", learning_starts=10 ** 6)
    other.load_state_dict(learner.state_dict())
    assert other.logged_share() == learner.logged_share() == 0.25
    with pytest.raises(ValueError, match="logged_actions"):
        make(logged_actions="sometimes")


# ------------------------------------------------------------------ branching

def test_multidiscrete_branches_shapes_bounds_and_update():
    space = gym.spaces.MultiDiscrete([3, 2, 4], start=[1, 0, -2])
    learner = make(space, dueling=True)
    q = learner.q(torch.zeros(5, 4))
    assert q.shape == (5, 3, 4)
    assert torch.isinf(q[:, 0, 3]).all() and torch.isinf(q[:, 1, 2:]).all()   # padding
    assert torch.isfinite(q[:, 2]).all()
    out = learner.compute_actions(np.zeros((64, 4), np.float32))
    assert out.actions.shape == (64, 3) and out.actions.dtype == space.dtype
    assert all(space.contains(a) for a in out.actions)
    assert out.logp.shape == (64,) and out.logp.dtype == np.float32
    idx = learner.store_actions(out.actions)
    assert idx.shape == (64, 3) and idx.min() >= 0 and (idx < [3, 2, 4]).all()
    learner.add(transitions(32, action_space=space))
    learner.config["updates_per_step"] = 0.25
    metrics = learner.train()
    assert learner.updates == 8 and np.isfinite(metrics["loss"])


@pytest.mark.parametrize("space", [gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([3, 3]),
                                   gym.spaces.MultiDiscrete([3, 2])])
def test_dueling_q_averages_to_the_shared_value_in_every_branch(space):
    net = make(space, dueling=True).q
    obs = torch.randn(5, 4)
    q = net(obs)
    valid = torch.isfinite(q)
    branch_mean = q.masked_fill(~valid, 0).sum(-1) / valid.sum(-1)
    value = net.value(net.body(obs))                               # (5, 1)
    torch.testing.assert_close(branch_mean, value.expand_as(branch_mean))


def test_two_dimensional_multidiscrete_keeps_the_space_shape():
    space = gym.spaces.MultiDiscrete([[2, 3], [4, 5]])
    learner = make(space)
    out = learner.compute_actions(np.zeros((7, 4), np.float32))
    assert out.actions.shape == (7, 2, 2) and all(space.contains(a) for a in out.actions)
    assert learner.store_actions(out.actions).shape == (7, 4)


def test_discrete_with_start_round_trips():
    space = gym.spaces.Discrete(3, start=-1)
    learner = make(space)
    out = learner.compute_actions(np.zeros((50, 4), np.float32))
    assert out.actions.shape == (50,) and set(out.actions.tolist()) <= {-1, 0, 1}
    np.testing.assert_array_equal(learner.store_actions(out.actions)[:, 0], out.actions + 1)


def test_dqn_refuses_continuous_actions():
    with pytest.raises(ValueError, match="Discrete or MultiDiscrete"):
        make(gym.spaces.Box(-1, 1, (2,)))


# ------------------------------------------------------------------ acting

def test_epsilon_schedule_is_linear_in_agent_steps_then_flat():
    learner = make(epsilon_initial=1.0, epsilon_final=0.1, epsilon_timesteps=1000)
    for steps, eps in [(0, 1.0), (500, 0.55), (1000, 0.1), (10_000, 0.1)]:
        learner.agent_steps = steps
        assert learner.epsilon() == pytest.approx(eps)


def test_environment_mode_counts_the_simulators_uniform_choices_in_the_epsilon_floor():
    """With logged_actions "environment" a share p of the actions is already uniform: the learner's
    own floor is what makes all actions together random at epsilon_final, none when p >= it."""
    for mode, own, logged, final in [("environment", 7, 3, 0.0), ("environment", 99, 1, (0.02 - 0.01) / 0.99),
                                     ("environment", 10, 0, 0.02), ("ignore", 7, 3, 0.02)]:
        learner = make(logged_actions=mode, epsilon_initial=1.0, epsilon_final=0.02, epsilon_timesteps=1000,
                       learning_starts=10 ** 6)
        learner.add(own_and_logged(own, logged))
        learner.agent_steps = 500
        assert learner.epsilon() == pytest.approx((1.0 + final) / 2), mode
        learner.agent_steps = 1000
        assert learner.epsilon() == pytest.approx(final), mode


def test_a_learner_process_parent_counts_logged_rows_for_its_acting_epsilon():
    """Through the bridge the parent acts while a child trains: it counts the rows as it sends them."""
    from simbridge.trainer.run.learner_process import LearnerProcess
    learner = make(logged_actions="environment", epsilon_final=0.02, epsilon_timesteps=10, learning_starts=10 ** 6)
    proc = LearnerProcess("default_policy", learner)
    try:
        proc.add(own_and_logged(7, 3))
        assert learner.logged_share() == pytest.approx(0.3) and learner.epsilon() == 0.0
    finally:
        proc.close()


def test_learning_rate_is_constant_or_decays_linearly_to_lr_final():
    assert make(lr=3e-4).learning_rate() == 3e-4
    learner = make(lr=1e-3, lr_final=1e-4, lr_timesteps=1000, updates_per_step=0.01)
    for steps, lr in [(0, 1e-3), (500, 5.5e-4), (1000, 1e-4), (5000, 1e-4)]:
        learner.agent_steps = steps
        assert learner.learning_rate() == pytest.approx(lr)
    learner.add(transitions(100))                                  # agent_steps 5100: one update
    learner.train()
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)


def test_logp_is_that_of_the_epsilon_greedy_distribution():
    n = 4
    learner = make(gym.spaces.Discrete(n), epsilon_initial=0.4, epsilon_final=0.4)
    obs = np.tile(np.array([[0.1, -0.2, 0.3, 0.5]], np.float32), (20_000, 1))
    greedy = learner.compute_actions(obs[:1], explore=False)
    assert greedy.logp[0] == 0.0
    g = greedy.actions[0]
    out = learner.compute_actions(obs)
    p_greedy, p_other = 0.6 + 0.4 / n, 0.4 / n
    np.testing.assert_allclose(out.logp, np.where(out.actions == g, np.log(p_greedy), np.log(p_other)),
                               rtol=1e-6)
    assert np.mean(out.actions == g) == pytest.approx(p_greedy, abs=0.02)
    assert out.logp.dtype == np.float32


def test_logp_for_branches_is_of_the_joint_action():
    space = gym.spaces.MultiDiscrete([2, 3])
    learner = make(space, epsilon_initial=0.5, epsilon_final=0.5)
    obs = np.zeros((5000, 4), np.float32)
    g = learner.compute_actions(obs[:1], explore=False).actions[0]
    out = learner.compute_actions(obs)
    is_greedy = (out.actions == g).all(axis=1)
    np.testing.assert_allclose(np.exp(out.logp), np.where(is_greedy, 0.5 + 0.5 / 6, 0.5 / 6), rtol=1e-6)
    assert is_greedy.mean() == pytest.approx(0.5 + 0.5 / 6, abs=0.03)


# ------------------------------------------------------------------ training and checkpoints

def test_version_counts_updates_in_the_acting_weights():
    learner = make(learning_starts=10, updates_per_step=0.5)
    obs = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    q_before = learner.acting(torch.as_tensor(obs)).clone()
    learner.add(transitions(8))
    assert learner.train() == {} and learner.version == 0          # not yet at learning_starts
    learner.add(transitions(20))
    metrics = learner.train()
    assert learner.updates == 9 and learner.version == 9           # (28 - 10) * 0.5
    assert set(metrics) >= {"loss", "q_mean", "grad_norm", "epsilon"}
    assert not torch.equal(learner.acting(torch.as_tensor(obs)), q_before)
    assert learner.train() == {}                                   # nothing more due


def test_hard_target_update_copies_every_interval():
    learner = make(target_update_interval=3, tau=1.0, updates_per_step=1.0, batch_size=2)
    learner.add(transitions(2))
    learner.train()                                                # 2 updates: no copy yet
    assert not torch.equal(learner.q_target.advantage.weight, learner.q.advantage.weight)
    learner.add(transitions(1))
    learner.train()                                                # 3rd update copies
    assert torch.equal(learner.q_target.advantage.weight, learner.q.advantage.weight)


def test_state_dict_round_trip_restores_identical_actions():
    learner = make(epsilon_initial=0.5, epsilon_final=0.5, updates_per_step=0.5)
    learner.add(transitions(40))
    learner.train()
    buf = io.BytesIO()
    torch.save(learner.state_dict(include_replay=True), buf)
    buf.seek(0)
    other = make(seed=123, epsilon_initial=0.5, epsilon_final=0.5, updates_per_step=0.5)
    other.load_state_dict(torch.load(buf, weights_only=False))
    obs = np.random.default_rng(2).normal(size=(200, 4)).astype(np.float32)
    for explore in (False, True):                                  # exploration rng restored too
        a, b = learner.compute_actions(obs, explore), other.compute_actions(obs, explore)
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.logp, b.logp)
    assert other.version == learner.version == 20 and len(other.replay) == 40
    for name in ("q", "q_target"):
        for p, p2 in zip(getattr(learner, name).parameters(), getattr(other, name).parameters()):
            assert torch.equal(p, p2)


def test_learns_the_right_greedy_actions_offline_from_logged_actions():
    """Two states. In s0, action 1 pays 1 and ends; action 0 pays 0 and leads to s1, where
    action 0 pays 10 (action 1 pays 0); both end. With gamma 0.9, Q(s0, 0) = 9 > Q(s0, 1) = 1:
    only bootstrapping through s1 finds it. Data: uniformly random logged actions (version -1)."""
    obs_space = gym.spaces.Discrete(2)
    learner = DQNLearner(obs_space, gym.spaces.Discrete(2),
                         {"hidden": [32], "batch_size": 64, "lr": 3e-3, "gamma": 0.9, "n_step": 1,
                          "learning_starts": 0, "updates_per_step": 0.25, "seed": 0,
                          "target_update_interval": 50, "tau": 1.0})
    rng = np.random.default_rng(0)
    rows = {k: [] for k in ("obs", "new_obs", "actions", "rewards", "terminateds", "eps_id", "t")}
    for ep in range(1000):
        a0 = int(rng.integers(2))
        steps = [(0, 1, a0, 0.0, False)] if a0 == 0 else [(0, 0, a0, 1.0, True)]
        if a0 == 0:
            a1 = int(rng.integers(2))
            steps.append((1, 1, a1, 10.0 if a1 == 0 else 0.0, True))
        for t, (s, s2, a, r, done) in enumerate(steps):
            for k, v in zip(rows, (s, s2, a, r, done, ep, t)):
                rows[k].append(v)
    n = len(rows["obs"])
    batch = SampleBatch(obs=np.array(rows["obs"]), new_obs=np.array(rows["new_obs"]),
                        actions=np.array(rows["actions"]), rewards=np.array(rows["rewards"], np.float32),
                        terminateds=np.array(rows["terminateds"]), truncateds=np.zeros(n, bool),
                        eps_id=np.array(rows["eps_id"]), agent_index=np.zeros(n, np.int64),
                        t=np.array(rows["t"]), policy_version=np.full(n, -1),
                        action_logp=np.full(n, np.nan, np.float32))
    learner.add(batch)
    learner.train()
    assert learner.updates == n // 4
    greedy = learner.compute_actions(np.array([0, 1]), explore=False).actions
    np.testing.assert_array_equal(greedy, [0, 0])
    q = learner.q(learner.obs_tensor(np.array([0, 1])))[:, 0].detach()
    np.testing.assert_allclose(q.numpy(), [[9, 1], [10, 0]], atol=1.0)


# ------------------------------------------------------------------ the in-process harness
# (the preset's CartPole solve is tests/e2e/test_learning_e2e.py's, through the bridge)

class Recorder:
    """A stand-in learner: acts 0 with logp -1, records what the harness hands it."""

    def __init__(self):
        self.version, self.updates, self.last_metrics, self.batches = 7, 0, {}, []

    def compute_actions(self, obs, explore=True):
        from simbridge.server.policies import ActionBatch
        return ActionBatch(np.zeros(len(obs), np.int64), np.full(len(obs), -1.0, np.float32))

    def add(self, batch):
        self.batches.append(batch)

    def train(self):
        return {}


def test_inprocess_hands_over_bridge_columns_in_fragments_with_truncation():
    rec = Recorder()
    out = run_inprocess(rec, "CartPole-v1", 50, seed=0, fragment=4, off_policy_fraction=0.5,
                        env_kwargs={"max_episode_steps": 6})
    assert [b.count for b in rec.batches] == [4] * 12 + [2] and out["env_steps"] == 50
    b = SampleBatch.concat_samples(rec.batches)
    assert set(b.keys()) == {"obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "eps_id",
                             "agent_index", "t", "policy_version", "action_logp"}
    ends = b["terminateds"] | b["truncateds"]
    assert not (b["terminateds"] & b["truncateds"]).any()
    np.testing.assert_array_equal(b["t"][ends], np.asarray(out["lengths"]) - 1)
    assert b["truncateds"].any()                                   # 6-step time limit hit
    np.testing.assert_array_equal(b["obs"][1:][~ends[:-1]], b["new_obs"][:-1][~ends[:-1]])
    assert (b["agent_index"] == 0).all() and np.all(np.diff(b["eps_id"]) >= 0)
    logged = b["policy_version"] == -1
    assert 10 < logged.sum() < 40 and np.isnan(b["action_logp"][logged]).all()
    assert (b["policy_version"][~logged] == 7).all() and (b["action_logp"][~logged] == -1).all()


# ------------------------------------------------------------------ action masks (Unity connector)

def masked_space(n_mask):
    """The Unity connector's observation for a behavior with masks: 1 = allowed."""
    return gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(n_mask), "obs_0": gym.spaces.Box(-1, 1, (2,))})


class Fixed(nn.Module):
    """The same Q-values for every row: (B, branches, actions)."""

    def __init__(self, q):
        super().__init__()
        self.q = torch.as_tensor(q, dtype=torch.float32)

    def forward(self, obs):
        return self.q.expand(len(obs), *self.q.shape)


def test_inprocess_stops_at_the_target_without_training_on_the_rows_after_it():
    # Its wall time is bench/learning.py's reference: the time to the target, as the bridge run's.
    # It trained on the fragment under way after reaching it (SAC Pendulum: 200 more updates, ~2 s).
    rec = Recorder()
    out = run_inprocess(rec, "CartPole-v1", 1_000, seed=0, fragment=4, stop_at_return=-1.0,
                        env_kwargs={"max_episode_steps": 6})
    assert out["reached_step"] == 60 == out["env_steps"]          # the 10th 6-step episode's end
    assert sum(b.count for b in rec.batches) == 56                # 14 fragments; the last 4 rows unused


def test_masked_actions_are_never_chosen_greedy_or_exploring_and_logp_counts_allowed_only():
    learner = make(gym.spaces.Discrete(4), masked_space(4), epsilon_initial=0.5, epsilon_final=0.5)
    q = Fixed([[0.0, 1.0, 2.0, 3.0]])                      # action 3 is the unmasked favourite
    mask = np.array([[1, 1, 1, 0]] * 3000 + [[0, 1, 0, 0]] * 1000, np.int8)
    obs = learner.obs_tensor({"action_mask": mask, "obs_0": np.zeros((len(mask), 2), np.float32)})
    greedy, _ = learner.act(q, obs, explore=False)
    np.testing.assert_array_equal(greedy, [2] * 3000 + [1] * 1000)     # best allowed, not 3
    actions, logp = learner.act(q, obs, explore=True)
    assert mask[np.arange(len(mask)), actions].all()                   # never a masked action
    first = actions[:3000]
    assert set(first) == {0, 1, 2} and np.mean(first == 2) == pytest.approx(0.5 + 0.5 / 3, abs=0.04)
    np.testing.assert_allclose(np.exp(logp[:3000]), np.where(first == 2, 0.5 + 0.5 / 3, 0.5 / 3), rtol=1e-6)
    np.testing.assert_allclose(np.exp(logp[3000:]), 1.0, rtol=1e-6)   # one allowed action: certain


def test_masks_apply_per_branch_of_multidiscrete():
    learner = make(gym.spaces.MultiDiscrete([3, 2]), masked_space(5), epsilon_initial=1.0, epsilon_final=1.0)
    mask = np.tile(np.array([[0, 1, 1, 1, 0]], np.int8), (2000, 1))   # branch 0: not 0; branch 1: only 0
    obs = learner.obs_tensor({"action_mask": mask, "obs_0": np.zeros((2000, 2), np.float32)})
    actions, logp = learner.act(learner.acting, obs, explore=True)
    assert set(actions[:, 0]) == {1, 2} and set(actions[:, 1]) == {0}
    np.testing.assert_allclose(np.exp(logp), 0.5, rtol=1e-6)          # 2 x 1 allowed joint actions


def test_target_bootstraps_from_the_best_allowed_next_action():
    learner = make(gym.spaces.Discrete(3), masked_space(3))
    learner.q = Fixed([[0.0, 5.0, 9.0]])
    learner.q_target = Fixed([[1.0, 2.0, 30.0]])
    new_obs = learner.obs_tensor({"action_mask": np.array([[1, 1, 0], [1, 1, 1]], np.int8),
                                  "obs_0": np.zeros((2, 2), np.float32)})
    batch = {"new_obs": new_obs, "rewards": torch.zeros(2), "discounts": torch.ones(2)}
    torch.testing.assert_close(learner.td_target(batch), torch.tensor([2.0, 30.0]))  # action 1 when 2 is masked


def test_mask_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="action_mask"):
        make(gym.spaces.Discrete(4), masked_space(3))
