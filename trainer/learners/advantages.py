"""Advantages and value targets for on-policy learners (PPO), on the bridge's rows.

The semantics are those of RLlib's `compute_advantages(rollout, last_r, gamma, lambda_, use_gae)`
(the seeds' postprocessing), applied to every *segment* of a batch: the rows of one agent of one
episode (eps_id, agent_index), ordered by t, up to an episode end, a fragment end or a gap in t
(rows dropped in between). A segment is one RLlib rollout, with

    last_r = 0                       when its last row terminated,
    last_r = V(new_obs of that row)  otherwise: truncated (a time limit), cut by a fragment's end
                                     (batch_mode truncate_episodes) or by a gap.

use_gae:   delta_t = r_t + gamma * V(s_t+1) - V(s_t),  advantage_t = sum_k (gamma * lambda)^k delta_t+k,
           value_target_t = advantage_t + V(s_t)
otherwise: value_target_t = r_t + gamma * r_t+1 + ... + gamma^m * last_r (discounted return),
           advantage_t = value_target_t - V(s_t)

Within a segment V(s_t+1) is V(new_obs_t), which is the next row's V(obs): the caller evaluates the
value function on every row's obs and new_obs, in one pass each.
"""
from typing import Tuple

import numpy as np


def segments(eps_id: np.ndarray, agent_index: np.ndarray, t: np.ndarray,
             episode_ends: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(order, ends): `order` sorts rows by (eps_id, agent_index, t), whatever their interleaving
    in the batch; ends[i] is True where the i-th row in that order is the last of its segment (the
    next row belongs to another agent or episode, is not at t + 1, or the episode ended here)."""
    eps_id, agent_index, t = np.asarray(eps_id), np.asarray(agent_index), np.asarray(t)
    order = np.lexsort((t, agent_index, eps_id))
    e, a, tt = eps_id[order], agent_index[order], t[order]
    ends = np.ones(len(order), bool)
    ends[:-1] = (e[1:] != e[:-1]) | (a[1:] != a[:-1]) | (tt[1:] != tt[:-1] + 1)
    return order, ends | np.asarray(episode_ends, bool)[order]


def compute_advantages(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray,
                       terminateds: np.ndarray, ends: np.ndarray, gamma: float, lambda_: float = 1.0,
                       use_gae: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """(advantages, value_targets), float32, for rows already in segment order (see `segments`).

    values: V(obs) per row; next_values: V(new_obs) per row (read at segment ends only when the
    row did not terminate, and as V(s_t+1) inside segments)."""
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    bootstrap = np.where(np.asarray(terminateds, bool), 0.0, np.asarray(next_values, np.float64))
    ends = np.asarray(ends, bool)
    n = len(rewards)
    out = np.empty(n, np.float64)
    if use_gae:
        delta = rewards + gamma * bootstrap - values
        decay = gamma * lambda_
        acc = 0.0
        for i in range(n - 1, -1, -1):
            acc = delta[i] if ends[i] else delta[i] + decay * acc
            out[i] = acc
        return out.astype(np.float32), (out + values).astype(np.float32)
    acc = 0.0
    for i in range(n - 1, -1, -1):
        acc = rewards[i] + gamma * (bootstrap[i] if ends[i] else acc)
        out[i] = acc
    return (out - values).astype(np.float32), out.astype(np.float32)
