"""A camera's observation journaled once per transition, not twice.

A transition's obs is, byte for byte, the new_obs of the same agent's transition before it (the
bridge keeps each agent's last observation and hands it on). The journal wrote both: 460 KB a
step for a 320x240 camera, most of what the journal cost. A rows record now leaves out each obs
row that equals its agent's last new_obs in the segment (compared bytewise, not assumed) and
says which with a mask; reading the segment back in order puts it in again.

Writer and reader keep the same state (each policy's last new_obs per (eps_id, agent_index)),
changed the same way by the same rows in the same order: every rows record of a segment, in
record and row order, from the segment's start (a resume reads whole segments; a new segment
starts with none). An agent whose transition ends (terminated or truncated) is forgotten;
agents whose last transition never came (a simulator lost, a session closed) are forgotten all at
once when a policy has LIMIT of them, or BUDGET bytes of their rows (the writer holds views of
the rows it was given: a lost agent's row keeps its chunk alive).

Only observations of at least MIN_ROW_BYTES a row are linked: for a vector the mask and the
per-row work cost more than its bytes.
"""
import json
import math
from typing import Dict, List, Optional, Tuple

import numpy as np

from simbridge.wire.columns import AGENT_INDEX, EPS_ID, NEW_OBS, OBS, TERMINATEDS, TRUNCATEDS

MIN_ROW_BYTES = 4096
LIMIT = 65536
BUDGET = 256 << 20


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype, shape and bytes (NaNs and -0.0 included: the reader gives back bytes)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.nbytes < 65536:   # two small copies and a memcmp cost less than numpy's comparison
        return a.tobytes() == b.tobytes()
    a = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    b = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    if a.nbytes % 8 == 0:
        a, b = a.view(np.uint64), b.view(np.uint64)
    return bool(np.array_equal(a, b))


class ObsLinks:
    """One segment's links, for the writer (`link`) or the reader (`resolve`)."""

    def __init__(self) -> None:
        self.last: Dict[str, Dict[Tuple[int, int], List[np.ndarray]]] = {}

    def link(self, pid: str, limit: int, keys: list, done: list, obs: List[np.ndarray],
             new_obs: List[np.ndarray]) -> np.ndarray:
        """The writer's side: which rows' obs equal their agent's last new_obs (a bool mask, rows
        in order: a row may link to the row before it in the same record). keys: (eps_id,
        agent_index) per row; done: whether its transition ended the agent's episode; limit: the
        agents the policy keeps (_Plan.limit)."""
        last = self.last.setdefault(pid, {})
        mask = []
        for r, key in enumerate(keys):
            if len(last) >= limit and key not in last:
                last.clear()   # row by row: the same moment on both sides, however rows are chunked
            seen = last.get(key)
            mask.append(seen is not None and all([_same(o[r], s) for o, s in zip(obs, seen)]))
            self._remember(last, key, done[r], [a[r] for a in new_obs])
        if len(keys) > 1:   # rows kept as views would hold their whole chunk (an upload's 200 rows)
            here = {k for k, d in zip(keys, done) if not d and k in last}
            if 2 * len(here) < len(keys):
                for key in here:
                    if last[key][0].base is not None:
                        last[key] = [a.copy() for a in last[key]]
        return np.array(mask, bool)

    def resolve(self, pid: str, limit: int, keys: list, done: list, mask: np.ndarray,
                kept: List[np.ndarray], new_obs: List[np.ndarray]) -> Optional[List[np.ndarray]]:
        """The reader's side: the obs leaves whole again from the rows kept (those not in `mask`),
        or None when a linked row's agent is unknown (a record out of its segment's order)."""
        last = self.last.setdefault(pid, {})
        n = len(keys)
        out = [np.empty((n, *a.shape[1:]), a.dtype) for a in kept]
        j = 0
        for r, key in enumerate(keys):
            if len(last) >= limit and key not in last:
                last.clear()
            if mask[r]:
                seen = last.get(key)
                if seen is None or any(o[r].shape != x.shape or o.dtype != x.dtype for o, x in zip(out, seen)):
                    return None
                for o, x in zip(out, seen):
                    o[r] = x
            else:
                for o, k in zip(out, kept):
                    o[r] = k[j]
                j += 1
            self._remember(last, key, done[r], [a[r] for a in new_obs])
        return out

    @staticmethod
    def _remember(last: dict, key, done, row: List[np.ndarray]) -> None:
        if done:
            last.pop(key, None)
        else:
            last[key] = row


# ------------------------------------------------------------------ records

LINKED = "~obs_linked"   # the mask's column in a rows record (no SampleBatch column has a "~")
_MISSING = object()


def spec_leaves(spec) -> List[int]:
    """A column's leaf indices (records.flatten's tree of them), in order."""
    if isinstance(spec, int):
        return [spec]
    kids = spec["d"].values() if "d" in spec else spec["t"]
    return [i for k in kids for i in spec_leaves(k)]


class _Plan:
    """Where a layout's columns are among its leaves, and its linked header, rendered once."""

    def __init__(self, layout: dict) -> None:
        cols = layout["cols"]
        self.layout = layout
        self.obs, self.new = spec_leaves(cols[OBS]), spec_leaves(cols[NEW_OBS])
        self.eps, self.agent = spec_leaves(cols[EPS_ID])[0], spec_leaves(cols[AGENT_INDEX])[0]
        self.done = [spec_leaves(cols[c])[0] for c in (TERMINATEDS, TRUNCATEDS) if c in cols]
        # An obs row's bytes, from the layout's dtypes and trailing shapes; the agents kept: as
        # many rows as BUDGET holds, the same number for the writer and the reader.
        self.row_bytes = sum(np.dtype(layout["a"][i][0]).itemsize * math.prod(layout["a"][i][1])
                             for i in self.obs)
        self.limit = min(LIMIT, max(64, BUDGET // max(1, self.row_bytes)))
        if LINKED in cols:   # read: the header is the record's
            return
        # The header but for the obs leaves' row count, rendered once: its "a" (dtypes and shapes
        # only) last, each entry apart, the obs leaves' open for the count.
        rest = dict(layout, cols=dict(cols, **{LINKED: len(layout["a"])}))
        del rest["a"]
        entries = [json.dumps(a, separators=(",", ":")).encode() for a in layout["a"]]
        entries.append(json.dumps([np.dtype(bool).str, []]).encode())
        self.pieces = [json.dumps(rest, separators=(",", ":"))[1:-1].encode() + b',"a":[']
        for j, e in enumerate(entries):
            if j in self.obs:
                self.pieces[-1] += e[:-1] + b","
                self.pieces.append(b"]")
            else:
                self.pieces[-1] += e
            self.pieces[-1] += b"," if j + 1 < len(entries) else b"]}"

    def header(self, obs_rows: int) -> bytes:
        """The linked header past "k", "i" and "n", its obs leaves of `obs_rows` rows."""
        return (b"%d" % obs_rows).join(self.pieces)

    def keys(self, leaves: List[np.ndarray]) -> Tuple[list, list]:
        """Each row's (eps_id, agent_index), and whether its transition ended its agent's episode."""
        keys = list(zip(leaves[self.eps].tolist(), leaves[self.agent].tolist()))
        done = [False] * len(keys)
        for i in self.done:
            done = [d or bool(x) for d, x in zip(done, leaves[i].tolist())]
        return keys, done


def _plan(layout: dict) -> Optional[_Plan]:
    """A layout's plan where its obs are worth linking: as big a row as MIN_ROW_BYTES, of the
    dtypes and shapes of its new_obs."""
    cols = layout["cols"]
    if not all(c in cols for c in (OBS, NEW_OBS, EPS_ID, AGENT_INDEX)) or LINKED in cols:
        return None
    plan = _Plan(layout)
    a = layout["a"]
    if [a[i] for i in plan.obs] != [a[i] for i in plan.new] or plan.row_bytes < MIN_ROW_BYTES:
        return None
    return plan


class RecordLinks(ObsLinks):
    """ObsLinks over the journal's rows records: the writer's `record`, the reader's `unlink`."""

    def __init__(self) -> None:
        super().__init__()
        self.plans: Dict[tuple, object] = {}

    def record(self, key: tuple, layout: bytes, pid: str, chunks: List[List[np.ndarray]]):
        """A rows record's header (past "k", "i" and "n") and leaves with its obs rows linked, for
        a layout (its cached header) and its chunks' leaves; None where it is not linked."""
        plan = self.plans.get(key, _MISSING)
        if plan is _MISSING:
            plan = self.plans[key] = _plan(json.loads(b"{" + layout))
        if plan is None:
            return None
        masks, kept = [], {i: [] for i in plan.obs}
        for leaves in chunks:
            keys, done = plan.keys(leaves)
            mask = self.link(pid, plan.limit, keys, done, [leaves[i] for i in plan.obs],
                             [leaves[i] for i in plan.new])
            masks.append(mask)
            linked = int(np.count_nonzero(mask))
            for i in plan.obs:   # a lockstep simulator's one row: all linked or none
                kept[i].append(leaves[i] if not linked else leaves[i][:0] if linked == len(mask)
                               else leaves[i][~mask])
        mask = masks[0] if len(masks) == 1 else np.concatenate(masks)
        out = [part for j in range(len(chunks[0]))
               for part in (kept[j] if j in kept else [leaves[j] for leaves in chunks])]
        return plan.header(len(mask) - int(np.count_nonzero(mask))), out + [mask]

    def unlink(self, header: dict, arrays: List[np.ndarray]) -> Optional[List[np.ndarray]]:
        """The record's arrays with its obs leaves whole again; None where they cannot be (a
        linked row of an agent not seen in the segment before it)."""
        cols = header["cols"]
        # decode_all took "a" out of the header: the same dtypes and trailing shapes, from the arrays
        plan = _Plan(dict(header, a=[[x.dtype.str, list(x.shape[1:])] for x in arrays]))
        mask = np.asarray(arrays[cols[LINKED]], bool)
        kept = [arrays[i] for i in plan.obs]
        if len(mask) != int(header["n"]) or any(len(a) != len(mask) - mask.sum() for a in kept):
            return None
        keys, done = plan.keys(arrays)
        full = self.resolve(header["p"], plan.limit, keys, done, mask, kept, [arrays[i] for i in plan.new])
        if full is None:
            return None
        out = list(arrays)
        for i, a in zip(plan.obs, full):
            out[i] = a
        return out


class NoLinks:
    """The writer's links for the rest of a segment some of whose linked records were built and
    never written (an error while a call's records were made): nothing more is linked, so no
    row can lean on bytes that are not on disk."""

    def record(self, *args) -> None:
        return None
