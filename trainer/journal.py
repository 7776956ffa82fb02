"""The run's journal: a write-ahead log of experience and counters, written as they enter the bridge.

A trainer SIGKILLed between checkpoints would otherwise lose every env step, episode and
transition since its last checkpoint. The bridge calls the journal (ServerContext.set_journal)
as transitions enter its collector, as clients acting locally upload theirs, and once each call
is applied, before it is answered; the daemon adds ended episodes and its learners' update
counts. `--resume` loads the checkpoint, then `recover()` reads the journal back.

Files: LOGDIR/journal/seg-NNNNNN.sbj, a new segment at each checkpoint. A segment is a run of
records, each: b"SBJ1", header length, payload length, CRC-32 of header+payload (little-endian
uint32s), a JSON header, then the payload: raw little-endian numpy bytes of the arrays the
header describes (dtype, shape; nested observations as a tree of leaf indices). No pickle: a
reader trusts nothing but JSON, dtypes without objects, and sizes it checks. A record cut short
by a kill (or damaged) fails its length or CRC check; it and anything after it in its segment
are dropped. Kinds ("k" in the header):
  rows      transitions of one policy: {"p": policy, "i": first row index (per policy, counted
            over the whole run), "n": rows, "cols": {name: tree}}
  counters  the bridge's {"env", "agent", "episodes"} after a call was applied
  episode   one ended episode's summary (JSON)
  updates   {"u": {policy: gradient updates done}} after a chunk of updates

Writes are plain os.write() calls on an O_APPEND descriptor, one per applied call: a SIGKILL
loses nothing the kernel has. fsync_s > 0 also fsyncs every fsync_s seconds (power loss).
"""
import json
import logging
import os
import struct
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from simbridge.wire import tree
from simbridge.wire.columns import AGENT_INDEX, EPS_ID, REWARDS, T

log = logging.getLogger("simbridge.trainer")

DIRNAME = "journal"
MAGIC = b"SBJ1"
_HEAD = struct.Struct("<4sIII")
MAX_HEADER = 1 << 20            # a reader refuses larger headers (a damaged length field)


def segment_name(n: int) -> str:
    return f"seg-{n:06d}.sbj"


# ---------------------------------------------------------------- records

def _flatten(value, leaves: list):
    """A column (an array, or dicts/tuples of them) -> (JSON tree of leaf indices, leaves += arrays)."""
    if isinstance(value, dict):
        return {"d": {str(k): _flatten(v, leaves) for k, v in value.items()}}
    if isinstance(value, tuple):
        return {"t": [_flatten(v, leaves) for v in value]}
    leaves.append(np.ascontiguousarray(value))
    return len(leaves) - 1


def _unflatten(spec, arrays: list):
    if isinstance(spec, int):
        return arrays[spec]
    if "d" in spec:
        return {k: _unflatten(v, arrays) for k, v in spec["d"].items()}
    return tuple(_unflatten(v, arrays) for v in spec["t"])


def _frame(h: bytes, payload: bytes = b"") -> bytes:
    return _HEAD.pack(MAGIC, len(h), len(payload), zlib.crc32(payload, zlib.crc32(h))) + h + payload


def _le(a: np.ndarray) -> np.ndarray:
    return a if a.dtype.byteorder == "<" or (a.dtype.byteorder in "=|" and _LITTLE) else a.astype(a.dtype.newbyteorder("<"))


_LITTLE = np.little_endian


def encode(header: dict, arrays: List[np.ndarray] = ()) -> bytes:
    """One record: `header` (JSON) and `arrays` (their dtype and shape go in the header)."""
    arrays = [_le(np.asarray(a)) for a in arrays]
    header = dict(header, a=[[a.dtype.str, list(a.shape)] for a in arrays])
    return _frame(json.dumps(header, separators=(",", ":")).encode(), b"".join(a.tobytes() for a in arrays))


def _counters(env: int, agent: int, episodes: int) -> bytes:
    # Once per applied call: formatted directly (json.dumps costs several times more).
    return _frame(b'{"k":"counters","env":%d,"agent":%d,"episodes":%d,"a":[]}' % (env, agent, episodes))


def decode_all(data: bytes) -> Tuple[List[Tuple[dict, List[np.ndarray]]], int]:
    """The whole records at the start of `data`, and how many bytes they take (the rest: torn)."""
    out, pos = [], 0
    while pos + _HEAD.size <= len(data):
        magic, hlen, plen, crc = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + hlen + plen
        if magic != MAGIC or hlen > MAX_HEADER or end > len(data):
            break
        h = data[pos + _HEAD.size: pos + _HEAD.size + hlen]
        payload = data[pos + _HEAD.size + hlen: end]
        if zlib.crc32(payload, zlib.crc32(h)) != crc:
            break
        try:
            header = json.loads(h)
            arrays, off = [], 0
            rows = [int(header["n"])] if header.get("k") == "rows" else []   # rows: trailing shapes
            for dt, shape in header.pop("a"):
                shape = rows + list(shape)
                dtype = np.dtype(dt)
                if dtype.hasobject:
                    raise ValueError("object dtype")
                size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
                arrays.append(np.frombuffer(payload, dtype, offset=off, count=size // max(dtype.itemsize, 1))
                              .reshape(shape) if size else np.zeros(shape, dtype))
                off += size
            if off != len(payload):
                raise ValueError("payload size")
        except (ValueError, TypeError, KeyError) as e:
            log.warning("journal: a record with a valid checksum does not decode (%s): dropped with the rest", e)
            break
        out.append((header, arrays))
        pos = end
    return out, pos


# ---------------------------------------------------------------- writing

class Journal:
    """The writer. Its row/episode calls come under the bridge's lock; `commit()` ends a call."""

    def __init__(self, directory: Path, segment: int = 1, rows: Optional[Dict[str, int]] = None,
                 fsync_s: float = 0.0):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rows: Dict[str, int] = dict(rows or {})      # rows journaled per policy, whole run
        self.segment = segment
        self.seg_ends: Dict[int, Dict[str, int]] = {}     # segment -> rows end per policy in it
        self.failed: Optional[str] = None                 # why writing stopped (disk full, ...)
        self.bytes_written = 0
        self._lock = threading.Lock()
        self._buf: List[Tuple[str, Any, int, bool]] = []  # (policy, columns or row, n, single row)
        self._episodes: List[dict] = []
        self._last = (-1, -1, -1)
        self._layouts: Dict[tuple, bytes] = {}
        self._fd = -1
        self._dirty = False
        self._open(segment)
        self._fsync_s = fsync_s
        self._stop = threading.Event()
        if fsync_s > 0:
            threading.Thread(target=self._fsync_loop, name="journal-fsync", daemon=True).start()

    def _open(self, n: int) -> None:
        self.segment = n
        self.seg_ends.setdefault(n, {})
        self._fd = os.open(self.dir / segment_name(n), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    # -- the bridge's side (ServerContext, ExperienceCollector, ExperienceQueue.offer)
    def add_rows(self, policy_id: str, columns: dict, n: int) -> None:
        with self._lock:
            self._buf.append((policy_id, columns, n, False))

    def add_row(self, policy_id: str, row: dict) -> None:
        with self._lock:
            self._buf.append((policy_id, row, 1, True))

    def add_batch(self, batch) -> None:
        """A MultiAgentBatch that bypasses the collector (uploads): journaled now, as one call."""
        with self._lock:
            for pid, b in batch.policy_batches.items():
                self._buf.append((pid, {k: b[k] for k in b}, b.count, False))
            self._write(self._take_records())

    def commit(self, metrics) -> None:
        """A call was applied: its rows, episodes and the counters, in one write."""
        with self._lock:
            now = (metrics.env_steps, metrics.agent_steps, metrics.episodes)
            if not self._buf and not self._episodes and now == self._last:
                return
            recs = self._take_records()
            if now != self._last:
                recs.append(_counters(*now))
                self._last = now
            self._write(recs)

    # -- the daemon's side
    def episode(self, summary: dict) -> None:
        """Runtime lock held (an episode-end hook): written with the call's commit."""
        with self._lock:
            self._episodes.append(summary)

    def updates(self, counts: Dict[str, int]) -> None:
        with self._lock:
            self._write([encode({"k": "updates", "u": counts})])

    def rotate(self) -> dict:
        """Runtime lock held, with the checkpoint's counters read: what follows goes to a new
        segment. Returns the journal's part of the checkpoint."""
        with self._lock:
            self._write(self._take_records())
            self._sync(self._fd)
            os.close(self._fd)
            self.seg_ends[self.segment] = dict(self.rows)
            self._open(self.segment + 1)
            if self._fsync_s > 0:
                self._sync_dir()
            return {"segment": self.segment, "rows": dict(self.rows)}

    def prune(self, needed_from: Dict[str, int]) -> int:
        """After a checkpoint is safely written: delete the closed segments holding no row from
        needed_from[policy] on (rows a resume still replays); returns how many."""
        gone = 0
        for n in sorted(self.seg_ends):
            if n >= self.segment:
                break
            ends = self.seg_ends[n]
            if all(end <= needed_from.get(pid, 0) for pid, end in ends.items()):
                try:
                    os.unlink(self.dir / segment_name(n))
                except FileNotFoundError:
                    pass
                del self.seg_ends[n]
                gone += 1
            else:
                break   # segments go oldest first: a resume reads a contiguous tail
        return gone

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._write(self._take_records())
            self._sync(self._fd)
            os.close(self._fd)
            self._fd = -1

    # -- internals (self._lock held)
    def _take_records(self) -> List[bytes]:
        recs, buf, self._buf = [], self._buf, []
        i = 0
        while i < len(buf):
            pid, cols, n, single = buf[i]
            if single:   # consecutive single rows of one policy: stacked into one record
                j = i
                while j < len(buf) and buf[j][3] and buf[j][0] == pid:
                    j += 1
                rows = [b[1] for b in buf[i:j]]
                cols = {k: tree.stack([r[k] for r in rows]) for k in rows[0]}
                n, i = j - i, j
            else:
                i += 1
            recs.append(self._rows_record(pid, cols, n))
        for s in self._episodes:
            recs.append(encode({"k": "episode", "s": s}))
        self._episodes = []
        return recs

    def _rows_record(self, pid: str, cols: dict, n: int) -> bytes:
        """A rows record; its header but for "i" and "n" is cached per column layout (the
        per-call cost of the journal is mostly here)."""
        leaves: list = []
        sig = []   # (column, its tree of leaf indices as JSON, or the flat column's leaf index)
        for k, v in cols.items():
            if type(v) is np.ndarray:   # the common, flat column
                if not v.dtype.hasobject:
                    sig.append((k, len(leaves), v.dtype.str, v.shape[1:]))
                    leaves.append(_le(v))
                continue
            mark = len(leaves)
            spec = _flatten(v, leaves)
            if any(a.dtype.hasobject for a in leaves[mark:]):   # infos: no learner reads them
                del leaves[mark:]
                continue
            leaves[mark:] = [_le(a) for a in leaves[mark:]]
            sig.append((k, json.dumps(spec), tuple((a.dtype.str, a.shape[1:]) for a in leaves[mark:])))
        key = (pid, tuple(sig))
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) > 256:
                self._layouts.clear()
            cols_spec = {x[0]: x[1] if isinstance(x[1], int) else json.loads(x[1]) for x in sig}
            layout = self._layouts[key] = json.dumps(
                {"p": pid, "cols": cols_spec, "a": [[a.dtype.str, list(a.shape[1:])] for a in leaves]},
                separators=(",", ":"))[1:].encode()
        first = self.rows.get(pid, 0)
        self.rows[pid] = first + n
        self.seg_ends[self.segment][pid] = first + n
        return _frame(b'{"k":"rows","i":%d,"n":%d,' % (first, n) + layout, b"".join(a.tobytes() for a in leaves))

    def _write(self, recs: List[bytes]) -> None:
        if not recs or self.failed or self._fd < 0:
            return
        data = b"".join(recs)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as e:
            self.failed = f"{e.strerror or e} writing {self.dir / segment_name(self.segment)}"
            log.error("journal: %s: journaling stops; a kill from now on loses what came since the last "
                      "checkpoint (the run goes on)", self.failed)
            return
        self.bytes_written += len(data)
        self._dirty = True

    def _sync(self, fd: int) -> None:
        if self._fsync_s > 0 and fd >= 0 and self._dirty:
            try:
                os.fsync(fd)
            except OSError as e:
                log.warning("journal: fsync failed: %s", e)
            self._dirty = False

    def _sync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _fsync_loop(self) -> None:
        while not self._stop.wait(self._fsync_s):
            with self._lock:
                self._sync(self._fd)


# ---------------------------------------------------------------- reading back

@dataclass
class Recovered:
    """What the journal adds to a checkpoint (read by recover())."""
    counters: Optional[dict] = None                           # the last after the checkpoint
    summaries: List[dict] = field(default_factory=list)       # episodes ended after it
    # policy -> (first row index, columns, rows, written after the checkpoint)
    rows: Dict[str, List[Tuple[int, dict, int, bool]]] = field(default_factory=dict)
    updates: Dict[str, int] = field(default_factory=dict)     # the last journaled update counts
    seg_ends: Dict[int, Dict[str, int]] = field(default_factory=dict)
    last_segment: int = 0
    records: int = 0
    torn: List[str] = field(default_factory=list)             # segments with a dropped tail
    max_eps_id: int = 0
    ended_ids: set = field(default_factory=set)               # eps_ids of every journaled summary

    def rows_end(self) -> Dict[str, int]:
        return {pid: chunks[-1][0] + chunks[-1][2] for pid, chunks in self.rows.items() if chunks}

    def open_episodes(self) -> List[dict]:
        """Summaries, ended as truncated, of the episodes with journaled transitions and no
        summary: they were open at the kill (their sessions are gone). Their length and return
        come from their transitions still in the journal (an action whose outcome never came is
        dropped, as when a simulator is lost)."""
        open_ids = set()
        for chunks in self.rows.values():
            for _, cols, _, _ in chunks:
                open_ids.update(np.unique(np.asarray(cols[EPS_ID])).tolist())
        open_ids -= self.ended_ids
        eps: Dict[int, dict] = {}
        for pid, chunks in self.rows.items():
            for _, cols, n, _ in chunks:
                ids = np.asarray(cols[EPS_ID])
                mine = np.flatnonzero(np.isin(ids, list(open_ids))) if open_ids else ()
                agents, rew, t = np.asarray(cols[AGENT_INDEX]), np.asarray(cols[REWARDS]), np.asarray(cols[T])
                for k in mine:
                    ep = eps.setdefault(int(ids[k]), {"length": 0, "agents": {}})
                    ep["length"] = max(ep["length"], int(t[k]) + 1)
                    a = ep["agents"].setdefault(f"agent{int(agents[k])}", [pid, 0.0])
                    a[1] += float(rew[k])
        out = []
        for e, ep in sorted(eps.items()):
            agent_rewards = {aid: r for aid, (_, r) in ep["agents"].items()}
            agent_policies = {aid: pid for aid, (pid, _) in ep["agents"].items()}
            policy_rewards: Dict[str, float] = {}
            for aid, pid in agent_policies.items():
                policy_rewards[pid] = policy_rewards.get(pid, 0.0) + agent_rewards[aid]
            out.append({"episode_id": f"eps-{e}", "eps_id": e, "session_id": "", "total_reward":
                        float(sum(agent_rewards.values())), "length": ep["length"],
                        "agent_rewards": agent_rewards, "agent_policies": agent_policies,
                        "policy_rewards": policy_rewards, "custom_metrics": {}, "training_enabled": True,
                        "end_reason": "trainer_lost", "duration_s": 0.0})
        return out


def recover(directory: Path, since_segment: int, needed_from: Dict[str, int]) -> Recovered:
    """Read every segment; counters, episodes and updates from `since_segment` on (the ones
    before are in the checkpoint), rows from needed_from[policy] on (earlier ones are neither
    new to the learner nor needed to refill its replay buffer)."""
    rec = Recovered()
    directory = Path(directory)
    names = sorted(directory.glob("seg-*.sbj")) if directory.is_dir() else []
    for path in names:
        try:
            n = int(path.stem.split("-")[1])
        except (IndexError, ValueError):
            continue
        data = path.read_bytes()
        records, used = decode_all(data)
        if used < len(data):
            rec.torn.append(f"{path.name}: {len(data) - used} bytes")
        rec.last_segment = max(rec.last_segment, n)
        ends = rec.seg_ends.setdefault(n, {})
        after = n >= since_segment
        for header, arrays in records:
            rec.records += 1
            kind = header.get("k")
            if kind == "rows":
                pid, i, k = header["p"], int(header["i"]), int(header["n"])
                ends[pid] = i + k
                if i + k <= needed_from.get(pid, 0) and not after:
                    continue
                cols = {c: _unflatten(spec, arrays) for c, spec in header["cols"].items()}
                if EPS_ID in cols and len(cols[EPS_ID]):
                    rec.max_eps_id = max(rec.max_eps_id, int(np.max(cols[EPS_ID])))
                rec.rows.setdefault(pid, []).append((i, cols, k, after))
            elif kind == "episode":
                eps_id = int(header["s"].get("eps_id", 0))
                rec.ended_ids.add(eps_id)
                rec.max_eps_id = max(rec.max_eps_id, eps_id)
                if after:
                    rec.summaries.append(header["s"])
            elif not after:
                continue
            elif kind == "counters":
                rec.counters = {"env_steps": header["env"], "agent_steps": header["agent"],
                                "episodes": header["episodes"]}
            elif kind == "updates":
                rec.updates.update({p: int(u) for p, u in header["u"].items()})
    for chunks in rec.rows.values():
        chunks.sort(key=lambda c: c[0])
    return rec
