"""The bridge's runtime: sessions, episodes, policies and experience.

Transport-free: every call takes the request message and returns the response
message, so the unary RPCs and the Stream share one code path (server.py).
Each call validates everything first and raises BridgeError before changing
any state, so a bad request has no effect on the session, on other
simulators' episodes or on collected experience.

Locking: one lock guards sessions, episodes and the collector; policy forward
passes run outside it (batched across callers by DynamicBatcher), and handing
finished batches to the ExperienceQueue (which may block) happens outside it.
"""
import collections
import functools
import itertools
import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from google.protobuf import json_format

from simbridge.server import uploads as local_serving, slots
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors, tree
from simbridge.server.batcher import DynamicBatcher
from simbridge.server.experience import ExperienceCollector, ExperienceQueue
from simbridge.server.episodes import ALL_AGENTS, SINGLE_AGENT_ID, AgentState, Episode, SlotTable
from simbridge.wire.errors import (Reason, already_exists, failed_precondition, invalid_argument,
                              not_found, resource_exhausted)
from simbridge.server.mapping import DEFAULT_POLICY
from simbridge.server.policies import Policy, random_policy_factory
from simbridge.wire.v1 import simbridge_pb2 as pb

log = logging.getLogger("simbridge")

SERVER_VERSION = "simbridge 0.1.0"

_NO_FLAGS = (False,) * 4096

PolicyMappingFn = Callable[[str, Episode], str]
PolicyFactory = Callable[[str, object, object], Policy]


@dataclass
class BridgeConfig:
    rollout_fragment_length: int = 200
    batch_mode: str = "truncate_episodes"      # or "complete_episodes"
    count_steps_by: str = "env_steps"          # or "agent_steps"
    max_message_bytes: int = 64 * 1024 * 1024
    max_rows_per_request: int = 16384
    max_open_episodes_per_session: int = 100_000
    session_timeout_s: float = 120.0           # unary sessions: idle this long -> closed
    reconnect_grace_s: float = 30.0            # stream sessions: detached this long -> closed
    max_batch_rows: int = 4096                 # dynamic batcher
    max_wait_ms: float = 0.0
    experience_queue_size: int = 64
    response_cache_size: int = 256             # answers kept for resent requests
    finished_ids_kept: int = 10_000            # for precise "already ended" errors
    upload_queue_wait_s: float = 0.2           # UploadExperience: wait this long for room in the
                                               # experience queue, then refuse (RESOURCE_EXHAUSTED)


class SpaceSpec:
    """An observation/action space pair, with the wire form kept for comparison."""

    def __init__(self, obs_space, act_space):
        self.obs_space = obs_space
        self.act_space = act_space
        self.key = (sb_spaces.space_to_proto(obs_space).SerializeToString(deterministic=True),
                    sb_spaces.space_to_proto(act_space).SerializeToString(deterministic=True))


class Session:
    def __init__(self, session_id: str, multi_agent: bool, default: SpaceSpec,
                 agent_specs: Dict[str, SpaceSpec], client_name: str):
        self.session_id = session_id
        self.multi_agent = multi_agent
        self.default = default
        self.agent_specs = agent_specs
        self.client_name = client_name
        self.episodes: Dict[str, Episode] = {}
        self.finished: "collections.OrderedDict[str, str]" = collections.OrderedDict()
        self.last_active = time.monotonic()
        self.streams = 0
        self.detached_since: Optional[float] = None
        self.last_seq = 0
        self.responses: "collections.OrderedDict[int, object]" = collections.OrderedDict()
        self.closed = False
        self.episodes_ended = 0
        self.slots = None   # slots.SlotBank of a batched simulator (CreateSession.num_slots)
        # The bookkeeping of the last streamed call, answered but not yet applied (settle()).
        self.pending: Optional[Callable[[], None]] = None
        self.local = None   # local_serving state of a client that acts locally

    def spec_for(self, agent_id: str) -> SpaceSpec:
        return self.agent_specs.get(agent_id, self.default)


class _Rows:
    """One AgentRows (or RewardRows) resolved against a session."""
    __slots__ = ("eids", "aids", "spec", "n", "obs", "actions", "episodes", "states", "policy_ids",
                 "unique_episodes")

    def __init__(self, eids, aids, spec, n):
        self.eids, self.aids, self.spec, self.n = eids, aids, spec, n
        self.obs = self.actions = None
        self.episodes: List[Episode] = []
        self.states: List[Optional[AgentState]] = []   # None: the agent's first appearance
        self.policy_ids: List[str] = []
        self.unique_episodes = False   # known: no episode appears twice in these rows


class Metrics:
    def __init__(self):
        self.env_steps = 0
        self.agent_steps = 0
        self.episodes = 0
        self.recent = collections.deque(maxlen=100)   # episode summaries
        self.errors = collections.Counter()           # status code name -> count
        # UploadExperience (clients acting locally): accepted steps, and chunks refused because
        # the experience queue stayed full (the client keeps and resends them: no drop).
        self.uploaded_steps = 0
        self.upload_refused_chunks = 0
        self.upload_refused_steps = 0

    def policy_return_means(self, last: int = 100) -> Dict[str, float]:
        """Mean return of one agent's episode, per policy, over its last `last` agent-episodes
        (of the last 100 episodes), as RLlib's policy_reward_mean."""
        sums: Dict[str, List[float]] = collections.defaultdict(list)
        for s in self.recent:
            for aid, pid in s["agent_policies"].items():
                sums[pid].append(s["agent_rewards"][aid])
        return {pid: float(np.mean(v[-last:])) for pid, v in sums.items()}


class BridgeRuntime:
    def __init__(self, config: Optional[BridgeConfig] = None,
                 policy_mapping_fn: Optional[PolicyMappingFn] = None,
                 policy_factory: Optional[PolicyFactory] = None,
                 experience: Optional[ExperienceQueue] = None):
        self.config = config or BridgeConfig()
        self.policy_mapping_fn = policy_mapping_fn or (lambda agent_id, episode: DEFAULT_POLICY)
        self.policy_factory = policy_factory or random_policy_factory
        self.experience = experience or ExperienceQueue(self.config.experience_queue_size)
        self.collector = ExperienceCollector(self.config.rollout_fragment_length,
                                             self.config.batch_mode, self.config.count_steps_by)
        self.metrics = Metrics()
        self.episode_end_callbacks: List[Callable[[dict], None]] = []
        self._lock = threading.RLock()
        self._sessions: Dict[str, Session] = {}
        self._policies: Dict[str, Policy] = {}
        self._policy_keys: Dict[str, tuple] = {}
        self._batchers: Dict[str, DynamicBatcher] = {}
        self._tables: Dict[tuple, SlotTable] = {}
        self._episode_counter = itertools.count(1)
        # Batches completed by a settle that are still on their way into the queue.
        self._settling = 0
        self._settled = threading.Condition()

    # ------------------------------------------------------------ policies

    def add_policy(self, policy_id: str, policy: Policy) -> None:
        with self._lock:
            self._policies[policy_id] = policy
            self._policy_keys[policy_id] = SpaceSpec(policy.observation_space, policy.action_space).key
            self._batchers[policy_id] = DynamicBatcher(policy, self.config.max_batch_rows,
                                                       self.config.max_wait_ms)

    def policy(self, policy_id: str) -> Policy:
        return self._policies[policy_id]

    @property
    def policies(self) -> Dict[str, Policy]:
        return dict(self._policies)

    def batcher(self, policy_id: str) -> DynamicBatcher:
        return self._batchers[policy_id]

    def _bind_policy(self, policy_id: str, spec: SpaceSpec, agent_id: str) -> None:
        """Create the policy on first use; refuse agents whose spaces differ from it."""
        key = self._policy_keys.get(policy_id)
        if key is None:
            self.add_policy(policy_id, self.policy_factory(policy_id, spec.obs_space, spec.act_space))
        elif key != spec.key:
            p = self._policies[policy_id]
            raise invalid_argument(
                f"agent {agent_id!r} maps to policy {policy_id!r}, whose spaces are "
                f"observation {p.observation_space}, action {p.action_space}; this session declared "
                f"observation {spec.obs_space}, action {spec.act_space} for it")

    # ------------------------------------------------------------ sessions

    def create_session(self, req: pb.CreateSessionRequest, multi_agent: bool) -> pb.CreateSessionResponse:
        with self._lock:
            if req.resume_session_id:
                s = self._sessions.get(req.resume_session_id)
                if s is not None and s.multi_agent != multi_agent:
                    svc = "ExternalMultiAgentEnv" if s.multi_agent else "ExternalEnv"
                    raise failed_precondition(f"session {s.session_id!r} belongs to {svc}: resume it there", Reason.WRONG_SESSION)
                if s is not None:
                    s.detached_since = None
                    s.last_active = time.monotonic()
                    log.info("session %s resumed (%d open episodes)", s.session_id, len(s.episodes))
                    return self._session_response(s, resumed=True)
        if not req.HasField("observation_space") or not req.HasField("action_space"):
            raise invalid_argument("CreateSession needs observation_space and action_space")
        default = SpaceSpec(sb_spaces.space_from_proto(req.observation_space),
                            sb_spaces.space_from_proto(req.action_space))
        agent_specs = {}
        if req.agents and not multi_agent:
            raise invalid_argument("ExternalEnv sessions have one agent: use ExternalMultiAgentEnv to declare agents")
        for a in req.agents:
            if not a.agent_id or a.agent_id == ALL_AGENTS:
                raise invalid_argument(f"invalid agent id {a.agent_id!r}")
            obs = sb_spaces.space_from_proto(a.observation_space) if a.HasField("observation_space") else default.obs_space
            act = sb_spaces.space_from_proto(a.action_space) if a.HasField("action_space") else default.act_space
            agent_specs[a.agent_id] = SpaceSpec(obs, act)
        s = Session(uuid.uuid4().hex, multi_agent, default, agent_specs, req.client_name)
        with self._lock:
            s.slots = slots.create_bank(self, s, req)
            self._sessions[s.session_id] = s
        log.info("session %s created for %r (%s)", s.session_id, req.client_name,
                 "multi-agent" if multi_agent else "single-agent")
        return self._session_response(s, resumed=False)

    def _session_response(self, s: Session, resumed: bool) -> pb.CreateSessionResponse:
        c = self.config
        return pb.CreateSessionResponse(
            session_id=s.session_id, server_version=SERVER_VERSION, resumed=resumed, last_seq=s.last_seq,
            limits=pb.ServerLimits(max_message_bytes=c.max_message_bytes,
                                   max_rows_per_request=c.max_rows_per_request,
                                   max_open_episodes_per_session=c.max_open_episodes_per_session,
                                   session_timeout_s=c.session_timeout_s,
                                   reconnect_grace_s=c.reconnect_grace_s))

    def session(self, session_id: str, multi_agent: bool) -> Session:
        with self._lock:
            s = self._sessions.get(session_id)
        if s is None:
            raise not_found(f"unknown session {session_id!r} (expired, closed, or from before a server "
                            f"restart): call CreateSession again", Reason.SESSION_UNKNOWN)
        if s.multi_agent != multi_agent:
            svc = "ExternalMultiAgentEnv" if s.multi_agent else "ExternalEnv"
            raise failed_precondition(f"session {session_id!r} was created on {svc}: call that service", Reason.WRONG_SESSION)
        return s

    def attach_stream(self, s: Session) -> None:
        with self._lock:
            s.streams += 1
            s.detached_since = None

    def detach_stream(self, s: Session) -> None:
        with self._lock:
            s.streams -= 1
            if s.streams == 0 and not s.closed:
                s.detached_since = time.monotonic()
                log.warning("session %s lost its stream with %d open episodes; keeping it %.0fs for a "
                            "reconnect", s.session_id, len(s.episodes), self.config.reconnect_grace_s)

    def close_session(self, s: Session, req=None, reason: str = "session_closed") -> pb.CloseSessionResponse:
        with self._lock:
            self._commit_pending(s)   # its last call was answered: it counts
            ended = list(s.episodes)
            for ep in list(s.episodes.values()):
                self._finish_episode(s, ep, {}, truncated=True, reason=reason, drop_pending=True)
            slots.close_bank(self, s, reason)
            s.closed = True
            self._sessions.pop(s.session_id, None)
            batch = self.collector.ready()
        self._deliver(batch)
        return pb.CloseSessionResponse(truncated_episode_ids=ended)

    def reap(self, now: Optional[float] = None) -> List[str]:
        """Close sessions whose client is gone; returns their ids."""
        now = time.monotonic() if now is None else now
        c = self.config
        with self._lock:
            dead = [s for s in self._sessions.values() if s.streams == 0 and (
                (s.detached_since is not None and now - s.detached_since > c.reconnect_grace_s)
                or (s.detached_since is None and now - s.last_active > c.session_timeout_s))]
        for s in dead:
            log.warning("session %s (%s) is gone: ending its %d open episodes as truncated",
                        s.session_id, s.client_name, len(s.episodes))
            self.close_session(s, reason="client_lost")
        return [s.session_id for s in dead]

    # ------------------------------------------------------------ dispatch

    def handle(self, method: str, req, multi_agent: bool, bound: Optional[Session] = None):
        """Run one call: session lookup, resend detection, the call, delivery."""
        header = req.header
        if bound is not None:
            if header.session_id and header.session_id != bound.session_id:
                raise invalid_argument(f"this stream is bound to session {bound.session_id!r}, "
                                       f"the request names {header.session_id!r}")
            s = bound
        else:
            if not header.session_id:
                raise invalid_argument("request header has no session_id: call CreateSession first")
            s = self.session(header.session_id, multi_agent)
        seq = header.seq
        self.settle(s)   # the previous call's bookkeeping, if its stream has not applied it yet
        with self._lock:
            s.last_active = time.monotonic()
            if seq and seq <= s.last_seq:
                cached = s.responses.get(seq)
                if cached is None:
                    raise failed_precondition(f"request seq {seq} was already applied and its answer is "
                                              f"no longer kept (last applied: {s.last_seq})", Reason.ALREADY_APPLIED)
                return cached
        if method == "step":   # on a stream the bookkeeping waits for settle(), after the answer
            resp = slots.step(self, s, req, defer=bound is not None)
        elif method == "get_action":
            resp = self._get_action(s, req, defer=bound is not None)
        else:
            resp = getattr(self, "_" + method)(s, req)
        if seq:
            with self._lock:
                s.last_seq = max(s.last_seq, seq)
                s.responses[seq] = resp
                while len(s.responses) > self.config.response_cache_size:
                    s.responses.popitem(last=False)
        return resp

    # Batched simulators (slots.py) and clients that act locally (local_serving.py)
    # keep their own rooms; the runtime only dispatches to them.
    # A streamed GetAction or Step is answered as soon as it is validated and acted on; the
    # bookkeeping (transitions, rewards, ended episodes, the hand-over to the learner) is left in
    # session.pending and applied by the stream right after the answer is sent, while the
    # simulator steps. Anything that reads the session settles it first: the session's next
    # call, close, flush, snapshot.
    def settle(self, s: Session) -> None:
        """Apply the session's pending bookkeeping, if any, and deliver what it completes."""
        # Always under the lock, even to find nothing pending: another thread may be applying
        # this very commit, and the caller must see it finished.
        with self._lock:
            if not self._commit_pending(s):
                return
            batch = self.collector.ready()
            if batch is None:
                return
            self._settling += 1
        self._deliver_settled(batch)

    @staticmethod
    def _commit_pending(s: Session) -> bool:
        """Lock held."""
        commit, s.pending = s.pending, None
        if commit is None:
            return False
        commit()
        return True

    def settle_all(self, timeout: float = 10.0) -> None:
        """Apply every answered call's pending bookkeeping and wait until the experience it
        completed is in the queue (whichever thread settles it)."""
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            self.settle(s)
        with self._settled:
            self._settled.wait_for(lambda: self._settling == 0, timeout)

    def _deliver_settled(self, batch) -> None:
        """Deliver a batch a settle completed; self._settling was counted up under the lock."""
        try:
            self._deliver(batch)
        finally:
            with self._settled:
                self._settling -= 1
                self._settled.notify_all()

    def _get_policy(self, s: Session, req: pb.GetPolicyRequest) -> pb.GetPolicyResponse:
        return local_serving.get_policy(self, s, req)

    def _upload_experience(self, s: Session, req: pb.UploadExperienceRequest) -> pb.UploadExperienceResponse:
        return local_serving.upload_experience(self, s, req)

    def _deliver(self, batch) -> None:
        if batch is not None:
            self.experience.put(batch)  # may block: backpressure, never a drop

    # ------------------------------------------------------------ validation helpers

    def _open_episode(self, s: Session, eid: str) -> Episode:
        ep = s.episodes.get(eid)
        if ep is None:
            reason = s.finished.get(eid)
            if reason is not None:
                raise failed_precondition(f"episode {eid!r} already ended ({reason})", Reason.EPISODE_ENDED)
            raise not_found(f"unknown episode {eid!r} in session {s.session_id!r}: call StartEpisode first", Reason.EPISODE_UNKNOWN)
        return ep

    def _resolve_ids(self, s: Session, episode_ids, agent_ids, what: str) -> Tuple[List[str], List[str], int]:
        if s.multi_agent:
            n = len(agent_ids)
            if n == 0:
                raise invalid_argument(f"{what}: no agent ids (ExternalMultiAgentEnv rows need one per row)")
            aids = list(agent_ids)
            if ALL_AGENTS in aids and what.startswith(("observations", "actions", "final")):
                raise invalid_argument(f"{what}: {ALL_AGENTS!r} is not an agent")
        else:
            if agent_ids:
                raise invalid_argument(f"{what}: ExternalEnv rows carry no agent ids; "
                                       f"use ExternalMultiAgentEnv for several agents per episode")
            n = len(episode_ids)
            aids = [SINGLE_AGENT_ID] * n
        if len(episode_ids) == n:
            eids = list(episode_ids)
        elif len(episode_ids) == 1:
            eids = [episode_ids[0]] * n
        else:
            raise invalid_argument(f"{what}: {len(episode_ids)} episode ids for {n} rows; "
                                   f"give one per row or one for all rows")
        if n > self.config.max_rows_per_request:
            raise invalid_argument(f"{what}: {n} rows exceed the server limit of "
                                   f"{self.config.max_rows_per_request} per request")
        return eids, aids, n

    def _rows_spec(self, s: Session, aids: List[str], what: str) -> SpaceSpec:
        spec = s.spec_for(aids[0]) if aids else s.default
        if s.agent_specs:
            for a in aids:
                if s.spec_for(a) is not spec:
                    raise invalid_argument(f"{what}: agents {aids[0]!r} and {a!r} have different spaces; "
                                           f"send them in separate rows messages")
        return spec

    def _resolve_agent_rows(self, s: Session, rows_msgs, what: str, seen: set) -> List[_Rows]:
        out = []
        for i, m in enumerate(rows_msgs):
            w = f"{what} {i}"
            eids, aids, n = self._resolve_ids(s, m.episode_ids, m.agent_ids, f"observations of rows {i}")
            r = _Rows(eids, aids, self._rows_spec(s, aids, w), n)
            if not m.HasField("observations"):
                raise invalid_argument(f"{w}: no observations")
            r.obs = sb_spaces.decode_value(r.spec.obs_space, m.observations, n, f"observations of rows {i}")
            out.append(r)
        with self._lock:
            if len(out) == 1 and not s.multi_agent:
                self._resolve_single_agent(s, out[0])  # the hot path, with comprehensions
                return out
            for r in out:
                for eid, aid in zip(r.eids, r.aids):
                    if (eid, aid) in seen:
                        raise invalid_argument(f"agent {aid!r} of episode {eid!r} appears twice in one request")
                    seen.add((eid, aid))
                    ep = self._open_episode(s, eid)
                    st = ep.agents.get(aid)
                    if st is not None and st.done:
                        raise failed_precondition(f"agent {aid!r} is already done in episode {eid!r}", Reason.EPISODE_ENDED)
                    r.episodes.append(ep)
                    r.states.append(st)
                    r.policy_ids.append(self._policy_of(st, aid, ep, r.spec))
        return out

    def _policy_of(self, st: Optional[AgentState], aid: str, ep: Episode, spec: SpaceSpec) -> str:
        if st is not None and st.policy_id is not None:
            return st.policy_id
        pid = self.policy_mapping_fn(aid, ep)  # first appearance: bind
        self._bind_policy(pid, spec, aid)
        return pid

    def _resolve_single_agent(self, s: Session, r: _Rows) -> None:
        """Lock held. Same checks as the general path, one comprehension per step."""
        episodes = s.episodes
        eps = [episodes.get(e) for e in r.eids]
        if None in eps:
            self._open_episode(s, r.eids[eps.index(None)])  # raises the precise error
        if len(set(r.eids)) != r.n:
            dup = next(e for i, e in enumerate(r.eids) if e in r.eids[:i])
            raise invalid_argument(f"agent {SINGLE_AGENT_ID!r} of episode {dup!r} appears twice in one request")
        sts = [ep.agents.get(SINGLE_AGENT_ID) for ep in eps]
        pids = [st.policy_id if st is not None else None for st in sts]
        if None in pids:
            pids = [self._policy_of(st, SINGLE_AGENT_ID, ep, r.spec) for st, ep in zip(sts, eps)]
        r.episodes, r.states, r.policy_ids = eps, sts, pids
        r.unique_episodes = True

    # ------------------------------------------------------------ calls

    def _start_episode(self, s: Session, req: pb.StartEpisodeRequest) -> pb.StartEpisodeResponse:
        training = req.training_enabled if req.HasField("training_enabled") else True
        if req.episode_ids:
            ids = list(req.episode_ids)
        else:
            if req.count < 0 or req.count > self.config.max_rows_per_request:
                raise invalid_argument(f"StartEpisode: count {req.count} out of range")
            ids = [uuid.uuid4().hex for _ in range(max(1, req.count))]
        with self._lock:
            self._check_new_ids(s, ids)
            self._open_episodes(s, ids, training)
        return pb.StartEpisodeResponse(episode_ids=ids)

    def _check_new_ids(self, s: Session, ids: List[str], ending: int = 0) -> None:
        """Lock held. New episode ids must be unused; `ending` episodes close first."""
        if len(set(ids)) != len(ids):
            raise invalid_argument("episode ids to start repeat within the request")
        for eid in ids:
            if not eid:
                raise invalid_argument("StartEpisode: empty episode id")
            if eid in s.episodes:
                raise already_exists(f"episode {eid!r} is already running")
            if eid in s.finished:
                raise already_exists(f"episode id {eid!r} was already used by an episode that ended")
        if len(s.episodes) - ending + len(ids) > self.config.max_open_episodes_per_session:
            raise resource_exhausted(f"session would have more than "
                                     f"{self.config.max_open_episodes_per_session} open episodes: "
                                     f"end some first", Reason.TOO_MANY_EPISODES)

    def _open_episodes(self, s: Session, ids: List[str], training: bool) -> None:
        for eid in ids:
            s.episodes[eid] = Episode(eid, next(self._episode_counter), s.session_id, training)

    def _get_action(self, s: Session, req: pb.GetActionRequest, defer: bool = False) -> pb.GetActionResponse:
        rows, plans = self._resolve_with_returns(s, req, "GetAction rows")
        ended_before = s.episodes_ended
        # Forward passes, outside the lock, batched across simulators per policy.
        results = []
        for r in rows:
            results.append(self._compute(r))
        with self._lock:
            self._check_still_open(s, rows, plans, ended_before)
            self._commit_pending(s)   # another thread's call on this session (unary), if any
            s.pending = functools.partial(self._commit_actions, s, rows, plans, results)
        if not defer:
            self.settle(s)
        resp = pb.GetActionResponse()
        for r, (actions, _, versions) in zip(rows, results):
            out = resp.actions.add()
            sb_spaces.fill_value(out.actions, r.spec.act_space, actions)
            out.policy_versions.extend(versions)
            out.policy_ids.extend(r.policy_ids)
        return resp

    def _commit_actions(self, s: Session, rows, plans, results) -> None:
        """Lock held. A validated GetAction's effect: its rewards, then the actions it answered."""
        self._apply_returns(s, plans)
        stepped = set()
        for r, (actions, logp, versions) in zip(rows, results):
            self._act(r, actions, logp, versions, stepped)

    def _resolve_with_returns(self, s: Session, req, what: str):
        rows = self._resolve_agent_rows(s, req.rows, what, set())
        if not req.rewards:
            return rows, []
        with self._lock:
            plans = self._check_returns(s, req.rewards)
            done = self._done_in(plans)
            if done:
                acting = {(r.eids[i], r.aids[i]) for r in rows for i in range(r.n)}
                acting_eps = {e for e, _ in acting}
                for eid, aid in done:
                    if (eid, aid) in acting or (aid == ALL_AGENTS and eid in acting_eps):
                        raise invalid_argument(f"agent {aid!r} of episode {eid!r} is marked done by the "
                                               f"attached rewards and also asks for an action")
        return rows, plans

    def _compute(self, r: _Rows):
        pids = r.policy_ids
        if pids.count(pids[0]) == len(pids):  # common case: one policy for all rows
            actions, logp, version = self._batchers[pids[0]].compute(r.obs, r.n)
            return actions, logp, [version] * r.n
        # Rows of several policies: one pass per policy, then reassembled in row order.
        idx_by_pid: Dict[str, List[int]] = collections.defaultdict(list)
        for i, p in enumerate(pids):
            idx_by_pid[p].append(i)
        actions = sb_spaces.zeros_like_space(r.spec.act_space, r.n)
        logp = np.full(r.n, np.nan, np.float32)
        versions = [0] * r.n
        for p, idx in idx_by_pid.items():
            ix = np.asarray(idx)
            a, lp, v = self._batchers[p].compute(tree.take(r.obs, ix), len(idx))

            def put(dst, src, ix=ix):
                dst[ix] = src
            tree.map_structure(put, actions, a)
            if lp is not None:
                logp[ix] = lp
            for i in idx:
                versions[i] = v
        return actions, logp, versions

    def _check_still_open(self, s: Session, rows: List[_Rows], plans: list = (), ended_before: int = -1) -> None:
        """After the forward pass: every episode the request touches must still be open."""
        if s.episodes_ended == ended_before:
            return  # none of this session's episodes ended meanwhile
        eps = [ep for r in rows for ep in r.episodes] + [ep for plan in plans for ep in plan[2]]
        for ep in eps:
            if s.episodes.get(ep.episode_id) is not ep:
                raise failed_precondition(f"episode {ep.episode_id!r} ended while this request's action "
                                          f"was being computed; nothing of the request was applied", Reason.EPISODE_ENDED)

    def _table(self, spec: SpaceSpec) -> SlotTable:
        t = self._tables.get(spec.key)
        if t is None:
            t = self._tables[spec.key] = SlotTable(spec.obs_space, spec.act_space)
        return t

    def _agent(self, ep: Episode, aid: str, spec: SpaceSpec) -> AgentState:
        st = ep.agents.get(aid)
        if st is None:
            st = ep.add_agent(aid, spec, self._table(spec))
        return st

    def _act(self, r: _Rows, actions, logp, versions, stepped: set) -> None:
        """Record observation + action per row; completes each agent's previous transition.

        Vectorised over rows through the agents' slot table: one Python loop to
        find the slots, then array operations. `stepped` holds the episodes
        already counted one env step in this call."""
        n = r.n
        table = self._table(r.spec)
        sts = r.states
        if None in sts or any(st.policy_id is None for st in sts):  # first appearances
            for i, st in enumerate(sts):
                if st is None:  # (rewards applied just before may have created it)
                    ep = r.episodes[i]
                    st = sts[i] = ep.agents.get(r.aids[i]) or ep.add_agent(r.aids[i], r.spec, table)
                if st.policy_id is None:
                    st.policy_id = r.policy_ids[i]
        slots = np.fromiter([st.slot for st in sts], np.int64, n)
        if r.unique_episodes and not stepped:  # single-agent rows: one row per episode
            counted = r.episodes
            stepped.update(map(id, counted))
        else:
            counted = []
            for ep in r.episodes:
                if id(ep) not in stepped:
                    stepped.add(id(ep))
                    counted.append(ep)
        for ep in counted:
            ep.length += 1
        new_steps = len(counted)
        self.collector.count_env_steps(counted)
        pend = table.pending[slots]
        if pend.any():
            idx = np.flatnonzero(pend)
            ps = slots[idx]
            k = len(idx)
            cols = {"obs": tree.take(table.obs, ps), "new_obs": tree.take(r.obs, idx),
                    "actions": tree.take(table.act, ps), "rewards": table.reward_acc[ps].astype(np.float32),
                    "terminateds": np.zeros(k, bool), "truncateds": np.zeros(k, bool),
                    "eps_id": table.eps_id[ps], "agent_index": table.agent_index[ps], "t": table.t[ps],
                    "policy_version": table.version[ps], "action_logp": table.logp[ps]}
            table.t[ps] += 1
            self._collect_chunk(r, idx, cols)
        # Reward before an agent's first action rewards no action: dropped with the rest.
        table.reward_acc[slots] = 0.0

        def put(dst, src):
            dst[slots] = src
        tree.map_structure(put, table.obs, r.obs)
        tree.map_structure(put, table.act, actions)
        table.logp[slots] = np.nan if logp is None else logp
        table.version[slots] = versions
        table.pending[slots] = True
        self.metrics.env_steps += new_steps
        self.metrics.agent_steps += n

    def _collect_chunk(self, r: _Rows, idx: np.ndarray, cols: dict) -> None:
        """Hand completed transitions (rows idx of r) to the collector, per policy."""
        eps = [r.episodes[i] for i in idx]
        pids = [r.policy_ids[i] for i in idx]
        if (not self.collector.complete_episodes and pids.count(pids[0]) == len(pids)
                and all([ep.training_enabled for ep in eps])):
            self.collector.add_rows(pids[0], cols)  # the common case: one chunk
            return
        for j, ep in enumerate(eps):
            if ep.training_enabled:
                self.collector.add_transition(ep, pids[j], {k: tree.take(v, j) for k, v in cols.items()})

    def _emit(self, ep: Episode, st: AgentState, new_obs, terminated: bool, truncated: bool) -> None:
        """Complete one agent's pending transition (the per-row path: dones, episode ends)."""
        tb, sl = st.table, st.slot
        if ep.training_enabled:
            self.collector.add_transition(ep, st.policy_id, {
                "obs": tb.row(sl, "obs"), "new_obs": new_obs, "actions": tb.row(sl, "act"),
                "rewards": np.float32(tb.reward_acc[sl]), "terminateds": terminated, "truncateds": truncated,
                "eps_id": ep.index, "agent_index": st.index, "t": int(tb.t[sl]),
                "policy_version": int(tb.version[sl]), "action_logp": np.float32(tb.logp[sl]),
            })
        tb.reward_acc[sl] = 0.0
        tb.pending[sl] = False
        tb.t[sl] += 1

    def _log_action(self, s: Session, req: pb.LogActionRequest) -> pb.LogActionResponse:
        if len(req.actions) != len(req.rows):
            raise invalid_argument(f"LogAction: {len(req.rows)} rows messages but {len(req.actions)} "
                                   f"action values; give one per rows message")
        rows, plans = self._resolve_with_returns(s, req, "LogAction rows")
        for i, (r, a) in enumerate(zip(rows, req.actions)):
            what = f"actions of rows {i}"
            r.actions = sb_spaces.decode_value(r.spec.act_space, a, r.n, what)
            sb_spaces.check_contains(r.spec.act_space, r.actions, r.n, what)
        with self._lock:
            self._check_still_open(s, rows, plans)
            self._apply_returns(s, plans)
            stepped = set()
            for r in rows:
                self._act(r, r.actions, None, [-1] * r.n, stepped)  # version -1: the simulator's own choice
            batch = self.collector.ready()
        self._deliver(batch)
        return pb.LogActionResponse()

    def _log_returns(self, s: Session, req: pb.LogReturnsRequest) -> pb.LogReturnsResponse:
        with self._lock:
            plans = self._check_returns(s, req.rows)
            for em in req.custom_metrics:
                self._open_episode(s, em.episode_id)
            self._apply_returns(s, plans)
            for em in req.custom_metrics:
                s.episodes[em.episode_id].custom_metrics.update(em.values)
            batch = self.collector.ready()
        self._deliver(batch)
        return pb.LogReturnsResponse()

    def _check_returns(self, s: Session, rows_msgs) -> list:
        """Lock held. Validates RewardRows; returns plans for _apply_returns."""
        plans = []
        seen: Dict[Tuple[str, str], int] = {}
        for i, m in enumerate(rows_msgs):
            what = f"rewards of rows {i}"
            eids, aids, n = self._resolve_ids(s, m.episode_ids, m.agent_ids, what)
            if not m.HasField("rewards"):
                raise invalid_argument(f"{what}: no rewards tensor")
            rew = tensors.from_tensor(m.rewards)
            if rew.shape != (n,) or rew.dtype.kind != "f":
                raise invalid_argument(f"{what}: expected float32 rewards of shape ({n},), "
                                       f"got {rew.dtype} {rew.shape}")
            if not math.isfinite(rew.sum()):  # one reduction on the fast path
                bad = int((~np.isfinite(rew)).argmax())
                raise invalid_argument(f"{what}: reward of row {bad} is {rew[bad]}, not a finite number")
            term = self._flags(m.terminated, n, f"{what}: terminated")
            trunc = self._flags(m.truncated, n, f"{what}: truncated")
            any_done = any(m.terminated) or any(m.truncated)  # the wire lists: empty when no flags
            if not s.multi_agent and any_done:
                raise invalid_argument(f"{what}: ExternalEnv ends episodes with EndEpisode, "
                                       f"not with done flags")
            if m.infos and len(m.infos) != n:
                raise invalid_argument(f"{what}: {len(m.infos)} infos for {n} rows")
            final = None
            if m.HasField("final_observations"):
                spec = self._rows_spec(s, [a for a in aids if a != ALL_AGENTS], what)
                final = sb_spaces.decode_value(spec.obs_space, m.final_observations, n,
                                               f"final observations of rows {i}")
            if not s.multi_agent:  # one agent per episode; it is done only when the episode is
                episodes = s.episodes
                eps = [episodes.get(e) for e in eids]
                if None in eps:
                    self._open_episode(s, eids[eps.index(None)])  # raises the precise error
                plans.append((m, aids, eps, rew, term, trunc, final))
                continue
            eps = []
            for j, (eid, aid) in enumerate(zip(eids, aids)):
                ep = self._open_episode(s, eid)
                st = ep.agents.get(aid)
                if st is not None and st.done:
                    raise failed_precondition(f"agent {aid!r} is already done in episode {eid!r}", Reason.EPISODE_ENDED)
                seen[(eid, aid)] = seen.get((eid, aid), 0) + 1
                eps.append(ep)
            plans.append((m, aids, eps, rew, term, trunc, final))
        # An agent marked done may not appear again anywhere in the request: a
        # reward after its end would count in totals but never reach a transition.
        for pair in self._done_in(plans):
            if seen[pair] > 1:
                raise invalid_argument(f"agent {pair[1]!r} of episode {pair[0]!r} is marked done and "
                                       f"appears more than once in one request")
        return plans

    @staticmethod
    def _done_in(plans) -> set:
        """(episode_id, agent_id) pairs that the planned returns finish ("__all__" included)."""
        out = set()
        for m, aids, eps, rew, term, trunc, final in plans:
            if not (m.terminated or m.truncated):
                continue
            for j, (ep, aid) in enumerate(zip(eps, aids)):
                if term[j] or trunc[j]:
                    out.add((ep.episode_id, aid))
        return out

    def _apply_returns(self, s: Session, plans) -> None:
        """Lock held, plans validated: rewards accrue until each agent's next action."""
        ending: Dict[str, Tuple[Episode, bool]] = {}
        for m, aids, eps, rew, term, trunc, final in plans:
            sts = [ep.agents.get(aid) or self._agent(ep, aid, s.spec_for(aid)) if aid != ALL_AGENTS else None
                   for ep, aid in zip(eps, aids)]
            simple = not (m.terminated or m.truncated or m.infos) and None not in sts
            if simple and (not s.multi_agent or all([st.table is sts[0].table for st in sts])):
                tb = sts[0].table  # the common case: one vectorised update
                slots = np.fromiter((st.slot for st in sts), np.int64, len(sts))
                np.add.at(tb.reward_acc, slots, rew)
                np.add.at(tb.reward_total, slots, rew)
                continue
            for j, (ep, aid, st) in enumerate(zip(eps, aids, sts)):
                if st is None:  # "__all__"
                    if term[j] or trunc[j]:
                        ending[ep.episode_id] = (ep, bool(trunc[j]) and not term[j])
                    continue
                r = float(rew[j])
                st.table.reward_acc[st.slot] += r
                st.table.reward_total[st.slot] += r
                if m.infos:
                    st.info = json_format.MessageToDict(m.infos[j])
                if term[j] or trunc[j]:
                    if st.pending:
                        new_obs = tree.take(final, j) if final is not None else st.table.row(st.slot, "obs")
                        self._emit(ep, st, new_obs, terminated=bool(term[j]), truncated=not term[j])
                    st.done = True
        for ep, truncated in ending.values():
            self._finish_episode(s, ep, {}, truncated=truncated, reason="truncated" if truncated else "terminated")

    @staticmethod
    def _flags(values, n: int, what: str):
        if len(values) == 0:
            return _NO_FLAGS if n <= len(_NO_FLAGS) else (False,) * n
        if len(values) != n:
            raise invalid_argument(f"{what}: {len(values)} flags for {n} rows")
        return list(values)

    def _end_episode(self, s: Session, req: pb.EndEpisodeRequest) -> pb.EndEpisodeResponse:
        eids = list(req.episode_ids)
        if not eids:
            raise invalid_argument("EndEpisode: no episode ids")
        if len(set(eids)) != len(eids):
            raise invalid_argument("EndEpisode: episode ids repeat within the request")
        if len(req.truncated) not in (0, 1, len(eids)):
            raise invalid_argument(f"EndEpisode: {len(req.truncated)} truncated flags for {len(eids)} "
                                   f"episodes; give one per episode or one for all")
        finals: Dict[str, Dict[str, object]] = {eid: {} for eid in eids}
        for i, m in enumerate(req.final_observations):
            what = f"final observations of rows {i}"
            f_eids, f_aids, n = self._resolve_ids(s, m.episode_ids, m.agent_ids, what)
            spec = self._rows_spec(s, f_aids, what)
            obs = sb_spaces.decode_value(spec.obs_space, m.observations, n, what)
            for j, (eid, aid) in enumerate(zip(f_eids, f_aids)):
                if eid not in finals:
                    raise invalid_argument(f"{what}: episode {eid!r} is not among the episodes being ended")
                finals[eid][aid] = tree.take(obs, j)
        with self._lock:
            eps = [self._open_episode(s, eid) for eid in eids]
            starts = list(req.start_episode_ids)
            if starts:
                self._check_new_ids(s, starts, ending=len(eids))
            plans = self._check_returns(s, req.rewards)
            if any(aid == ALL_AGENTS for _, aid in self._done_in(plans)):
                raise invalid_argument("EndEpisode: attached rewards may not mark '__all__' done: "
                                       "EndEpisode ends the episode itself")
            self._apply_returns(s, plans)
            for k, ep in enumerate(eps):
                tr = bool(req.truncated[0 if len(req.truncated) == 1 else k]) if req.truncated else False
                self._finish_episode(s, ep, finals[ep.episode_id], truncated=tr,
                                  reason="truncated" if tr else "terminated")
            if starts:
                training = req.start_training_enabled if req.HasField("start_training_enabled") else True
                self._open_episodes(s, starts, training)
            batch = self.collector.ready()
        self._deliver(batch)
        return pb.EndEpisodeResponse()

    def _close_session(self, s: Session, req) -> pb.CloseSessionResponse:
        return self.close_session(s, req)

    def _finish_episode(self, s: Session, ep: Episode, finals: dict, truncated: bool, reason: str,
                     drop_pending: bool = False) -> None:
        """Lock held. Completes every pending agent transition and files the summary."""
        for aid, st in ep.agents.items():
            if st.pending and not st.done:
                if drop_pending:
                    st.table.pending[st.slot] = False  # its outcome was never observed
                else:
                    final = finals.get(aid)
                    if final is None:
                        final = st.table.row(st.slot, "obs")
                    self._emit(ep, st, final, terminated=not truncated, truncated=truncated)
            st.done = True
        del s.episodes[ep.episode_id]
        s.episodes_ended += 1
        s.finished[ep.episode_id] = reason
        while len(s.finished) > self.config.finished_ids_kept:
            s.finished.popitem(last=False)
        if ep.training_enabled:
            self.collector.end_episode(ep)
        summary = ep.summary(reason)
        ep.release()
        self.file_summary(summary)

    def file_summary(self, summary: dict) -> None:
        """Lock held. An ended episode's summary into the metrics and to the episode-end hooks
        (every kind of episode: rows, batched slots, uploads from clients acting locally)."""
        self.file_summaries((summary,))

    def file_summaries(self, summaries) -> None:
        """Lock held. file_summary for several episodes at once (a Step ends a dozen)."""
        self.metrics.episodes += len(summaries)
        self.metrics.recent.extend(summaries)
        for cb in self.episode_end_callbacks:
            for summary in summaries:
                try:
                    cb(summary)
                except Exception:  # a faulty hook must not break the bridge
                    log.exception("episode_end callback failed")

    # ------------------------------------------------------------ introspection

    def flush(self) -> None:
        """Hand whatever experience is collected to the queue now."""
        with self._lock:
            for s in self._sessions.values():
                self._commit_pending(s)
                slots.hand_over(self, s)
            batch = self.collector.flush()
        self._deliver(batch)
        self.settle_all()

    def snapshot(self) -> dict:
        with self._lock:
            for s in self._sessions.values():   # answered calls count, settled or not
                self._commit_pending(s)
            returns = [x["total_reward"] for x in self.metrics.recent]
            return {
                "sessions": len(self._sessions),
                "open_episodes": sum(len(s.episodes) + (s.slots.n if s.slots and not s.slots.closed else 0)
                                     for s in self._sessions.values()),
                "episodes": self.metrics.episodes,
                "env_steps": self.metrics.env_steps,
                "agent_steps": self.metrics.agent_steps,
                "episode_return_mean": float(np.mean(returns)) if returns else None,
                "policy_return_mean": self.metrics.policy_return_means(),
                "policy_return_mean_10": self.metrics.policy_return_means(10),
                "policy_versions": {pid: p.version for pid, p in self._policies.items()},
                "experience_queue": self.experience.qsize(),
                "experience_blocked_puts": self.experience.blocked_puts,
                "uploaded_steps": self.metrics.uploaded_steps,
                "upload_refused_chunks": self.metrics.upload_refused_chunks,
                "upload_refused_steps": self.metrics.upload_refused_steps,
            }
