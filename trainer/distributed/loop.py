"""A rank's side of a data-parallel run (trainer/distributed/group.py): its learning loop, which
exchanges with the group once a pass and runs the updates the group decided, and the daemon's
hooks (attach, join, leave). Only rank 0 reports and checkpoints."""
import math
import os
import sys
import time
from typing import Dict

import torch
import torch.distributed as dist

from simbridge.trainer.distributed.group import Group, _learns, weights_digest
from simbridge.trainer.distributed.ranks import GroupLost, _first_line, init_group, lost, timeout_s
from simbridge.trainer.run.loop import TRAIN_CHUNK, LearningLoop

INTAKE_BATCHES = 8     # experience batches a rank takes between two exchanges, at most


class DistributedLoop(LearningLoop):
    """The learning loop of one rank: intake, the exchange, then the updates the group decided."""

    group: Group   # set by attach()
    group_lost: str = ""

    def run(self, last_checkpoint_env_steps: int, learners_expected: int = 0) -> None:
        run, g = self.run_cfg, self.group
        if self.group_lost:   # never joined
            return
        for pid, p in self.runtime.policies.items():   # a resumed rank 0's clocks go on from its checkpoint
            if _learns(p):
                g.base[pid] = p.agent_steps
        # A warm start's share (trainer/data/warm_start.py), after the base: its rows count in `fed`, so the
        # first exchange puts the whole dataset on the group's clock, as agent steps.
        for pid, b in self.warm_start:
            self.feed(pid, self.runtime.policies[pid], b)
        self.warm_start = []
        self._next_report = time.monotonic() + run.print_every_s
        every = run.checkpoint_every_env_steps
        next_ckpt = (last_checkpoint_env_steps // every + 1) * every if every else math.inf
        known = len(self.runtime.policies)
        owed = True   # no intake before the first exchange: a warm start's due updates come first
        while True:
            if not owed:
                self._intake()
            try:
                d = g.exchange(self.stop_event.is_set())
                if d["stop"]:
                    self._stop("a rank asked the group to stop")
                    return
                if run.total_env_steps and g.env_steps >= run.total_env_steps:
                    self._stop(f"total_env_steps {run.total_env_steps} reached by the group")
                    return
                owed = self._train_group()
            except GroupLost as e:
                self.group_lost = str(e)
                self._stop(str(e))
                return
            if len(self.runtime.policies) != known:
                known = len(self.runtime.policies)
                self._checkpoint()
            self._maybe_report()
            steps = self.runtime.metrics.env_steps
            if steps >= next_ckpt:
                self._checkpoint()
                next_ckpt = (steps // every + 1) * every

    def _intake(self) -> None:
        # Each batch taken is ingested: the last turn took a ninth and dropped it (a fragment lost
        # to the recorder and the learner, where the queue refilled during a slow intake).
        for i in range(INTAKE_BATCHES):
            batch = self.runtime.experience.get(timeout=0.02 if i == 0 else 0)
            if batch is None:
                return
            self.ingest(batch)

    def feed(self, pid: str, p, b) -> None:
        super().feed(pid, p, b)
        if pid in self.group.fed and _learns(p):
            self.group.fed[pid] += b.count

    def _train_group(self) -> bool:
        """The updates the exchange made due, the same on every rank; True while more are owed."""
        g, owed = self.group, False
        for pid in g.pids:
            if pid not in g.synced:
                if not any(g.has.get(pid, ())):
                    continue
                g.sync(pid)   # every rank has it now, with rank 0's (or the first holder's) weights
            p = self.runtime.policies.get(pid)
            if not _learns(p):
                continue
            p.agent_steps = g.clock(pid)   # the same on every rank: so are the due updates and lr
            try:
                owed |= g.train(pid, p, TRAIN_CHUNK)
            except RuntimeError as e:   # a collective inside an optimizer step
                raise lost(e, g.info.rank) from None
        return owed

    def finish(self) -> None:
        """After the server stopped and the queue drained: the last counts and episodes, to rank 0
        (exchanges until no rank has episodes left to send; bounded)."""
        if self.group_lost:
            return
        for _ in range(1000):
            try:
                if not self.group.exchange(True)["more"]:
                    return
            except GroupLost as e:
                self.group_lost = str(e)
                return

    def digests(self) -> Dict[str, str]:
        return {pid: f"version {p.version}, weights sha256 {weights_digest(p)}"
                for pid, p in sorted(self.runtime.policies.items()) if _learns(p)}


class SilentReporter:
    """The reporter of ranks other than 0: rank 0 writes the group's records."""

    def __init__(self, *args, **kwargs):
        self.address = "?"

    def open(self, purge_step=None) -> None:
        pass

    def hparams(self, *args) -> None:
        pass

    def report(self, event=None, extra=None) -> dict:
        return {}

    def close(self) -> None:
        pass


# -------------------------------------------------------------------- the daemon's side

def attach(daemon):
    """A rank's reporter and loop for TrainerDaemon (rank 0: the usual Reporter, whose records
    are the group's once the exchange folds the other ranks' counts in)."""
    from simbridge.trainer.learners.placement import pick_device
    from simbridge.trainer.run.reporting import Reporter
    info, cfg = daemon.rank, daemon.cfg
    reporter = (Reporter(daemon.runtime, daemon.logdir, daemon.out, cfg.server.experience_queue_size, daemon.wall_s)
                if info.writes else SilentReporter())
    loop = DistributedLoop(daemon.runtime, cfg.run, daemon.stop_event, daemon.request_stop, reporter.report,
                           daemon.checkpoint)
    device = pick_device(cfg.run.device)
    loop.group = Group(info, daemon.runtime, [pid for pid in cfg.policies if cfg.trainable(pid)],
                       device if device.type == "cuda" else torch.device("cpu"))
    return reporter, loop


def join(daemon) -> None:
    """Joins the process group, once this rank serves; a group that does not form in time stops
    this rank with a message naming the likely causes."""
    info = daemon.rank
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    print(f"simbridge-trainer: rank {info.rank} of {info.world} serving on {daemon.address}; joining the group "
          f"at {where}", file=daemon.out, flush=True)
    t0 = time.monotonic()
    try:
        backend = init_group(info, daemon.loop.group.device)   # cuda:LOCAL_RANK or the CPU (attach)
    except Exception as e:   # noqa: BLE001 - a timeout, a refused connection: the message is the fix
        daemon.loop.group_lost = (f"rank {info.rank} could not join the group at {where} within {timeout_s():.0f} s "
                                  f"({_first_line(e)}): start all {info.world} ranks with the same MASTER_ADDR and "
                                  f"MASTER_PORT (rank 0's host, a port it can bind), and check that the ranks reach "
                                  f"each other")
        daemon.request_stop("no process group")
        return
    print(f"simbridge-trainer: rank {info.rank} joined the group of {info.world} ({backend}, "
          f"{time.monotonic() - t0:.1f} s)", file=daemon.out, flush=True)


def leave(daemon) -> None:
    """At shutdown, after the drain: the last exchange, each policy's version and weights hash
    (equal on every rank), then out of the group."""
    loop, info = daemon.loop, daemon.rank
    loop.finish()
    for pid, what in loop.digests().items():
        print(f"simbridge-trainer: rank {info.rank}: policy {pid} at {what}", file=daemon.out, flush=True)
    if loop.group_lost:
        print(f"simbridge-trainer: error: {loop.group_lost}", file=sys.stderr, flush=True)
        daemon.exit_code = 1
        return   # a broken group is not torn down in order: the process exits
    try:
        dist.destroy_process_group()
    except Exception:   # noqa: BLE001 - leaving anyway
        pass
