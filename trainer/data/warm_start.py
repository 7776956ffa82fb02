"""Warm start: a Minari dataset's transitions into a learner's replay before it serves.

`[dataset] warm_start = { POLICY = "path or dataset id" }` or `simbridge-trainer run
--warm-start POLICY=PATH`: as RLlib's offline input (the seeds' `log_action` pattern), the
recorded transitions are learned from like the simulators' own. They go through the learner's
`add` (its n-step accumulator, per episode) as if they had just arrived, so they count as its
agent steps: `learning_starts` and the exploration schedule see them, and the replay ratio
makes (transitions - learning_starts) x updates_per_step updates due at once. The learning
loop pays those before it takes the simulators' experience (its rate limiter holds intake),
so the policy the simulators meet first has already learned from the dataset; with no
simulator connected at all the run is purely offline learning.

Off-policy learners only (DQN, SAC, import paths with a replay buffer): PPO learns from its own
recent actions and is refused. The dataset's spaces must equal the policy's (declared in the
config, or the dataset's own when the config declares none). A fresh run only: a resumed one
already counted the dataset in its checkpoint.
"""
import logging
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import numpy as np

from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.config.dataset import EXTRA_HINT, DatasetConfigError
from simbridge.trainer.data.datasets import require_minari
from simbridge.wire import tree
from simbridge.wire.columns import (ACTIONS, AGENT_INDEX, EPS_ID, NEW_OBS, OBS, REWARDS, T, TERMINATEDS,
                                    TRUNCATEDS)

log = logging.getLogger("simbridge.trainer")

ROWS_PER_BATCH = 4096     # transitions handed to the learner at a time


def open_dataset(source: str, what: str):
    """A MinariDataset from a directory (the dataset's, or its data/ folder) or a dataset id
    (under MINARI_DATASETS_PATH, never downloaded)."""
    minari = require_minari()
    from minari.dataset.minari_dataset import MinariDataset

    path = Path(source)
    for data in (path, path / "data"):
        if (data / "metadata.json").is_file():
            try:
                return MinariDataset(data)
            except Exception as e:   # a damaged or foreign file: say which, not a traceback
                raise DatasetConfigError(f"{what}: cannot read the Minari dataset at {data}: {e}") from None
    try:
        return minari.load_dataset(source)
    except (FileNotFoundError, ValueError) as e:
        # Minari's words end "Use download=True to download the dataset.": nothing is downloaded here
        why = ". ".join(s for s in str(e).split(". ") if "download" not in s).rstrip(".")
        raise DatasetConfigError(f"{what}: no Minari dataset at {source!r} ({why}); give the dataset's directory "
                                 f"(e.g. runs/a/datasets/simbridge/default_policy-v0) or an id under "
                                 f"MINARI_DATASETS_PATH") from None


def check_learner(policy, pid: str, what: str) -> None:
    """Refuses policies that cannot learn from a dataset, naming why."""
    from simbridge.trainer.learners.base import trains
    from simbridge.trainer.learners.ppo import PPOLearner

    if isinstance(policy, PPOLearner):
        raise DatasetConfigError(f"{what}: policy {pid!r} is PPO, which learns on-policy from its own recent "
                                 f"actions: a dataset cannot warm-start it; use dqn or sac, or remove the warm start")
    if not trains(policy) or getattr(policy, "replay", None) is None:
        raise DatasetConfigError(f"{what}: policy {pid!r} ({type(policy).__name__}) does not learn from a replay "
                                 f"buffer here (random, frozen by policies_to_train, or no replay): warm-start a "
                                 f"trained dqn or sac policy")


def check_spaces(dataset, policy, pid: str, what: str) -> None:
    if (dataset.observation_space, dataset.action_space) != (policy.observation_space, policy.action_space):
        raise DatasetConfigError(
            f"{what}: the dataset's spaces (observation {dataset.observation_space}, action {dataset.action_space}) "
            f"differ from policy {pid!r}'s (observation {policy.observation_space}, action {policy.action_space}): "
            f"warm-start from a dataset recorded with the same spaces")


def share(dataset, rank: int = 0, world: int = 1) -> List[int]:
    """The episodes (indices in the dataset's order) rank `rank` of `world` learns from: every
    world-th from the rank's own, so the group's shards hold the whole dataset once."""
    return [int(i) for i in dataset.episode_indices[rank::world]]


def batches(dataset, episodes: Optional[List[int]] = None) -> Iterator[SampleBatch]:
    """The dataset's transitions (of `episodes`, default all) as SampleBatches of whole episodes
    (each its own eps_id, negative so that none is ever a live episode's)."""
    chunk, rows = [], 0
    indices = share(dataset) if episodes is None else episodes
    for i, ep in zip(indices, dataset.iterate_episodes(indices)):
        n = len(ep.rewards)
        if n == 0:
            continue
        term = np.asarray(ep.terminations, bool).copy()
        trunc = np.asarray(ep.truncations, bool).copy()
        if not (term[-1] or trunc[-1]):
            trunc[-1] = True   # an episode cut short ends the n-step trajectory: bootstrapped
        obs = ep.observations
        chunk.append({OBS: tree.take(obs, slice(0, n)), NEW_OBS: tree.take(obs, slice(1, n + 1)),
                      ACTIONS: np.asarray(ep.actions) if not isinstance(ep.actions, (dict, tuple)) else ep.actions,
                      REWARDS: np.asarray(ep.rewards, np.float32), TERMINATEDS: term, TRUNCATEDS: trunc,
                      EPS_ID: np.full(n, -1 - i, np.int64), AGENT_INDEX: np.zeros(n, np.int64),
                      T: np.arange(n, dtype=np.int64)})
        rows += n
        if rows >= ROWS_PER_BATCH:
            yield _batch(chunk)
            chunk, rows = [], 0
    if chunk:
        yield _batch(chunk)


def _batch(chunk: list) -> SampleBatch:
    return SampleBatch({k: tree.concat([c[k] for c in chunk], fresh=True) for k in chunk[0]})


def load(source: str, pid: str) -> Tuple[object, str]:
    what = f"[dataset] warm_start {pid} = {source!r}"
    return open_dataset(source, what), what


__all__ = ["open_dataset", "check_learner", "check_spaces", "share", "batches", "load", "EXTRA_HINT"]
