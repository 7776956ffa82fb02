"""Batched codecs compiled once per space, for the per-step hot path.

spaces.decode_value and spaces.fill_value walk the space on every call:
isinstance checks, structure, dtype and shape rules, error messages that name
the leaf. A batched simulator sends values of the same space hundreds of
times a second, so its session compiles the space once. A space that is one
Box, Discrete or MultiDiscrete leaf gets a direct path: a few field
comparisons, then a view of the bytes. Other spaces, and any value that does
not match exactly, take the generic path, which is also what words the
error. Either way the result is the same.
"""
import math
from typing import Any, Callable

import numpy as np
from gymnasium import spaces as gs

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.v1 import simbridge_pb2 as pb

Decoder = Callable[[pb.Value, int, str], Any]
Encoder = Callable[[pb.Value, Any, str], None]


def _leaf_dtype(space: gs.Space):
    """The numpy dtype a single-leaf space has on the fast path, or None."""
    if type(space) is gs.Box:
        return np.dtype(space.dtype)
    if type(space) in (gs.Discrete, gs.MultiDiscrete):
        return np.dtype(np.int64)   # the bridge's wire dtype for these (spaces.py)
    return None


# Up to this many float elements, a C loop over them as Python floats is cheaper than a numpy
# reduction's set-up (0.3 against 1-2 µs for a CartPole observation, or one reward).
SMALL_FLOATS = 32


def quick_all_finite(arr: np.ndarray) -> bool:
    """The hot path's test of a float array: True when every element is finite. False when one
    is NaN or +-Inf, or (over SMALL_FLOATS elements, tested by one reduction) when finite values
    overflowed the sum: the caller then decides exactly and words the error."""
    if arr.size <= SMALL_FLOATS:
        return all(map(math.isfinite, arr.ravel().tolist()))
    with np.errstate(over="ignore", invalid="ignore"):
        return math.isfinite(float(arr.sum()))


def batch_decoder(space: gs.Space) -> Decoder:
    """decode(msg, n, what) == spaces.decode_value(space, msg, n, what)."""
    def generic(msg: pb.Value, n: int, what: str) -> Any:
        return sb_spaces.decode_value(space, msg, n, what)

    dtype = _leaf_dtype(space)
    if dtype is None:
        return generic
    code = tensors.pb_dtype(dtype)
    leaf = tuple(space.shape)
    row_bytes = math.prod(leaf) * dtype.itemsize
    check_finite = code in tensors.FLOAT_DTYPES

    def decode(msg: pb.Value, n: int, what: str) -> Any:
        t = msg.tensor   # a default Tensor (dtype 0) when the value is not one: generic path
        data = t.data
        if t.dtype != code or len(data) != n * row_bytes or tuple(t.shape) != (n, *leaf):
            return generic(msg, n, what)
        arr = np.frombuffer(data, dtype).reshape((n, *leaf))
        if check_finite and arr.size and not quick_all_finite(arr):
            return generic(msg, n, what)   # decides exactly and words the error
        return arr
    return decode


def batch_encoder(space: gs.Space) -> Encoder:
    """fill(msg, value, what) == spaces.fill_value(msg, space, value, batched=True, what=what)."""
    def generic(msg: pb.Value, value: Any, what: str) -> None:
        sb_spaces.fill_value(msg, space, value, batched=True, what=what)

    dtype = _leaf_dtype(space)
    if dtype is None:
        return generic
    code = tensors.pb_dtype(dtype)
    leaf = tuple(space.shape)
    ndim = len(leaf) + 1

    def fill(msg: pb.Value, value: Any, what: str) -> None:
        if type(value) is not np.ndarray or value.dtype != dtype or value.ndim != ndim \
                or value.shape[1:] != leaf:
            return generic(msg, value, what)
        t = msg.tensor   # selects the tensor in the oneof; every field is written below
        t.dtype = code
        t.shape[:] = value.shape
        t.data = value.tobytes()
    return fill


def vector_view(t: pb.Tensor, code: int, dtype: np.dtype, n: int):
    """A (n,) tensor of exactly wire dtype `code` (numpy `dtype`) as a read-only view, or
    None when it is anything else: the caller then takes its generic path, which words the error."""
    data = t.data
    if t.dtype != code or len(data) != n * dtype.itemsize or len(t.shape) != 1 or t.shape[0] != n:
        return None
    return np.frombuffer(data, dtype)
