"""n-step returns at ingestion time, per (episode, agent) trajectory.

Transitions of one trajectory arrive in order (across MultiAgentBatches, as
fragments are cut anywhere). Transition t leaves as soon as its n-step target
is known: reward = sum_k gamma^k r_{t+k}, new_obs = new_obs_{t+m-1} and
discount = gamma^m (0 when the trajectory terminated within those m steps), so
a learner's target is reward + discount * V(new_obs). Truncation ends a
trajectory without zeroing the discount: learners bootstrap from its last
observation. With n = 1 this is the identity plus a discount column.
"""
import collections
from typing import Dict, List, Tuple

import numpy as np

from simbridge.server.sample_batch import SampleBatch
from simbridge.wire import tree
from simbridge.wire.columns import ACTIONS, AGENT_INDEX, EPS_ID, NEW_OBS, OBS, REWARDS, TERMINATEDS, TRUNCATEDS

#: The replay's column of bootstrap factors: gamma^m, 0 once the trajectory terminated.
DISCOUNTS = "discounts"


class NStepAccumulator:
    def __init__(self, n: int, gamma: float, max_open: int = 100_000):
        if n < 1:
            raise ValueError("n_step must be >= 1")
        self.n, self.gamma = n, gamma
        self.max_open = max_open  # trajectories whose end never came (lost clients) are evicted
        self._open: "collections.OrderedDict[Tuple[int, int], list]" = collections.OrderedDict()

    def add(self, batch: SampleBatch) -> Dict[str, np.ndarray]:
        """Rows of `batch` in -> finished n-step transitions out (columns: obs, actions,
        rewards, new_obs, discounts, terminateds)."""
        obs, act, rew, nobs = batch[OBS], batch[ACTIONS], batch[REWARDS], batch[NEW_OBS]
        term, trunc = batch[TERMINATEDS], batch[TRUNCATEDS]
        if self.n == 1:  # vectorised fast path
            return {OBS: obs, ACTIONS: act, REWARDS: rew.astype(np.float32),
                    NEW_OBS: nobs, TERMINATEDS: term.astype(bool),
                    DISCOUNTS: np.where(term, 0.0, self.gamma).astype(np.float32)}
        out: List[tuple] = []
        keys = list(zip(batch[EPS_ID].tolist(), batch[AGENT_INDEX].tolist()))
        for i, key in enumerate(keys):
            traj = self._open.pop(key, None) or []
            traj.append((tree.take(obs, i), tree.take(act, i), float(rew[i]), tree.take(nobs, i), bool(term[i])))
            if term[i] or trunc[i]:
                while traj:
                    out.append(self._target(traj))
                    traj.pop(0)
            else:
                if len(traj) == self.n:
                    out.append(self._target(traj))
                    traj.pop(0)
                self._open[key] = traj
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)
        if not out:
            return {}
        o, a, r, no, t, d = zip(*out)
        return {OBS: tree.stack(o), ACTIONS: tree.stack(a), REWARDS: np.asarray(r, np.float32),
                NEW_OBS: tree.stack(no), TERMINATEDS: np.asarray(t, bool),
                DISCOUNTS: np.asarray(d, np.float32)}

    def _target(self, traj: list) -> tuple:
        ret, g = 0.0, 1.0
        for (_, _, r, _, _) in traj:
            ret += g * r
            g *= self.gamma
        last = traj[-1]
        terminated = last[4]
        return traj[0][0], traj[0][1], ret, last[3], terminated, 0.0 if terminated else g
