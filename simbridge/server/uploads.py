"""Serving clients that act locally: policy download and experience upload.

A local-inference client (simbridge.client.local_client) holds a copy of its policy
and acts without the server; it talks to the bridge with two unary calls:

GetPolicy: the session's policy in its portable form (Policy.portable()), or
  `unchanged` when the client already holds that version. The policy is the
  one the mapping gives the single agent id "agent0", bound once per session
  as a row session binds it on its agent's first appearance.

UploadExperience: a chunk of transitions. Everything is validated before
  anything changes (dtypes, shapes, NaN, actions in their space, lengths,
  episode indices, time order, policy versions, limits): a bad chunk gets
  INVALID_ARGUMENT or FAILED_PRECONDITION and has no effect. A good one becomes
  the same SampleBatch columns the row path produces, in one MultiAgentBatch
  for the runtime's experience queue, and its finished episodes feed the
  metrics (episodes, recent returns, episode_end_callbacks) as ended row
  episodes do. `terminated` / `truncated` may be left out (all false) and
  `action_logp` too (unknown, NaN). A chunk is its own fragment: it goes to
  the queue whole, without the collector (rollout_fragment_length and
  complete_episodes apply to the row path; a client wanting whole episodes
  per batch cuts its chunks at episode ends).

Backpressure: a chunk is offered to the experience queue for at most
BridgeConfig.upload_queue_wait_s. If the learner has not made room by then the
call fails with RESOURCE_EXHAUSTED, the refusal is counted in runtime.metrics,
and nothing of the chunk is applied: failed calls are not remembered by seq
(runtime.handle), so the client resends the same chunk, under the same seq
(before any later one) or a new one, and it is applied exactly once. Nothing
is dropped on the server.

Episodes of local clients live here, not in Session.episodes: per session, the
server-wide eps_id each episode id got, its last uploaded t (so a chunk sent
twice under different seqs is refused instead of counted twice) and whether
its terminal row came. Their ids join Session.finished when their summary
arrives.
"""
import logging
import math
import threading
import time
from typing import Dict, Optional

import numpy as np

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors, tree
from simbridge.server.episodes import SINGLE_AGENT_ID, Episode
from simbridge.wire.errors import Reason, failed_precondition, invalid_argument, resource_exhausted
from simbridge.server.sample_batch import MultiAgentBatch, SampleBatch
from simbridge.wire.v1 import simbridge_pb2 as pb

log = logging.getLogger("simbridge")

QUEUE_FULL = "experience queue full: the learner is behind; retry later"


class _LocalEpisode:
    __slots__ = ("eps_id", "last_t", "ended", "first_seen")

    def __init__(self, eps_id: int):
        self.eps_id = eps_id
        self.last_t = -1
        self.ended = False          # its terminal row was uploaded
        self.first_seen = time.time()


class _LocalState:
    """Per session: the bound policy and the open local episodes."""

    def __init__(self):
        self.lock = threading.Lock()  # one upload at a time: validate, offer, apply
        self.policy_id: Optional[str] = None
        self.episodes: Dict[str, _LocalEpisode] = {}


_states_lock = threading.Lock()


def _state(session) -> _LocalState:
    st = session.local
    if st is None:
        with _states_lock:
            if session.local is None:
                session.local = _LocalState()
            st = session.local
    return st


def _check_session(session) -> None:
    if getattr(session, "slots", None) is not None:
        raise failed_precondition("this session drives batched slots with Step; open another session "
                                  "(without num_slots) to act locally", Reason.WRONG_SESSION_KIND)


def _bound_policy(runtime, session, st: _LocalState):
    """Runtime lock held. (policy id, policy), binding the session's agent on first use."""
    if st.policy_id is None:
        probe = Episode(f"{session.session_id}/local", -1, session.session_id, True)
        pid = runtime.policy_mapping_fn(SINGLE_AGENT_ID, probe)
        runtime._bind_policy(pid, session.default, SINGLE_AGENT_ID)
        st.policy_id = pid
    return st.policy_id, runtime.policy(st.policy_id)


# ---------------------------------------------------------------- GetPolicy

def get_policy(runtime, session, req: pb.GetPolicyRequest) -> pb.GetPolicyResponse:
    _check_session(session)
    st = _state(session)
    with runtime._lock:
        pid, policy = _bound_policy(runtime, session, st)
    if req.known_version >= policy.version:
        return pb.GetPolicyResponse(unchanged=True)
    msg = policy.portable(include_onnx=req.include_onnx)
    if msg is None:
        raise failed_precondition(
            f"policy {pid!r} ({type(policy).__name__}) has no portable form and cannot act on the "
            f"client; use remote inference (simbridge.client.policy_client.PolicyClient) for it",
            Reason.POLICY_NOT_PORTABLE)
    if msg.version <= req.known_version:  # an export not newer than what the client holds
        return pb.GetPolicyResponse(unchanged=True)
    resp = pb.GetPolicyResponse()
    resp.policy.CopyFrom(msg)  # the exported message is shared between calls
    resp.policy.policy_id = pid
    return resp


# ---------------------------------------------------------------- UploadExperience

def upload_experience(runtime, session, req: pb.UploadExperienceRequest) -> pb.UploadExperienceResponse:
    _check_session(session)
    st = _state(session)
    with st.lock:
        chunk = _decode(runtime, session, req)
        with runtime._lock:
            pid, policy = _bound_policy(runtime, session, st)
            version = policy.version
            plan = _check_against_state(runtime, session, st, chunk, version)
        if chunk.n:
            batch = MultiAgentBatch({pid: SampleBatch(_columns(chunk, plan))}, chunk.n)
            if not runtime.experience.offer(batch, runtime.config.upload_queue_wait_s):
                with runtime._lock:
                    runtime.metrics.upload_refused_chunks += 1
                    runtime.metrics.upload_refused_steps += chunk.n
                raise resource_exhausted(QUEUE_FULL, Reason.QUEUE_FULL)
        with runtime._lock:
            _apply(runtime, session, st, chunk, plan, pid)
    return pb.UploadExperienceResponse(accepted_steps=chunk.n, policy_version=version)


class _Chunk:
    """A decoded, self-consistent upload (not yet checked against the session)."""
    __slots__ = ("n", "ids", "ep_index", "t", "obs", "actions", "rewards", "new_obs", "terminated",
                 "truncated", "versions", "logp", "summaries", "first_rows", "used")


def _decode(runtime, session, req) -> _Chunk:
    """Everything that needs no session state; raises INVALID_ARGUMENT naming the first problem."""
    cfg = runtime.config
    limit = cfg.max_rows_per_request
    spec = session.default
    c = _Chunk()
    # rewards give N; a chunk with no transitions (only finished episodes) may leave it out
    rew = _array(req.rewards, "rewards", "f", None) if req.HasField("rewards") else np.zeros(0, np.float32)
    n = c.n = len(rew)
    if n > limit:
        raise invalid_argument(f"UploadExperience: {n} transitions exceed the server limit of {limit} per "
                               f"request; send smaller chunks")
    if not math.isfinite(rew.sum()):
        bad = int((~np.isfinite(rew)).argmax())
        raise invalid_argument(f"rewards row {bad}: {rew[bad]} is not a finite number")
    c.rewards = rew.astype(np.float32)
    c.ids = list(req.episode_ids)
    if len(c.ids) > limit:
        raise invalid_argument(f"UploadExperience: {len(c.ids)} episode ids exceed the limit of {limit}")
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
        logp = _array(req.action_logp, "action_logp", "f", n).astype(np.float32)
        if np.isinf(logp).any():
            bad = int(np.isinf(logp).argmax())
            raise invalid_argument(f"action_logp row {bad}: {logp[bad]}; give a finite log-probability, "
                                   f"or NaN when unknown")
        c.logp = logp
    else:
        c.logp = np.full(n, np.nan, np.float32)
    _check_time_order(c)
    c.summaries = list(req.finished_episodes)
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
        raise invalid_argument(f"UploadExperience: {len(c.summaries)} finished episodes exceed the limit of {limit}")
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


def _flags(req, field: str, n: int) -> np.ndarray:
    if not req.HasField(field):
        return np.zeros(n, bool)
    raw = _array(getattr(req, field), field, "b", n).view(np.uint8)
    if n and raw.max() > 1:
        bad = int((raw > 1).argmax())
        raise invalid_argument(f"{field} row {bad}: byte {raw[bad]} is not a bool (0 or 1)")
    return raw.astype(bool)


def _value(req, field: str, space, n: int):
    if not req.HasField(field):
        if n == 0:
            return None
        raise invalid_argument(f"UploadExperience: no {field} ({n} transitions need one each)")
    return sb_spaces.decode_value(space, getattr(req, field), n, field)


def _check_time_order(c: _Chunk) -> None:
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


def _check_against_state(runtime, session, st: _LocalState, c: _Chunk, version: int) -> dict:
    """Runtime lock held. Checks that need the session; returns eps_id per episode with rows."""
    if c.n and c.versions.max() > version:
        bad = int((c.versions > version).argmax())
        raise invalid_argument(f"policy_versions row {bad}: {c.versions[bad]} is newer than the policy's "
                               f"current version {version}")
    eps_ids: Dict[int, int] = {}  # index into c.ids -> eps_id
    new = 0
    for k, row in zip(c.used, c.first_rows):
        eid = c.ids[k]
        _not_finished(session, eid)
        ep = st.episodes.get(eid)
        if ep is None:
            new += 1
            eps_ids[k] = -1
            continue
        if ep.ended:
            raise failed_precondition(f"episode {eid!r} already uploaded its terminal row: no rows may follow", Reason.EPISODE_ENDED)
        if c.t[row] <= ep.last_t:
            raise invalid_argument(f"row {row}: t {c.t[row]} of episode {eid!r} was already uploaded (last t "
                                   f"{ep.last_t}): is this chunk sent twice?")
        eps_ids[k] = ep.eps_id
    for s in c.summaries:
        _not_finished(session, s.episode_id)
    cap = runtime.config.max_open_episodes_per_session
    if new and len(st.episodes) + new > cap:
        raise resource_exhausted(f"session would have more than {cap} open episodes: end some first", Reason.TOO_MANY_EPISODES)
    for k in eps_ids:  # numbers for new episodes; one burnt by a refused chunk is harmless
        if eps_ids[k] < 0:
            eps_ids[k] = next(runtime._episode_counter)
    return eps_ids


def _not_finished(session, eid: str) -> None:
    reason = session.finished.get(eid)
    if reason is not None:
        raise failed_precondition(f"episode {eid!r} already ended ({reason})", Reason.EPISODE_ENDED)


def _columns(c: _Chunk, eps_ids: dict) -> dict:
    """The row path's columns (runtime._act / _emit), as owned arrays."""
    by_index = np.full(len(c.ids), -1, np.int64)
    for k, eps in eps_ids.items():
        by_index[k] = eps
    own = lambda v: tree.map_structure(np.array, v)  # noqa: E731 - the request's buffers are read-only views
    return {"obs": own(c.obs), "new_obs": own(c.new_obs), "actions": own(c.actions), "rewards": c.rewards,
            "terminateds": c.terminated, "truncateds": c.truncated, "eps_id": by_index[c.ep_index],
            "agent_index": np.zeros(c.n, np.int64), "t": c.t, "policy_version": c.versions,
            "action_logp": c.logp}


def _apply(runtime, session, st: _LocalState, c: _Chunk, eps_ids: dict, pid: str) -> None:
    """Runtime lock held; everything validated and the batch delivered."""
    if c.n:
        last = np.zeros(len(c.ids), np.int64)
        np.maximum.at(last, c.ep_index, c.t)
        done_idx = set(c.ep_index[c.terminated | c.truncated].tolist())
        for k, eps in eps_ids.items():
            eid = c.ids[k]
            ep = st.episodes.get(eid)
            if ep is None:
                ep = st.episodes[eid] = _LocalEpisode(eps)
            ep.last_t = int(last[k])
            ep.ended = ep.ended or k in done_idx
    m = runtime.metrics
    steps = c.n
    for s in c.summaries:
        ep = st.episodes.pop(s.episode_id, None)
        if ep is None:
            steps += s.length  # no rows (training disabled): its steps count as the row path counts them
        _finish(runtime, session, s, ep, pid)
    m.env_steps += steps
    m.agent_steps += steps
    m.uploaded_steps += c.n


def _finish(runtime, session, s: pb.EpisodeSummary, ep: Optional[_LocalEpisode], pid: str) -> None:
    reason = "truncated" if s.truncated else "terminated"
    session.finished[s.episode_id] = reason
    while len(session.finished) > runtime.config.finished_ids_kept:
        session.finished.popitem(last=False)
    total = float(s.total_reward)
    summary = {   # the keys of Episode.summary
        "episode_id": s.episode_id,
        "eps_id": ep.eps_id if ep is not None else next(runtime._episode_counter),
        "session_id": session.session_id,
        "total_reward": total,
        "length": int(s.length),
        "agent_rewards": {SINGLE_AGENT_ID: total},
        "agent_policies": {SINGLE_AGENT_ID: pid},
        "policy_rewards": {pid: total},
        "custom_metrics": dict(s.custom_metrics),
        "training_enabled": ep is not None,
        "end_reason": reason,
        "duration_s": time.time() - ep.first_seen if ep is not None else 0.0,
    }
    runtime.file_summary(summary)

