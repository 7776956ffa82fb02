"""What the call handlers share: the runtime's plumbing, handed to each room explicitly.

Rows (rows.py), batched slots (slots.py) and uploads (uploads.py) receive one
ServerContext instead of reaching into the runtime: the configuration, the
lock, the policies and the mapping, the collector and the experience queue,
the metrics and the episode-end hooks, the server-wide episode numbers, and
settle() for answered calls.

Locking: `lock` guards sessions, episodes and the collector; policy forward
passes run outside it (batched across callers by DynamicBatcher), policies are
created outside it (PolicyRegistry.ensure), and handing finished batches to
the ExperienceQueue (which may block) happens outside it.

Hand-over order: a batch the collector completes is queued for the learner in the order it was
completed (under `lock`), whichever call's thread puts it. An episode's rows span consecutive
batches, and the consumers that read a trajectory across batches (n-step returns, a recorded
dataset) need its rows in order; two threads putting their own batches after leaving the lock
could swap them, most of all while the queue holds intake back.
"""
import collections
import threading
from typing import Callable, List

from simbridge.server.episodes import Episode, EpisodeSummary
from simbridge.server.experience import ExperienceCollector, ExperienceQueue
from simbridge.server.metrics import Metrics
from simbridge.server.policies import PolicyRegistry

PolicyMappingFn = Callable[[str, Episode], str]


class ServerContext:
    def __init__(self, config, policies: PolicyRegistry, policy_mapping_fn: PolicyMappingFn,
                 experience: ExperienceQueue, episode_end_callbacks: List[Callable[[dict], None]]):
        self.config = config
        self.lock = threading.RLock()
        self.policies = policies
        self.policy_mapping_fn = policy_mapping_fn
        self.collector = ExperienceCollector(config.rollout_fragment_length, config.batch_mode,
                                             config.count_steps_by)
        self.experience = experience
        self.metrics = Metrics()
        self.episode_end_callbacks = episode_end_callbacks
        self._next_eps = 1
        self._eps_lock = threading.Lock()   # its own: slot banks number episodes without `lock`
        self.journal = None
        # Batches completed (under `lock`, in that order) and not yet in the queue; put in order
        # by whichever thread holds `_handing_over`.
        self._completed: "collections.deque" = collections.deque()
        self._handing_over = threading.Lock()
        # Batches completed by a settle that are still on their way into the queue.
        self._settling = 0
        self._settled = threading.Condition()

    def next_eps_id(self) -> int:
        """A server-wide unique episode number (the eps_id column). Thread-safe."""
        with self._eps_lock:
            n = self._next_eps
            self._next_eps = n + 1
            return n

    def next_episode_number(self) -> int:
        """The number next_eps_id() gives next (a checkpoint keeps it). It only looks: taking the
        number and putting it back raced with a caller outside `lock`, which then shared an eps_id."""
        with self._eps_lock:
            return self._next_eps

    def start_episode_numbers(self, n: int) -> None:
        """Before serving: episode numbers continue from n (a resumed run's)."""
        with self._eps_lock:
            self._next_eps = max(1, n)

    def set_journal(self, journal) -> None:
        """Before serving. journal: add_rows(policy, columns, n), add_row(policy, row),
        add_batch(batch) and commit(metrics) (see trainer/run/journal.py). The arrays handed to
        it are not changed afterwards: it keeps views of them (an agent's last new_obs, to which
        its next obs is compared) beyond the call."""
        self.journal = self.collector.journal = self.experience.journal = journal

    def committed(self) -> None:
        """Lock held. The current call is applied: a journal records it before it is answered."""
        if self.journal is not None:
            self.journal.commit(self.metrics)

    def file_summaries(self, summaries) -> None:
        """Lock held. Ended episodes into the metrics and to the episode-end hooks."""
        self.metrics.file_summaries(summaries, self.episode_end_callbacks)

    def file_summary(self, summary: EpisodeSummary) -> None:
        self.file_summaries((summary,))

    def ready(self, flush: bool = False):
        """Lock held. The collector's completed batch (every row it holds with `flush`), or None;
        a batch is in line for the queue from now on, and the caller must `deliver` it."""
        batch = self.collector.flush() if flush else self.collector.ready()
        if batch is not None:
            self._completed.append(batch)
        return batch

    def deliver(self, batch) -> None:
        """Lock NOT held: the queue may block (backpressure, never a drop). Returns once `batch`
        (from `ready`) and every batch completed before it are in the queue."""
        if self.journal is not None:   # the call that delivers is applied: on record first
            with self.lock:
                self.committed()
        if batch is None:
            return
        with self._handing_over:   # one thread puts at a time, in completion order
            while self._completed:
                self.experience.put(self._completed.popleft())

    # A streamed GetAction or Step is answered as soon as it is validated and acted on; the
    # bookkeeping (transitions, rewards, ended episodes, the hand-over to the learner) is left in
    # session.pending and applied by the stream right after the answer is sent, while the
    # simulator steps. Anything that reads the session settles it first: the session's next
    # call, close, flush, snapshot.
    def settle(self, session) -> None:
        """Apply the session's pending bookkeeping, if any, and deliver what it completes."""
        # Always under the lock, even to find nothing pending: another thread may be applying
        # this very commit, and the caller must see it finished.
        with self.lock:
            if not session.settle():
                return
            self.committed()
            batch = self.ready()
            if batch is None:
                return
            self._settling += 1
        try:
            self.deliver(batch)
        finally:
            with self._settled:
                self._settling -= 1
                self._settled.notify_all()

    def wait_settled(self, timeout: float) -> None:
        """Until every batch a settle completed is in the queue, whichever thread settles it."""
        with self._settled:
            self._settled.wait_for(lambda: self._settling == 0, timeout)
