"""UploadExperience: decoding a chunk and checking it on its own (uploads.py checks it
against the session and applies it).

Everything here needs no session state and raises INVALID_ARGUMENT naming the
first problem.
"""
import math
from typing import Optional

import numpy as np

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors, tree
from simbridge.wire import checks
from simbridge.wire.checks import flags
from simbridge.wire.errors import Reason, invalid_argument, invalid_value
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.columns import (ACTION_LOGP, ACTIONS, AGENT_INDEX, EPS_ID, NEW_OBS, OBS, POLICY_VERSION, REWARDS,
                                    T, TERMINATEDS, TRUNCATEDS)


class Chunk:
    """A decoded, self-consistent upload (not yet checked against the session)."""
    __slots__ = ("n", "ids", "ep_index", "t", "obs", "actions", "rewards", "new_obs", "terminated",
                 "truncated", "versions", "logp", "summaries", "first_rows", "used")


def decode(config, session, req) -> Chunk:
    """Everything that needs no session state; raises INVALID_ARGUMENT naming the first problem."""
    limit = config.max_rows_per_request
    spec = session.default
    c = Chunk()
    # rewards give N; a chunk with no transitions (only finished episodes) may leave it out
    shape = tuple(req.rewards.shape) if req.HasField("rewards") else (0,)
    if len(shape) != 1:
        raise invalid_value(f"rewards: shape {shape}, expected (N,): one per transition")
    n = c.n = shape[0]
    if n > limit:
        raise invalid_argument(f"UploadExperience: {n} transitions exceed the server limit of {limit} per "
                               f"request; send smaller chunks", Reason.MESSAGE_TOO_LARGE)
    c.rewards = (checks.rewards(req.rewards, n, "rewards", "one per transition", "rewards row {}")
                 if req.HasField("rewards") else np.zeros(0, np.float32))
    c.ids = list(req.episode_ids)
    if len(c.ids) > limit:
        raise invalid_argument(f"UploadExperience: {len(c.ids)} episode ids exceed the limit of {limit}", Reason.MESSAGE_TOO_LARGE)
    checks.ids(c.ids, config.max_id_bytes, "episode id")
    if len(set(c.ids)) != len(c.ids):
        raise invalid_argument("episode_ids repeat: list each episode of the chunk once")
    if "" in c.ids:
        raise invalid_argument(f"episode_ids[{c.ids.index('')}] is empty")
    if n and not c.ids:
        raise invalid_argument(f"UploadExperience: {n} transitions but no episode_ids")
    c.ep_index = _required(req, "episode_index", n, "iu").astype(np.int64)
    if n and (c.ep_index.min() < 0 or c.ep_index.max() >= len(c.ids)):
        bad = int(((c.ep_index < 0) | (c.ep_index >= len(c.ids))).argmax())
        raise invalid_argument(f"episode_index row {bad}: {c.ep_index[bad]} is not an index into the "
                               f"{len(c.ids)} episode_ids")
    c.t = _required(req, "t", n, "iu").astype(np.int64)
    if n and c.t.min() < 0:
        bad = int((c.t < 0).argmax())
        raise invalid_argument(f"t row {bad}: {c.t[bad]} is negative")
    c.obs = _value(req, "observations", spec.obs_space, n)
    c.new_obs = _value(req, "next_observations", spec.obs_space, n)
    c.actions = _value(req, "actions", spec.act_space, n)
    if n:
        sb_spaces.check_contains(spec.act_space, c.actions, n, "actions")
    c.terminated = _flags(req, "terminated", n)
    c.truncated = _flags(req, "truncated", n)
    both = c.terminated & c.truncated
    if both.any():
        raise invalid_argument(f"row {int(both.argmax())} is both terminated and truncated: a terminal "
                               f"state is terminated, a cut-short episode truncated")
    c.versions = _required(req, "policy_versions", n, "iu").astype(np.int64)
    if n and c.versions.min() < -1:
        bad = int((c.versions < -1).argmax())
        raise invalid_argument(f"policy_versions row {bad}: {c.versions[bad]}; versions are >= 0, or -1 for "
                               f"an action the simulator chose itself")
    if req.HasField("action_logp"):
        logp = _array(req.action_logp, "action_logp", "f", n)
        if logp.dtype != np.float32:
            raise invalid_value(f"action_logp: dtype {logp.dtype}, expected a float32 tensor (FLOAT32)")
        if np.isinf(logp).any():
            bad = int(np.isinf(logp).argmax())
            raise invalid_argument(f"action_logp row {bad}: {logp[bad]}; give a finite log-probability, "
                                   f"or NaN when unknown")
        c.logp = logp
    else:
        c.logp = np.full(n, np.nan, np.float32)
    _check_time_order(c)
    c.summaries = list(req.finished_episodes)
    checks.ids([x.episode_id for x in c.summaries], config.max_id_bytes, "finished episode id")
    seen = set()
    for i, s in enumerate(c.summaries):
        what = f"finished_episodes[{i}]"
        if not s.episode_id:
            raise invalid_argument(f"{what}: empty episode_id")
        if s.episode_id in seen:
            raise invalid_argument(f"{what}: episode {s.episode_id!r} is listed twice")
        seen.add(s.episode_id)
        if not math.isfinite(s.total_reward):
            raise invalid_argument(f"{what}: total_reward {s.total_reward} is not a finite number")
        if s.length < 0:
            raise invalid_argument(f"{what}: negative length {s.length}")
    if len(c.summaries) > limit:
        raise invalid_argument(f"UploadExperience: {len(c.summaries)} finished episodes exceed the limit of {limit}", Reason.MESSAGE_TOO_LARGE)
    return c


def _array(t: pb.Tensor, what: str, kinds: str, n: Optional[int]) -> np.ndarray:
    arr = tensors.from_tensor(t)
    if arr.dtype.kind not in kinds:
        expected = {"f": "a float dtype (float32)", "iu": "an integer dtype", "b": "bool"}[kinds]
        raise invalid_argument(f"{what}: dtype {arr.dtype}, expected {expected}")
    if arr.ndim != 1 or (n is not None and len(arr) != n):
        raise invalid_argument(f"{what}: shape {arr.shape}, expected ({'N' if n is None else n},) "
                               f"(one per transition)")
    return arr


def _required(req, field: str, n: int, kinds: str) -> np.ndarray:
    if not req.HasField(field):
        if n == 0:
            return np.zeros(0, np.int64)
        raise invalid_argument(f"UploadExperience: no {field} tensor ({n} transitions need one each)")
    return _array(getattr(req, field), field, kinds, n)


def _value(req, field: str, space, n: int):
    if not req.HasField(field):
        if n == 0:
            return None
        raise invalid_argument(f"UploadExperience: no {field} ({n} transitions need one each)")
    return sb_spaces.decode_value(space, getattr(req, field), n, field)


def _check_time_order(c: Chunk) -> None:
    """Each episode's rows in time order (t increasing); a terminal row is its episode's last."""
    n = c.n
    order = np.argsort(c.ep_index, kind="stable")
    e = c.ep_index[order]
    same = e[1:] == e[:-1]
    t = c.t[order]
    back = same & (t[1:] <= t[:-1])
    if back.any():
        j = int(back.argmax())
        raise invalid_argument(f"row {order[j + 1]}: t {t[j + 1]} of episode {c.ids[e[j]]!r} does not come "
                               f"after t {t[j]} of row {order[j]}: each episode's rows must be in time order")
    done = (c.terminated | c.truncated)[order]
    after_end = same & done[:-1]
    if after_end.any():
        j = int(after_end.argmax())
        raise invalid_argument(f"row {order[j + 1]} of episode {c.ids[e[j]]!r} follows its terminal row "
                               f"{order[j]}")
    first = np.ones(n, bool)
    first[1:] = ~same
    c.first_rows = order[first].tolist()  # the first row of each episode present ...
    c.used = e[first].tolist()            # ... and its index into c.ids


def columns(c: Chunk, eps_ids: dict) -> dict:
    """The row path's columns (transitions.py), as owned arrays."""
    by_index = np.full(len(c.ids), -1, np.int64)
    for k, eps in eps_ids.items():
        by_index[k] = eps
    own = lambda v: tree.map_structure(np.array, v)  # noqa: E731 - the request's buffers are read-only views
    return {OBS: own(c.obs), NEW_OBS: own(c.new_obs), ACTIONS: own(c.actions), REWARDS: c.rewards,
            TERMINATEDS: c.terminated, TRUNCATEDS: c.truncated, EPS_ID: by_index[c.ep_index],
            AGENT_INDEX: np.zeros(c.n, np.int64), T: c.t, POLICY_VERSION: c.versions,
            ACTION_LOGP: c.logp}


def _flags(req, field: str, n: int) -> np.ndarray:
    t = getattr(req, field) if req.HasField(field) else None
    return np.array(flags(t, n, field, "one per transition"))   # owned: it goes into the batch
