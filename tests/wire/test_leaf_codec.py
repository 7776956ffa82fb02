"""The compiled per-space codecs must be indistinguishable from the generic ones:
same arrays for good values, same INVALID_ARGUMENT message for bad ones."""
import gymnasium as gym
import numpy as np
import pytest

from simbridge.wire import checks, leaf_codec, tensors
from simbridge.wire import spaces as sb_spaces
from simbridge.wire.errors import BridgeError
from simbridge.wire.v1 import simbridge_pb2 as pb

SPACES = {
    "box_f32": gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
    "box_u8_image": gym.spaces.Box(0, 255, (2, 2, 3), np.uint8),
    "box_f64_scalar": gym.spaces.Box(-1.0, 1.0, (), np.float64),
    "discrete": gym.spaces.Discrete(3),
    "multi_discrete": gym.spaces.MultiDiscrete([2, 5]),
    "multi_binary": gym.spaces.MultiBinary(3),   # not a fast-path leaf: generic all the way
    "dict": gym.spaces.Dict({"a": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "b": gym.spaces.Discrete(2)}),
}


def _sample(space, n, seed=0):
    return sb_spaces.sample_batch_of(space, n, np.random.default_rng(seed))


def _generic_error(fn):
    with pytest.raises(BridgeError) as e:
        fn()
    return e.value.code, e.value.message


@pytest.mark.parametrize("name", sorted(SPACES))
@pytest.mark.parametrize("n", [0, 1, 7])
def test_round_trip_matches_the_generic_codec(name, n):
    space = SPACES[name]
    value = _sample(space, n)
    fast_msg, slow_msg = pb.Value(), pb.Value()
    leaf_codec.batch_encoder(space)(fast_msg, value, "v")
    sb_spaces.fill_value(slow_msg, space, value, batched=True, what="v")
    assert fast_msg.SerializeToString() == slow_msg.SerializeToString()
    got = leaf_codec.batch_decoder(space)(fast_msg, n, "v")
    want = sb_spaces.decode_value(space, slow_msg, n, "v")
    if isinstance(want, dict):
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
            assert got[k].dtype == want[k].dtype
    else:
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype and got.shape == want.shape


def _box_msg(arr):
    msg = pb.Value()
    tensors.fill_tensor(msg.tensor, arr)
    return msg


BAD = {
    "wrong dtype": lambda: _box_msg(np.zeros((2, 4), np.float64)),
    "wrong rows": lambda: _box_msg(np.zeros((3, 4), np.float32)),
    "wrong leaf shape": lambda: _box_msg(np.zeros((2, 5), np.float32)),
    "nan": lambda: _box_msg(np.array([[0, 0, 0, 0], [0, np.nan, 0, 0]], np.float32)),
    "short data": lambda: _short(),
    "a dict instead": lambda: sb_spaces.encode_value(SPACES["dict"], _sample(SPACES["dict"], 2), True),
    "empty": lambda: pb.Value(),
}


def _short():
    msg = _box_msg(np.zeros((2, 4), np.float32))
    msg.tensor.data = msg.tensor.data[:-4]
    return msg


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_values_get_the_generic_error(case):
    space = SPACES["box_f32"]
    msg = BAD[case]()
    want = _generic_error(lambda: sb_spaces.decode_value(space, msg, 2, "Step observations"))
    got = _generic_error(lambda: leaf_codec.batch_decoder(space)(msg, 2, "Step observations"))
    assert got == want


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_inf_minus_inf_is_not_mistaken_for_nan():
    # The sum is NaN, yet no element is: the error names the infinity (the contract refuses
    # +-Inf like NaN, whatever the bounds), as the generic path words it.
    space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    msg = _box_msg(np.array([[np.inf, -np.inf]], np.float32))
    with pytest.raises(BridgeError) as ei:
        leaf_codec.batch_decoder(space)(msg, 1, "v")
    assert "contains +Inf at row 0" in ei.value.message and "NaN" not in ei.value.message


def test_encoder_leaves_odd_values_to_the_generic_path():
    space = SPACES["box_f32"]
    enc = leaf_codec.batch_encoder(space)
    for value in ([[0.0, 0.0, 0.0, 0.0]], np.zeros((1, 4), np.float64), np.zeros((4,), np.float32)):
        fast, slow = pb.Value(), pb.Value()
        try:
            sb_spaces.fill_value(slow, space, value, batched=True, what="obs")
        except BridgeError as e:
            with pytest.raises(BridgeError) as got:
                enc(fast, value, "obs")
            assert got.value.message == e.message
            continue
        enc(fast, value, "obs")
        assert fast.SerializeToString() == slow.SerializeToString()


def test_encoder_replaces_a_previous_value():
    space = SPACES["box_f32"]
    msg = sb_spaces.encode_value(SPACES["dict"], _sample(SPACES["dict"], 2), True)
    leaf_codec.batch_encoder(space)(msg, np.ones((2, 4), np.float32), "obs")
    assert msg.WhichOneof("kind") == "tensor"
    np.testing.assert_array_equal(sb_spaces.decode_value(space, msg, 2, "obs"), np.ones((2, 4)))


def test_vector_view_only_takes_exact_vectors():
    f32 = np.dtype(np.float32)
    good = tensors.to_tensor(np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(leaf_codec.vector_view(good, pb.FLOAT32, f32, 3), [0, 1, 2])
    assert leaf_codec.vector_view(good, pb.FLOAT32, f32, 2) is None
    assert leaf_codec.vector_view(tensors.to_tensor(np.arange(3.0)), pb.FLOAT32, f32, 3) is None
    assert leaf_codec.vector_view(tensors.to_tensor(np.zeros((3, 1), np.float32)), pb.FLOAT32, f32, 3) is None
    lying = tensors.to_tensor(np.arange(3, dtype=np.float32))
    lying.shape[:] = [4]
    assert leaf_codec.vector_view(lying, pb.FLOAT32, f32, 3) is None


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("rows", [1, leaf_codec.SMALL_FLOATS // 4, leaf_codec.SMALL_FLOATS // 4 + 1, 64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_refused_on_both_sides_of_the_small_path(rows, bad):
    # Up to SMALL_FLOATS elements the check is per element, above it one reduction: both refuse
    # a NaN or +-Inf in the last element with the generic path's words, and rewards likewise.
    space = SPACES["box_f32"]
    arr = np.zeros((rows, 4), np.float32)
    arr[-1, -1] = bad
    msg = _box_msg(arr)
    want = _generic_error(lambda: sb_spaces.decode_value(space, msg, rows, "Step observations"))
    assert _generic_error(lambda: leaf_codec.batch_decoder(space)(msg, rows, "Step observations")) == want
    np.testing.assert_array_equal(leaf_codec.batch_decoder(space)(_box_msg(np.ones((rows, 4), np.float32)),
                                                                  rows, "obs"), np.ones((rows, 4)))
    n = rows * 4
    rewards = np.ones(n, np.float32)
    rewards[-1] = bad
    t = pb.Tensor()
    tensors.fill_tensor(t, rewards)
    with pytest.raises(BridgeError) as e:
        checks.rewards(t, n, "Step rewards", "one per slot", "Step rewards: slot {}")
    assert f"slot {n - 1}" in e.value.message and "not a finite number" in e.value.message
    tensors.fill_tensor(t, np.ones(n, np.float32))
    assert checks.rewards(t, n, "Step rewards", "one per slot", "slot {}").sum() == n
