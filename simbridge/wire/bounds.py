"""Bounds of values: whether a decoded (batched) value lies in its space (`check_contains`).

Decoding (values.py) checks a value's structure, dtype, shape and finiteness; this checks what
only the space's bounds can say: a Box's low/high, a Discrete's range, MultiBinary's 0/1.
Whole leaves at once with numpy, as everything in the wire room.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces as gs

from simbridge.wire.errors import invalid_value
from simbridge.wire.values import Path, fmt_path


def check_contains(space: gs.Space, value: Any, n_rows: int | None, what: str) -> None:
    """Raise INVALID_ARGUMENT unless every row of `value` lies in `space`.

    `value` must already have the space's structure, dtypes and shapes (as
    `decode_value` returns it); `n_rows` None means a single, unbatched value.
    The message names the first offending row: "actions row 2: 5 is outside
    Discrete(2)".
    """
    _check(space, value, n_rows is not None, what, ())


def _check(space: gs.Space, value: Any, batched: bool, what: str, path: Path) -> None:
    if isinstance(space, gs.Dict):
        for key, sub in space.spaces.items():
            _check(sub, value[key], batched, what, path + (key,))
        return
    if isinstance(space, gs.Tuple):
        for i, (sub, v) in enumerate(zip(space.spaces, value)):
            _check(sub, v, batched, what, path + (i,))
        return

    arr = np.asarray(value)
    if arr.size == 0:
        return

    if isinstance(space, gs.Discrete):
        lo, hi = int(space.start), int(space.start + space.n)
        # min/max are two reductions without temporaries: the common,
        # valid case costs no more than that.
        if arr.min() >= lo and arr.max() < hi:
            return
        bad = (arr < lo) | (arr >= hi)
        row, idx = _first(bad, batched)
        raise invalid_value(
            f"{_where_row(what, path, row)}: {arr[row + idx]} is outside {space!r}"
        )

    if isinstance(space, gs.MultiBinary):
        if arr.min() >= 0 and arr.max() <= 1:
            return
        bad = (arr != 0) & (arr != 1)
        row, idx = _first(bad, batched)
        raise invalid_value(
            f"{_where_row(what, path, row)}: {arr[row + idx]}{_index(idx)} is not 0 or 1"
        )

    if isinstance(space, gs.MultiDiscrete):
        lo = space.start
        hi = space.start + space.nvec
        bad = (arr < lo) | (arr >= hi)
        if not bad.any():
            return
        row, idx = _first(bad, batched)
        raise invalid_value(
            f"{_where_row(what, path, row)}: {arr[row + idx]}{_index(idx)} "
            f"is outside [{lo[idx]}, {hi[idx]})"
        )

    if isinstance(space, gs.Box):
        # Comparisons with NaN are False, so NaN fails this check too.
        ok = (arr >= space.low) & (arr <= space.high)
        if ok.all():
            return
        row, idx = _first(~ok, batched)
        v = arr[row + idx]
        shown = "NaN" if np.isnan(v) else str(v)
        raise invalid_value(
            f"{_where_row(what, path, row)}: {shown}{_index(idx)} "
            f"is outside [{space.low[idx]}, {space.high[idx]}]"
        )

    raise invalid_value(
        f"{fmt_path(what, path)}: unsupported space {type(space).__name__} ({space!r})"
    )


def _first(bad: np.ndarray, batched: bool) -> tuple[tuple, tuple]:
    """(row index tuple, element index tuple) of the first True in `bad`."""
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    if batched:
        return first[:1], first[1:]
    return (), first


def _where_row(what: str, path: Path, row: tuple) -> str:
    where = fmt_path(what, path)
    return f"{where} row {row[0]}" if row else where


def _index(idx: tuple) -> str:
    return f" at index {idx}" if idx else ""


