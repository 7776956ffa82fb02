import time

import grpc
import numpy as np
import pytest

from simbridge.wire.errors import BridgeError
from simbridge.wire.tensors import dtype_name, fill_tensor, from_tensor, pb_dtype, to_tensor
from simbridge.wire.v1 import simbridge_pb2 as pb

ALL_DTYPES = [
    (np.float32, pb.FLOAT32),
    (np.float64, pb.FLOAT64),
    (np.float16, pb.FLOAT16),
    (np.int8, pb.INT8),
    (np.int16, pb.INT16),
    (np.int32, pb.INT32),
    (np.int64, pb.INT64),
    (np.uint8, pb.UINT8),
    (np.uint16, pb.UINT16),
    (np.uint32, pb.UINT32),
    (np.uint64, pb.UINT64),
    (np.bool_, pb.BOOL),
]


def assert_invalid(exc_info, substring):
    assert exc_info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert substring in str(exc_info.value), str(exc_info.value)


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("np_dtype, code", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (2, 0, 4), (3, 1, 2, 2)])
def test_round_trip_every_dtype(np_dtype, code, shape):
    rng = np.random.default_rng(0)
    arr = (rng.random(shape) * 100).astype(np_dtype)
    t = to_tensor(arr)
    assert t.dtype == code
    assert tuple(t.shape) == shape
    assert len(t.data) == arr.size * arr.itemsize
    # Through the wire too, not just the in-memory message.
    back = from_tensor(pb.Tensor.FromString(t.SerializeToString()))
    assert back.dtype == np.dtype(np_dtype)
    assert back.shape == shape
    np.testing.assert_array_equal(back, arr)


def test_pb_dtype_mapping():
    for np_dtype, code in ALL_DTYPES:
        assert pb_dtype(np_dtype) == code
        assert pb_dtype(np.dtype(np_dtype).newbyteorder(">")) == code
        assert dtype_name(code) == np.dtype(np_dtype).name
    assert dtype_name(pb.DTYPE_UNSPECIFIED) == "DTYPE_UNSPECIFIED"


def test_python_values_keep_their_natural_dtype():
    assert to_tensor([1.5, 2.0]).dtype == pb.FLOAT64  # not silently float32
    assert to_tensor(3.0).dtype == pb.FLOAT64
    assert to_tensor([1, 2]).dtype == pb.INT64
    assert to_tensor([True, False]).dtype == pb.BOOL
    assert tuple(to_tensor(7).shape) == ()


def test_wire_is_little_endian_and_big_endian_input_is_swapped():
    native = to_tensor(np.array([1, 258], dtype="<i4"))
    assert native.data == b"\x01\x00\x00\x00\x02\x01\x00\x00"
    big = to_tensor(np.array([1, 258], dtype=">i4"))
    assert big.dtype == pb.INT32
    assert big.data == native.data
    np.testing.assert_array_equal(from_tensor(big), [1, 258])


def test_non_contiguous_input():
    arr = np.arange(24, dtype=np.float32).reshape(4, 6)
    for view in (arr.T, arr[:, ::2], arr[::-1]):
        np.testing.assert_array_equal(from_tensor(to_tensor(view)), view)


def test_fill_tensor_replaces_existing_content():
    t = to_tensor(np.zeros((2, 3, 4), dtype=np.float64))
    fill_tensor(t, np.array([1, 2], dtype=np.int8))
    assert t.dtype == pb.INT8
    assert tuple(t.shape) == (2,)
    np.testing.assert_array_equal(from_tensor(t), [1, 2])


def test_fill_tensor_into_submessage():
    box = pb.BoxSpace()
    fill_tensor(box.low, np.full(3, -1.0, dtype=np.float32))
    assert box.HasField("low")
    np.testing.assert_array_equal(from_tensor(box.low), [-1, -1, -1])


def test_decode_is_zero_copy():
    t = to_tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    arr = from_tensor(t)
    # A view: it does not own its memory, it is backed by the message bytes.
    assert not arr.flags.owndata
    assert arr.base is not None
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, bytes)
    assert not arr.flags.writeable


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "value, name",
    [
        (np.array([object(), 1], dtype=object), "object"),
        (np.array(["a", "bc"]), "<U2"),
        (np.array([1 + 2j]), "complex128"),
        (np.array([1], dtype="datetime64[s]"), "datetime64"),
    ],
)
def test_unsupported_dtype(value, name):
    with pytest.raises(BridgeError) as ei:
        to_tensor(value)
    assert_invalid(ei, f"unsupported tensor dtype {name}")


def test_from_tensor_unspecified_dtype():
    with pytest.raises(BridgeError) as ei:
        from_tensor(pb.Tensor(shape=[1], data=b"\0\0\0\0"))
    assert_invalid(ei, "DTYPE_UNSPECIFIED")


def test_from_tensor_unknown_dtype():
    t = pb.Tensor.FromString(pb.Tensor(dtype=pb.FLOAT32).SerializeToString())
    t.dtype = 99  # open enum: a newer peer could send it
    with pytest.raises(BridgeError) as ei:
        from_tensor(t)
    assert_invalid(ei, "unknown tensor dtype 99")


def test_from_tensor_negative_dim():
    with pytest.raises(BridgeError) as ei:
        from_tensor(pb.Tensor(dtype=pb.FLOAT32, shape=[2, -1], data=b""))
    assert_invalid(ei, "tensor shape (2, -1) has a negative dimension")


def test_from_tensor_size_mismatch():
    with pytest.raises(BridgeError) as ei:
        from_tensor(pb.Tensor(dtype=pb.FLOAT32, shape=[2, 4], data=b"\0" * 12))
    assert_invalid(ei, "tensor data has 12 bytes, shape (2, 4) float32 needs 32")


def test_from_tensor_too_many_bytes_for_scalar():
    with pytest.raises(BridgeError) as ei:
        from_tensor(pb.Tensor(dtype=pb.INT64, shape=[], data=b"\0" * 16))
    assert_invalid(ei, "tensor data has 16 bytes, shape () int64 needs 8")


def test_from_tensor_huge_shape_does_not_overflow():
    with pytest.raises(BridgeError) as ei:
        from_tensor(pb.Tensor(dtype=pb.FLOAT64, shape=[2**62, 2**62], data=b""))
    assert_invalid(ei, "tensor data has 0 bytes")


# ---------------------------------------------------------------- speed


def test_encode_decode_speed():
    arr = np.random.default_rng(0).random((256, 64), dtype=np.float32)
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        t = to_tensor(arr)
        back = from_tensor(t)
        best = min(best, time.perf_counter() - t0)
    np.testing.assert_array_equal(back, arr)
    assert best < 5e-3, f"encode+decode took {best * 1e3:.2f} ms"
