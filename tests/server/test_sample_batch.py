import numpy as np
import pytest

from simbridge.server.sample_batch import (
    ACTIONS,
    DEFAULT_POLICY_ID,
    EPS_ID,
    INFOS,
    NEW_OBS,
    OBS,
    REWARDS,
    T,
    TERMINATEDS,
    MultiAgentBatch,
    SampleBatch,
)
from simbridge.server.batch_builder import SampleBatchBuilder


def make_batch(n, start=0, eps=None):
    idx = np.arange(start, start + n)
    cols = {
        OBS: np.stack([idx, idx * 10], axis=1).astype(np.float32),
        ACTIONS: idx.astype(np.int64),
        REWARDS: idx.astype(np.float32) * 0.5,
        T: idx,
    }
    if eps is not None:
        cols[EPS_ID] = np.asarray(eps)
    return SampleBatch(cols)


def make_nested(n, start=0):
    idx = np.arange(start, start + n)
    return SampleBatch(
        {
            OBS: {
                "pos": np.stack([idx, idx + 1, idx + 2], axis=1).astype(np.float64),
                "inner": (idx.astype(np.int32), np.zeros((n, 2, 2)) + idx[:, None, None]),
            },
            ACTIONS: idx,
        }
    )


# ---------------------------------------------------------------- construction
def test_constructor_columns_and_kwargs():
    b = SampleBatch({OBS: np.zeros((4, 2))}, actions=[1, 2, 3, 4])
    assert b.count == 4 and len(b) == 4
    assert set(b.keys()) == {OBS, ACTIONS}
    assert isinstance(b[ACTIONS], np.ndarray)
    np.testing.assert_array_equal(b[ACTIONS], [1, 2, 3, 4])
    assert OBS in b and REWARDS not in b
    assert b.get(REWARDS) is None
    assert b.get(REWARDS, 7) == 7
    assert dict(b.items())[OBS].shape == (4, 2)
    assert list(iter(b)) == [OBS, ACTIONS]
    assert "count=4" in repr(b) and "'obs'" in repr(b)


def test_constructor_does_not_copy_arrays():
    obs = np.zeros((3, 2))
    b = SampleBatch({OBS: obs})
    assert b[OBS] is obs


def test_empty_batch():
    b = SampleBatch()
    assert b.count == 0 and len(b) == 0 and list(b.keys()) == []


def test_row_count_mismatch_names_column():
    with pytest.raises(ValueError, match="'actions'"):
        SampleBatch({OBS: np.zeros((4, 2)), ACTIONS: np.zeros(3)})


def test_row_count_mismatch_in_nested_column():
    with pytest.raises(ValueError, match="'obs'"):
        SampleBatch({OBS: {"a": np.zeros(4), "b": np.zeros(5)}})
    with pytest.raises(ValueError, match="'actions'"):
        SampleBatch({OBS: {"a": np.zeros(4)}, ACTIONS: (np.zeros(4), np.zeros(2))})


def test_scalar_column_rejected():
    with pytest.raises(ValueError, match="'rewards'"):
        SampleBatch({REWARDS: np.float32(1.0)})


def test_setitem_validates_row_count():
    b = make_batch(3)
    b[NEW_OBS] = np.ones((3, 2))
    assert NEW_OBS in b and b[NEW_OBS].shape == (3, 2)
    with pytest.raises(ValueError, match="'terminateds'"):
        b[TERMINATEDS] = np.zeros(5, dtype=bool)
    assert TERMINATEDS not in b
    # Replacing the only column may change the row count.
    single = SampleBatch({OBS: np.zeros(2)})
    single[OBS] = np.zeros(5)
    assert single.count == 5


def test_infos_list_becomes_object_array():
    infos = [{"a": 1}, {"b": 2}, {}]
    b = SampleBatch({ACTIONS: np.arange(3), INFOS: infos})
    assert b[INFOS].dtype == object and b[INFOS].shape == (3,)
    assert b[INFOS][1] == {"b": 2}


# ---------------------------------------------------------------------- concat
def test_concat_single_agent():
    a, b = make_batch(3), make_batch(2, start=3)
    c = a.concat(b)
    assert c.count == 5
    np.testing.assert_array_equal(c[T], np.arange(5))
    np.testing.assert_array_equal(c[OBS][:, 1], np.arange(5) * 10)
    assert c[OBS].dtype == np.float32
    # Result owns its memory.
    assert not np.shares_memory(c[OBS], a[OBS])
    # concat_samples with several batches
    d = SampleBatch.concat_samples([a, b, make_batch(4, start=5)])
    np.testing.assert_array_equal(d[ACTIONS], np.arange(9))


def test_concat_samples_empty_list_and_empty_batches():
    e = SampleBatch.concat_samples([])
    assert isinstance(e, SampleBatch) and e.count == 0 and list(e.keys()) == []
    a = make_batch(2)
    c = SampleBatch.concat_samples([SampleBatch(), a])
    assert c.count == 2 and set(c.keys()) == set(a.keys())
    single = SampleBatch.concat_samples([a])
    np.testing.assert_array_equal(single[T], a[T])
    assert not np.shares_memory(single[T], a[T])


def test_concat_requires_same_columns():
    a = make_batch(2)
    b = make_batch(2)
    b[NEW_OBS] = np.zeros((2, 2))
    with pytest.raises(ValueError, match="different columns"):
        a.concat(b)
    with pytest.raises(ValueError):
        SampleBatch.concat_samples([a, SampleBatch({OBS: np.zeros((1, 2))})])


def test_concat_nested_dict_obs():
    a, b = make_nested(2), make_nested(3, start=2)
    c = a.concat(b)
    assert c.count == 5
    assert set(c[OBS].keys()) == {"pos", "inner"}
    np.testing.assert_array_equal(c[OBS]["pos"][:, 0], np.arange(5))
    assert isinstance(c[OBS]["inner"], tuple)
    np.testing.assert_array_equal(c[OBS]["inner"][0], np.arange(5))
    assert c[OBS]["inner"][0].dtype == np.int32
    assert c[OBS]["inner"][1].shape == (5, 2, 2)
    np.testing.assert_array_equal(c[OBS]["inner"][1][:, 1, 1], np.arange(5))


def test_concat_nested_structure_mismatch():
    a = make_nested(2)
    b = SampleBatch({OBS: {"pos": np.zeros((1, 3))}, ACTIONS: np.zeros(1)})
    with pytest.raises(ValueError, match="'obs'"):
        a.concat(b)


# ---------------------------------------------------------------------- slices
def test_slice_returns_views():
    b = make_nested(6)
    s = b.slice(2, 5)
    assert isinstance(s, SampleBatch) and s.count == 3
    np.testing.assert_array_equal(s[ACTIONS], [2, 3, 4])
    assert np.shares_memory(s[ACTIONS], b[ACTIONS])
    assert np.shares_memory(s[OBS]["pos"], b[OBS]["pos"])
    assert np.shares_memory(s[OBS]["inner"][1], b[OBS]["inner"][1])
    # Writing through the view changes the parent: no copy was made.
    s[ACTIONS][0] = 100
    assert b[ACTIONS][2] == 100


def test_getitem_slice():
    b = make_batch(5)
    s = b[1:3]
    assert isinstance(s, SampleBatch) and s.count == 2
    np.testing.assert_array_equal(s[T], [1, 2])
    assert np.shares_memory(s[OBS], b[OBS])
    assert b[-2:].count == 2
    assert b[10:20].count == 0
    assert b[::2].count == 3


def test_timeslices_sizes_and_content():
    b = make_batch(10)
    parts = b.timeslices(4)
    assert [p.count for p in parts] == [4, 4, 2]
    np.testing.assert_array_equal(parts[0][T], [0, 1, 2, 3])
    np.testing.assert_array_equal(parts[1][T], [4, 5, 6, 7])
    np.testing.assert_array_equal(parts[2][T], [8, 9])
    np.testing.assert_array_equal(parts[2][OBS], b[OBS][8:10])
    assert all(np.shares_memory(p[OBS], b[OBS]) for p in parts)
    assert [p.count for p in b.timeslices(5)] == [5, 5]
    assert [p.count for p in b.timeslices(100)] == [10]
    assert SampleBatch().timeslices(3) == []
    with pytest.raises(ValueError):
        b.timeslices(0)


def test_split_by_episode():
    eps = [7, 7, 7, 3, 3, 9, 7, 7]
    b = make_batch(8, eps=eps)
    episodes = b.split_by_episode()
    assert [e.count for e in episodes] == [3, 2, 1, 2]
    assert [int(e[EPS_ID][0]) for e in episodes] == [7, 3, 9, 7]
    for e in episodes:
        assert len(set(e[EPS_ID].tolist())) == 1
    np.testing.assert_array_equal(episodes[1][T], [3, 4])
    np.testing.assert_array_equal(episodes[3][T], [6, 7])
    # single episode
    one = make_batch(4, eps=[1, 1, 1, 1]).split_by_episode()
    assert len(one) == 1 and one[0].count == 4


def test_split_by_episode_requires_eps_id():
    with pytest.raises(KeyError):
        make_batch(3).split_by_episode()


def test_shuffle_returns_permuted_copy():
    b = make_nested(20)
    s = b.shuffle(np.random.default_rng(0))
    assert s.count == 20
    assert not np.array_equal(s[ACTIONS], b[ACTIONS])
    assert sorted(s[ACTIONS].tolist()) == list(range(20))
    # Rows stay aligned across columns, nested ones included.
    np.testing.assert_array_equal(s[OBS]["pos"][:, 0], s[ACTIONS])
    np.testing.assert_array_equal(s[OBS]["inner"][0], s[ACTIONS])
    np.testing.assert_array_equal(b[ACTIONS], np.arange(20))  # original untouched
    assert not np.shares_memory(s[ACTIONS], b[ACTIONS])
    # Same seed -> same permutation.
    s2 = b.shuffle(np.random.default_rng(0))
    np.testing.assert_array_equal(s2[ACTIONS], s[ACTIONS])


def test_copy_is_deep():
    b = make_nested(3)
    b[INFOS] = [{"x": 1}, {"x": 2}, {"x": 3}]
    c = b.copy()
    c[ACTIONS][0] = 42
    c[OBS]["pos"][0, 0] = -1
    c[INFOS][0]["x"] = 99
    assert b[ACTIONS][0] == 0
    assert b[OBS]["pos"][0, 0] == 0
    assert b[INFOS][0]["x"] == 1


def test_single_batch_steps():
    b = make_batch(5)
    assert b.agent_steps() == 5 and b.env_steps() == 5


# ------------------------------------------------------------- multi-agent
def make_ma(env_steps=3, n_agents=2, start=0):
    # two agents, both acting each env step; agent i uses policy "p{i}"
    return MultiAgentBatch(
        {f"p{i}": make_batch(env_steps, start=start) for i in range(n_agents)},
        env_steps=env_steps,
    )


def test_multi_agent_steps():
    ma = make_ma(3, 2)
    assert ma.env_steps() == 3
    assert ma.count == 3
    assert ma.agent_steps() == 6
    assert set(ma.policy_batches) == {"p0", "p1"}
    r = repr(ma)
    assert "env_steps=3" in r and "agent_steps=6" in r and "p0" in r


def test_multi_agent_requires_sample_batches():
    with pytest.raises(TypeError):
        MultiAgentBatch({"p0": {OBS: np.zeros(2)}}, 2)


def test_multi_agent_concat():
    a = make_ma(3, 2)
    b = MultiAgentBatch(
        {"p0": make_batch(2, start=3), "p2": make_batch(4, start=100)}, env_steps=4
    )
    c = a.concat(b)
    assert c.env_steps() == 7
    assert {pid: pb.count for pid, pb in c.policy_batches.items()} == {
        "p0": 5,
        "p1": 3,
        "p2": 4,
    }
    np.testing.assert_array_equal(c.policy_batches["p0"][T], np.arange(5))
    np.testing.assert_array_equal(c.policy_batches["p2"][T], np.arange(100, 104))
    assert c.agent_steps() == 12
    d = MultiAgentBatch.concat_samples([a, b, a])
    assert d.env_steps() == 10 and d.policy_batches["p1"].count == 6
    empty = MultiAgentBatch.concat_samples([])
    assert empty.env_steps() == 0 and empty.policy_batches == {}


def test_multi_agent_concat_nested_obs():
    a = MultiAgentBatch({"p0": make_nested(2), "p1": make_batch(2)}, 2)
    b = MultiAgentBatch({"p0": make_nested(3, start=2)}, 3)
    c = MultiAgentBatch.concat_samples([a, b])
    assert c.env_steps() == 5
    np.testing.assert_array_equal(c.policy_batches["p0"][OBS]["pos"][:, 0], np.arange(5))
    assert c.policy_batches["p0"][OBS]["inner"][1].shape == (5, 2, 2)
    assert c.policy_batches["p1"].count == 2


def test_multi_agent_concat_rejects_nonempty_sample_batch():
    with pytest.raises(TypeError):
        MultiAgentBatch.concat_samples([make_ma(), make_batch(2)])
    # Empty SampleBatches are ignored.
    c = MultiAgentBatch.concat_samples([make_ma(), SampleBatch()])
    assert c.env_steps() == 3
    # SampleBatch.concat_samples delegates when it sees a MultiAgentBatch.
    d = SampleBatch.concat_samples([make_ma(), make_ma(start=3)])
    assert isinstance(d, MultiAgentBatch) and d.env_steps() == 6


def test_multi_agent_timeslices():
    ma = MultiAgentBatch({"p0": make_batch(5), "p1": make_batch(2, start=50)}, 5)
    parts = ma.timeslices(2)
    assert len(parts) == 3
    assert [sorted(p.policy_batches) for p in parts] == [["p0", "p1"], ["p0"], ["p0"]]
    assert [p.policy_batches["p0"].count for p in parts] == [2, 2, 1]
    assert parts[0].policy_batches["p1"].count == 2
    # env_steps apportioned as max rows of the chunk over policies
    assert [p.env_steps() for p in parts] == [2, 2, 1]
    np.testing.assert_array_equal(parts[1].policy_batches["p0"][T], [2, 3])
    np.testing.assert_array_equal(parts[0].policy_batches["p1"][T], [50, 51])
    assert sum(p.agent_steps() for p in parts) == ma.agent_steps()
    # Pieces are views
    assert np.shares_memory(parts[2].policy_batches["p0"][OBS], ma.policy_batches["p0"][OBS])
    assert MultiAgentBatch({}, 0).timeslices(3) == []


def test_multi_agent_copy_is_deep():
    ma = make_ma()
    c = ma.copy()
    c.policy_batches["p0"][ACTIONS][0] = 77
    assert ma.policy_batches["p0"][ACTIONS][0] == 0
    assert c.env_steps() == ma.env_steps()


def test_wrap_as_needed():
    sb = make_batch(4)
    out = MultiAgentBatch.wrap_as_needed({DEFAULT_POLICY_ID: sb}, 4)
    assert out is sb
    out = MultiAgentBatch.wrap_as_needed({"other": sb}, 4)
    assert isinstance(out, MultiAgentBatch) and out.env_steps() == 4
    assert out.policy_batches["other"] is sb
    out = MultiAgentBatch.wrap_as_needed({DEFAULT_POLICY_ID: sb, "p1": make_batch(2)}, 4)
    assert isinstance(out, MultiAgentBatch) and out.agent_steps() == 6


def test_as_multi_agent():
    sb = make_batch(3)
    ma = sb.as_multi_agent()
    assert ma.policy_batches == {DEFAULT_POLICY_ID: sb} and ma.env_steps() == 3


# --------------------------------------------------------------------- builder
def test_builder_add_row_build_and_reset():
    bb = SampleBatchBuilder()
    assert bb.count == 0
    for i in range(3):
        bb.add_row(obs=np.array([i, -i], dtype=np.float32), actions=i, rewards=float(i) / 2,
                   terminateds=(i == 2), infos={"step": i})
    assert bb.count == 3
    b = bb.build()
    assert isinstance(b, SampleBatch) and b.count == 3
    assert b[OBS].shape == (3, 2) and b[OBS].dtype == np.float32
    np.testing.assert_array_equal(b[OBS][:, 1], [0, -1, -2])
    np.testing.assert_array_equal(b[ACTIONS], [0, 1, 2])
    np.testing.assert_array_equal(b[REWARDS], [0.0, 0.5, 1.0])
    assert b[TERMINATEDS].dtype == bool
    np.testing.assert_array_equal(b[TERMINATEDS], [False, False, True])
    assert b[INFOS].dtype == object and [d["step"] for d in b[INFOS]] == [0, 1, 2]
    # build() reset the builder
    assert bb.count == 0
    empty = bb.build()
    assert empty.count == 0 and list(empty.keys()) == []
    # after reset a different column set is allowed
    bb.add_row(actions=5)
    assert bb.build()[ACTIONS].tolist() == [5]


def test_builder_nested_rows():
    bb = SampleBatchBuilder()
    for i in range(4):
        bb.add_row({OBS: {"pos": np.full(3, i), "flag": (i, np.ones(2) * i)}, ACTIONS: i})
    b = bb.build()
    assert b[OBS]["pos"].shape == (4, 3)
    assert isinstance(b[OBS]["flag"], tuple)
    np.testing.assert_array_equal(b[OBS]["flag"][0], np.arange(4))
    assert b[OBS]["flag"][1].shape == (4, 2)


def test_builder_add_rows_chunks():
    bb = SampleBatchBuilder()
    bb.add_rows({OBS: np.zeros((3, 2)), ACTIONS: np.arange(3)})
    bb.add_rows({OBS: np.ones((2, 2)), ACTIONS: np.arange(3, 5)})
    assert bb.count == 5
    b = bb.build()
    assert b.count == 5 and b[OBS].shape == (5, 2)
    np.testing.assert_array_equal(b[ACTIONS], np.arange(5))
    np.testing.assert_array_equal(b[OBS][3:], np.ones((2, 2)))
    assert bb.count == 0


def test_builder_add_rows_single_chunk_is_copied():
    bb = SampleBatchBuilder()
    actions = np.arange(4)
    bb.add_rows({ACTIONS: actions})
    b = bb.build()
    assert not np.shares_memory(b[ACTIONS], actions)
    np.testing.assert_array_equal(b[ACTIONS], actions)


def test_builder_add_rows_validates_row_counts():
    bb = SampleBatchBuilder()
    with pytest.raises(ValueError, match="'actions'"):
        bb.add_rows({OBS: np.zeros((3, 2)), ACTIONS: np.arange(2)})
    assert bb.count == 0


def test_builder_mixed_add_row_and_add_rows():
    bb = SampleBatchBuilder()
    bb.add_row(obs={"a": np.array([0.0, 0.0]), "b": 0}, actions=0)
    bb.add_row(obs={"a": np.array([1.0, 1.0]), "b": 1}, actions=1)
    bb.add_rows({OBS: {"a": np.full((3, 2), 2.0), "b": np.array([2, 3, 4])},
                 ACTIONS: np.array([2, 3, 4])})
    bb.add_row(obs={"a": np.array([5.0, 5.0]), "b": 5}, actions=5)
    assert bb.count == 6
    b = bb.build()
    assert b.count == 6
    np.testing.assert_array_equal(b[ACTIONS], np.arange(6))
    np.testing.assert_array_equal(b[OBS]["b"], np.arange(6))
    np.testing.assert_array_equal(b[OBS]["a"][:, 0], [0, 1, 2, 2, 2, 5])
    assert b[OBS]["a"].shape == (6, 2)


def test_builder_mixed_with_infos():
    bb = SampleBatchBuilder()
    bb.add_row(actions=0, infos={"i": 0})
    bb.add_rows({ACTIONS: np.array([1, 2]), INFOS: [{"i": 1}, {"i": 2}]})
    b = bb.build()
    assert b[INFOS].shape == (3,)
    assert [d["i"] for d in b[INFOS]] == [0, 1, 2]


def test_builder_column_set_must_match():
    bb = SampleBatchBuilder()
    bb.add_row(obs=1, actions=2)
    with pytest.raises(ValueError):
        bb.add_row(obs=1)
    with pytest.raises(ValueError):
        bb.add_rows({OBS: np.zeros(2), REWARDS: np.zeros(2)})
    assert bb.count == 1
    assert bb.build().count == 1


def test_builder_reset_discards():
    bb = SampleBatchBuilder()
    bb.add_row(actions=1)
    bb.add_rows({ACTIONS: np.arange(3)})
    bb.reset()
    assert bb.count == 0
    assert bb.build().count == 0
