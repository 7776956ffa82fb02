"""Sessions: one simulator connection's spaces, episodes and call history.

The SessionTable creates, resumes, finds, attaches and closes them, keeps the
answers of recent calls for resends (seq), and names the sessions whose client
is gone (reap).
"""
import collections
import logging
import time
import uuid
from typing import Callable, Dict, List, Optional

from simbridge.wire import spaces as sb_spaces
from simbridge.server.episodes import Episode
from simbridge.wire.columns import ALL_AGENTS
from simbridge.wire.errors import Reason, failed_precondition, invalid_argument, not_found
from simbridge.wire.v1 import simbridge_pb2 as pb

log = logging.getLogger("simbridge")


class SpaceSpec:
    """An observation/action space pair, with the wire form kept for comparison."""

    def __init__(self, obs_space, act_space):
        self.obs_space = obs_space
        self.act_space = act_space
        self.key = space_key(obs_space, act_space)


def space_key(obs_space, act_space) -> tuple:
    return (sb_spaces.space_to_proto(obs_space).SerializeToString(deterministic=True),
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
        self.local = None   # uploads state of a client that acts locally

    def spec_for(self, agent_id: str) -> SpaceSpec:
        return self.agent_specs.get(agent_id, self.default)

    def commit_pending(self) -> bool:
        """Runtime lock held. Applies the answered call's bookkeeping; False: none was left."""
        commit, self.pending = self.pending, None
        if commit is None:
            return False
        commit()
        return True

    def mark_finished(self, episode_id: str, reason: str, kept: int) -> None:
        """Runtime lock held. Remembers an ended episode id (the last `kept` of them) for
        precise "already ended" errors."""
        self.finished[episode_id] = reason
        while len(self.finished) > kept:
            self.finished.popitem(last=False)


def _other_service(s: Session) -> str:
    return "ExternalMultiAgentEnv" if s.multi_agent else "ExternalEnv"


class SessionTable:
    def __init__(self, config, lock):
        self.config = config
        self._lock = lock           # the runtime's lock
        self._sessions: Dict[str, Session] = {}

    def resume(self, session_id: str, multi_agent: bool) -> Optional[Session]:
        """The live session to resume, or None (gone: the caller creates a new one)."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return None
            if s.multi_agent != multi_agent:
                raise failed_precondition(f"session {s.session_id!r} belongs to {_other_service(s)}: "
                                          f"resume it there", Reason.WRONG_SESSION)
            s.detached_since = None
            s.last_active = time.monotonic()
        log.info("session %s resumed (%d open episodes)", s.session_id, len(s.episodes))
        return s

    def create(self, req: pb.CreateSessionRequest, multi_agent: bool,
               make_bank: Callable[[Session, pb.CreateSessionRequest], object]) -> Session:
        """A new session from CreateSession; make_bank gives its slots (runs without the lock:
        it may create a policy)."""
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
        s.slots = make_bank(s, req)
        with self._lock:
            self._sessions[s.session_id] = s
        log.info("session %s created for %r (%s)", s.session_id, req.client_name,
                 "multi-agent" if multi_agent else "single-agent")
        return s

    def get(self, session_id: str, multi_agent: Optional[bool] = None) -> Session:
        """The live session; multi_agent: the service asking (None: either)."""
        with self._lock:
            s = self._sessions.get(session_id)
        if s is None:
            raise not_found(f"unknown session {session_id!r} (expired, closed, or from before a server "
                            f"restart): call CreateSession again", Reason.SESSION_UNKNOWN)
        if multi_agent is not None and s.multi_agent != multi_agent:
            raise failed_precondition(f"session {session_id!r} was created on {_other_service(s)}: "
                                      f"call that service", Reason.WRONG_SESSION)
        return s

    def remove(self, s: Session) -> None:
        """Lock held. The session is closed: forget it."""
        s.closed = True
        self._sessions.pop(s.session_id, None)

    def ids(self) -> List[str]:
        with self._lock:
            return list(self._sessions)

    def all(self) -> List[Session]:
        with self._lock:
            return list(self._sessions.values())

    def __len__(self) -> int:
        return len(self._sessions)

    # ---- streams and liveness
    def attach(self, s: Session) -> None:
        with self._lock:
            s.streams += 1
            s.detached_since = None

    def detach(self, s: Session) -> None:
        with self._lock:
            s.streams -= 1
            if s.streams == 0 and not s.closed:
                s.detached_since = time.monotonic()
                log.warning("session %s lost its stream with %d open episodes; keeping it %.0fs for a "
                            "reconnect", s.session_id, len(s.episodes), self.config.reconnect_grace_s)

    def gone(self, now: float) -> List[Session]:
        """Sessions whose client is gone: stream detached past the grace, or unary idle too long."""
        c = self.config
        with self._lock:
            return [s for s in self._sessions.values() if s.streams == 0 and (
                (s.detached_since is not None and now - s.detached_since > c.reconnect_grace_s)
                or (s.detached_since is None and now - s.last_active > c.session_timeout_s))]

    # ---- resends: a call's answer is kept by seq, a resend gets it again
    def answered(self, s: Session, seq: int):
        """The kept answer to seq when it was already applied, else None (apply it).
        Marks the session active."""
        with self._lock:
            s.last_active = time.monotonic()
            if not seq or seq > s.last_seq:
                return None
            cached = s.responses.get(seq)
            if cached is None:
                raise failed_precondition(f"request seq {seq} was already applied and its answer is "
                                          f"no longer kept (last applied: {s.last_seq})", Reason.ALREADY_APPLIED)
            return cached

    def remember(self, s: Session, seq: int, resp) -> None:
        with self._lock:
            s.last_seq = max(s.last_seq, seq)
            s.responses[seq] = resp
            while len(s.responses) > self.config.response_cache_size:
                s.responses.popitem(last=False)
