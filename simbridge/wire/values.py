"""Values of gymnasium spaces <-> the wire (`Value`): encode, decode, bounds checks.

Values follow the space's structure: an array per leaf space, a dict for Dict,
a tuple for Tuple. Batched values carry N rows: every leaf has shape
(N, *leaf_shape). Everything here works on whole leaves with numpy; nothing
loops over rows or elements, because the server decodes and checks every
observation and action that passes through it. The dtype rules are in
spaces.py's docstring and in the proto.
"""

from __future__ import annotations

from typing import Any

import math

import numpy as np
from gymnasium import spaces as gs

from simbridge.wire.errors import BridgeError, invalid_value
from simbridge.wire.tensors import (
    FLOAT_DTYPES,
    INTEGER_DTYPES,
    dtype_name,
    fill_tensor,
    from_tensor,
    pb_dtype,
)
from simbridge.wire.v1 import simbridge_pb2 as pb

_MULTI_BINARY_DTYPES = INTEGER_DTYPES | {pb.BOOL}

Path = tuple  # dict keys and tuple indices from the root to a subspace


def fmt_path(what: str, path: Path) -> str:
    # Python indexing syntax, so a message reads like the code that would
    # reach the leaf: "observations['arm'][0]".
    return what + "".join(f"[{k!r}]" for k in path)


# ---------------------------------------------------------------- encode


def encode_value(space: gs.Space, value: Any, batched: bool) -> pb.Value:
    """The wire form of a (batched or single) value of `space`."""
    msg = pb.Value()
    fill_value(msg, space, value, batched=batched)
    return msg


def fill_value(
    msg: pb.Value,
    space: gs.Space,
    value: Any,
    *,
    batched: bool | None = None,
    what: str = "value",
) -> None:
    """Write `value` into the existing message `msg` (replacing its content).

    Box arrays keep their dtype (the server insists on the box's dtype, so a
    mismatch is reported rather than hidden); lists and Python scalars take
    the box's dtype. Discrete / MultiDiscrete leaves become int64, MultiBinary
    leaves int8 (bool kept).

    With `batched` given, leaf shapes are checked here so that a client finds
    its mistake before a round trip: (N, *leaf_shape) with one N for all
    leaves when True, leaf_shape when False. None skips the check.
    """
    msg.Clear()
    if batched is None:
        lead = None
    else:
        lead = [] if batched else ()
    _fill(msg, space, value, lead, what, ())


def _fill(msg: pb.Value, space: gs.Space, value: Any, lead: Any, what: str, path: Path) -> None:
    if isinstance(space, gs.Dict):
        if not isinstance(value, dict):
            raise invalid_value(
                f"{fmt_path(what, path)}: expected a dict, got {type(value).__name__}"
            )
        if len(value) != len(space.spaces) or any(k not in value for k in space.spaces):
            raise invalid_value(_keys_message(fmt_path(what, path), value, space))
        msg.dict.SetInParent()
        items = msg.dict.items
        for key, sub in space.spaces.items():
            _fill(items[key], sub, value[key], lead, what, path + (key,))
        return
    if isinstance(space, gs.Tuple):
        if not isinstance(value, (tuple, list)):
            raise invalid_value(
                f"{fmt_path(what, path)}: expected a tuple, got {type(value).__name__}"
            )
        if len(value) != len(space.spaces):
            raise invalid_value(
                f"{fmt_path(what, path)}: tuple of {len(value)} items, "
                f"expected {len(space.spaces)}"
            )
        msg.tuple.SetInParent()
        items = msg.tuple.items
        for i, (sub, v) in enumerate(zip(space.spaces, value)):
            _fill(items.add(), sub, v, lead, what, path + (i,))
        return

    arr = _leaf_array(space, value, what, path)
    if lead is not None:
        _check_encoded_shape(arr, space, lead, what, path)
    fill_tensor(msg.tensor, arr)


def _leaf_array(space: gs.Space, value: Any, what: str, path: Path) -> np.ndarray:
    if isinstance(space, gs.Box):
        if isinstance(value, (np.ndarray, np.generic)):
            return np.asarray(value)
        return np.asarray(value, dtype=space.dtype)

    if isinstance(space, (gs.Discrete, gs.MultiDiscrete)):
        arr = np.asarray(value)
        # An empty list is float64 to numpy but is no mistake.
        if arr.dtype.kind not in "iu" and arr.size:
            raise invalid_value(
                f"{fmt_path(what, path)}: {type(space).__name__} needs integers, "
                f"got dtype {arr.dtype}"
            )
        return arr.astype(np.int64, copy=False)

    if isinstance(space, gs.MultiBinary):
        arr = np.asarray(value)
        if arr.dtype.kind == "b" or arr.dtype == np.int8:
            return arr
        if arr.dtype.kind not in "iu" and arr.size:
            raise invalid_value(
                f"{fmt_path(what, path)}: MultiBinary needs integers or bools, "
                f"got dtype {arr.dtype}"
            )
        # Narrowing to int8 would wrap e.g. 256 to 0; only 0/1 are valid anyway.
        if arr.size:
            lo, hi = arr.min(), arr.max()
            if lo < 0 or hi > 1:
                raise invalid_value(
                    f"{fmt_path(what, path)}: MultiBinary values must be 0 or 1, "
                    f"got {lo if lo < 0 else hi}"
                )
        return arr.astype(np.int8)

    raise invalid_value(
        f"{fmt_path(what, path)}: unsupported space {type(space).__name__} ({space!r})"
    )


def _check_encoded_shape(
    arr: np.ndarray, space: gs.Space, lead: Any, what: str, path: Path
) -> None:
    leaf_shape = _leaf_shape(space)
    if isinstance(lead, list):  # batched: all leaves must agree on N
        if arr.ndim >= 1 and arr.shape[1:] == leaf_shape:
            if not lead:
                lead.append(arr.shape[0])
            if arr.shape[0] == lead[0]:
                return
            expected = (lead[0], *leaf_shape)
        else:
            expected = ("N", *leaf_shape)
        # Python's tuple syntax, with "N" for a row count not known yet.
        trailing = "," if len(expected) == 1 else ""
        expected_str = "(" + ", ".join(str(d) for d in expected) + trailing + ")"
    else:
        if arr.shape == leaf_shape:
            return
        expected_str = str(leaf_shape)
    raise invalid_value(f"{fmt_path(what, path)}: shape {arr.shape}, expected {expected_str}")


def _keys_message(where: str, got: Any, space: gs.Dict) -> str:
    missing = [k for k in space.spaces if k not in got]
    extra = [k for k in got if k not in space.spaces]
    parts = []
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"unexpected {extra}")
    # Sorted: a protobuf map has no order of its own.
    return (
        f"{where}: dict keys {sorted(got, key=str)}, expected {list(space.spaces)} "
        f"({', '.join(parts)})"
    )


def _leaf_shape(space: gs.Space) -> tuple:
    # Discrete.shape is (); the others carry their shape.
    return tuple(space.shape)


# ---------------------------------------------------------------- decode


def decode_value(space: gs.Space, msg: pb.Value, n_rows: int | None, what: str) -> Any:
    """Nested numpy value of a wire Value, validated against `space`.

    `n_rows` None: a single value, leaves shaped like the space. Otherwise a
    batch: every leaf (n_rows, *leaf_shape). Box leaves come back as read-only
    views over the message bytes; Discrete / MultiDiscrete leaves as int64 and
    MultiBinary leaves as int8.

    Raises INVALID_ARGUMENT, the message starting with `what` and the leaf's
    path, for a structure, dtype or shape mismatch, a NaN or +-Inf in a float
    leaf (whatever the bounds), or a MultiBinary value other than 0/1. Bounds are left to `check_contains`.
    """
    lead = () if n_rows is None else (n_rows,)
    return _decode(space, msg, lead, what, ())


def _decode(space: gs.Space, msg: pb.Value, lead: tuple, what: str, path: Path) -> Any:
    kind = msg.WhichOneof("kind")

    if isinstance(space, gs.Dict):
        if kind != "dict":
            raise _structure_error(what, path, "a dict", kind)
        items = msg.dict.items
        # Test membership before indexing: indexing a message map inserts.
        if len(items) != len(space.spaces) or any(k not in items for k in space.spaces):
            raise invalid_value(_keys_message(fmt_path(what, path), items, space))
        return {
            key: _decode(sub, items[key], lead, what, path + (key,))
            for key, sub in space.spaces.items()
        }

    if isinstance(space, gs.Tuple):
        if kind != "tuple":
            raise _structure_error(what, path, "a tuple", kind)
        items = msg.tuple.items
        if len(items) != len(space.spaces):
            raise invalid_value(
                f"{fmt_path(what, path)}: tuple of {len(items)} items, "
                f"expected {len(space.spaces)}"
            )
        return tuple(
            _decode(sub, item, lead, what, path + (i,))
            for i, (sub, item) in enumerate(zip(space.spaces, items))
        )

    if not isinstance(space, (gs.Box, gs.Discrete, gs.MultiDiscrete, gs.MultiBinary)):
        raise invalid_value(
            f"{fmt_path(what, path)}: unsupported space {type(space).__name__} ({space!r})"
        )
    if kind != "tensor":
        raise _structure_error(what, path, f"a tensor for {type(space).__name__}", kind)
    t = msg.tensor

    # Dtype and shape are checked on the message fields, before touching the
    # data, so that the message names the real mistake rather than a
    # byte-count mismatch.
    code = t.dtype
    if isinstance(space, gs.Box):
        expected_code = pb_dtype(space.dtype)
        if code != expected_code:
            raise invalid_value(
                f"{fmt_path(what, path)}: dtype {dtype_name(code)}, "
                f"expected {dtype_name(expected_code)}"
            )
    elif isinstance(space, gs.MultiBinary):
        if code not in _MULTI_BINARY_DTYPES:
            raise invalid_value(
                f"{fmt_path(what, path)}: dtype {dtype_name(code)}, "
                "expected an integer or bool dtype"
            )
    elif code not in INTEGER_DTYPES:
        raise invalid_value(
            f"{fmt_path(what, path)}: dtype {dtype_name(code)}, expected an integer dtype"
        )

    expected_shape = lead + space.shape
    shape = tuple(t.shape[:])
    if shape != expected_shape:
        raise invalid_value(
            f"{fmt_path(what, path)}: shape {shape}, expected {expected_shape}"
        )
    try:
        arr = from_tensor(t)
    except BridgeError as e:
        raise invalid_value(f"{fmt_path(what, path)}: {e.message}") from None

    if isinstance(space, gs.Box):
        # One reduction on the fast path: the sum is finite unless an element is NaN or
        # +-Inf (or finite values overflow it, which the exact test below tells apart).
        if code in FLOAT_DTYPES and arr.size and not math.isfinite(_sum(arr)):
            bad = ~np.isfinite(arr)
            if bad.any():
                idx = tuple(int(i) for i in np.argwhere(bad)[0])
                v = arr[idx]
                shown = "NaN" if np.isnan(v) else ("+Inf" if v > 0 else "-Inf")
                raise invalid_value(f"{fmt_path(what, path)}: contains {shown} {_at(idx, lead)} "
                                    f"(float values must be finite)")
        return arr
    if isinstance(space, gs.MultiBinary):
        return _multi_binary(arr, lead, what, path)
    # Discrete / MultiDiscrete: a view when the wire already has int64.
    return arr.astype(np.int64, copy=False)


def _sum(arr: np.ndarray) -> float:
    with np.errstate(over="ignore", invalid="ignore"):   # overflow or inf - inf: checked exactly after
        return float(arr.sum())


def _multi_binary(arr: np.ndarray, lead: tuple, what: str, path: Path) -> np.ndarray:
    # A bool tensor is raw bytes too: a byte other than 0/1 is not a valid
    # bool, so check it through a uint8 view like any other integer.
    ints = arr.view(np.uint8) if arr.dtype == np.bool_ else arr
    if ints.size and (ints.min() < 0 or ints.max() > 1):
        bad = (ints != 0) & (ints != 1)
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise invalid_value(
            f"{fmt_path(what, path)}: contains {ints[idx]} {_at(idx, lead)}, "
            "MultiBinary values must be 0 or 1"
        )
    if ints.dtype.itemsize == 1:
        return ints.view(np.int8)  # same bytes, no copy
    return ints.astype(np.int8)


def _at(idx: tuple, lead: tuple) -> str:
    if lead:
        return f"at row {idx[0]}"
    return f"at index {idx}" if idx else ""


def _structure_error(what: str, path: Path, expected: str, kind: str | None) -> BridgeError:
    got = f"a {kind}" if kind else "an empty Value"
    return invalid_value(f"{fmt_path(what, path)}: expected {expected}, got {got}")
