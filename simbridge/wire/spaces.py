"""gymnasium spaces <-> the wire (`Space`); their values are encoded in values.py.

Supported spaces: Box, Discrete, MultiDiscrete, MultiBinary, and Dict / Tuple
nesting them. Values follow the space's structure: an array per leaf space, a
dict for Dict, a tuple for Tuple. Batched values carry N rows: every leaf has
shape (N, *leaf_shape).

Everything here works on whole leaves with numpy; nothing loops over rows or
elements, because the server decodes and checks every observation and action
that passes through it.

Dtype rules (what the server accepts and returns):
  * Box: exactly the box's dtype, no casting (a float64 observation for a
    float32 box is a client bug worth reporting, not something to hide);
    float values finite (NaN and +-Inf refused, whatever the bounds).
  * Discrete, MultiDiscrete: any integer dtype on the wire, int64 in numpy.
    The bridge always uses int64 for these, so a space declared with another
    integer dtype becomes int64 on the wire (the proto has no dtype field for
    Discrete and sends MultiDiscrete's nvec as int64).
  * MultiBinary: any integer dtype or bool on the wire, values 0/1, int8 in
    numpy (gymnasium's dtype for MultiBinary).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from simbridge.wire.errors import BridgeError, invalid_value
from simbridge.wire.tensors import INTEGER_DTYPES, MAX_DIMS, dtype_name, fill_tensor, from_tensor
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.values import Path, fmt_path
# The value codecs, re-exported: callers treat a space and its values as one codec.
from simbridge.wire.bounds import check_contains  # noqa: F401
from simbridge.wire.values import decode_value, encode_value, fill_value  # noqa: F401


# ---------------------------------------------------------------- spaces

# A leaf's values travel and are kept batched, (rows, *leaf_shape): one dimension is the rows'.
MAX_LEAF_DIMS = MAX_DIMS - 1


def space_elements(space: gs.Space) -> int:
    """Elements of one value of `space`: the product of each leaf's shape, summed over the
    leaves (a Discrete is one). What a policy's memory per observation or action grows with."""
    if isinstance(space, gs.Dict):
        return sum(space_elements(s) for s in space.spaces.values())
    if isinstance(space, gs.Tuple):
        return sum(space_elements(s) for s in space.spaces)
    return math.prod(space.shape)   # Python ints: a hostile shape cannot overflow


def space_to_proto(space: gs.Space, what: str = "space") -> pb.Space:
    """The wire form of a gymnasium space (INVALID_ARGUMENT if unsupported)."""
    msg = pb.Space()
    _fill_space(msg, space, what, ())
    return msg


def _fill_space(msg: pb.Space, space: gs.Space, what: str, path: Path) -> None:
    if isinstance(space, gs.Box):
        try:
            fill_tensor(msg.box.low, space.low)
            fill_tensor(msg.box.high, space.high)
        except BridgeError as e:
            raise invalid_value(f"{fmt_path(what, path)}: Box: {e.message}") from None
    elif isinstance(space, gs.Discrete):
        msg.discrete.n = int(space.n)
        msg.discrete.start = int(space.start)
    elif isinstance(space, gs.MultiDiscrete):
        fill_tensor(msg.multi_discrete.nvec, space.nvec.astype(np.int64))
        fill_tensor(msg.multi_discrete.start, space.start.astype(np.int64))
    elif isinstance(space, gs.MultiBinary):
        msg.multi_binary.shape.extend(space.shape)
    elif isinstance(space, gs.Dict):
        # An empty Dict must still say "dict" on the wire.
        msg.dict.SetInParent()
        for key, sub in space.spaces.items():
            if not isinstance(key, str):
                raise invalid_value(
                    f"{fmt_path(what, path)}: Dict key {key!r} is not a string"
                )
            named = msg.dict.spaces.add()
            named.name = key
            _fill_space(named.space, sub, what, path + (key,))
    elif isinstance(space, gs.Tuple):
        msg.tuple.SetInParent()
        for i, sub in enumerate(space.spaces):
            _fill_space(msg.tuple.spaces.add(), sub, what, path + (i,))
    else:
        raise invalid_value(
            f"{fmt_path(what, path)}: unsupported space {type(space).__name__} ({space!r}); "
            "supported: Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple"
        )


def space_from_proto(msg: pb.Space, what: str = "space") -> gs.Space:
    """The gymnasium space of a wire Space, validated.

    Raises INVALID_ARGUMENT for an empty or malformed message, naming the
    subspace (`what` prefixes the message, e.g. "observation_space").
    """
    return _space_from(msg, what, ())


def _space_from(msg: pb.Space, what: str, path: Path) -> gs.Space:
    where = fmt_path(what, path)
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise invalid_value(f"{where}: empty Space (no kind set)")

    if kind == "box":
        box = msg.box
        if not (box.HasField("low") and box.HasField("high")):
            raise invalid_value(f"{where}: Box needs both low and high")
        low = _bound(box.low, where, "low")
        high = _bound(box.high, where, "high")
        _check_dims(low.shape, where, "Box")
        if low.dtype != high.dtype:
            raise invalid_value(
                f"{where}: Box low dtype {low.dtype.name} != high dtype {high.dtype.name}"
            )
        if low.shape != high.shape:
            raise invalid_value(
                f"{where}: Box low shape {low.shape} != high shape {high.shape}"
            )
        if low.dtype.kind == "f" and (np.isnan(low).any() or np.isnan(high).any()):
            raise invalid_value(f"{where}: Box bounds contain NaN")
        # Native byte order for the space itself; the wire copy was little-endian.
        dtype = low.dtype.newbyteorder("=")
        return _build(where, gs.Box, low=low, high=high, shape=low.shape, dtype=dtype)

    if kind == "discrete":
        n, start = msg.discrete.n, msg.discrete.start
        if n <= 0:
            raise invalid_value(f"{where}: Discrete n must be positive, got {n}")
        return _build(where, gs.Discrete, int(n), start=int(start))

    if kind == "multi_discrete":
        md = msg.multi_discrete
        if not md.HasField("nvec"):
            raise invalid_value(f"{where}: MultiDiscrete needs nvec")
        nvec = _int_tensor(md.nvec, where, "nvec")
        _check_dims(nvec.shape, where, "MultiDiscrete")
        if nvec.size and nvec.min() <= 0:
            raise invalid_value(
                f"{where}: MultiDiscrete nvec must be positive, got {nvec.tolist()}"
            )
        start = None
        if md.HasField("start"):
            start = _int_tensor(md.start, where, "start")
            if start.shape != nvec.shape:
                raise invalid_value(
                    f"{where}: MultiDiscrete start shape {start.shape} "
                    f"!= nvec shape {nvec.shape}"
                )
        return _build(where, gs.MultiDiscrete, nvec, dtype=np.int64, start=start)

    if kind == "multi_binary":
        shape = tuple(msg.multi_binary.shape)
        _check_dims(shape, where, "MultiBinary")
        if not shape or min(shape) <= 0:
            raise invalid_value(
                f"{where}: MultiBinary shape must be non-empty and positive, got {shape}"
            )
        # gymnasium tells MultiBinary(5) (n == 5) from MultiBinary([5])
        # (n == (5,)); the wire only has the shape, so 1-D means the int form.
        return _build(where, gs.MultiBinary, shape[0] if len(shape) == 1 else shape)

    if kind == "dict":
        items = []
        seen = set()
        for named in msg.dict.spaces:
            if named.name in seen:
                raise invalid_value(f"{where}: duplicate Dict key {named.name!r}")
            seen.add(named.name)
            items.append((named.name, _space_from(named.space, what, path + (named.name,))))
        # A list of pairs keeps the declared order (a plain dict would be sorted).
        return gs.Dict(items)

    if kind == "tuple":
        return gs.Tuple(
            [_space_from(s, what, path + (i,)) for i, s in enumerate(msg.tuple.spaces)]
        )

    raise invalid_value(f"{where}: unsupported Space kind {kind!r}")  # newer proto


def _check_dims(shape: tuple, where: str, kind: str) -> None:
    if len(shape) > MAX_LEAF_DIMS:
        raise invalid_value(f"{where}: {kind} has {len(shape)} dimensions; at most {MAX_LEAF_DIMS} are "
                            f"supported (values carry one more, the rows')")


def _bound(t: pb.Tensor, where: str, name: str) -> np.ndarray:
    try:
        return from_tensor(t)
    except BridgeError as e:
        raise invalid_value(f"{where}: Box {name}: {e.message}") from None


def _int_tensor(t: pb.Tensor, where: str, name: str) -> np.ndarray:
    if t.dtype not in INTEGER_DTYPES:
        raise invalid_value(
            f"{where}: MultiDiscrete {name} dtype {dtype_name(t.dtype)}, expected int64"
        )
    try:
        return from_tensor(t).astype(np.int64)
    except BridgeError as e:
        raise invalid_value(f"{where}: MultiDiscrete {name}: {e.message}") from None


def _build(where: str, cls: type, *args: Any, **kwargs: Any) -> gs.Space:
    # gymnasium's own checks (e.g. Box low <= high) raise plain exceptions;
    # they are the client's mistake, so report them as INVALID_ARGUMENT.
    try:
        return cls(*args, **kwargs)
    except (ValueError, TypeError, AssertionError) as e:
        raise invalid_value(f"{where}: invalid {cls.__name__}: {e}") from None


# ---------------------------------------------------------------- batches


def sample_batch_of(space: gs.Space, n: int, rng: np.random.Generator) -> Any:
    """`n` random values of `space` in batched layout (leaves (n, *shape)).

    Box: uniform where both bounds are finite, low + exponential / high -
    exponential where one is, standard normal where neither is.
    """
    if isinstance(space, gs.Dict):
        return {k: sample_batch_of(s, n, rng) for k, s in space.spaces.items()}
    if isinstance(space, gs.Tuple):
        return tuple(sample_batch_of(s, n, rng) for s in space.spaces)
    if isinstance(space, gs.Discrete):
        start = int(space.start)
        return rng.integers(start, start + int(space.n), size=n, dtype=np.int64)
    if isinstance(space, gs.MultiDiscrete):
        start = space.start.astype(np.int64)
        size = (n, *space.shape)
        return rng.integers(start, start + space.nvec.astype(np.int64), size=size, dtype=np.int64)
    if isinstance(space, gs.MultiBinary):
        return rng.integers(0, 2, size=(n, *space.shape), dtype=np.int8)
    if isinstance(space, gs.Box):
        return _sample_box(space, n, rng)
    raise invalid_value(f"unsupported space {type(space).__name__} ({space!r})")


def _sample_box(space: gs.Box, n: int, rng: np.random.Generator) -> np.ndarray:
    size = (n, *space.shape)
    low, high = space.low, space.high
    if space.dtype.kind == "b":
        return rng.integers(low.astype(np.int64), high.astype(np.int64), size=size,
                            endpoint=True).astype(np.bool_)
    if space.dtype.kind in "iu":
        return rng.integers(low, high, size=size, dtype=space.dtype, endpoint=True)

    low64 = low.astype(np.float64)
    high64 = high.astype(np.float64)
    lo_fin = np.isfinite(low64)
    hi_fin = np.isfinite(high64)
    both = lo_fin & hi_fin
    if both.all():
        x = _lerp(low64, high64, rng.random(size))
    else:
        # Every branch gets finite inputs (infinite bounds replaced by 0) so
        # that np.where never evaluates inf - inf.
        lo = np.where(lo_fin, low64, 0.0)
        hi = np.where(hi_fin, high64, 0.0)
        x = rng.standard_normal(size)
        if both.any():
            x = np.where(both, _lerp(lo, hi, rng.random(size)), x)
        only_lo = lo_fin & ~hi_fin
        if only_lo.any():
            x = np.where(only_lo, lo + rng.exponential(size=size), x)
        only_hi = hi_fin & ~lo_fin
        if only_hi.any():
            x = np.where(only_hi, hi - rng.exponential(size=size), x)
    # Clip in float64: rounding to the box dtype then cannot leave [low, high]
    # since the bounds are representable in it.
    return np.clip(x, low64, high64).astype(space.dtype)


def _lerp(low: np.ndarray, high: np.ndarray, u: np.ndarray) -> np.ndarray:
    # Not low + u * (high - low): high - low overflows to inf for bounds near
    # the largest float.
    return low * (1.0 - u) + high * u


def zeros_like_space(space: gs.Space, n: int) -> Any:
    """A batch of `n` zero values in batched layout, with the space's dtypes.

    Placeholders (e.g. "no previous action"): zero need not lie in the space
    (Discrete with start=1, a Box bounded away from 0).
    """
    if isinstance(space, gs.Dict):
        return {k: zeros_like_space(s, n) for k, s in space.spaces.items()}
    if isinstance(space, gs.Tuple):
        return tuple(zeros_like_space(s, n) for s in space.spaces)
    if isinstance(space, gs.Box):
        return np.zeros((n, *space.shape), dtype=space.dtype)
    if isinstance(space, (gs.Discrete, gs.MultiDiscrete)):
        return np.zeros((n, *space.shape), dtype=np.int64)
    if isinstance(space, gs.MultiBinary):
        return np.zeros((n, *space.shape), dtype=np.int8)
    raise invalid_value(f"unsupported space {type(space).__name__} ({space!r})")


def leaf_rows(value: Any) -> int | None:
    """Leading dimension of the first leaf of a batched value.

    Dicts and tuples are the nesting; anything else (array, list) is a leaf.
    None when the value has no leaves (empty Dict / Tuple).
    """
    while isinstance(value, (dict, tuple)):
        if not value:
            return None
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
    shape = np.shape(value)
    if not shape:
        raise invalid_value("value has no row dimension (a scalar leaf)")
    return shape[0]


def batch_row0(space: gs.Space, value: Any) -> Any:
    """One value of `space` as a batch of one row (unbatch_row0's inverse). The space, not the
    value, says what nests: a Tuple's items may come as a list, a Box value as a list."""
    if isinstance(space, gs.Dict):
        if not isinstance(value, dict) or value.keys() != space.spaces.keys():
            return value   # fill_value names what is wrong with it
        return {k: batch_row0(space[k], value[k]) for k in space.spaces}
    if isinstance(space, gs.Tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(space.spaces):
            return value
        return tuple(batch_row0(s, v) for s, v in zip(space.spaces, value))
    return _leaf(space, value)[None]


def stack_values(space: gs.Space, values: list) -> Any:
    """Values of `space` (one per row) as one batched value, nested as the space says."""
    if isinstance(space, gs.Dict):
        if not all(isinstance(v, dict) and v.keys() == space.spaces.keys() for v in values):
            return next(v for v in values if not isinstance(v, dict) or v.keys() != space.spaces.keys())
        return {k: stack_values(space[k], [v[k] for v in values]) for k in space.spaces}
    if isinstance(space, gs.Tuple):
        n = len(space.spaces)
        if not all(isinstance(v, (tuple, list)) and len(v) == n for v in values):
            return next(v for v in values if not isinstance(v, (tuple, list)) or len(v) != n)
        return tuple(stack_values(s, [v[i] for v in values]) for i, s in enumerate(space.spaces))
    return np.stack([_leaf(space, v) for v in values])


def _leaf(space: gs.Space, value: Any) -> np.ndarray:
    # As fill_value encodes them: an array keeps its dtype (a mismatch is the caller's to
    # see), a list or Python number takes a Box's dtype.
    if isinstance(space, gs.Box) and not isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value, dtype=space.dtype)
    return np.asarray(value)


def unbatch_row0(space: gs.Space, value: Any) -> Any:
    """Row 0 of a batched value as one value of `space`, Discrete leaves as Python ints."""
    if isinstance(space, gs.Dict):
        return {k: unbatch_row0(space[k], value[k]) for k in space.spaces}
    if isinstance(space, gs.Tuple):
        return tuple(unbatch_row0(s, v) for s, v in zip(space.spaces, value))
    if isinstance(space, gs.Discrete):
        return int(value[0])
    return np.array(value[0])
