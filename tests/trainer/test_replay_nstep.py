import gymnasium as gym
import numpy as np
import pytest
import torch

from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.learners import capture, replay
from simbridge.trainer.learners.nstep import NStepAccumulator
from simbridge.trainer.learners.replay import ReplayBuffer
from simbridge.trainer.run.checkpoint import state_bytes, state_from_bytes
from simbridge.wire.preprocess import flat_dim, flatten
from support.learners import filled, weights


def rows(eps, agent, t0, rewards, term_last=False, trunc_last=False):
    n = len(rewards)
    term = np.zeros(n, bool)
    trunc = np.zeros(n, bool)
    term[-1], trunc[-1] = term_last, trunc_last
    t = np.arange(t0, t0 + n)
    return SampleBatch(obs=t[:, None].astype(np.float32), new_obs=(t + 1)[:, None].astype(np.float32),
                       actions=t.astype(np.int64), rewards=np.asarray(rewards, np.float32),
                       terminateds=term, truncateds=trunc, eps_id=np.full(n, eps), agent_index=np.full(n, agent))


def test_nstep_targets_across_fragments_and_episode_ends():
    acc = NStepAccumulator(3, 0.5)
    out = acc.add(rows(1, 0, 0, [1, 1]))
    assert out == {}                                   # nothing has 3 steps yet
    out = acc.add(rows(1, 0, 2, [1, 1, 8], term_last=True))  # same trajectory continues, then terminates
    np.testing.assert_allclose(out["rewards"], [1.75, 1.75, 3.5, 5.0, 8.0])
    np.testing.assert_array_equal(out["obs"][:, 0], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(out["new_obs"][:, 0], [3, 4, 5, 5, 5])
    np.testing.assert_allclose(out["discounts"], [0.125, 0.125, 0, 0, 0])  # reached the terminal state
    assert list(out["terminateds"]) == [False, False, True, True, True]


def test_nstep_truncation_bootstraps_and_trajectories_do_not_mix():
    acc = NStepAccumulator(2, 0.9)
    b = SampleBatch.concat_samples([rows(1, 0, 0, [1]), rows(2, 0, 0, [10]), rows(1, 1, 0, [100])])
    assert acc.add(b) == {}
    out = acc.add(rows(2, 0, 1, [20], trunc_last=True))
    np.testing.assert_allclose(out["rewards"], [10 + 0.9 * 20, 20])
    np.testing.assert_allclose(out["discounts"], [0.81, 0.9])        # truncated: still bootstrap
    assert not out["terminateds"].any()


def test_one_step_is_vectorised_identity_with_discounts():
    out = NStepAccumulator(1, 0.99).add(rows(1, 0, 0, [1, 2, 3], term_last=True))
    np.testing.assert_allclose(out["rewards"], [1, 2, 3])
    np.testing.assert_allclose(out["discounts"], [0.99, 0.99, 0.0])


def test_replay_wraps_and_samples_on_device():
    rb = ReplayBuffer(5)
    rb.add({"x": np.arange(3, dtype=np.float32), "a": np.arange(3)})
    rb.add({"x": np.arange(3, 7, dtype=np.float32), "a": np.arange(3, 7)})
    assert len(rb) == 5 and rb.added == 7
    assert sorted(rb._data["x"].tolist()) == [2, 3, 4, 5, 6]          # oldest two overwritten
    s = rb.sample(64, torch.Generator().manual_seed(0))
    assert s["x"].shape == (64,) and set(s["x"].tolist()) <= {2.0, 3.0, 4.0, 5.0, 6.0}
    assert torch.equal(s["x"].long(), s["a"])                          # rows stay aligned
    rb2 = ReplayBuffer(1)
    rb2.load_state_dict(rb.state_dict())
    assert torch.equal(rb2._data["x"], rb._data["x"]) and len(rb2) == 5


def _mixed(pack: bool, monkeypatch) -> ReplayBuffer:
    """Columns of three dtypes (camera frames among them), written past the end of a 6-row buffer."""
    monkeypatch.setattr(replay, "PACK", pack)
    rb = ReplayBuffer(6)
    rng = np.random.default_rng(0)
    for n in (4, 5):
        rb.add({"obs": rng.standard_normal((n, 3)).astype(np.float32),
                "frames": rng.integers(0, 255, (n, 2, 2), dtype=np.uint8),
                "actions": rng.integers(0, 4, n), "rewards": rng.standard_normal(n).astype(np.float32),
                "new_frames": rng.integers(0, 255, (n, 2, 2), dtype=np.uint8)})
    return rb


def test_columns_of_one_dtype_share_a_store_and_sample_the_same_rows(monkeypatch):
    """One index op per dtype (PACK): three stores for five columns, every column's rows, shapes and
    dtypes as a store per column gives them, through wrapping writes."""
    packed, apart = _mixed(True, monkeypatch), _mixed(False, monkeypatch)
    assert len(packed._stores) == 3 and len(apart._stores) == 5
    assert len(packed) == len(apart) == 6 and packed.added == 9
    idx = torch.tensor([5, 0, 2, 2, 3])
    got, want = packed.gather(idx), apart.gather(idx)
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and torch.equal(got[k], want[k])
    assert torch.equal(packed._data["frames"], apart._data["frames"])


@pytest.mark.parametrize("saved_packed", [True, False])
def test_a_replay_checkpoint_loads_whichever_way_it_was_stored(saved_packed, monkeypatch):
    """Checkpoints keep columns (written before PACK, or with it off) and load into either layout."""
    saved = _mixed(saved_packed, monkeypatch)
    state = state_from_bytes(state_bytes(saved.state_dict()))   # torch.save / weights_only load
    monkeypatch.setattr(replay, "PACK", not saved_packed)
    loaded = ReplayBuffer(1)
    loaded.load_state_dict(state)
    assert len(loaded._stores) == (5 if saved_packed else 3) and len(loaded) == 6 and loaded.added == 9
    idx = torch.arange(6)
    for k, v in saved.gather(idx).items():
        assert torch.equal(loaded.gather(idx)[k], v)


@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_a_learner_on_a_packed_replay_updates_as_on_a_store_per_column(kind, monkeypatch):
    """The views a packed sample hands the networks (rows strided by the store's width) give the
    same updates as contiguous columns."""
    packed = filled(kind)
    monkeypatch.setattr(replay, "PACK", False)
    apart = filled(kind)
    assert len(packed.replay._stores) < len(apart.replay._stores)
    for lrn in (packed, apart):
        lrn.train(max_updates=5)
    for a, b in zip(weights(packed), weights(apart)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_a_packed_replay_on_the_graph_path_updates_as_a_store_per_column_on_cuda(kind, monkeypatch):
    packed = filled(kind, device="cuda", update_path="graph")
    monkeypatch.setattr(replay, "PACK", False)
    apart = filled(kind, device="cuda", update_path="graph")
    for lrn in (packed, apart):
        lrn.train(max_updates=capture.WARMUP + 20)   # warm-up, capture, replays
    assert packed.updater.path == "graph" and len(packed.updater._graphs) >= 1
    for a, b in zip(weights(packed), weights(apart)):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_flatten_composite_observations():
    sp = gym.spaces.Dict({"d": gym.spaces.Discrete(3), "b": gym.spaces.Box(-1, 1, (2, 2), np.float32),
                          "m": gym.spaces.MultiDiscrete([2, 3])})
    v = {"d": np.array([2, 0]), "b": np.ones((2, 2, 2), np.float32), "m": np.array([[1, 2], [0, 0]])}
    f = flatten(sp, v)
    assert f.shape == (2, flat_dim(sp)) == (2, 3 + 4 + 5)
    # gymnasium orders a plain dict's keys: b, d, m
    np.testing.assert_array_equal(f[0], [1, 1, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1])


def _with_t(batch, t0):
    cols = {k: batch[k] for k in batch.keys()}
    return SampleBatch(**cols, t=np.arange(t0, t0 + batch.count))


def test_rows_out_of_order_are_counted_and_said_once(caplog):
    """n-step targets need a trajectory's rows in order; the bridge once handed batches over out of
    order under the rate limiter's hold (a third of the demo's). The accumulator watches `t`."""
    acc = NStepAccumulator(3, 0.5)
    acc.add(_with_t(rows(1, 0, 0, [1, 1]), 0))
    acc.add(_with_t(rows(2, 0, 0, [1, 1, 1]), 0))     # another trajectory: its own order
    acc.add(_with_t(rows(1, 0, 2, [1, 1]), 2))        # in order
    assert acc.out_of_order == 0
    with caplog.at_level("WARNING", logger="simbridge.trainer"):
        acc.add(_with_t(rows(1, 0, 6, [1, 1], term_last=True), 6))   # a later fragment first...
        acc.add(_with_t(rows(1, 0, 4, [1, 1]), 4))                   # ...then the one before it
    assert acc.out_of_order == 2
    said = [r.getMessage() for r in caplog.records if "out of order" in r.getMessage()]
    assert len(said) == 1 and "eps_id 1, agent 0" in said[0] and "t 4 after t 7" in said[0], said
