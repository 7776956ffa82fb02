"""Datasets: every transition the trainer receives, recorded per policy as a Minari dataset.

    [dataset]
    record = true                    # record the run's experience (default false)
    record_policies = ["p0"]         # which policies (default: every policy that gets experience)
    dir = ""                         # default LOGDIR/datasets; ids simbridge/<policy>-v0 (-rank<k>-v0 in a group)
    warm_start = { p0 = "runs/old/datasets/simbridge/p0-v0" }   # trainer/data/warm_start.py
    max_open_episodes = 10000        # open (episode, agent) trajectories kept at once
    max_episode_steps = 100000       # a longer trajectory is written in pieces

The recorder sits where the learners take their experience (LearningLoop.ingest: every
MultiAgentBatch the bridge delivers, in order, the rows the journal numbered). Rows arrive
cut into fragments (`truncate_episodes`) and mixed across episodes and agents; it puts them
back together per (eps_id, agent_index) and writes a trajectory as one Minari episode when
its terminated or truncated row arrives, with its final observation (observations has one
more entry than actions). Memory holds open trajectories only; finished ones are written in
small groups (every WRITE_EVERY episodes or WRITE_EVERY_S seconds, and at the end).

What is recorded is what the learners get: evaluation episodes and episodes started with
training_enabled=False bring no rows (the bridge never turns them into experience) and so are
never recorded; actions the simulator logged itself (log_action) are, as the learners take
them (their action_logp info is NaN). Trajectories still open when the trainer stops (their
simulator's session ended without a final step: the bridge drops the unanswered action) are
written as truncated at their last observed step. Each agent of a multi-agent episode is an
episode of its policy's dataset. docs/datasets.md

Minari is imported only when a run records or warm-starts (`pip install 'simbridge[datasets]'`).
"""
import collections
import logging
import os
import re
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from simbridge.trainer.config.dataset import EXTRA_HINT, DatasetConfigError, DatasetSection
from simbridge.wire import tree
from simbridge.wire.columns import (ACTION_LOGP, ACTIONS, AGENT_INDEX, EPS_ID, NEW_OBS, OBS, POLICY_VERSION,
                                    REWARDS, TERMINATEDS, TRUNCATEDS)

log = logging.getLogger("simbridge.trainer")

NAMESPACE = "simbridge"
WRITE_EVERY = 64          # finished episodes held before they are written ...
WRITE_EVERY_S = 2.0       # ... or this long after the first of them finished


def require_minari():
    try:
        import minari  # noqa: F401
    except ImportError as e:
        raise DatasetConfigError(f"[dataset] needs the minari package ({e}): {EXTRA_HINT}") from None
    return minari


def dataset_id(policy_id: str, rank: Optional[int] = None) -> str:
    """simbridge/<policy>-v0: what minari.load_dataset takes with MINARI_DATASETS_PATH = the root.
    Rank k of a data-parallel group records simbridge/<policy>-rank<k>-v0: the ranks' logdirs may be
    one shared path, and distinct ids in one root are what minari.combine_datasets joins."""
    name = re.sub(r'[^-A-Za-z0-9_]', '_', policy_id) + ("" if rank is None else f"-rank{rank}")
    return f"{NAMESPACE}/{name}-v0"


# ---------------------------------------------------------------- writing

class _Writer:
    """One policy's Minari dataset on disk (HDF5), appended to in groups of episodes."""

    def __init__(self, root: Path, policy_id: str, obs_space, act_space, resume: bool, rank: Optional[int] = None):
        from minari import __version__
        from minari.dataset.minari_storage import MinariStorage

        self.id = dataset_id(policy_id, rank)
        # absolute: Minari's storage joins a relative data path to itself when it sizes the file
        # (minari 0.5: 'runs/x/data/runs/x/data/main_data.hdf5', and the first write failed)
        data = Path(root).resolve() / self.id / "data"
        if (data / "metadata.json").exists():
            if not resume:
                raise DatasetConfigError(f"a dataset already exists at {data}: remove it, or set [dataset] dir "
                                         f"to another directory")
            self.storage = MinariStorage.read(data)
            if (self.storage.observation_space, self.storage.action_space) != (obs_space, act_space):
                raise DatasetConfigError(f"the dataset at {data} has observation {self.storage.observation_space}, "
                                         f"action {self.storage.action_space}; policy {policy_id!r} has "
                                         f"{obs_space}, {act_space}: set [dataset] dir to another directory")
        else:
            data.mkdir(parents=True, exist_ok=True)
            # Lossless: JPEG-encoded images would not be the observations the learner saw.
            self.storage = MinariStorage.new(data, observation_space=obs_space, action_space=act_space,
                                             jpeg_encoding=False)
            self.storage.update_metadata({"dataset_id": self.id, "algorithm_name": f"simbridge policy {policy_id}",
                                          "minari_version": __version__,
                                          "description": f"every transition the simbridge trainer"
                                                         f"{'' if rank is None else f' rank {rank}'} received "
                                                         f"for policy {policy_id!r} (docs/datasets.md)"})
        self.pending: list = []
        self.since = 0.0

    def add(self, buffer) -> None:
        if not self.pending:
            self.since = time.monotonic()
        self.pending.append(buffer)

    def due(self) -> bool:
        return len(self.pending) >= WRITE_EVERY or (bool(self.pending)
                                                    and time.monotonic() - self.since >= WRITE_EVERY_S)

    def write(self) -> int:
        n = len(self.pending)
        if n:
            self.storage.update_episodes(self.pending)
            self.pending = []
        return n


class _Trajectory:
    __slots__ = ("chunks", "steps", "last_new_obs", "touched")

    def __init__(self):
        self.chunks: list = []
        self.steps = 0
        self.last_new_obs = None   # the last row's new_obs, one row (a leading dimension of 1)
        self.touched = 0


_KEEP = (OBS, ACTIONS, REWARDS, TERMINATEDS, TRUNCATEDS, POLICY_VERSION, ACTION_LOGP)


def _take(col, index):
    return col[index] if isinstance(col, np.ndarray) else tree.take(col, index)


def _rows(col, lo: int, hi: int):
    """Rows lo:hi as a copy: an open trajectory must not keep its whole batch alive."""
    if isinstance(col, np.ndarray):
        return col[lo:hi].copy()
    return tree.map_structure(lambda a: a[lo:hi].copy(), col)


class EpisodeRecorder:
    """MultiAgentBatches in (`add`, the learning loop's thread only), Minari episodes out."""

    def __init__(self, cfg: DatasetSection, root: Path, spaces: Callable[[str], Tuple], resume: bool = False,
                 rank: Optional[int] = None):
        """rank: this process's rank in a data-parallel group (None: a single trainer). A rank looks
        only at its own datasets (ids ending -rank<k>-v0): the others' may share the root."""
        require_minari()
        mine = "*" if rank is None else f"*-rank{rank}-v0"
        existing = sorted(p.parent.parent.name for p in Path(root).glob(f"{NAMESPACE}/{mine}/data/metadata.json"))
        if existing and not resume:
            raise DatasetConfigError(f"[dataset] datasets already exist in {root} ({', '.join(existing)}): remove "
                                     f"them, or set [dataset] dir to another directory")
        self.cfg, self.root, self._spaces, self._resume, self.rank = cfg, Path(root), spaces, resume, rank
        self._open: "collections.OrderedDict[Tuple[str, int, int], _Trajectory]" = collections.OrderedDict()
        self._dropped_keys: "collections.OrderedDict[Tuple[str, int, int], None]" = collections.OrderedDict()
        self._writers: Dict[str, _Writer] = {}
        self._tick = 0
        self.episodes_written: Dict[str, int] = collections.Counter()
        self.steps_written: Dict[str, int] = collections.Counter()
        self.dropped_episodes = 0   # open trajectories evicted by max_open_episodes (and their later rows)
        self.dropped_rows = 0
        self.split_episodes = 0     # trajectories longer than max_episode_steps, written in pieces

    # -------------------------------------------------------------- intake

    def add(self, batch) -> None:
        for pid, b in batch.policy_batches.items():
            if b.count and self.cfg.records(pid):
                self._add_policy_rows(pid, b)
        self._write_due()

    def _add_policy_rows(self, pid: str, b) -> None:
        eps, agents = np.asarray(b[EPS_ID]), np.asarray(b[AGENT_INDEX])
        done = np.asarray(b[TERMINATEDS], bool) | np.asarray(b[TRUNCATEDS], bool)
        # Rows grouped by trajectory (a stable sort keeps their order within each): one gather per
        # column for the whole batch, then a contiguous copy per trajectory.
        pairs = np.stack([eps, agents], axis=1)
        uniq, first, inverse = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")
        ends = np.cumsum(np.bincount(inverse, minlength=len(uniq)))
        cols = {k: _take(b[k], order) for k in _KEEP if k in b}
        new_obs, done = _take(b[NEW_OBS], order), done[order]
        for g in np.argsort(first):   # trajectories in the order they first appear
            lo, hi = (int(ends[g - 1]) if g else 0), int(ends[g])
            key = (pid, int(uniq[g][0]), int(uniq[g][1]))
            if key in self._dropped_keys:
                self.dropped_rows += hi - lo
                continue
            traj = self._open.pop(key, None) or _Trajectory()
            self._tick += 1
            traj.touched = self._tick
            self._open[key] = traj   # most recently extended last
            start = lo
            for e in lo + np.flatnonzero(done[lo:hi]):   # a done row ends the trajectory
                self._extend(traj, {k: _rows(v, start, e + 1) for k, v in cols.items()}, _rows(new_obs, e, e + 1))
                self._finish(key, self._open.pop(key))
                traj = self._open[key] = _Trajectory()
                start = e + 1
            if start < hi:
                self._extend(traj, {k: _rows(v, start, hi) for k, v in cols.items()}, _rows(new_obs, hi - 1, hi))
                if traj.steps >= self.cfg.max_episode_steps:
                    self.split_episodes += 1
                    if self.split_episodes == 1:
                        log.warning("dataset: a trajectory of policy %r reached [dataset] max_episode_steps = %d: "
                                    "written as truncated there, the rest goes on as another episode", pid,
                                    self.cfg.max_episode_steps)
                    self._finish(key, self._open.pop(key), truncate=True)
            else:
                self._open.pop(key)
        self._bound_open()

    @staticmethod
    def _extend(traj: _Trajectory, cols: dict, last_new_obs) -> None:
        traj.chunks.append(cols)
        traj.steps += len(cols[REWARDS])
        traj.last_new_obs = last_new_obs

    def _bound_open(self) -> None:
        while len(self._open) > self.cfg.max_open_episodes:
            key, traj = self._open.popitem(last=False)   # the one extended longest ago
            self.dropped_episodes += 1
            self.dropped_rows += traj.steps
            self._dropped_keys[key] = None
            if len(self._dropped_keys) > self.cfg.max_open_episodes:
                self._dropped_keys.popitem(last=False)
            if self.dropped_episodes == 1 or self.dropped_episodes % 1000 == 0:
                log.warning("dataset: more than [dataset] max_open_episodes = %d trajectories open: dropped the "
                            "one extended longest ago (policy %r, eps_id %d, agent %d; %d dropped so far)",
                            self.cfg.max_open_episodes, key[0], key[1], key[2], self.dropped_episodes)

    # -------------------------------------------------------------- episodes out

    def _finish(self, key, traj: _Trajectory, truncate: bool = False) -> None:
        from minari.data_collector.episode_buffer import EpisodeBuffer

        pid, eps_id, agent = key
        cols = {k: tree.concat([c[k] for c in traj.chunks]) for k in traj.chunks[0]}
        n = traj.steps
        observations = tree.concat([cols[OBS], traj.last_new_obs])
        term = np.asarray(cols[TERMINATEDS], bool).copy()
        trunc = np.asarray(cols[TRUNCATEDS], bool).copy()
        if truncate and not (term[-1] or trunc[-1]):
            trunc[-1] = True
        # infos[i] goes with observations[i] (Minari's convention): the version of the policy
        # that chose the action taken there, and its log-probability (NaN: logged by the
        # simulator, or a policy that gives none); -1 and NaN at the final observation.
        version = np.append(np.asarray(cols.get(POLICY_VERSION, np.full(n, -1)), np.int64), -1)
        logp = np.append(np.asarray(cols.get(ACTION_LOGP, np.full(n, np.nan)), np.float32), np.nan)
        infos = {"policy_version": version, "action_logp": logp,
                 "eps_id": np.full(n + 1, eps_id, np.int64), "agent_index": np.full(n + 1, agent, np.int64)}
        self._writer(pid).add(EpisodeBuffer(observations=observations, actions=cols[ACTIONS],
                                            rewards=np.asarray(cols[REWARDS], np.float32), terminations=term,
                                            truncations=trunc, infos=infos))
        self.steps_written[pid] += n

    def _writer(self, pid: str) -> _Writer:
        w = self._writers.get(pid)
        if w is None:
            obs_space, act_space = self._spaces(pid)
            w = self._writers[pid] = _Writer(self.root, pid, obs_space, act_space, self._resume, self.rank)
            log.info("dataset: recording policy %r to %s (minari id %s)", pid, self.root / w.id, w.id)
        return w

    def _write_due(self, force: bool = False) -> None:
        for pid, w in self._writers.items():
            if force or w.due():
                self.episodes_written[pid] += w.write()

    def close(self) -> Dict[str, dict]:
        """The trainer stops: open trajectories are written as truncated at their last step."""
        open_at_stop = len(self._open)
        while self._open:
            key, traj = self._open.popitem(last=False)
            self._finish(key, traj, truncate=True)
        self._write_due(force=True)
        summary = {pid: {"id": w.id, "path": str(self.root / w.id), "episodes": self.episodes_written[pid],
                         "steps": self.steps_written[pid]} for pid, w in self._writers.items()}
        if summary or open_at_stop or self.dropped_episodes:
            log.info("dataset: %s; %d open at the stop written as truncated; %d dropped (max_open_episodes), "
                     "%d split (max_episode_steps)", ", ".join(f"{pid}: {s['episodes']} episodes, {s['steps']} "
                                                              f"steps in {s['path']}" for pid, s in summary.items())
                     or "nothing recorded", open_at_stop, self.dropped_episodes, self.split_episodes)
        return summary


def minari_datasets_path(root) -> str:
    """What MINARI_DATASETS_PATH must be for minari.load_dataset("simbridge/<policy>-v0")."""
    return os.fspath(Path(root).resolve())
