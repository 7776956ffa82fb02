"""Tiny helpers for nested values (dict / tuple of numpy arrays).

Observations and actions of Dict and Tuple spaces are nested structures whose
leaves are arrays; batched forms carry the row dimension first on every leaf.
"""
from typing import Any, Callable

import numpy as np


def map_structure(fn: Callable, *trees: Any) -> Any:
    first = trees[0]
    if isinstance(first, dict):
        return {k: map_structure(fn, *(t[k] for t in trees)) for k in first}
    if isinstance(first, (tuple, list)):
        return tuple(map_structure(fn, *parts) for parts in zip(*trees))
    return fn(*trees)


def first_leaf(tree: Any) -> Any:
    while isinstance(tree, (dict, tuple, list)):
        tree = next(iter(tree.values())) if isinstance(tree, dict) else tree[0]
    return tree


def rows(tree: Any) -> int:
    """Row count (leading dimension) of a batched structure."""
    return len(first_leaf(tree))


def take(tree: Any, index) -> Any:
    """Rows `index` (int, slice or index array) of every leaf."""
    return map_structure(lambda a: a[index], tree)


def concat(trees: list) -> Any:
    if len(trees) == 1:
        return trees[0]
    return map_structure(lambda *leaves: np.concatenate(leaves, axis=0), *trees)


def stack(trees: list) -> Any:
    return map_structure(lambda *leaves: np.stack(leaves, axis=0), *trees)
