"""SampleBatch columns: turning what users give into canonical columns (dict / tuple
nodes, numpy array leaves, one row count) and checking them."""

from __future__ import annotations

import copy as _copy
from typing import Any

import numpy as np

from simbridge.wire import tree
from simbridge.wire.columns import INFOS


def _leaf_copy(leaf: np.ndarray) -> np.ndarray:
    if leaf.dtype == object:
        return _copy.deepcopy(leaf)
    return leaf.copy()


def _object_array(values: Any) -> np.ndarray:
    """1-D object array holding each element of ``values`` as-is."""
    values = list(values)
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def _to_column(name: str, value: Any) -> Any:
    """Convert a user-supplied column to the canonical form (array leaves)."""
    if name == INFOS and isinstance(value, (list, tuple)):
        return _object_array(value)
    return tree.map_structure(lambda leaf: leaf if isinstance(leaf, np.ndarray) else np.asarray(leaf), value)


def _column_rows(name: str, column: Any) -> int:
    """Row count of a canonical column; validates leaves agree."""
    leaves = tree.leaves(column)
    if not leaves:
        raise ValueError(f"column {name!r} has no array leaves")
    rows = None
    for leaf in leaves:
        if leaf.ndim == 0:
            raise ValueError(
                f"column {name!r} has a 0-d leaf; columns need a leading row dimension"
            )
        if rows is None:
            rows = leaf.shape[0]
        elif leaf.shape[0] != rows:
            raise ValueError(
                f"column {name!r} has nested leaves with different row counts "
                f"({rows} vs {leaf.shape[0]})"
            )
    assert rows is not None
    return rows


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)
