"""What the bridge counts: steps, episodes and their summaries, errors, uploads."""
import collections
import logging
from typing import Callable, Dict, Iterable, List

import numpy as np

from simbridge.server.episodes import EpisodeSummary

log = logging.getLogger("simbridge")

# End reasons of episodes cut short because their simulator (or the trainer: trainer_lost, ended
# at a resume) stopped or went away, not ended by the environment: truncated for the learners,
# but not returns of the policy (a CartPole policy that always scores 500 would read far less):
# counted apart, out of the mean returns.
CUT_REASONS = frozenset({"simulator_stopped", "session_closed", "client_lost", "step_timeout", "trainer_lost"})


def count_cut(summaries: Iterable[EpisodeSummary]) -> int:
    """How many of these ended episodes were cut short (CUT_REASONS)."""
    return sum(x["end_reason"] in CUT_REASONS for x in summaries)


class Metrics:
    def __init__(self):
        self.env_steps = 0
        self.agent_steps = 0
        self.episodes = 0
        self.episodes_cut = 0   # of `episodes`, those cut short (CUT_REASONS): out of the returns
        # Episodes that ended without a single step (no observation ever given): no return to
        # speak of, so they stay out of `episodes`, the returns and the episode-end hooks.
        self.empty_episodes = 0
        # Sessions closed because their simulator made no call for step_timeout_s.
        self.sessions_timed_out = 0
        self.recent = collections.deque(maxlen=100)   # episode summaries (training and the like)
        self.recent_eval = collections.deque(maxlen=100)   # evaluation episodes' summaries, apart
        self.errors = collections.Counter()           # status code name -> count
        self.refused = collections.Counter()          # ErrorReason name -> count
        self.refusal_said: Dict[str, str] = {}        # ErrorReason name -> its last message (one per reason)
        # UploadExperience (clients acting locally): accepted steps, and chunks refused because
        # the experience queue stayed full (the client keeps and resends them: no drop).
        self.uploaded_steps = 0
        self.upload_refused_chunks = 0
        self.upload_refused_steps = 0

    def note_error(self, err) -> None:
        """A call answered with a BridgeError: counted by status code and by reason."""
        self.errors[err.code.name] += 1
        if err.reason:
            self.refused[err.reason_name] += 1
            self.refusal_said[err.reason_name] = str(err.message)

    def policy_return_means(self, last: int = 100, evaluation: bool = False) -> Dict[str, float]:
        """Mean return of one agent's episode, per policy, over its last `last` agent-episodes
        (of the last 100 episodes), as RLlib's policy_reward_mean; evaluation: of the
        evaluation episodes (kept apart)."""
        sums: Dict[str, List[float]] = collections.defaultdict(list)
        for s in self.returns(evaluation):
            for aid, pid in s["agent_policies"].items():
                sums[pid].append(s["agent_rewards"][aid])
        return {pid: float(np.mean(v[-last:])) for pid, v in sums.items()}

    def policy_length_means(self, last: int = 100) -> Dict[str, float]:
        """Mean episode length (env steps) per policy, over the last `last` episodes it acted in."""
        lengths: Dict[str, List[int]] = collections.defaultdict(list)
        for s in self.returns():
            for pid in set(s["agent_policies"].values()):
                lengths[pid].append(s["length"])
        return {pid: float(np.mean(v[-last:])) for pid, v in lengths.items()}

    def file_recent(self, summaries: Iterable[EpisodeSummary]) -> None:
        """Into the recent episodes: training's, or the evaluation ones apart."""
        for s in summaries:
            (self.recent_eval if s.get("evaluation") else self.recent).append(s)

    def returns(self, evaluation: bool = False) -> List[EpisodeSummary]:
        """The recent episodes whose return is the policy's: not those cut short (CUT_REASONS)."""
        return [s for s in (self.recent_eval if evaluation else self.recent) if s["end_reason"] not in CUT_REASONS]

    def file_summaries(self, summaries: Iterable[EpisodeSummary],
                       callbacks: List[Callable[[dict], None]]) -> None:
        """Runtime lock held. Ended episodes into the counts and the recent returns, and to
        the episode-end hooks (every kind of episode: rows, batched slots, uploads); those
        without a step only into empty_episodes."""
        summaries = list(summaries)
        stepped = [x for x in summaries if x["length"] > 0]   # usually all of them
        self.empty_episodes += len(summaries) - len(stepped)
        summaries = stepped
        self.episodes += len(summaries)
        self.episodes_cut += count_cut(summaries)
        self.file_recent(summaries)
        for cb in callbacks:
            for summary in summaries:
                try:
                    cb(summary)
                except Exception:  # a faulty hook must not break the bridge
                    log.exception("episode_end callback failed")
