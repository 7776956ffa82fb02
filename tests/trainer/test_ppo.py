"""PPOLearner: rows kept, dropped and corrected; iterations in the daemon's chunks; acting and training
agree on logp for every action space; greedy determinism; export equal to torch; checkpoints;
and CartPole learned in process within a step budget."""
import io

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch

from simbridge.client.local_policy import LocalPolicy
from simbridge.trainer.config.trainer_config import ALGORITHMS
from simbridge.trainer.learners.ppo import PPOLearner
from simbridge.wire import preprocess
from simbridge.wire import spaces as sb_spaces
from support.batches import acted_rows

torch.set_num_threads(1)

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
SMALL = {"hidden": [16, 16], "train_batch_size": 32, "minibatch_size": 8, "num_epochs": 2, "seed": 0}
HYBRID = gym.spaces.Dict({"continuous": gym.spaces.Box(-2.0, 1.0, (2,), np.float32),
                          "discrete": gym.spaces.MultiDiscrete([3, 2])})
SPACES = {
    "discrete": gym.spaces.Discrete(3, start=-1),
    "multidiscrete": gym.spaces.MultiDiscrete([[2, 4], [3, 3]], start=[[1, 0], [0, 2]]),
    "box": gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32)),
    "hybrid": HYBRID,
}


def make(act_space=gym.spaces.Discrete(2), obs_space=OBS, **cfg):
    return PPOLearner(obs_space, act_space, {**SMALL, **cfg}, device="cpu")


def test_ppo_is_a_registered_algorithm():
    assert ALGORITHMS["ppo"] == "simbridge.trainer.learners.ppo:PPOLearner"


def test_replay_keys_are_refused():
    with pytest.raises(ValueError, match="no replay buffer"):
        make(buffer_size=10)


# ------------------------------------------------------------------ rows dropped and corrected

def test_logged_greedy_and_stale_rows_are_dropped_and_counted_lagged_ones_kept():
    learner = make()
    learner.add(acted_rows(learner, 5, version=-1, logp=np.nan))           # the simulator's own actions
    learner.add(acted_rows(learner, 4, logp=np.nan))                       # acted without a logp (explore=False)
    learner.add(acted_rows(learner, 3, logp=0.0))                          # greedy: a deterministic behaviour
    c = learner.counters
    assert (c["rows_dropped_logged"], c["rows_dropped_greedy"], learner.incoming_rows) == (9, 3, 0)
    learner.add(acted_rows(learner, 32))
    assert learner.updates_due() == 2 * 4
    learner.train()
    assert learner.version == 8 and learner.previous_version == 0
    learner.add(acted_rows(learner, 30, version=0, eps_id=1))             # one iteration behind: kept, corrected
    learner.add(acted_rows(learner, 2, version=8, eps_id=2))
    learner.train()
    assert learner.version == 16 and learner.counters["rows_lagged"] == 30
    assert learner.counters["rows_dropped_stale"] == 0
    learner.add(acted_rows(learner, 7, version=0, eps_id=3))              # two iterations behind: stale
    assert learner.counters["rows_dropped_stale"] == 7 and learner.incoming_rows == 0
    m = learner.last_metrics                                         # current, not as of the last iteration
    assert m["rows_dropped_logged"] == 9 and m["rows_dropped_greedy"] == 3 and m["rows_lagged"] == 30
    assert m["rows_dropped_stale"] == 7


@pytest.mark.parametrize("shift, clipped", [(0.0, 0.0), (-1.0, 1.0)])
def test_the_ratio_is_taken_against_the_recorded_logp(shift, clipped):
    """One update on one minibatch: with the logp recorded as acted, every ratio is 1 (nothing
    clipped); recorded 1 nat lower (a behaviour that found these actions rarer), every ratio is
    e > 1 + clip_param."""
    learner = make(gym.spaces.Discrete(3), num_epochs=1, minibatch_size=32)
    batch = acted_rows(learner, 32)
    batch["action_logp"] = batch["action_logp"] + np.float32(shift)
    learner.add(batch)
    learner.train()
    assert learner.last_metrics["clip_frac"] == clipped
    assert learner.last_metrics["approx_kl"] == pytest.approx(0.0 if not shift else np.e - 2, abs=1e-4)


def test_a_sure_policys_own_rows_are_not_mistaken_for_greedy_ones():
    learner = make(gym.spaces.Discrete(2))
    with torch.no_grad():                                   # logits 40 apart: p = 1 in float32
        learner.acting.net[-1].bias.copy_(torch.tensor([40.0, 0.0]))
    batch = acted_rows(learner, 10)
    assert (batch["actions"] == 0).all() and (batch["action_logp"] < 0).all()
    learner.add(batch)
    assert learner.counters["rows_dropped_greedy"] == 0 and learner.incoming_rows == 10


def test_rows_waiting_when_newer_weights_are_published_become_stale():
    learner = make(max_policy_lag=0)                                   # only rows of the current weights
    learner.add(acted_rows(learner, 32))
    learner.add(acted_rows(learner, 5, eps_id=1))                            # waits: the iteration takes all 37
    learner.train()
    learner.add(acted_rows(learner, 6, version=0, eps_id=2))
    assert learner.counters["rows_dropped_stale"] == 6 and learner.counters["rows_trained"] == 37


def test_an_iteration_runs_in_chunks_and_publishes_weights_only_at_its_end():
    learner = make(train_batch_size=32, minibatch_size=8, num_epochs=3)
    assert learner.updates_due() == 0
    learner.add(acted_rows(learner, 20))
    assert learner.updates_due() == 0                                   # fewer than train_batch_size
    learner.add(acted_rows(learner, 12, eps_id=1))
    assert learner.updates_due() == 12
    before = [p.clone() for p in learner.acting.parameters()]
    learner.train(max_updates=5)
    assert (learner.updates, learner.version, learner.updates_due()) == (5, 0, 7)
    assert all(torch.equal(a, b) for a, b in zip(before, learner.acting.parameters()))
    learner.add(acted_rows(learner, 40, eps_id=2))                            # mid-iteration: the next one's
    assert learner.updates_due() == 7
    learner.train(max_updates=64)
    assert (learner.updates, learner.version) == (12, 12)
    assert not all(torch.equal(a, b) for a, b in zip(before, learner.acting.parameters()))
    assert learner.incoming_rows == 40 and learner.updates_due() == 3 * 5
    assert learner.counters["rows_trained"] == 32


@pytest.mark.parametrize("act", [gym.spaces.Discrete(2), gym.spaces.Box(-1.0, 1.0, (2,)),
                                 gym.spaces.Dict({"continuous": gym.spaces.Box(-1.0, 1.0, (2,)),
                                                  "discrete": gym.spaces.MultiDiscrete([2, 3])})],
                         ids=["discrete", "box", "hybrid"])
def test_a_group_ranks_sit_out_iteration_has_its_updates_and_gradients_and_leaves_the_rows(act):
    """trainer/distributed/group.py: a rank with too few rows runs the group's iteration on no rows: the same
    number of updates, a gradient (zero) on exactly the parameters a real iteration gives one (each
    is one all_reduce's worth, in the same order), and its rows wait for the next iteration."""
    full, empty = make(act, train_batch_size=8, minibatch_size=4, num_epochs=2), \
        make(act, train_batch_size=8, minibatch_size=4, num_epochs=2)
    full.add(acted_rows(full, 8))
    empty.add(acted_rows(empty, 3))
    full.iteration = full.start_iteration(per_epoch=3)
    empty.iteration = empty.start_iteration(per_epoch=3, take_rows=False)
    assert len(full.iteration["steps"]) == len(empty.iteration["steps"]) == 6
    grads = {}
    for name, learner in (("full", full), ("empty", empty)):
        learner.run_updates(1, keep_metrics=name == "full")
        grads[name] = [p.grad for p in learner.optimizer.param_groups[0]["params"]]
    assert [g is None for g in grads["full"]] == [g is None for g in grads["empty"]]
    assert all(not g.any() for g in grads["empty"] if g is not None)
    empty.run_updates(5, keep_metrics=False)
    assert (empty.updates, empty.iteration, empty.incoming_rows) == (6, None, 3)
    assert empty.counters["rows_trained"] == 0 and "policy_loss" not in empty.last_metrics


def test_memory_estimate_is_the_rollout_buffer_not_a_replay_buffer():
    est = PPOLearner.memory_estimate(OBS, gym.spaces.Discrete(2), {"train_batch_size": 1000})
    assert est["replay"] == 2 * 1000 * est["transition"]


# ------------------------------------------------------------------ acting and training agree

@pytest.mark.parametrize("name", sorted(SPACES))
def test_acting_logp_equals_the_training_logp_of_the_same_actions(name):
    learner = make(SPACES[name], log_std_init=-0.5)
    obs = np.random.default_rng(1).uniform(-1, 1, (64, 3)).astype(np.float32)
    out = learner.compute_actions(obs, explore=True)
    idx, a = learner.layout.from_env(out.actions)
    with torch.no_grad():
        flat = torch.as_tensor(obs)
        logp, entropy = learner.layout.log_prob(learner.policy(flat), learner.policy.log_std, None,
                                                torch.as_tensor(idx), torch.as_tensor(a))
    np.testing.assert_allclose(logp.numpy(), out.logp, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(entropy).all()
    for i in range(len(obs)):   # every action lies in the space
        assert learner.action_space.contains(sb_spaces.unbatch_row0(learner.action_space,
                                                                    _take(out.actions, i))), i


def _take(value, i):
    if isinstance(value, dict):
        return {k: _take(v, i) for k, v in value.items()}
    return value[i:i + 1]


@pytest.mark.parametrize("name", sorted(SPACES))
def test_greedy_actions_are_deterministic_and_have_no_logp(name):
    learner = make(SPACES[name])
    obs = np.random.default_rng(2).uniform(-1, 1, (50, 3)).astype(np.float32)
    first = learner.compute_actions(obs, explore=False)
    assert first.logp is None
    for _ in range(3):
        again = learner.compute_actions(obs, explore=False).actions
        if isinstance(again, dict):
            for k in again:
                np.testing.assert_array_equal(again[k], first.actions[k])
        else:
            np.testing.assert_array_equal(again, first.actions)
    sampled = learner.compute_actions(obs, explore=True).actions   # exploring differs somewhere
    flat = lambda x: np.concatenate([np.asarray(v, np.float64).reshape(50, -1) for v in x.values()], 1) \
        if isinstance(x, dict) else np.asarray(x, np.float64)
    assert not np.array_equal(flat(sampled), flat(first.actions))


def test_masked_actions_are_never_chosen_and_training_respects_the_mask():
    obs_space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                                 "action_mask": gym.spaces.MultiBinary(5)})
    learner = make(gym.spaces.MultiDiscrete([3, 2]), obs_space)
    rng = np.random.default_rng(3)
    n = 400
    mask = np.ones((n, 5), np.int8)
    mask[:, 0] = mask[:, 2] = 0           # branch 0: only action 1
    mask[: n // 2, 3:] = 0                # branch 1 allows nothing in half the rows: then all
    obs = {"x": rng.uniform(-1, 1, (n, 2)).astype(np.float32), "action_mask": mask}
    for explore in (True, False):
        acts = learner.compute_actions(obs, explore=explore).actions
        assert (acts[:, 0] == 1).all()
        if explore:   # branch 1 allowing nothing allows both
            assert set(acts[: n // 2, 1]) == {0, 1}
    out = learner.compute_actions(obs, explore=True)
    assert np.all(out.logp[n // 2:] <= 0) and np.isfinite(out.logp).all()
    with pytest.raises(ValueError, match="action_mask"):
        make(gym.spaces.Discrete(4), obs_space)


# ------------------------------------------------------------------ export and checkpoints

@pytest.mark.parametrize("name", ["discrete", "multidiscrete", "box"])
def test_export_numpy_and_onnx_equal_torch_and_act_greedily_like_the_learner(name):
    learner = make(SPACES[name], log_std_init=-0.7)
    learner.add(acted_rows(learner, 32))
    learner.train()                                  # non-trivial weights
    msg = learner.portable(include_onnx=True)
    assert msg.version == learner.version == 8
    obs = np.random.default_rng(4).uniform(-1, 1, (64, 3)).astype(np.float32)
    flat = preprocess.flatten(OBS, obs)
    with torch.no_grad():
        out = learner.acting(torch.as_tensor(flat)).numpy()
    if name == "box":
        out = np.concatenate([out, np.tile(learner.acting.log_std.detach().numpy(), (64, 1))], 1)
    pol = LocalPolicy(msg, seed=0)
    np.testing.assert_allclose(pol.forward(flat), out, rtol=1e-4, atol=1e-5)
    sess = ort.InferenceSession(msg.onnx_model, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(["out"], {"obs": flat})[0], out, rtol=1e-4, atol=1e-5)
    greedy = learner.compute_actions(obs, explore=False).actions
    np.testing.assert_allclose(pol.compute_actions(obs)[0], greedy, rtol=1e-5, atol=1e-6)


def test_hybrid_actions_have_no_portable_form():
    assert make(HYBRID).portable() is None


def test_checkpoint_round_trip_gives_identical_actions_and_counters():
    learner = make(gym.spaces.MultiDiscrete([3, 2]))
    learner.add(acted_rows(learner, 4, version=-1, logp=np.nan))
    learner.add(acted_rows(learner, 32))
    learner.train()
    buf = io.BytesIO()
    torch.save(learner.state_dict(include_replay=True), buf)
    buf.seek(0)
    other = make(gym.spaces.MultiDiscrete([3, 2]), seed=123)
    other.load_state_dict(torch.load(buf, weights_only=True))     # checkpoint.py's safe loader
    obs = np.random.default_rng(5).uniform(-1, 1, (100, 3)).astype(np.float32)
    np.testing.assert_array_equal(learner.compute_actions(obs, False).actions, other.compute_actions(obs, False).actions)
    assert other.version == learner.version == 8 and other.previous_version == 0
    assert other.counters == learner.counters and other.counters["rows_dropped_logged"] == 4
    for p, q in zip(learner.optimizer.state_dict()["state"].values(), other.optimizer.state_dict()["state"].values()):
        assert torch.equal(p["exp_avg"], q["exp_avg"])
