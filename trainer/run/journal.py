"""The run's journal: a write-ahead log of experience and counters, written as they enter the bridge.

A trainer SIGKILLed between checkpoints would otherwise lose every env step, episode and
transition since its last checkpoint. The bridge calls the journal (ServerContext.set_journal)
as transitions enter its collector, as clients acting locally upload theirs, and once each call
is applied, before it is answered; the daemon adds ended episodes and its learners' update
counts. `--resume` loads the checkpoint, then trainer/run/recovery.py reads the journal back.

Files: LOGDIR/journal/seg-NNNNNN.sbj, a new segment at each checkpoint. A segment is a run of
records (trainer/run/records.py: a JSON header and raw array bytes under a CRC-32, no pickle).
A record cut short by a kill (or damaged) fails its length or CRC check; it and anything after
it in its segment are dropped. Kinds ("k" in the header):
  rows      transitions of one policy: {"p": policy, "i": first row index (per policy, counted
            over the whole run), "n": rows, "cols": {name: tree}}; a camera's obs rows that are
            their agents' last new_obs are left out, a mask says which (trainer/run/obs_links.py)
  counters  the bridge's {"env", "agent", "episodes"} after a call was applied
  episode   one ended episode's summary (JSON)
  updates   {"u": {policy: gradient updates done}} after a chunk of updates

Writes are plain os.write() calls on an O_APPEND descriptor, one per applied call: a SIGKILL
loses nothing the kernel has. fsync_s > 0 also fsyncs every fsync_s seconds (power loss).
"""
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from simbridge.trainer.run.obs_links import NoLinks, RecordLinks
from simbridge.trainer.run.records import LITTLE, counters_record, encode, flatten, little_endian, record
from simbridge.trainer.run.rundir import JOURNAL
from simbridge.wire import tree

log = logging.getLogger("simbridge.trainer")

DIRNAME = JOURNAL


def segment_name(n: int) -> str:
    return f"seg-{n:06d}.sbj"


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
        self._links = RecordLinks()   # a segment is read from its start: its links too
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
                recs.append(counters_record(*now))
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
        try:
            return self._build_records()
        except BaseException:
            # Records linked before this one were never written: no link may follow them here.
            self._links = NoLinks()
            raise

    def _build_records(self) -> List[bytes]:
        recs, buf, self._buf = [], self._buf, []
        run: list = []   # consecutive chunks of one policy and layout: one record
        i = 0
        while i < len(buf):
            pid, cols, n, single = buf[i]
            if single:   # consecutive single rows of one policy: stacked into one chunk
                j = i
                while j < len(buf) and buf[j][3] and buf[j][0] == pid:
                    j += 1
                rows = [b[1] for b in buf[i:j]]
                cols = {k: tree.stack([r[k] for r in rows]) for k in rows[0]}
                n, i = j - i, j
            else:
                i += 1
            key, leaves = self._layout(pid, cols)
            if run and run[0][0] != key:
                recs.append(self._rows_record(run))
                run = []
            run.append((key, leaves, n))
        if run:
            recs.append(self._rows_record(run))
        for s in self._episodes:
            recs.append(encode({"k": "episode", "s": s}))
        self._episodes = []
        return recs

    def _layout(self, pid: str, cols: dict) -> Tuple[tuple, list]:
        """(pid and the columns' layout, their leaf arrays in order); the header of a layout but
        for "i" and "n" is made once and cached (the per-call cost of the journal is mostly here)."""
        leaves: list = []
        sig = []   # (column, its tree of leaf indices as JSON, or the flat column's leaf index)
        for k, v in cols.items():
            if type(v) is np.ndarray:   # the common, flat column
                dt = v.dtype
                if not dt.hasobject:
                    sig.append((k, len(leaves), dt, v.shape[1:]))
                    leaves.append(v if LITTLE and dt.isnative else little_endian(v))
                continue
            mark = len(leaves)
            spec = flatten(v, leaves)
            if any(a.dtype.hasobject for a in leaves[mark:]):   # infos: no learner reads them
                del leaves[mark:]
                continue
            leaves[mark:] = [little_endian(a) for a in leaves[mark:]]
            sig.append((k, json.dumps(spec), tuple((a.dtype, a.shape[1:]) for a in leaves[mark:])))
        key = (pid, tuple(sig))
        if key not in self._layouts:
            if len(self._layouts) > 256:
                self._layouts.clear()
            cols_spec = {x[0]: x[1] if isinstance(x[1], int) else json.loads(x[1]) for x in sig}
            self._layouts[key] = json.dumps(
                {"p": pid, "cols": cols_spec, "a": [[a.dtype.str, list(a.shape[1:])] for a in leaves]},
                separators=(",", ":"))[1:].encode()
        return key, leaves

    def _rows_record(self, run: list) -> bytes:
        """One record of chunks of one layout: row-major leaves, so each column's bytes are its
        chunks' bytes one after the other."""
        key = run[0][0]
        pid = key[0]
        n = sum(r[2] for r in run)
        first = self.rows.get(pid, 0)
        self.rows[pid] = first + n
        self.seg_ends[self.segment][pid] = first + n
        head = b'{"k":"rows","i":%d,"n":%d,' % (first, n)
        linked = self._links.record(key, self._layouts[key], pid, [leaves for _, leaves, _ in run])
        if linked is not None:   # a camera's obs rows that are their agents' last new_obs: left out
            return record(head + linked[0], linked[1])
        return record(head + self._layouts[key], [leaves[j] for j in range(len(run[0][1])) for _, leaves, _ in run])

    def _write(self, recs: List[bytes]) -> None:
        if not recs or self.failed or self._fd < 0:
            return
        # writev, not a join: a camera's records are not copied once more to be written
        bufs = [memoryview(r).cast("B") for r in recs]
        size = sum(b.nbytes for b in bufs)
        try:
            while bufs:
                n = os.writev(self._fd, bufs[:512])   # IOV_MAX is 1,024 on Linux
                while bufs and n >= bufs[0].nbytes:   # a partial write goes on where it stopped
                    n -= bufs[0].nbytes
                    bufs.pop(0)
                if bufs and n:
                    bufs[0] = bufs[0][n:]
        except OSError as e:
            self.failed = f"{e.strerror or e} writing {self.dir / segment_name(self.segment)}"
            log.error("journal: %s: journaling stops; a kill from now on loses what came since the last "
                      "checkpoint (the run goes on)", self.failed)
            return
        self.bytes_written += size
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
