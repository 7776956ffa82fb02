"""Columnar experience batches, modelled on RLlib's SampleBatch / MultiAgentBatch.

A :class:`SampleBatch` holds the experience of one policy as a set of named
columns.  Every column has the same number of rows (one row per agent step).
A column is either

* a numpy array whose first dimension is the row dimension, or
* a nested structure (``dict`` and/or ``tuple`` nodes, arbitrarily nested) whose
  leaves are such arrays.  This is how observations / actions of composite
  spaces (``gymnasium.spaces.Dict`` / ``Tuple``) are stored: a Dict observation
  with keys ``"pos"`` (shape ``(3,)``) and ``"img"`` (shape ``(8, 8)``) becomes
  ``{"pos": array(N, 3), "img": array(N, 8, 8)}``.

Lists are never tree nodes (the rule of ``simbridge.wire.tree``, whose walker
this module uses): a list leaf is converted with ``np.asarray``.  Use tuples
only for Tuple-space values, and lists / arrays for vectors.

A :class:`MultiAgentBatch` maps policy ids to SampleBatches and additionally
records how many environment steps the data covers (``env_steps``), which in
multi-agent data differs from the number of agent steps (rows).

:class:`SampleBatchBuilder` accumulates rows (or chunks of rows) for one policy
and stacks them into a SampleBatch.

No torch here: this module is used on the simulator side.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from simbridge.wire import tree

__all__ = [
    "OBS",
    "NEW_OBS",
    "ACTIONS",
    "REWARDS",
    "TERMINATEDS",
    "TRUNCATEDS",
    "EPS_ID",
    "AGENT_INDEX",
    "T",
    "POLICY_VERSION",
    "ACTION_LOGP",
    "INFOS",
    "DEFAULT_POLICY_ID",
    "SampleBatch",
    "MultiAgentBatch",
]

from simbridge.wire.columns import (  # noqa: E402  (re-exported: SampleBatch users name them here)
    ACTION_LOGP, ACTIONS, AGENT_INDEX, EPS_ID, INFOS, NEW_OBS, OBS, POLICY_VERSION, REWARDS, T,
    TERMINATEDS, TRUNCATEDS)
from simbridge.wire.columns import DEFAULT_POLICY as DEFAULT_POLICY_ID  # noqa: E402


from simbridge.server.batch_columns import (  # noqa: E402
    _check_k, _column_rows, _leaf_copy, _to_column)


# --------------------------------------------------------------------------
# SampleBatch
# --------------------------------------------------------------------------
class SampleBatch:
    """Experience of a single policy: a mapping column name -> column.

    ``len(batch)`` and ``batch.count`` are the number of ROWS (as in RLlib),
    not the number of columns.  Iterating a batch yields column names.

    The constructor does not copy arrays that are already numpy arrays;
    non-array leaves (lists, scalars sequences) are converted with
    ``np.asarray``.  A list given for the ``infos`` column becomes a 1-D object
    array with one entry per row.
    """

    __slots__ = ("_data", "_count")

    def __init__(self, columns: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._data: dict[str, Any] = {}
        self._count = 0
        merged: dict[str, Any] = {}
        if columns is not None:
            merged.update(columns.items())
        for key, value in kwargs.items():
            if key in merged:
                raise ValueError(f"column {key!r} given twice")
            merged[key] = value
        first_name = None
        for name, value in merged.items():
            col = _to_column(name, value)
            rows = _column_rows(name, col)
            if first_name is None:
                first_name = name
                self._count = rows
            elif rows != self._count:
                raise ValueError(
                    f"column {name!r} has {rows} rows, but column {first_name!r} "
                    f"has {self._count}"
                )
            self._data[name] = col

    # ---------------------------------------------------------------- mapping
    @property
    def count(self) -> int:
        """Number of rows."""
        return self._count

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def keys(self):
        return self._data.keys()

    def values(self):
        return self._data.values()

    def items(self):
        return self._data.items()

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return self._from_validated(
                {k: tree.take(v, key) for k, v in self._data.items()},
                len(range(*key.indices(self._count))),
            )
        try:
            return self._data[key]
        except KeyError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(key, slice):
            raise TypeError("slice assignment is not supported")
        col = _to_column(key, value)
        rows = _column_rows(key, col)
        others = [k for k in self._data if k != key]
        if others and rows != self._count:
            raise ValueError(
                f"column {key!r} has {rows} rows, but the batch has {self._count} "
                f"(e.g. column {others[0]!r})"
            )
        self._data[key] = col
        self._count = rows

    def __delitem__(self, key: str) -> None:
        del self._data[key]
        if not self._data:
            self._count = 0

    def pop(self, key: str, *default: Any) -> Any:
        if key in self._data:
            value = self._data[key]
            del self[key]
            return value
        if default:
            return default[0]
        raise KeyError(key)

    # ---------------------------------------------------------------- helpers
    @classmethod
    def _from_validated(cls, data: dict[str, Any], count: int) -> "SampleBatch":
        """Build without re-validating (internal: data is already canonical)."""
        out = cls.__new__(cls)
        out._data = data
        out._count = count if data else 0
        return out

    def copy(self) -> "SampleBatch":
        """Deep copy (new arrays; object arrays such as infos are deep-copied)."""
        return self._from_validated(
            {k: tree.map_structure(_leaf_copy, v) for k, v in self._data.items()}, self._count
        )

    def __repr__(self) -> str:
        return f"SampleBatch(count={self._count}, columns={list(self._data)})"

    # ------------------------------------------------------------------ steps
    def agent_steps(self) -> int:
        return self._count

    def env_steps(self) -> int:
        return self._count

    def as_multi_agent(self) -> "MultiAgentBatch":
        """Wrap as a MultiAgentBatch under ``DEFAULT_POLICY_ID``."""
        return MultiAgentBatch({DEFAULT_POLICY_ID: self}, self._count)

    # ------------------------------------------------------------ concatenate
    def concat(self, other: "SampleBatch") -> "SampleBatch":
        """New batch with the rows of ``self`` followed by those of ``other``."""
        return SampleBatch.concat_samples([self, other])

    @staticmethod
    def concat_samples(batches: list) -> Any:
        """Concatenate batches row-wise into a new batch (fresh arrays).

        All batches must have the same column set (ValueError otherwise) and,
        for nested columns, the same structure.  Batches without any columns
        (e.g. ``SampleBatch()``) are skipped.  An empty list gives an empty
        SampleBatch.  If any element is a MultiAgentBatch, this delegates to
        :meth:`MultiAgentBatch.concat_samples`.
        """
        batches = list(batches)
        if any(isinstance(b, MultiAgentBatch) for b in batches):
            return MultiAgentBatch.concat_samples(batches)
        for b in batches:
            if not isinstance(b, SampleBatch):
                raise TypeError(
                    f"can only concatenate SampleBatch objects, not {type(b).__name__}"
                )
        batches = [b for b in batches if b._data]
        if not batches:
            return SampleBatch()
        keys = list(batches[0]._data)
        key_set = set(keys)
        for b in batches[1:]:
            if set(b._data) != key_set:
                raise ValueError(
                    "cannot concatenate batches with different columns: "
                    f"{sorted(key_set)} vs {sorted(b._data)}"
                )
        data = {}
        for k in keys:
            try:
                data[k] = tree.concat([b._data[k] for b in batches], fresh=True)
            except ValueError as e:
                raise ValueError(f"cannot concatenate column {k!r}: {e}") from e
        return SampleBatch._from_validated(data, sum(b._count for b in batches))

    # ---------------------------------------------------------------- slicing
    def slice(self, start: int | None, end: int | None) -> "SampleBatch":
        """Rows ``start:end`` as a new batch whose arrays are views (no copy)."""
        return self[start:end]

    def timeslices(self, k: int) -> list["SampleBatch"]:
        """Consecutive slices (views) of at most ``k`` rows each, in order."""
        k = _check_k(k)
        return [self[i : i + k] for i in range(0, self._count, k)]

    def split_by_episode(self) -> list["SampleBatch"]:
        """One slice (views) per contiguous run of equal ``eps_id`` values.

        An episode whose rows are not contiguous yields several batches, one
        per run (as in RLlib).  Requires a 1-D ``eps_id`` column.
        """
        if EPS_ID not in self._data:
            raise KeyError(f"split_by_episode needs the {EPS_ID!r} column")
        eps = self._data[EPS_ID]
        if not isinstance(eps, np.ndarray) or eps.ndim != 1:
            raise ValueError(f"column {EPS_ID!r} must be a 1-D array")
        if self._count == 0:
            return []
        change = np.flatnonzero(eps[1:] != eps[:-1]) + 1
        bounds = [0, *change.tolist(), self._count]
        return [self[s:e] for s, e in zip(bounds[:-1], bounds[1:])]

    def shuffle(self, rng: Any = None) -> "SampleBatch":
        """Row-permuted copy.  ``rng``: a ``np.random.Generator`` (or anything
        with ``permutation``), or a seed / None for ``np.random.default_rng``."""
        if not hasattr(rng, "permutation"):
            rng = np.random.default_rng(rng)
        perm = rng.permutation(self._count)
        return self._from_validated(
            {k: tree.map_structure(lambda a: a[perm], v) for k, v in self._data.items()},
            self._count,
        )


# --------------------------------------------------------------------------
# MultiAgentBatch
# --------------------------------------------------------------------------
class MultiAgentBatch:
    """Per-policy SampleBatches plus the number of env steps they cover.

    ``count`` is the number of ENV steps (as in RLlib); ``agent_steps()`` is the
    total number of rows over all policies.  With 2 agents acting on each of
    3 env steps, ``env_steps() == 3`` and ``agent_steps() == 6``.
    """

    __slots__ = ("policy_batches", "count")

    def __init__(self, policy_batches: Mapping[str, SampleBatch], env_steps: int) -> None:
        for pid, b in policy_batches.items():
            if not isinstance(b, SampleBatch):
                raise TypeError(
                    f"policy {pid!r}: expected a SampleBatch, got {type(b).__name__}"
                )
        env_steps = int(env_steps)
        if env_steps < 0:
            raise ValueError(f"env_steps must be >= 0, got {env_steps}")
        self.policy_batches: dict[str, SampleBatch] = dict(policy_batches)
        self.count: int = env_steps

    def env_steps(self) -> int:
        return self.count

    def agent_steps(self) -> int:
        return sum(b.count for b in self.policy_batches.values())

    def copy(self) -> "MultiAgentBatch":
        return MultiAgentBatch(
            {pid: b.copy() for pid, b in self.policy_batches.items()}, self.count
        )

    def __repr__(self) -> str:
        sizes = {pid: b.count for pid, b in self.policy_batches.items()}
        return (
            f"MultiAgentBatch(env_steps={self.count}, "
            f"agent_steps={self.agent_steps()}, policy_batches={sizes})"
        )

    def concat(self, other: "MultiAgentBatch") -> "MultiAgentBatch":
        return MultiAgentBatch.concat_samples([self, other])

    @staticmethod
    def concat_samples(batches: list) -> "MultiAgentBatch":
        """Per-policy concatenation; env steps are summed.

        A policy may be missing from some of the batches.  Plain SampleBatches
        with no rows are ignored; any other non-MultiAgentBatch is an error.
        An empty list gives ``MultiAgentBatch({}, 0)``.
        """
        per_policy: dict[str, list[SampleBatch]] = {}
        env_steps = 0
        for b in batches:
            if not isinstance(b, MultiAgentBatch):
                if isinstance(b, SampleBatch) and b.count == 0:
                    continue
                raise TypeError(
                    "MultiAgentBatch.concat_samples can only concatenate "
                    f"MultiAgentBatch objects, not {type(b).__name__}"
                )
            for pid, pb in b.policy_batches.items():
                per_policy.setdefault(pid, []).append(pb)
            env_steps += b.count
        return MultiAgentBatch(
            {pid: SampleBatch.concat_samples(pbs) for pid, pbs in per_policy.items()},
            env_steps,
        )

    def timeslices(self, k: int) -> list["MultiAgentBatch"]:
        """Split into consecutive MultiAgentBatches of at most ``k`` rows per policy.

        Our policy batches carry no per-row env-step index, so "k env steps"
        is approximated per policy: each policy batch is cut into consecutive
        chunks of ``k`` agent rows (``SampleBatch.timeslices(k)``, views), and
        the i-th chunks of all policies form the i-th MultiAgentBatch.  A policy
        that has fewer chunks is simply absent from the later batches (policies
        with no rows never appear).  The env_steps of each resulting batch is
        ``max(rows in its chunk over policies)``, i.e. at most ``k``.  Because
        of this apportioning, the env_steps of the slices need not add up to
        ``self.env_steps()``; agent steps are preserved exactly.
        """
        k = _check_k(k)
        chunks = {pid: b.timeslices(k) for pid, b in self.policy_batches.items()}
        n = max((len(c) for c in chunks.values()), default=0)
        out = []
        for i in range(n):
            pbs = {pid: c[i] for pid, c in chunks.items() if i < len(c)}
            out.append(MultiAgentBatch(pbs, max(b.count for b in pbs.values())))
        return out

    @staticmethod
    def wrap_as_needed(
        policy_batches: Mapping[str, SampleBatch], env_steps: int
    ) -> SampleBatch | "MultiAgentBatch":
        """The bare SampleBatch if the only policy is ``"default_policy"``,
        otherwise a MultiAgentBatch."""
        if len(policy_batches) == 1 and DEFAULT_POLICY_ID in policy_batches:
            return policy_batches[DEFAULT_POLICY_ID]
        return MultiAgentBatch(policy_batches, env_steps)

