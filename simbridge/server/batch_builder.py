"""SampleBatchBuilder: accumulates experience for one policy, builds a SampleBatch."""

from __future__ import annotations

from typing import Any, Mapping

from simbridge.wire import tree
from simbridge.wire.columns import INFOS
from simbridge.server.batch_columns import _object_array
from simbridge.server.sample_batch import SampleBatch


# --------------------------------------------------------------------------
class _RowSegment:
    """Run of consecutive single rows: one Python list per column."""

    __slots__ = ("lists", "count")

    def __init__(self, columns: list[str]) -> None:
        self.lists: dict[str, list] = {c: [] for c in columns}
        self.count = 0


class SampleBatchBuilder:
    """Accumulates experience for one policy and builds a SampleBatch.

    * ``add_row(**values)`` appends one transition (one value per column,
      without a row dimension; nested dict/tuple values are fine).  Values are
      kept in per-column lists and stacked by :meth:`build`.
    * ``add_rows(columns)`` appends a chunk whose columns already have a
      leading row dimension.  The chunk is stored as-is and concatenated at
      build time: no per-row Python work.

    Both may be mixed; row order is the order of the calls.  Every call must
    use the same column set (ValueError otherwise).  Arrays passed in are
    referenced, not copied, until :meth:`build`, which always returns freshly
    allocated arrays and then resets the builder.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Drop all accumulated data."""
        self._segments: list[Any] = []  # _RowSegment or dict of canonical columns
        self._columns: list[str] | None = None
        self._count = 0

    @property
    def count(self) -> int:
        """Number of rows accumulated since the last build/reset."""
        return self._count

    def _check_columns(self, names: list[str]) -> None:
        if self._columns is None:
            self._columns = list(names)
        elif set(names) != set(self._columns):
            raise ValueError(
                f"columns {sorted(names)} do not match the builder's columns "
                f"{sorted(self._columns)}"
            )

    def add_row(self, row: Mapping[str, Any] | None = None, /, **values: Any) -> None:
        """Append one row.  Columns may be given as a mapping, as keywords, or both."""
        if row is not None:
            dup = set(row).intersection(values)
            if dup:
                raise ValueError(f"columns given twice: {sorted(dup)}")
            values = {**row, **values}
        if not values:
            raise ValueError("add_row needs at least one column")
        self._check_columns(list(values))
        seg = self._segments[-1] if self._segments else None
        if not isinstance(seg, _RowSegment):
            seg = _RowSegment(self._columns)
            self._segments.append(seg)
        lists = seg.lists
        for name, value in values.items():
            lists[name].append(value)
        seg.count += 1
        self._count += 1

    def add_rows(self, columns: Mapping[str, Any], count: int | None = None) -> None:
        """Append a chunk of rows; every column has a leading row dimension.

        `count`: the chunk's row count, given by a caller that built the columns
        consistently itself (the bridge's collector); skips re-validating them,
        which would cost more than the append on the per-call hot path."""
        if count is not None:
            self._check_columns(list(columns))
            self._segments.append(dict(columns))
            self._count += count
            return
        chunk = columns if isinstance(columns, SampleBatch) else SampleBatch(columns)
        if not chunk._data:
            raise ValueError("add_rows needs at least one column")
        self._check_columns(list(chunk._data))
        self._segments.append(chunk)
        self._count += chunk.count

    def build(self) -> "SampleBatch":
        """Stack everything into a SampleBatch and reset the builder."""
        if self._columns is None:
            self.reset()
            return SampleBatch()
        parts: dict[str, list] = {c: [] for c in self._columns}
        for seg in self._segments:
            if isinstance(seg, _RowSegment):
                for name, vals in seg.lists.items():
                    try:
                        if name == INFOS:
                            parts[name].append(_object_array(vals))
                        else:
                            parts[name].append(tree.stack(vals))
                    except ValueError as e:
                        raise ValueError(f"cannot stack rows of column {name!r}: {e}") from e
            else:
                for name in self._columns:
                    parts[name].append(seg[name])
        data: dict[str, Any] = {}
        for name, cols in parts.items():
            if len(cols) == 1 and isinstance(self._segments[0], _RowSegment):
                data[name] = cols[0]  # freshly stacked already
            else:
                try:
                    data[name] = tree.concat(cols, fresh=True)
                except ValueError as e:
                    raise ValueError(f"cannot concatenate column {name!r}: {e}") from e
        out = SampleBatch._from_validated(data, self._count)
        self.reset()
        return out

