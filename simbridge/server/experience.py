"""Experience assembly: transitions -> per-policy SampleBatches -> MultiAgentBatch.

Transitions arrive one agent row at a time from the runtime (which holds its
lock while calling in: this class is not thread-safe by itself). They are cut
into fragments of `rollout_fragment_length` steps, counted in env steps or
agent steps, either anywhere (`truncate_episodes`) or only at episode ends
(`complete_episodes`), and handed to an ExperienceQueue.
"""
import collections
import math
import queue
import threading
import time
from typing import Callable, Dict, List, Optional

from simbridge.server.batch_builder import SampleBatchBuilder
from simbridge.server.sample_batch import MultiAgentBatch

BATCH_MODES = ("truncate_episodes", "complete_episodes")
COUNT_STEPS_BY = ("env_steps", "agent_steps")


class ExperienceCollector:
    def __init__(self, rollout_fragment_length: int = 200, batch_mode: str = "truncate_episodes",
                 count_steps_by: str = "env_steps"):
        if batch_mode not in BATCH_MODES:
            raise ValueError(f"batch_mode must be one of {BATCH_MODES}, got {batch_mode!r}")
        if count_steps_by not in COUNT_STEPS_BY:
            raise ValueError(f"count_steps_by must be one of {COUNT_STEPS_BY}, got {count_steps_by!r}")
        if rollout_fragment_length < 1:
            raise ValueError("rollout_fragment_length must be >= 1")
        self.rollout_fragment_length = rollout_fragment_length
        self.complete_episodes = batch_mode == "complete_episodes"
        self.count_agent_steps = count_steps_by == "agent_steps"
        self._builders: Dict[str, SampleBatchBuilder] = {}
        self._env_steps = 0
        self._agent_steps = 0
        # A write-ahead log (the trainer's journal), told of every row as it enters: None: none.
        self.journal = None

    def add_transition(self, episode, policy_id: str, row: dict) -> None:
        if self.complete_episodes:
            episode.held_rows.append((policy_id, row))
        else:
            self._add(policy_id, row)

    def add_rows(self, policy_id: str, columns: dict) -> None:
        """A chunk of transitions (columns, rows first); truncate_episodes mode only."""
        b = self._builders.get(policy_id)
        if b is None:
            b = self._builders[policy_id] = SampleBatchBuilder()
        n = len(columns["rewards"])
        b.add_rows(columns, count=n)  # built consistently by the runtime: no re-validation
        self._agent_steps += n
        if self.journal is not None:
            self.journal.add_rows(policy_id, columns, n)

    def add_env_steps(self, n: int) -> None:
        """n env steps of rows given to add_rows (batched slots: one per slot and Step)."""
        self._env_steps += n

    def count_env_steps(self, episodes) -> None:
        """One env step for each of `episodes` (episodes with training disabled don't count)."""
        if self.complete_episodes:
            for ep in episodes:
                if ep.training_enabled:
                    ep.held_env_steps += 1
        else:
            self._env_steps += sum([ep.training_enabled for ep in episodes])

    def end_episode(self, episode) -> None:
        if self.complete_episodes:
            for policy_id, row in episode.held_rows:
                self._add(policy_id, row)
            self._env_steps += episode.held_env_steps
            episode.held_rows, episode.held_env_steps = [], 0

    def _add(self, policy_id: str, row: dict) -> None:
        b = self._builders.get(policy_id)
        if b is None:
            b = self._builders[policy_id] = SampleBatchBuilder()
        b.add_row(**row)
        self._agent_steps += 1
        if self.journal is not None:
            self.journal.add_row(policy_id, row)

    def ready(self) -> Optional[MultiAgentBatch]:
        """A MultiAgentBatch once a fragment's worth of steps was collected."""
        count = self._agent_steps if self.count_agent_steps else self._env_steps
        if count >= self.rollout_fragment_length:
            return self.flush()
        return None

    def flush(self) -> Optional[MultiAgentBatch]:
        """Everything collected so far (None when nothing is)."""
        if self._agent_steps == 0:
            self._env_steps = 0
            return None
        batches = {pid: b.build() for pid, b in self._builders.items() if b.count > 0}
        out = MultiAgentBatch(batches, self._env_steps)
        self._env_steps = self._agent_steps = 0
        return out


class ExperienceQueue:
    """Bounded FIFO between the bridge and its consumer (the learner).

    put() blocks while the queue is full: the simulator whose call completed a
    fragment waits, and so slows down, instead of experience being dropped. A consumer
    may also hold intake back by a rule of its own (`hold_while`, the trainer's rate
    limiter): put() then waits before queueing, so what the consumer has not learned from
    is bounded by its rule plus a fragment per waiting simulator, not by its rule plus the
    whole queue.
    """

    def __init__(self, maxsize: int = 64):
        self._q: "queue.Queue[MultiAgentBatch]" = queue.Queue(maxsize)
        self._lock = threading.Lock()
        self.batches_in = 0
        self.env_steps_in = 0
        self.agent_steps_in = 0
        # Each policy's rows let past the hold, counted before they enter the queue: a hold rule
        # counts what is queued but not yet taken (a consumer slow to take, on a loaded machine,
        # must not let more in than its rule allows).
        self.rows_admitted: Dict[str, int] = collections.Counter()
        self.blocked_puts = 0
        self.blocked_s = 0.0
        self._closed = False
        self._stranded: List[MultiAgentBatch] = []   # put after close() on a full queue
        self._hold: Optional[Callable[[], bool]] = None
        self._progress = threading.Condition()
        # offer()ed batches bypass the collector (uploads): a journal, if any, records them here.
        self.journal = None

    def hold_while(self, rule: Optional[Callable[[], bool]]) -> None:
        """put() and offer() wait while `rule()` is true (None: no rule). The consumer calls
        progress() whenever the rule may have turned false."""
        self._hold = rule
        self.progress()

    def progress(self) -> None:
        with self._progress:
            self._progress.notify_all()

    def _held(self, deadline: float = math.inf) -> bool:
        """Waits while the consumer holds intake back; True if it still does at `deadline`.
        The bounded waits cover a progress() between the rule's look and the wait."""
        rule = self._hold
        if rule is None or not rule():
            return False
        t0 = time.monotonic()
        with self._progress:
            while not self._closed and self._hold is not None and self._hold():
                left = deadline - time.monotonic()
                if left <= 0:
                    return True
                self._progress.wait(min(0.05, left))
        with self._lock:
            self.blocked_puts += 1
            self.blocked_s += time.monotonic() - t0
        return False

    def put(self, batch: MultiAgentBatch) -> None:
        self._held()
        self._admit(batch, +1)
        try:
            self._q.put_nowait(batch)
        except queue.Full:
            t0 = time.monotonic()
            while True:
                if self._closed:   # the server stopped: nobody may drain the queue any more
                    with self._lock:
                        self._stranded.append(batch)
                    break
                try:
                    self._q.put(batch, timeout=0.25)
                    break
                except queue.Full:
                    pass
            with self._lock:
                self.blocked_puts += 1
                self.blocked_s += time.monotonic() - t0
        self._count_in(batch)

    def close(self) -> None:
        """The server stopped: a put still blocked on a full queue keeps its batch aside (get and
        get_all return it) instead of waiting forever for a consumer that may never come."""
        self._closed = True
        self.progress()

    def reopen(self) -> None:
        self._closed = False

    def offer(self, batch: MultiAgentBatch, timeout: float) -> bool:
        """put() with a bounded wait: False (nothing queued) when still full after `timeout`.

        For callers that would rather tell their client to retry than hold it (uploads from
        clients acting locally keep the chunk and slow their simulator down)."""
        deadline = time.monotonic() + max(0.0, timeout)
        if self._held(deadline):
            return False
        self._admit(batch, +1)
        try:
            timeout = deadline - time.monotonic()
            if timeout > 0:
                self._q.put(batch, timeout=timeout)
            else:
                self._q.put_nowait(batch)
        except queue.Full:
            self._admit(batch, -1)
            return False
        if self.journal is not None:
            self.journal.add_batch(batch)
        self._count_in(batch)
        return True

    def _admit(self, batch: MultiAgentBatch, sign: int) -> None:
        with self._lock:
            for pid, b in batch.policy_batches.items():
                self.rows_admitted[pid] += sign * b.count

    def _count_in(self, batch: MultiAgentBatch) -> None:
        with self._lock:
            self.batches_in += 1
            self.env_steps_in += batch.env_steps()
            self.agent_steps_in += batch.agent_steps()

    def get(self, timeout: Optional[float] = None) -> Optional[MultiAgentBatch]:
        try:
            return self._q.get(timeout=timeout if not self._stranded else 0)
        except queue.Empty:
            with self._lock:
                return self._stranded.pop(0) if self._stranded else None

    def get_all(self) -> List[MultiAgentBatch]:
        out = []
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                with self._lock:
                    out.extend(self._stranded)
                    self._stranded.clear()
                return out

    def qsize(self) -> int:
        return self._q.qsize()

    @property
    def maxsize(self) -> int:
        return self._q.maxsize
