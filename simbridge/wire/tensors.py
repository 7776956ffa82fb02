"""numpy arrays <-> `simbridge.wire.v1.Tensor`.

This is on the hot path of every request, so the conversions are one numpy
call each: `ndarray.tobytes()` to encode and `np.frombuffer` to decode (a view
over the message's bytes, no copy). Tensors are little-endian on the wire; the
dtypes below are spelled with an explicit byte order so that decoding stays a
view on any host and encoding only byte-swaps arrays that are not already
little-endian.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from simbridge.wire.errors import invalid_value
from simbridge.wire.v1 import simbridge_pb2 as pb

_PB_TO_NP: dict[int, np.dtype] = {
    pb.FLOAT32: np.dtype("<f4"),
    pb.FLOAT64: np.dtype("<f8"),
    pb.FLOAT16: np.dtype("<f2"),
    pb.INT8: np.dtype("i1"),
    pb.INT16: np.dtype("<i2"),
    pb.INT32: np.dtype("<i4"),
    pb.INT64: np.dtype("<i8"),
    pb.UINT8: np.dtype("u1"),
    pb.UINT16: np.dtype("<u2"),
    pb.UINT32: np.dtype("<u4"),
    pb.UINT64: np.dtype("<u8"),
    pb.BOOL: np.dtype("?"),
}

# Keyed by `dtype.str` ("<f4", "|b1", ...) rather than by the dtype itself:
# int64 can be spelled 'l' or 'q', which hash differently but share `.str`.
_NP_STR_TO_PB: dict[str, int] = {dt.str: code for code, dt in _PB_TO_NP.items()}

FLOAT_DTYPES = frozenset({pb.FLOAT16, pb.FLOAT32, pb.FLOAT64})
INTEGER_DTYPES = frozenset(
    {pb.INT8, pb.INT16, pb.INT32, pb.INT64, pb.UINT8, pb.UINT16, pb.UINT32, pb.UINT64}
)

_SUPPORTED = ", ".join(dt.name for dt in _PB_TO_NP.values())

# numpy's limit (NPY_MAXDIMS in numpy 2): a deeper shape cannot become an array at all.
MAX_DIMS = 64


def dtype_name(code: int) -> str:
    """numpy-style name of a wire dtype ("float32"), for error messages."""
    dt = _PB_TO_NP.get(code)
    if dt is not None:
        return dt.name
    if code == pb.DTYPE_UNSPECIFIED:
        return "DTYPE_UNSPECIFIED"
    return f"unknown dtype {code}"


def numpy_dtype(code: int) -> np.dtype:
    """The little-endian numpy dtype of a wire dtype."""
    dt = _PB_TO_NP.get(code)
    if dt is None:
        raise invalid_value(_bad_dtype_message(code))
    return dt


def pb_dtype(dtype: Any) -> int:
    """The wire dtype (`pb.DType` value) of a numpy dtype, any byte order."""
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    code = _NP_STR_TO_PB.get(dt.str)
    if code is None:
        code = _NP_STR_TO_PB.get(dt.newbyteorder("<").str)
        if code is None:
            raise invalid_value(f"unsupported tensor dtype {dt} (supported: {_SUPPORTED})")
    return code


def fill_tensor(t: pb.Tensor, array: Any) -> None:
    """Write `array` into the existing message `t` (replacing its content).

    Filling a submessage in place (`fill_tensor(req.rewards, r)`) spares the
    allocation and copy that `CopyFrom(to_tensor(r))` would cost.
    """
    arr = np.asarray(array)
    code = _NP_STR_TO_PB.get(arr.dtype.str)
    if code is None:
        # Not a little-endian supported dtype: either a big-endian array
        # (foreign data, or a big-endian host) that we swap, or unsupported.
        le = arr.dtype.newbyteorder("<")
        code = _NP_STR_TO_PB.get(le.str)
        if code is None:
            raise invalid_value(
                f"unsupported tensor dtype {arr.dtype} (supported: {_SUPPORTED})"
            )
        arr = arr.astype(le)
    t.dtype = code
    t.shape[:] = arr.shape
    # tobytes() also makes non-contiguous views (slices, transposes) row-major.
    t.data = arr.tobytes()


def to_tensor(array: Any) -> pb.Tensor:
    """A new Tensor holding `array`, dtype kept as is (float64 stays float64)."""
    t = pb.Tensor()
    fill_tensor(t, array)
    return t


def from_tensor(t: pb.Tensor) -> np.ndarray:
    """A read-only array viewing the tensor's bytes (no copy).

    Raises INVALID_ARGUMENT when the dtype is missing or unknown, a dimension
    is negative, or the byte count does not match the shape.
    """
    dt = _PB_TO_NP.get(t.dtype)
    if dt is None:
        raise invalid_value(_bad_dtype_message(t.dtype))
    shape = tuple(t.shape[:])  # slicing first is ~2x faster than iterating the container
    if len(shape) > MAX_DIMS:
        raise invalid_value(f"tensor has {len(shape)} dimensions; at most {MAX_DIMS} are supported")
    if shape and min(shape) < 0:
        raise invalid_value(f"tensor shape {shape} has a negative dimension")
    data = t.data
    # math.prod on Python ints: a hostile shape cannot overflow into a match.
    needed = math.prod(shape) * dt.itemsize
    if len(data) != needed:
        raise invalid_value(
            f"tensor data has {len(data)} bytes, shape {shape} {dt.name} needs {needed}"
        )
    try:
        return np.frombuffer(data, dtype=dt).reshape(shape)
    except ValueError as e:   # an empty tensor whose other dimensions numpy cannot index
        raise invalid_value(f"tensor shape {shape} is not a valid array shape: {e}") from None


def _bad_dtype_message(code: int) -> str:
    if code == pb.DTYPE_UNSPECIFIED:
        return "tensor dtype is DTYPE_UNSPECIFIED (not set)"
    return f"unknown tensor dtype {code}"
