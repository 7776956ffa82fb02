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

UploadCalls receives the ServerContext (config, lock, policies, experience
queue, metrics, summary filing) and nothing else of the runtime.
"""
import logging
import threading
import time
from typing import Dict, Optional

import numpy as np

from simbridge.server.episodes import Episode, episode_summary
from simbridge.wire.columns import SINGLE_AGENT_ID
from simbridge.server.upload_checks import Chunk, columns, decode
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
        self.binding = threading.Lock()   # the first GetPolicy / upload binds the policy
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
    if session.slots is not None:
        raise failed_precondition("this session drives batched slots with Step; open another session "
                                  "(without num_slots) to act locally", Reason.WRONG_SESSION_KIND)


def _not_finished(session, eid: str) -> None:
    reason = session.finished.get(eid)
    if reason is not None:
        raise failed_precondition(f"episode {eid!r} already ended ({reason})", Reason.EPISODE_ENDED)


class UploadCalls:
    """GetPolicy and UploadExperience."""

    def __init__(self, ctx):
        self.ctx = ctx

    def _bound_policy(self, session, st: _LocalState) -> str:
        """Runtime lock NOT held (the policy may be created). The session's policy id, bound
        on first use as a row session binds its agent's."""
        if st.policy_id is None:
            with st.binding:
                if st.policy_id is None:
                    probe = Episode(f"{session.session_id}/local", -1, session.session_id, True)
                    pid = self.ctx.policy_mapping_fn(SINGLE_AGENT_ID, probe)
                    self.ctx.policies.ensure(pid, session.default, SINGLE_AGENT_ID)
                    k = self.ctx.policies.frame_stack(pid)
                    if k > 1:   # refused on every call: nothing is bound
                        raise failed_precondition(
                            f"policy {pid!r} stacks each agent's last {k} frames on the trainer "
                            f"(frame_stack = {k} in its [policies.{pid}] table), which a client acting "
                            f"locally does not do: use remote inference for it (PolicyClient, SlotClient; "
                            f"simbridge-sim without --inference local), or stack the frames in the "
                            f"simulator and set frame_stack = 1", Reason.POLICY_NOT_PORTABLE)
                    st.policy_id = pid
        return st.policy_id

    # ------------------------------------------------------------ GetPolicy

    def get_policy(self, session, req: pb.GetPolicyRequest, defer: bool = False) -> pb.GetPolicyResponse:
        _check_session(session)
        pid = self._bound_policy(session, _state(session))
        policy = self.ctx.policies[pid]
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

    # ------------------------------------------------------------ UploadExperience

    def upload_experience(self, session, req: pb.UploadExperienceRequest,
                          defer: bool = False) -> pb.UploadExperienceResponse:
        ctx = self.ctx
        _check_session(session)
        st = _state(session)
        with st.lock:
            chunk = decode(ctx.config, session, req)
            pid = self._bound_policy(session, st)
            with ctx.lock:
                version = ctx.policies[pid].version
                plan = self._check_against_state(session, st, chunk, version)
            if chunk.n:
                batch = MultiAgentBatch({pid: SampleBatch(columns(chunk, plan))}, chunk.n)
                if not ctx.experience.offer(batch, ctx.config.upload_queue_wait_s):
                    with ctx.lock:
                        ctx.metrics.upload_refused_chunks += 1
                        ctx.metrics.upload_refused_steps += chunk.n
                    raise resource_exhausted(QUEUE_FULL, Reason.QUEUE_FULL)
            with ctx.lock:
                self._apply(session, st, chunk, plan, pid)
                ctx.committed()   # its counters into the journal now, not with the next call
        return pb.UploadExperienceResponse(accepted_steps=chunk.n, policy_version=version)

    def _check_against_state(self, session, st: _LocalState, c: Chunk, version: int) -> dict:
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
        cap = self.ctx.config.max_open_episodes_per_session
        if new and len(st.episodes) + new > cap:
            raise resource_exhausted(f"session would have more than {cap} open episodes: end some first", Reason.TOO_MANY_EPISODES)
        for k in eps_ids:  # numbers for new episodes; one burnt by a refused chunk is harmless
            if eps_ids[k] < 0:
                eps_ids[k] = self.ctx.next_eps_id()
        return eps_ids

    def _apply(self, session, st: _LocalState, c: Chunk, eps_ids: dict, pid: str) -> None:
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
        m = self.ctx.metrics
        steps = c.n
        for s in c.summaries:
            ep = st.episodes.pop(s.episode_id, None)
            if ep is None:
                steps += s.length  # no rows (training disabled): its steps count as the row path counts them
            self._finish(session, s, ep, pid)
        m.env_steps += steps
        m.agent_steps += steps
        m.uploaded_steps += c.n

    def _finish(self, session, s: pb.EpisodeSummary, ep: Optional[_LocalEpisode], pid: str) -> None:
        reason = ("simulator_stopped" if s.stopping else "truncated") if s.truncated else "terminated"
        session.mark_finished(s.episode_id, reason, self.ctx.config.finished_ids_kept)
        total = float(s.total_reward)
        self.ctx.file_summary(episode_summary(
            s.episode_id, ep.eps_id if ep is not None else self.ctx.next_eps_id(), session.session_id,
            int(s.length), {SINGLE_AGENT_ID: total}, {SINGLE_AGENT_ID: pid}, s.custom_metrics,
            ep is not None, reason, time.time() - ep.first_seen if ep is not None else 0.0))
