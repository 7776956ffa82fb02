"""n-step returns at ingestion time, per (episode, agent) trajectory.

Transitions of one trajectory arrive in order (across MultiAgentBatches, as
fragments are cut anywhere). Transition t leaves as soon as its n-step target
is known: reward = sum_k gamma^k r_{t+k}, new_obs = new_obs_{t+m-1} and
discount = gamma^m (0 when the trajectory terminated within those m steps), so
a learner's target is reward + discount * V(new_obs). Truncation ends a
trajectory without zeroing the discount: learners bootstrap from its last
observation. With n = 1 this is the identity plus a discount column.

With n > 1 the order matters, so it is checked: a row whose `t` does not come after the last one
seen for its trajectory (the bridge handing batches over out of order, as it once did under the
rate limiter's hold) is counted in `out_of_order` and logged once. Nothing is dropped: the check
only watches.
"""
import collections
import logging
from typing import Dict, List, Tuple

import numpy as np

from simbridge.server.sample_batch import SampleBatch
from simbridge.wire import tree
from simbridge.wire.columns import ACTIONS, AGENT_INDEX, EPS_ID, NEW_OBS, OBS, REWARDS, T, TERMINATEDS, TRUNCATEDS

log = logging.getLogger("simbridge.trainer")

#: The replay's column of bootstrap factors: gamma^m, 0 once the trajectory terminated.
DISCOUNTS = "discounts"


def check(n: int) -> None:
    """A ValueError unless `n` is an `n_step` value (>= 1)."""
    if n < 1:
        raise ValueError("n_step must be >= 1")


class NStepAccumulator:
    def __init__(self, n: int, gamma: float, max_open: int = 100_000):
        check(n)
        self.n, self.gamma = n, gamma
        self.max_open = max_open  # trajectories whose end never came (lost clients) are evicted
        self._open: "collections.OrderedDict[Tuple[int, int], list]" = collections.OrderedDict()
        # the last t seen per trajectory, open or ended (bounded as _open is)
        self._last_t: "collections.OrderedDict[Tuple[int, int], int]" = collections.OrderedDict()
        self.out_of_order = 0

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
        if T in batch:
            self._check_order(keys, batch[T].tolist())
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

    def _check_order(self, keys: list, ts: list) -> None:
        for key, t in zip(keys, ts):
            last = self._last_t.pop(key, None)
            if last is not None and t <= last:
                self.out_of_order += 1
                if self.out_of_order == 1:
                    log.warning("n-step returns: a row of trajectory (eps_id %d, agent %d) came with t %d after "
                                "t %d: rows out of order make wrong targets (a bug in the hand-over; "
                                "counted from now on)", key[0], key[1], t, last)
            self._last_t[key] = t if last is None else max(t, last)
        while len(self._last_t) > self.max_open:
            self._last_t.popitem(last=False)

    def _target(self, traj: list) -> tuple:
        ret, g = 0.0, 1.0
        for (_, _, r, _, _) in traj:
            ret += g * r
            g *= self.gamma
        last = traj[-1]
        terminated = last[4]
        return traj[0][0], traj[0][1], ret, last[3], terminated, 0.0 if terminated else g
