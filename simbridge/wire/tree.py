"""Nested values: dicts and tuples of numpy arrays, the one tree walker of the project.

Observations and actions of Dict and Tuple spaces are nested structures whose
leaves are arrays; batched forms carry the row dimension first on every leaf.

The rule, here and in spaces.leaf_rows: dicts and tuples are the nesting (a
namedtuple keeps its type); anything else is a leaf, lists included: a list is
a vector (np.asarray makes it one), never a Tuple value. Walking several trees
at once needs them to have the same structure: ValueError names the first
difference.
"""
from typing import Any, Callable, List

import numpy as np


def map_structure(fn: Callable, *trees: Any) -> Any:
    """fn applied to the corresponding leaves of structurally identical trees."""
    first = trees[0]
    if not isinstance(first, (dict, tuple)):   # a leaf: the common case (Box spaces), first
        for other in trees[1:]:
            if isinstance(other, (dict, tuple)):
                raise ValueError(f"nested structures differ: leaf vs {_describe(other)}")
        return fn(*trees)
    if isinstance(first, dict):
        keys = first.keys()
        for other in trees[1:]:
            if not isinstance(other, dict) or other.keys() != keys:
                raise ValueError(f"nested structures differ: dict with keys {sorted(map(str, keys))} "
                                 f"vs {_describe(other)}")
        return {k: map_structure(fn, *(t[k] for t in trees)) for k in keys}
    n = len(first)   # a tuple
    for other in trees[1:]:
        if not isinstance(other, tuple) or len(other) != n:
            raise ValueError(f"nested structures differ: tuple of length {n} vs {_describe(other)}")
    children = [map_structure(fn, *parts) for parts in zip(*trees)]
    return type(first)(*children) if hasattr(first, "_fields") else tuple(children)


def _describe(x: Any) -> str:
    if isinstance(x, dict):
        return f"dict with keys {sorted(map(str, x.keys()))}"
    if isinstance(x, tuple):
        return f"tuple of length {len(x)}"
    return f"leaf of type {type(x).__name__}"


def leaves(tree: Any) -> List[Any]:
    """The leaves in walking order (dict insertion order, tuple order)."""
    out: List[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for v in node.values():
                visit(v)
        elif isinstance(node, tuple):
            for v in node:
                visit(v)
        else:
            out.append(node)

    visit(tree)
    return out


def first_leaf(tree: Any) -> Any:
    while isinstance(tree, (dict, tuple)):
        tree = next(iter(tree.values())) if isinstance(tree, dict) else tree[0]
    return tree


def rows(tree: Any) -> int:
    """Row count (leading dimension) of a batched structure."""
    return len(first_leaf(tree))


def take(tree: Any, index) -> Any:
    """Rows `index` (int, slice or index array) of every leaf."""
    return map_structure(lambda a: a[index], tree)


def _concat_leaves(*leaves: Any) -> np.ndarray:
    return np.concatenate(leaves, axis=0)


def concat(trees: list, fresh: bool = False) -> Any:
    """Rows of `trees` one after another. A single tree comes back as it is unless `fresh`
    asks for new arrays always."""
    if len(trees) == 1 and not fresh:
        return trees[0]
    return map_structure(_concat_leaves, *trees)


def stack(trees: list) -> Any:
    return map_structure(lambda *leaves: np.stack(leaves, axis=0), *trees)
