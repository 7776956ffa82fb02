"""The learning loop, the daemon's main thread.

Take a MultiAgentBatch from the bridge's experience queue, add each policy's SampleBatch to
its learner (trainable policies only), then run the updates the replay ratio makes due
before taking more. The queue is small, so a learner that falls behind blocks the bridge's
puts and slows the simulators instead of falling behind. Between chunks of updates the loop
writes the progress record when due, checkpoints every checkpoint_every_env_steps and stops
at total_env_steps.

`ingested` counts the rows each policy's batches brought, over the whole run: the journal
numbers rows the same way (the queue keeps their order), so a checkpoint saying how many
were ingested tells a resume which journaled rows its learners have not seen.
"""
import collections
import math
import threading
import time
from typing import Callable, Dict, List, Optional

from simbridge.server.runtime import BridgeRuntime
from simbridge.trainer.config.sections import RunSection
from simbridge.trainer.learners.base import Learner, trains
from simbridge.trainer.run.learner_process import LearnerProcess, LearnerProcessDied, spawn_child, wait_any

TRAIN_CHUNK = 64          # updates between checks for signals and progress lines


class LearningLoop:
    def __init__(self, runtime: BridgeRuntime, run: RunSection, stop_event: threading.Event,
                 stop: Callable[[str], None], report: Callable[[], object], checkpoint: Callable[[], None],
                 journal=None):
        self.runtime = runtime
        self.journal = journal   # told the update counts after each chunk of updates (None: none)
        self.recorder = None     # trainer/data/datasets.py's EpisodeRecorder, when the run records
        self.recording_failed = ""   # why the recorder stopped (the run stops with it, in order)
        self.warm_start: List = []   # (policy id, SampleBatch) fed before any experience (trainer/data/warm_start.py)
        self.ingested: Dict[str, int] = collections.Counter()
        # Rows taken from the experience queue (every ingest's) and fed on, this process's: with
        # the queue's rows_admitted, what the rate limiter counts as queued.
        self._taken: Dict[str, int] = collections.Counter()
        self.run_cfg = run
        self.stop_event = stop_event
        self._stop = stop
        self.budget_spent = False   # total_env_steps reached: the simulators are told training is over
        self._report = report
        self._checkpoint = checkpoint
        self._next_report = 0.0
        # [run] learner_process: each trainable Learner trains in a child process of its own.
        self.procs: Dict[str, LearnerProcess] = {}
        self._spares: List = []   # started children, for the policies still to come
        # the trainable learners the config may create, while their spare children wait for the
        # first simulator (None: started, or not learner_process)
        self._expected: Optional[int] = None

    def run(self, last_checkpoint_env_steps: int, learners_expected: int = 0) -> None:
        """Until stop_event is set (a signal, or total_env_steps reached). learners_expected: the
        trainable learners the config may create, whose processes start when the first simulator
        connects (learner_process)."""
        run = self.run_cfg
        if run.learner_process:
            # started when the first simulator connects, not before: a trainer that none joins
            # (a refused config, a trainer stopped while it waits) never pays a child's imports
            self._expected = learners_expected
            self.runtime.experience.hold_while(self._held_back)
        for pid, b in self.warm_start:
            self.feed(pid, self.runtime.policies[pid], b)
        self.warm_start = []
        self._next_report = time.monotonic() + run.print_every_s
        every = run.checkpoint_every_env_steps
        next_ckpt = (last_checkpoint_env_steps // every + 1) * every if every else math.inf
        known = len(self.runtime.policies)
        while not self.stop_event.is_set():
            try:
                steps = self._step(known, next_ckpt)
            except LearnerProcessDied as e:
                self._stop(str(e))
                break
            known = len(self.runtime.policies)
            if steps >= next_ckpt:
                next_ckpt = (steps // every + 1) * every
            if run.total_env_steps and steps >= run.total_env_steps:
                self.budget_spent = True
                self._stop(f"total_env_steps {run.total_env_steps} reached")

    def _step(self, known: int, next_ckpt: float) -> int:
        """Takes one batch if one is queued, trains or takes weights, reports and checkpoints as
        due; returns the env steps."""
        if self._expected is not None and len(self.runtime.sessions):
            # one per learner still to come: a simulator's first rows may have made one already
            self._spares = [spawn_child() for _ in range(self._expected - len(self.procs))]
            self._expected = None
        # With learner processes, the rate limiter holds the bridge's puts (hold_while), and what
        # is queued goes to the learners at once: the acting weights trail the simulators by at
        # most max_updates_behind updates and a fragment, not by the queue's fragments too.
        held = self._held_back()
        if held:
            wait_any(list(self.procs.values()), 0.05)
        batch = self.runtime.experience.get(timeout=0 if held else 0.01 if self.procs else 0.05)
        if batch is not None:
            self.ingest(batch)
        self._train_due()
        if self.procs and not self._held_back():
            self.runtime.experience.progress()
        if len(self.runtime.policies) != known:
            # A policy created by a simulator's handshake: checkpointed at once, so that a
            # resume knows its spaces and can replay the journal into it.
            self._checkpoint()
        self._maybe_report()
        steps = self.runtime.metrics.env_steps
        if steps >= next_ckpt:
            self._checkpoint()
        return steps

    def ingest(self, batch) -> None:
        if self.recorder is not None:   # the datasets see what the learners get, in the same order
            try:
                self.recorder.add(batch)
            except Exception as e:   # noqa: BLE001 - a full disk, a path the writer cannot use
                # The learners still get these rows; the run stops in order (checkpoint, learner
                # processes), where an exception here left the trainer unable to stop at all.
                self.recorder = None
                self.recording_failed = f"{type(e).__name__}: {e}"
                self._stop(f"the dataset could not be written ({self.recording_failed})")
        policies = self.runtime.policies
        for pid, b in batch.policy_batches.items():
            self.ingested[pid] += b.count
            p = policies.get(pid)
            if p is not None and trains(p):
                self.feed(pid, p, b)
            self._taken[pid] += b.count   # after feed: the rows are in the learner's count by now

    def feed(self, pid: str, p, b) -> None:
        """Rows into a trainable policy's learner (its process, with learner_process), uncounted:
        ingest counts the bridge's rows; a warm start's (trainer/data/warm_start.py) come this way too."""
        proc = self.procs.get(pid)
        if proc is None and self.run_cfg.learner_process and isinstance(p, Learner):
            spare = self._spares.pop() if self._spares else None
            proc = self.procs[pid] = LearnerProcess(pid, p, self.run_cfg.torch_threads, spare)
        if proc is not None:
            proc.add(b)
        else:
            p.add(b)

    def _held_back(self) -> bool:
        """The rate limiter: no more experience while a learner process is too far behind,
        counting the rows queued for it too. Called from RPC threads as well. Without the queued
        rows, a loop slow to take them (a loaded machine) let every put through until the queue
        was full: the bound was the tolerance plus the queue's fragments, not plus one."""
        limit = self.run_cfg.max_updates_behind
        admitted = self.runtime.experience.rows_admitted
        for pid, p in list(self.procs.items()):
            # _taken before rows_admitted and behind(): a batch taken meanwhile counts twice, never not at all.
            taken = self._taken[pid]
            if p.behind(admitted[pid] - taken) > limit:
                return True
        return False

    def _train_due(self) -> None:
        """Runs every due update (in chunks, staying responsive to signals and the clock); with
        learner processes, takes the weights they sent instead."""
        if self.procs:
            if any([proc.poll() for proc in self.procs.values()]) and self.journal is not None:
                self.journal.updates({pid: proc.learner.updates for pid, proc in self.procs.items()})
            return
        while not self.stop_event.is_set():
            busy = False
            for _, p in list(self.runtime.policies.items()):
                if trains(p) and p.updates_due() > 0:
                    p.train(max_updates=TRAIN_CHUNK)
                    busy = True
            if not busy:
                return
            if self.journal is not None:
                self.journal.updates({pid: p.updates for pid, p in list(self.runtime.policies.items())
                                      if trains(p)})
            self._maybe_report()

    def _maybe_report(self) -> None:
        now = time.monotonic()
        if now >= self._next_report:
            self._report()
            self._next_report = now + self.run_cfg.print_every_s

    def drain_while(self, stop_server: Callable[[], None]) -> None:
        """Keep taking experience while `stop_server` runs, so no RPC thread stays blocked on the
        queue; then take what is left, with the transitions of episodes still open (their
        sessions are gone with the server)."""
        self.runtime.experience.hold_while(None)   # the learners take what is left, however far behind
        done = threading.Event()

        def drain():
            while not done.is_set():
                b = self.runtime.experience.get(timeout=0.05)
                if b is not None:
                    self.ingest(b)
        t = threading.Thread(target=drain, name="trainer-drain", daemon=True)
        t.start()
        stop_server()
        done.set()
        t.join()
        for b in self.runtime.experience.get_all():
            self.ingest(b)
        self.runtime.flush()
        for b in self.runtime.experience.get_all():
            self.ingest(b)

    def kill(self) -> None:
        """Ends the learner processes at once, without their state (a second Ctrl-C). They ignore
        SIGINT and SIGTERM, so that the trainer can ask them for their state at a stop; left
        running, they would hold the trainer's exit for good (multiprocessing joins its children)."""
        for proc in self.procs.values():
            proc.kill()
        self._end_spares()

    def close(self) -> None:
        """Ends the learner processes (after the final checkpoint)."""
        for proc in self.procs.values():
            proc.close()
        self._end_spares()

    def _end_spares(self) -> None:
        for proc, conn in self._spares:
            # Never used, so nothing to keep: killed at once. Closing the pipe alone ended one only
            # once its imports were done, and a trainer stopped seconds after its start waited for
            # torch to finish loading in a child it would never use (4 s of an 8 s start and stop).
            conn.close()
            proc.kill()
            proc.join(10)
