"""Learners -> PortablePolicy -> numpy (simbridge.client.local_policy) and ONNX: the same outputs as torch.

Every comparison runs the learner's own acting network in torch on random observations and the
exported form on the same observations: Q-values / actor outputs, the greedy actions, and the
preprocessing against simbridge/wire/preprocess.py.
"""
import ast

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch

from simbridge.wire import spaces as sb_spaces
from simbridge.client.local_policy import LocalPolicy, PolicyFormatError, flatten
from simbridge.server.policies import Policy, RandomPolicy
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire import preprocess
from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.trainer.learners.sac import LOG_STD_MAX, LOG_STD_MIN, SACLearner

TOL = dict(rtol=1e-4, atol=1e-5)

OBS_SPACES = {
    "box": gym.spaces.Box(-2.0, 2.0, (4,), np.float32),
    "box2d_f64": gym.spaces.Box(-1.0, 1.0, (2, 3), np.float64),
    "dict": gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
                             "mode": gym.spaces.Discrete(3, start=1),
                             "keys": gym.spaces.MultiBinary(2)}),
    "tuple": gym.spaces.Tuple((gym.spaces.MultiDiscrete([2, 4]), gym.spaces.Box(0.0, 1.0, (2,), np.float32))),
    "discrete": gym.spaces.Discrete(5),
}


def _obs(space, n, seed=0):
    return sb_spaces.sample_batch_of(space, n, np.random.default_rng(seed))


def _dqn(obs_space, act_space, **cfg):
    return DQNLearner(obs_space, act_space, config={"hidden": [32, 16], "seed": 0, **cfg}, device="cpu")


def _onnx_run(msg, flat):
    sess = ort.InferenceSession(msg.onnx_model, providers=["CPUExecutionProvider"])
    return sess.run(["out"], {"obs": flat})[0]


@pytest.mark.parametrize("name", sorted(OBS_SPACES))
def test_flatten_matches_the_trainers_preprocessing(name):
    space = OBS_SPACES[name]
    obs = _obs(space, 7)
    np.testing.assert_array_equal(flatten(space, obs), preprocess.flatten(space, obs))
    learner = _dqn(space, gym.spaces.Discrete(2))
    pol = LocalPolicy(learner.portable())
    for i in range(3):  # the single-observation path flattens the same way
        np.testing.assert_array_equal(pol._flat1(_owned(_row(obs, i))), preprocess.flatten(space, obs)[i])


def _row(value, i):
    if isinstance(value, dict):
        return {k: _row(v, i) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_row(v, i) for v in value)
    return value[i]


def _owned(value):
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_owned(v) for v in value)
    return np.array(value)


@pytest.mark.parametrize("act_space,dueling", [
    (gym.spaces.Discrete(2), False),
    (gym.spaces.Discrete(3, start=-1), True),
    (gym.spaces.MultiDiscrete([3, 5, 2]), False),                 # unequal branches (-inf padding in torch)
    (gym.spaces.MultiDiscrete([[2, 4], [3, 3]], start=[[1, 0], [0, 2]]), True),
])
def test_dqn_numpy_and_onnx_equal_torch(act_space, dueling):
    obs_space = OBS_SPACES["dict"]
    learner = _dqn(obs_space, act_space, dueling=dueling, epsilon_initial=0.0, epsilon_final=0.0)
    msg = learner.portable(include_onnx=True)
    assert msg.head.kind == "q_argmax" and msg.version == learner.version
    pol = LocalPolicy(msg, seed=0)
    obs = _obs(obs_space, 64, seed=1)
    flat = preprocess.flatten(obs_space, obs)
    with torch.no_grad():
        q_torch = learner.acting(torch.as_tensor(flat)).numpy()           # (N, branches, width)
    valid = np.isfinite(q_torch)
    q_np = pol.forward(pol.preprocess(obs))                                # (N, sum(nvec))
    np.testing.assert_allclose(q_np, q_torch[valid].reshape(len(flat), -1), **TOL)
    np.testing.assert_allclose(_onnx_run(msg, flat), q_np, **TOL)
    # Greedy actions (epsilon 0) equal the learner's own, batched and one by one.
    expected = learner.compute_actions(obs, explore=False).actions
    actions, logp = pol.compute_actions(obs)
    np.testing.assert_array_equal(actions, expected)
    assert np.all(logp == 0.0)
    for i in range(5):
        a, lp = pol.act(_owned(_row(obs, i)))
        np.testing.assert_array_equal(a, expected[i])
        assert lp == 0.0


def test_dqn_action_masks_act_as_the_learner():
    if not hasattr(DQNLearner, "allowed"):
        pytest.skip("this DQNLearner has no action masks")
    act_space = gym.spaces.MultiDiscrete([3, 2])
    obs_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
                                 "action_mask": gym.spaces.MultiBinary(5)})
    learner = _dqn(obs_space, act_space, epsilon_initial=0.0, epsilon_final=0.0)
    pol = LocalPolicy(learner.portable(), seed=0)
    obs = _obs(obs_space, 200, seed=4)
    mask = obs["action_mask"]
    expected = learner.compute_actions(obs, explore=False).actions
    actions, _ = pol.compute_actions(obs)
    np.testing.assert_array_equal(actions, expected)
    for i in range(20):
        a, lp = pol.act(_owned(_row(obs, i)))
        np.testing.assert_array_equal(a, expected[i])
    # Exploring, every action is an allowed one (a branch allowing nothing allows all).
    explorer = _dqn(obs_space, act_space, epsilon_initial=1.0, epsilon_final=1.0)
    rnd = LocalPolicy(explorer.portable(), seed=1)
    acts, logp = rnd.compute_actions(obs)
    for b, (o, k) in enumerate([(0, 3), (3, 2)]):
        m = mask[:, o:o + k].astype(bool)
        m[~m.any(1)] = True
        assert m[np.arange(len(acts)), acts[:, b]].all()
    allowed = [mask[:, o:o + k].sum(1) for o, k in [(0, 3), (3, 2)]]
    choices = np.where(allowed[0] == 0, 3, allowed[0]) * np.where(allowed[1] == 0, 2, allowed[1])
    np.testing.assert_allclose(logp, -np.log(choices), rtol=1e-6)


def test_dqn_epsilon_and_logp_follow_the_learner():
    learner = _dqn(OBS_SPACES["box"], gym.spaces.Discrete(4), epsilon_initial=0.5, epsilon_final=0.5)
    msg = learner.portable()
    assert msg.head.params["epsilon"] == pytest.approx(0.5)
    pol = LocalPolicy(msg, seed=3)
    obs = _obs(OBS_SPACES["box"], 1)[0]
    greedy = int(learner.compute_actions(obs[None], explore=False).actions[0])
    draws = [pol.act(obs.copy()) for _ in range(4000)]
    share_greedy = np.mean([a == greedy for a, _ in draws])
    assert share_greedy == pytest.approx(0.5 + 0.5 / 4, abs=0.03)
    for a, lp in draws[:50]:  # p(greedy) = eps/4 + (1 - eps), p(other) = eps/4
        assert lp == pytest.approx(np.log(0.625) if a == greedy else np.log(0.125))


@pytest.mark.parametrize("shape,low,high", [((1,), -2.0, 2.0), ((2, 2), [[-1, 0], [0, -3]], [[1, 5], [2, 3]])])
def test_sac_numpy_and_onnx_equal_torch(shape, low, high):
    act_space = gym.spaces.Box(np.asarray(low, np.float32) * np.ones(shape, np.float32),
                               np.asarray(high, np.float32) * np.ones(shape, np.float32), dtype=np.float32)
    obs_space = OBS_SPACES["box2d_f64"]
    learner = SACLearner(obs_space, act_space, config={"hidden": [32, 32], "seed": 0, "random_warmup": False},
                         device="cpu")
    msg = learner.portable(include_onnx=True)
    assert msg.head.kind == "tanh_gaussian"
    pol = LocalPolicy(msg, seed=0)
    obs = _obs(obs_space, 50, seed=2)
    flat = preprocess.flatten(obs_space, obs)
    with torch.no_grad():
        mean, log_std = learner.acting(torch.as_tensor(flat))
    out = pol.forward(pol.preprocess(obs))
    a = pol.act_dim
    np.testing.assert_allclose(out[:, :a], mean.numpy(), **TOL)
    np.testing.assert_allclose(pol._log_std(out[:, a:].astype(np.float64)), log_std.numpy(), **TOL)
    assert log_std.min() >= LOG_STD_MIN and log_std.max() <= LOG_STD_MAX
    np.testing.assert_allclose(_onnx_run(msg, flat), out, **TOL)
    # Deterministic actions equal the learner's; sampled ones stay in bounds with a finite logp.
    msg.head.params["deterministic"] = 1.0
    det = LocalPolicy(msg)
    expected = learner.compute_actions(obs, explore=False).actions
    np.testing.assert_allclose(det.compute_actions(obs)[0], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(det.act(obs[0].copy())[0], expected[0], rtol=1e-5, atol=1e-5)
    sampled, logp = pol.compute_actions(obs)
    assert act_space.contains(sampled[0]) and np.isfinite(logp).all()
    one, lp = pol.act(obs[0].copy())
    assert one.shape == shape and one.dtype == np.float32 and act_space.contains(one) and np.isfinite(lp)


def test_sac_logp_matches_the_learners_formula():
    """Same noise through both: the local logp is the learner's env-space log density."""
    from simbridge.trainer.learners.sac import squashed_sample
    act_space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
    learner = SACLearner(OBS_SPACES["box"], act_space, config={"hidden": [16], "seed": 0, "random_warmup": False},
                         device="cpu")
    pol = LocalPolicy(learner.portable(), seed=0)
    obs = _obs(OBS_SPACES["box"], 1)[0]
    noise = pol._noise._buf[0].copy()
    action, logp = pol.act(obs.copy())
    with torch.no_grad():
        mean, log_std = learner.acting(torch.as_tensor(obs[None]))
        a, lp = squashed_sample(mean.double(), log_std.double(), torch.as_tensor(noise[None]))
    np.testing.assert_allclose(action, learner.to_env(a.numpy())[0], rtol=1e-5, atol=1e-5)
    assert logp == pytest.approx(float(lp[0]) - learner.log_scale_sum, rel=1e-4)


def test_sac_random_warmup_exports_a_random_head():
    learner = SACLearner(OBS_SPACES["box"], gym.spaces.Box(-1.0, 1.0, (2,), np.float32), device="cpu",
                         config={"hidden": [8], "learning_starts": 100})
    msg = learner.portable()
    assert msg.head.kind == "random" and not msg.layers
    a, logp = LocalPolicy(msg).act(np.zeros(4, np.float32))
    assert a.shape == (2,) and logp == pytest.approx(-2 * np.log(2.0))


def test_export_follows_the_acting_copy_and_is_cached_per_version():
    learner = _dqn(OBS_SPACES["box"], gym.spaces.Discrete(2))
    first = learner.portable()
    assert learner.portable() is first                    # same version: the cached message
    with torch.no_grad():                                  # the online net changes, the acting copy not yet
        for p in learner.q.parameters():
            p.add_(1.0)
    assert learner.portable() is first
    obs = _obs(OBS_SPACES["box"], 8)
    before = LocalPolicy(first).forward(obs)
    learner.updates = 7
    learner.sync_acting()                                  # what train() does after its updates
    second = learner.portable(include_onnx=True)
    assert second.version == 7 and second is not first and second.onnx_model
    assert learner.portable(include_onnx=True) is second   # ONNX exported once per version
    after = LocalPolicy(second).forward(obs)
    with torch.no_grad():
        q = learner.acting(torch.as_tensor(obs)).numpy().reshape(8, -1)
    np.testing.assert_allclose(after, q, **TOL)
    assert not np.allclose(before, after)


def test_random_and_unknown_policies():
    space = gym.spaces.MultiDiscrete([2, 3])
    msg = RandomPolicy(OBS_SPACES["box"], space).portable()
    pol = LocalPolicy(msg, seed=0)
    acts = [pol.act(np.zeros(4, np.float32)) for _ in range(50)]
    assert all(space.contains(a) for a, _ in acts) and acts[0][1] == pytest.approx(-np.log(6))
    assert Policy(OBS_SPACES["box"], space).portable() is None


def test_malformed_messages_are_refused():
    msg = _dqn(OBS_SPACES["box"], gym.spaces.Discrete(2)).portable()
    for mutate, words in [
        (lambda m: setattr(m, "preprocessor", "normalize"), "unknown preprocessor"),
        (lambda m: setattr(m.layers[1], "op", "gelu"), "unknown op"),
        (lambda m: m.head.branch_sizes.append(3), "branch_sizes"),
        (lambda m: m.layers.pop(), "outputs"),
        (lambda m: setattr(m.head, "kind", "softmax"), "unknown action head"),
    ]:
        bad = pb.PortablePolicy()
        bad.CopyFrom(msg)
        mutate(bad)
        with pytest.raises(PolicyFormatError, match=words):
            LocalPolicy(bad)


def test_nan_observations_are_refused():
    pol = LocalPolicy(_dqn(OBS_SPACES["box"], gym.spaces.Discrete(2)).portable())
    with pytest.raises(ValueError, match="NaN"):
        pol.act(np.array([0.0, np.nan, 0.0, 0.0], np.float32))
    rnd = LocalPolicy(RandomPolicy(OBS_SPACES["box"], gym.spaces.Discrete(2)).portable())
    with pytest.raises(ValueError, match="NaN"):
        rnd.act(np.array([0.0, np.nan, 0.0, 0.0], np.float32))


def test_export_knows_no_learner():
    """Each learner exports itself (Learner.export_layers) from export.py's blocks: export.py imports
    nothing of the trainer, so learner -> export -> learner cannot close a circle."""
    from pathlib import Path

    from simbridge.trainer.learners import export
    tree = ast.parse(Path(export.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [m for m in imported if m.startswith("simbridge.trainer")], imported
