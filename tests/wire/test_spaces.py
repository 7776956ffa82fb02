import time
from collections import OrderedDict

import grpc
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs

from simbridge.wire.errors import BridgeError
from simbridge.wire.spaces import (
    check_contains,
    decode_value,
    encode_value,
    fill_value,
    leaf_rows,
    sample_batch_of,
    space_from_proto,
    space_to_proto,
    zeros_like_space,
)
from simbridge.wire.tensors import from_tensor, to_tensor
from simbridge.wire.v1 import simbridge_pb2 as pb

F32_MAX = float(np.finfo(np.float32).max)

LEAF_SPACES = {
    "box_f32": gs.Box(-1.0, 1.0, (3,), np.float32),
    "box_scalar": gs.Box(-2.0, 5.0, (), np.float32),
    "box_f64_unbounded": gs.Box(-np.inf, np.inf, (2, 2), np.float64),
    "box_half_bounded": gs.Box(
        np.array([0.0, -np.inf, -np.inf, 1.0], np.float32),
        np.array([np.inf, 0.0, np.inf, 2.0], np.float32),
        dtype=np.float32,
    ),
    "box_f16": gs.Box(-1.0, 1.0, (4,), np.float16),
    "box_huge": gs.Box(-F32_MAX, F32_MAX, (3,), np.float32),
    "box_uint8_image": gs.Box(0, 255, (4, 4, 3), np.uint8),
    "box_int32": gs.Box(np.array([-5, 0]), np.array([5, 10]), dtype=np.int32),
    "box_bool": gs.Box(0, 1, (3,), np.bool_),
    "discrete": gs.Discrete(4),
    "discrete_start": gs.Discrete(3, start=-1),
    "multi_discrete": gs.MultiDiscrete([2, 3, 4]),
    "multi_discrete_2d_start": gs.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 0], [-2, 3]]),
    "multi_binary": gs.MultiBinary(5),
    "multi_binary_2d": gs.MultiBinary((2, 3)),
}


def nested_space():
    return gs.Dict(
        [
            ("position", gs.Box(-10.0, 10.0, (3,), np.float32)),
            (
                "arm",
                gs.Tuple(
                    (
                        gs.Discrete(3, start=1),
                        gs.Dict([("joints", gs.MultiDiscrete([2, 5])), ("grip", gs.MultiBinary(2))]),
                    )
                ),
            ),
            ("camera", gs.Box(0, 255, (2, 2), np.uint8)),
        ]
    )


ALL_SPACES = {
    **LEAF_SPACES,
    "dict_ordered": gs.Dict(OrderedDict([("z", gs.Discrete(2)), ("a", gs.Box(0.0, 1.0, (2,)))])),
    "tuple": gs.Tuple((gs.Discrete(2), gs.MultiBinary(3))),
    "nested": nested_space(),
    "empty_dict": gs.Dict({}),
    "empty_tuple": gs.Tuple(()),
}


def assert_invalid(exc_info, *substrings):
    assert exc_info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    for s in substrings:
        assert s in str(exc_info.value), str(exc_info.value)


def wire(msg):
    """The message as the peer sees it, after serialization."""
    return type(msg).FromString(msg.SerializeToString())


def assert_value_equal(a, b):
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            assert_value_equal(a[k], b[k])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_value_equal(x, y)
    else:
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- spaces


@pytest.mark.parametrize("name", ALL_SPACES)
def test_space_round_trip(name):
    space = ALL_SPACES[name]
    back = space_from_proto(wire(space_to_proto(space)))
    assert back == space
    assert type(back) is type(space)
    assert back.dtype == space.dtype


def test_box_bounds_are_exact_and_keep_dtype():
    low = np.array([-1.5, -np.inf, 0.0], np.float64)
    high = np.array([1e300, 3.0, np.inf], np.float64)
    space = gs.Box(low, high, dtype=np.float64)
    msg = space_to_proto(space)
    assert msg.box.low.dtype == pb.FLOAT64
    back = space_from_proto(wire(msg))
    np.testing.assert_array_equal(back.low, low)
    np.testing.assert_array_equal(back.high, high)
    # gymnasium's == only compares with allclose; check the exact bytes.
    assert back.low.tobytes() == low.tobytes()


def test_dict_order_is_preserved_not_sorted():
    space = gs.Dict([("zeta", gs.Discrete(2)), ("alpha", gs.Discrete(3)), ("mid", gs.Discrete(4))])
    back = space_from_proto(wire(space_to_proto(space)))
    assert list(back.spaces) == ["zeta", "alpha", "mid"]


def test_multi_binary_list_form_keeps_its_shape():
    # The wire only has the shape, so MultiBinary([5]) comes back as MultiBinary(5).
    back = space_from_proto(space_to_proto(gs.MultiBinary([5])))
    assert back.shape == (5,)
    assert back == gs.MultiBinary(5)


def test_discrete_dtype_normalised_to_int64():
    back = space_from_proto(space_to_proto(gs.Discrete(3, dtype=np.int32)))
    assert back == gs.Discrete(3)
    back = space_from_proto(space_to_proto(gs.MultiDiscrete([2, 3], dtype=np.int32)))
    assert back == gs.MultiDiscrete([2, 3])


def test_multi_discrete_without_start_means_zeros():
    msg = pb.Space()
    msg.multi_discrete.nvec.CopyFrom(to_tensor(np.array([3, 4])))
    assert space_from_proto(msg) == gs.MultiDiscrete([3, 4])


@pytest.mark.parametrize(
    "space, substring",
    [
        (gs.Text(5), "unsupported space Text"),
        (gs.Dict({"a": gs.Discrete(2), "b": gs.Dict({"c": gs.Text(3)})}), "space['b']['c']: unsupported"),
        (gs.Dict({1: gs.Discrete(2)}), "Dict key 1 is not a string"),
        (gs.Sequence(gs.Discrete(2)), "unsupported space Sequence"),
    ],
)
def test_space_to_proto_unsupported(space, substring):
    with pytest.raises(BridgeError) as ei:
        space_to_proto(space)
    assert_invalid(ei, substring)


def _box_msg(low, high):
    msg = pb.Space()
    msg.box.low.CopyFrom(to_tensor(low))
    msg.box.high.CopyFrom(to_tensor(high))
    return msg


def _malformed():
    f32 = np.float32
    cases = {}
    cases["empty space"] = (pb.Space(), "observation_space: empty Space")
    m = pb.Space()
    m.box.low.CopyFrom(to_tensor(np.zeros(2, f32)))
    cases["box missing high"] = (m, "Box needs both low and high")
    cases["box shape mismatch"] = (
        _box_msg(np.zeros(2, f32), np.ones(3, f32)),
        "Box low shape (2,) != high shape (3,)",
    )
    cases["box dtype mismatch"] = (
        _box_msg(np.zeros(2, f32), np.ones(2)),
        "Box low dtype float32 != high dtype float64",
    )
    cases["box low > high"] = (_box_msg(np.ones(2, f32), np.zeros(2, f32)), "invalid Box")
    cases["box nan"] = (_box_msg(np.array([np.nan], f32), np.ones(1, f32)), "Box bounds contain NaN")
    m = _box_msg(np.zeros(2, f32), np.ones(2, f32))
    m.box.high.data = b"\0" * 4
    cases["box bad bytes"] = (m, "Box high: tensor data has 4 bytes, shape (2,) float32 needs 8")
    cases["discrete n=0"] = (pb.Space(discrete=pb.DiscreteSpace(n=0)), "Discrete n must be positive, got 0")
    cases["discrete n<0"] = (pb.Space(discrete=pb.DiscreteSpace(n=-3)), "Discrete n must be positive, got -3")
    m = pb.Space()
    m.multi_discrete.SetInParent()
    cases["multi discrete no nvec"] = (m, "MultiDiscrete needs nvec")
    m = pb.Space()
    m.multi_discrete.nvec.CopyFrom(to_tensor(np.array([2, 0])))
    cases["multi discrete nvec 0"] = (m, "MultiDiscrete nvec must be positive, got [2, 0]")
    m = pb.Space()
    m.multi_discrete.nvec.CopyFrom(to_tensor(np.array([2.0, 3.0])))
    cases["multi discrete float nvec"] = (m, "MultiDiscrete nvec dtype float64, expected int64")
    m = pb.Space()
    m.multi_discrete.nvec.CopyFrom(to_tensor(np.array([2, 3])))
    m.multi_discrete.start.CopyFrom(to_tensor(np.array([0])))
    cases["multi discrete start shape"] = (m, "MultiDiscrete start shape (1,) != nvec shape (2,)")
    m = pb.Space()
    m.multi_binary.SetInParent()
    cases["multi binary no shape"] = (m, "MultiBinary shape must be non-empty and positive, got ()")
    cases["multi binary zero dim"] = (
        pb.Space(multi_binary=pb.MultiBinarySpace(shape=[2, 0])),
        "MultiBinary shape must be non-empty and positive, got (2, 0)",
    )
    m = pb.Space()
    for _ in range(2):
        m.dict.spaces.add(name="a").space.discrete.n = 2
    cases["duplicate dict key"] = (m, "duplicate Dict key 'a'")
    m = pb.Space()
    m.dict.spaces.add(name="ok").space.discrete.n = 2
    m.dict.spaces.add(name="arm").space.tuple.spaces.add().discrete.n = 0
    cases["nested error path"] = (m, "observation_space['arm'][0]: Discrete n must be positive")
    m = pb.Space()
    m.dict.spaces.add(name="x")
    cases["dict entry without space"] = (m, "observation_space['x']: empty Space")
    return cases


MALFORMED = _malformed()


@pytest.mark.parametrize("case", MALFORMED)
def test_space_from_proto_malformed(case):
    msg, substring = MALFORMED[case]
    with pytest.raises(BridgeError) as ei:
        space_from_proto(wire(msg), "observation_space")
    assert_invalid(ei, substring)


# ---------------------------------------------------------------- values


@pytest.mark.parametrize("name", ALL_SPACES)
@pytest.mark.parametrize("n_rows", [None, 0, 1, 7])
def test_value_round_trip(name, n_rows):
    space = ALL_SPACES[name]
    rng = np.random.default_rng(1)
    if n_rows is None:
        batch = sample_batch_of(space, 1, rng)
        value = _row(batch, 0)
    else:
        value = sample_batch_of(space, n_rows, rng)
    msg = wire(encode_value(space, value, batched=n_rows is not None))
    back = decode_value(space, msg, n_rows, "observations")
    assert_value_equal(back, value)
    _assert_dtypes(space, back)
    if n_rows is None:
        assert space.contains(_as_gym(space, back))


def _row(value, i):
    if isinstance(value, dict):
        return {k: _row(v, i) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_row(v, i) for v in value)
    return np.asarray(value[i])


def _as_gym(space, value):
    # gymnasium wants Discrete values as scalars.
    if isinstance(space, gs.Dict):
        return {k: _as_gym(space[k], v) for k, v in value.items()}
    if isinstance(space, gs.Tuple):
        return tuple(_as_gym(s, v) for s, v in zip(space.spaces, value))
    return value


def _assert_dtypes(space, value):
    if isinstance(space, gs.Dict):
        for k, s in space.spaces.items():
            _assert_dtypes(s, value[k])
    elif isinstance(space, gs.Tuple):
        for s, v in zip(space.spaces, value):
            _assert_dtypes(s, v)
    elif isinstance(space, gs.Box):
        assert value.dtype == space.dtype
    elif isinstance(space, (gs.Discrete, gs.MultiDiscrete)):
        assert value.dtype == np.int64
    else:
        assert value.dtype == np.int8


def test_nested_value_layout_on_the_wire():
    space = nested_space()
    value = zeros_like_space(space, 4)
    msg = encode_value(space, value, batched=True)
    assert set(msg.dict.items) == {"position", "arm", "camera"}
    arm = msg.dict.items["arm"].tuple.items
    assert arm[0].tensor.dtype == pb.INT64
    assert tuple(arm[0].tensor.shape) == (4,)
    assert tuple(arm[1].dict.items["joints"].tensor.shape) == (4, 2)
    assert arm[1].dict.items["grip"].tensor.dtype == pb.INT8
    assert msg.dict.items["position"].tensor.dtype == pb.FLOAT32


def test_encode_discrete_python_ints():
    msg = encode_value(gs.Discrete(5), 3, batched=False)
    assert msg.tensor.dtype == pb.INT64 and tuple(msg.tensor.shape) == ()
    msg = encode_value(gs.Discrete(5), [1, 2, 3], batched=True)
    assert msg.tensor.dtype == pb.INT64
    np.testing.assert_array_equal(from_tensor(msg.tensor), [1, 2, 3])
    msg = encode_value(gs.Discrete(5), np.array([1, 2], np.int32), batched=True)
    assert msg.tensor.dtype == pb.INT64


def test_encode_box_list_takes_box_dtype_but_arrays_keep_theirs():
    space = gs.Box(-1.0, 1.0, (2,), np.float32)
    assert encode_value(space, [0.5, 0.25], batched=False).tensor.dtype == pb.FLOAT32
    msg = encode_value(space, np.array([0.5, 0.25]), batched=False)
    assert msg.tensor.dtype == pb.FLOAT64  # reported by the server, not hidden
    with pytest.raises(BridgeError) as ei:
        decode_value(space, msg, None, "observations")
    assert_invalid(ei, "observations: dtype float64, expected float32")


def test_encode_multi_binary():
    space = gs.MultiBinary(3)
    assert encode_value(space, np.array([[1, 0, 1]]), batched=True).tensor.dtype == pb.INT8
    assert encode_value(space, np.array([True, False, True]), batched=False).tensor.dtype == pb.BOOL
    with pytest.raises(BridgeError) as ei:
        encode_value(space, np.array([1, 256, 0]), batched=False)
    assert_invalid(ei, "MultiBinary values must be 0 or 1, got 256")


@pytest.mark.parametrize(
    "space, value, batched, substring",
    [
        (gs.Discrete(3), np.array([1.0, 2.0]), True, "value: Discrete needs integers, got dtype float64"),
        (gs.Dict({"a": gs.Discrete(2)}), np.array([1]), True, "value: expected a dict, got ndarray"),
        (gs.Dict({"a": gs.Discrete(2)}), {"b": np.array([1])}, True, "missing ['a'], unexpected ['b']"),
        (gs.Tuple((gs.Discrete(2),)), (np.array([1]), np.array([1])), True, "tuple of 2 items, expected 1"),
        (gs.Box(0, 1, (3,), np.float32), np.zeros((2, 4), np.float32), True, "shape (2, 4), expected (N, 3)"),
        (gs.Box(0, 1, (3,), np.float32), np.zeros((2, 3), np.float32), False, "shape (2, 3), expected (3,)"),
        (
            gs.Dict([("a", gs.Discrete(2)), ("b", gs.Discrete(2))]),
            {"a": np.zeros(3, np.int64), "b": np.zeros(4, np.int64)},
            True,
            "value['b']: shape (4,), expected (3,)",
        ),
        (gs.Text(3), "abc", False, "unsupported space Text"),
    ],
)
def test_encode_errors(space, value, batched, substring):
    with pytest.raises(BridgeError) as ei:
        encode_value(space, value, batched)
    assert_invalid(ei, substring)


def test_fill_value_replaces_previous_content():
    space = gs.Dict({"a": gs.Discrete(2)})
    msg = encode_value(gs.Dict({"a": gs.Discrete(2), "b": gs.Discrete(2)}), {"a": 1, "b": 0}, False)
    fill_value(msg, space, {"a": 1})
    assert set(msg.dict.items) == {"a"}
    assert decode_value(space, msg, None, "v") == {"a": 1}


def test_decode_discrete_any_int_dtype_returns_int64_and_multibinary_int8():
    msg = pb.Value(tensor=to_tensor(np.array([0, 2, 1], np.uint8)))
    out = decode_value(gs.Discrete(3), msg, 3, "actions")
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [0, 2, 1])
    msg = pb.Value(tensor=to_tensor(np.array([[True, False]])))
    out = decode_value(gs.MultiBinary(2), msg, 1, "actions")
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, [[1, 0]])
    msg = pb.Value(tensor=to_tensor(np.array([[1, 0]], np.int32)))
    assert decode_value(gs.MultiBinary(2), msg, 1, "actions").dtype == np.int8


def test_decode_box_is_zero_copy():
    space = gs.Box(-1.0, 1.0, (64,), np.float32)
    msg = encode_value(space, np.zeros((8, 64), np.float32), batched=True)
    out = decode_value(space, msg, 8, "observations")
    assert not out.flags.owndata and out.base is not None


def _decode_errors():
    f32 = np.float32
    nested = nested_space()
    good = zeros_like_space(nested, 4)

    def nested_with(**changes):
        msg = encode_value(nested, good, batched=True)
        for key, value in changes.items():
            msg.dict.items[key].CopyFrom(value)
        return msg

    def tensor(arr):
        return pb.Value(tensor=to_tensor(arr))

    box = gs.Box(-1.0, 1.0, (3,), f32)
    nan = np.zeros((5, 3), f32)
    nan[3, 1] = np.nan
    cases = {
        "tensor where dict expected": (
            nested, tensor(np.zeros(4, f32)), 4, "observations: expected a dict, got a tensor"),
        "dict where tensor expected": (
            nested, nested_with(position=encode_value(gs.Dict({"x": gs.Discrete(2)}), {"x": [1] * 4}, True)), 4,
            "observations['position']: expected a tensor for Box, got a dict"),
        "empty value": (box, pb.Value(), 4, "observations: expected a tensor for Box, got an empty Value"),
        "missing key": (
            nested, _drop_key(encode_value(nested, good, True), "camera"), 4,
            "observations: dict keys ['arm', 'position'], expected ['position', 'arm', 'camera'] "
            "(missing ['camera'])"),
        "extra key": (
            nested, nested_with(extra=tensor(np.zeros(4, f32))), 4, "unexpected ['extra']"),
        "wrong tuple length": (
            gs.Tuple((gs.Discrete(2), gs.Discrete(2))),
            encode_value(gs.Tuple((gs.Discrete(2),)), (np.zeros(4, np.int64),), True), 4,
            "observations: tuple of 1 items, expected 2"),
        "tuple where dict expected": (
            gs.Dict({"a": gs.Discrete(2)}), encode_value(gs.Tuple(()), (), True), 4,
            "observations: expected a dict, got a tuple"),
        "box dtype": (box, tensor(np.zeros((4, 3))), 4, "observations: dtype float64, expected float32"),
        "nested box dtype": (
            nested, nested_with(position=tensor(np.zeros((4, 3)))), 4,
            "observations['position']: dtype float64, expected float32"),
        "box int for float": (box, tensor(np.zeros((4, 3), np.int32)), 4, "dtype int32, expected float32"),
        "discrete float": (gs.Discrete(3), tensor(np.zeros(4, f32)), 4,
                           "observations: dtype float32, expected an integer dtype"),
        "discrete bool": (gs.Discrete(3), tensor(np.zeros(4, bool)), 4, "dtype bool, expected an integer dtype"),
        "multi discrete float": (gs.MultiDiscrete([2, 2]), tensor(np.zeros((4, 2))), 4,
                                 "dtype float64, expected an integer dtype"),
        "multi binary float": (gs.MultiBinary(2), tensor(np.zeros((4, 2), f32)), 4,
                               "dtype float32, expected an integer or bool dtype"),
        "rows mismatch": (box, tensor(np.zeros((3, 3), f32)), 4, "observations: shape (3, 3), expected (4, 3)"),
        "leaf shape mismatch": (box, tensor(np.zeros((4, 2), f32)), 4, "shape (4, 2), expected (4, 3)"),
        "unbatched got batched": (box, tensor(np.zeros((1, 3), f32)), None, "shape (1, 3), expected (3,)"),
        "nested tuple path": (
            nested,
            nested_with(arm=_unchecked(
                nested["arm"], (np.zeros(4, np.int64), {"joints": np.zeros((4, 3), np.int64),
                                                        "grip": np.zeros((4, 2), np.int8)}))),
            4, "observations['arm'][1]['joints']: shape (4, 3), expected (4, 2)"),
        "nan": (box, tensor(nan), 5, "observations: contains NaN at row 3"),
        "nan unbatched": (box, tensor(nan[3]), None, "contains NaN at index (1,)"),
        "multi binary value": (gs.MultiBinary(3), tensor(np.array([[0, 1, 1], [1, 2, 0]], np.int64)), 2,
                               "observations: contains 2 at row 1, MultiBinary values must be 0 or 1"),
        "multi binary negative": (gs.MultiBinary(2), tensor(np.array([[0, -1]], np.int8)), 1, "contains -1 at row 0"),
    }
    m = tensor(np.zeros((4, 3), f32))
    m.tensor.data = b"\0" * 40
    cases["bad byte count"] = (box, m, 4, "observations: tensor data has 40 bytes, shape (4, 3) float32 needs 48")
    m = tensor(np.zeros((2, 2), bool))
    m.tensor.data = b"\x00\x01\x01\x02"
    cases["bool byte not 0/1"] = (gs.MultiBinary(2), m, 2, "contains 2 at row 1")
    m = tensor(np.zeros((4, 3), f32))
    m.tensor.dtype = pb.DTYPE_UNSPECIFIED
    cases["unspecified dtype"] = (box, m, 4, "dtype DTYPE_UNSPECIFIED, expected float32")
    return cases


def _unchecked(space, value):
    msg = pb.Value()
    fill_value(msg, space, value)  # batched=None: no shape check on encode
    return msg


def _drop_key(msg, key):
    del msg.dict.items[key]
    return msg


DECODE_ERRORS = _decode_errors()


@pytest.mark.parametrize("case", DECODE_ERRORS)
def test_decode_errors(case):
    space, msg, n_rows, substring = DECODE_ERRORS[case]
    with pytest.raises(BridgeError) as ei:
        decode_value(space, wire(msg), n_rows, "observations")
    assert_invalid(ei, substring)
    assert str(ei.value).startswith("observations")


def test_decode_error_message_starts_with_what():
    msg = pb.Value(tensor=to_tensor(np.zeros((2, 3))))
    with pytest.raises(BridgeError) as ei:
        decode_value(gs.Dict({"position": gs.Box(0, 1, (3,), np.float32)}), msg, 2, "observations of agent rows 0")
    assert str(ei.value).startswith("observations of agent rows 0: expected a dict")


@pytest.mark.parametrize("bad, shown", [(np.inf, "+Inf"), (-np.inf, "-Inf"), (np.nan, "NaN")])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_decode_refuses_non_finite_even_with_infinite_bounds(bad, shown, dtype):
    """The contract: float leaves are finite. Infinite Box bounds mean "unbounded", not that
    infinity is a value a learner can bootstrap from; the batched fast path agrees."""
    from simbridge.wire import leaf_codec
    from simbridge.wire.errors import Reason
    space = gs.Box(-np.inf, np.inf, (2,), dtype)
    rows = np.array([[1.0, 2.0], [3.0, bad]], dtype)
    msg = wire(encode_value(space, rows, batched=True))
    for decode in (lambda: decode_value(space, msg, 2, "obs"), lambda: leaf_codec.batch_decoder(space)(msg, 2, "obs")):
        with pytest.raises(BridgeError) as ei:
            decode()
        assert_invalid(ei, "obs", f"contains {shown} at row 1")
        assert ei.value.reason == Reason.INVALID_VALUE


def test_decode_accepts_finite_values_whose_sum_overflows():
    space = gs.Box(-np.inf, np.inf, (2,), np.float32)
    big = np.finfo(np.float32).max
    msg = wire(encode_value(space, np.array([[big, big]], np.float32), batched=True))
    np.testing.assert_array_equal(decode_value(space, msg, 1, "obs"), [[big, big]])


# ---------------------------------------------------------------- bounds


def test_check_contains_accepts_valid_batches():
    rng = np.random.default_rng(2)
    for name, space in ALL_SPACES.items():
        check_contains(space, sample_batch_of(space, 50, rng), 50, name)
        check_contains(space, sample_batch_of(space, 0, rng), 0, name)


@pytest.mark.parametrize(
    "space, value, substring",
    [
        (gs.Discrete(2), np.array([0, 1, 5, 7]), "actions row 2: 5 is outside Discrete(2)"),
        (gs.Discrete(3, start=1), np.array([1, 0]), "actions row 1: 0 is outside Discrete(3, start=1)"),
        (gs.Discrete(3, start=1), np.array([3, 4]), "actions row 1: 4 is outside"),
        (gs.MultiDiscrete([2, 3]), np.array([[1, 2], [0, 3]]), "actions row 1: 3 at index (1,) is outside [0, 3)"),
        (gs.MultiDiscrete([2, 3], start=[5, 5]), np.array([[5, 7], [4, 5]]), "actions row 1: 4 at index (0,) is outside [5, 7)"),
        (gs.MultiBinary(2), np.array([[1, 0], [0, 3]], np.int8), "actions row 1: 3 at index (1,) is not 0 or 1"),
        (gs.Box(-1.0, 1.0, (2,), np.float32), np.array([[0, 0], [0, 0], [0.5, 1.5]], np.float32),
         "actions row 2: 1.5 at index (1,) is outside [-1.0, 1.0]"),
        (gs.Box(-1.0, 1.0, (2,), np.float32), np.array([[0, np.nan]], np.float32),
         "actions row 0: NaN at index (1,) is outside"),
        (gs.Box(0, 10, (), np.int32), np.array([3, 11], np.int32), "actions row 1: 11 is outside [0, 10]"),
        (gs.Dict({"arm": gs.Tuple((gs.Discrete(2), gs.Discrete(4)))}),
         {"arm": (np.array([0, 1]), np.array([0, 4]))}, "actions['arm'][1] row 1: 4 is outside Discrete(4)"),
    ],
)
def test_check_contains_errors(space, value, substring):
    with pytest.raises(BridgeError) as ei:
        check_contains(space, value, len(leaf_rows_of(value)), "actions")
    assert_invalid(ei, substring)


def leaf_rows_of(value):
    return range(leaf_rows(value))


def test_check_contains_unbatched():
    check_contains(gs.Discrete(2), np.array(1), None, "action")
    with pytest.raises(BridgeError) as ei:
        check_contains(gs.Box(0.0, 1.0, (2,)), np.array([0.5, 2.0], np.float32), None, "action")
    assert_invalid(ei, "action: 2.0 at index (1,) is outside [0.0, 1.0]")


def test_check_contains_on_decoded_values():
    space = gs.Discrete(2)
    out = decode_value(space, encode_value(space, [0, 1, 2], True), 3, "actions")
    with pytest.raises(BridgeError) as ei:
        check_contains(space, out, 3, "actions")
    assert_invalid(ei, "actions row 2: 2 is outside Discrete(2)")


# ---------------------------------------------------------------- sampling


@pytest.mark.parametrize("name", ALL_SPACES)
def test_sample_batch_shapes_dtypes_and_bounds(name):
    space = ALL_SPACES[name]
    batch = sample_batch_of(space, 200, np.random.default_rng(3))
    _assert_dtypes(space, batch)
    _assert_batched_shapes(space, batch, 200)
    check_contains(space, batch, 200, name)
    # And gymnasium agrees, row by row.
    for i in range(0, 200, 37):
        assert space.contains(_row(batch, i))


def _assert_batched_shapes(space, value, n):
    if isinstance(space, gs.Dict):
        assert list(value) == list(space.spaces)
        for k, s in space.spaces.items():
            _assert_batched_shapes(s, value[k], n)
    elif isinstance(space, gs.Tuple):
        assert isinstance(value, tuple) and len(value) == len(space.spaces)
        for s, v in zip(space.spaces, value):
            _assert_batched_shapes(s, v, n)
    else:
        assert value.shape == (n, *space.shape)


def test_sample_box_respects_each_kind_of_bound():
    space = LEAF_SPACES["box_half_bounded"]  # [0, inf), (-inf, 0], (-inf, inf), [1, 2]
    x = sample_batch_of(space, 10_000, np.random.default_rng(4))
    assert np.isfinite(x).all()
    assert (x[:, 0] >= 0).all() and (x[:, 1] <= 0).all()
    assert (x[:, 2] < 0).any() and (x[:, 2] > 0).any()
    assert (x[:, 3] >= 1).all() and (x[:, 3] <= 2).all()
    # Uniform over the bounded dimension, not stuck at one end.
    assert 1.4 < x[:, 3].mean() < 1.6


def test_sample_huge_bounds_stay_finite():
    x = sample_batch_of(LEAF_SPACES["box_huge"], 1000, np.random.default_rng(5))
    assert np.isfinite(x).all()
    assert (x < 0).any() and (x > 0).any()


def test_sample_discrete_covers_range():
    x = sample_batch_of(gs.Discrete(3, start=-1), 1000, np.random.default_rng(6))
    assert x.dtype == np.int64 and x.shape == (1000,)
    assert set(np.unique(x).tolist()) == {-1, 0, 1}


def test_sample_is_reproducible_and_fast():
    space = nested_space()
    a = sample_batch_of(space, 10, np.random.default_rng(7))
    b = sample_batch_of(space, 10, np.random.default_rng(7))
    assert_value_equal(a, b)
    # Vectorised: a big batch costs about as little as a small one.
    t0 = time.perf_counter()
    sample_batch_of(space, 100_000, np.random.default_rng(7))
    assert time.perf_counter() - t0 < 0.5


# ---------------------------------------------------------------- zeros, rows


@pytest.mark.parametrize("name", ALL_SPACES)
def test_zeros_like_space(name):
    space = ALL_SPACES[name]
    z = zeros_like_space(space, 6)
    _assert_dtypes(space, z)
    _assert_batched_shapes(space, z, 6)
    for leaf in _leaves(z):
        assert not leaf.any()


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, tuple):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_leaf_rows():
    assert leaf_rows(np.zeros((5, 2))) == 5
    assert leaf_rows(zeros_like_space(nested_space(), 9)) == 9
    assert leaf_rows({"a": (np.zeros(3),)}) == 3
    assert leaf_rows([1, 2, 3]) == 3  # a list is a leaf
    assert leaf_rows({}) is None
    assert leaf_rows(()) is None
    with pytest.raises(BridgeError) as ei:
        leaf_rows(np.float32(1.0))
    assert_invalid(ei, "no row dimension")


# ---------------------------------------------------------------- speed


def test_encode_decode_batch_speed():
    space = gs.Box(-np.inf, np.inf, (64,), np.float32)
    batch = np.random.default_rng(8).standard_normal((256, 64), dtype=np.float32)
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        msg = encode_value(space, batch, batched=True)
        out = decode_value(space, msg, 256, "observations")
        best = min(best, time.perf_counter() - t0)
    np.testing.assert_array_equal(out, batch)
    assert best < 5e-3, f"encode+decode took {best * 1e3:.2f} ms"


def test_gymnasium_env_spaces_round_trip():
    # Spaces of real environments, as a simulator would declare them.
    for env_id in ("CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0"):
        env = gym.make(env_id)
        for space in (env.observation_space, env.action_space):
            assert space_from_proto(wire(space_to_proto(space))) == space
        env.close()
