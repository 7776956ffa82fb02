"""Sessions: one simulator connection's spaces, episodes and call history.

The SessionTable creates, resumes, finds, attaches and closes them, keeps the
answers of recent calls for resends (seq), and names the sessions whose client
is gone (reap) or stuck (step timeout).

Ownership: a session belongs to the client that created it (`owner`, an opaque
identity the transport gives: the credential, or the peer's host); resuming it
or calling it from another client is PERMISSION_DENIED, and one owner holds at
most max_sessions_per_client live sessions.

Sequence numbers: a session applies seq last_seq + 1 next (0: unchecked). A
resend is the same seq with the same digest (of the request's body, without
its header: the same request over another transport matches); it gets the
kept answer, or the kept error, again. Another request under an applied seq is
SEQ_REUSED; a seq that skips ahead is SEQ_OUT_OF_ORDER; a resend of the seq
being served right now is CALL_IN_PROGRESS.
"""
import collections
import hashlib
import logging
import struct
import time
import uuid
import zlib
from typing import Callable, Dict, List, Optional

import grpc

from simbridge.wire import checks, leaf_codec
from simbridge.wire import spaces as sb_spaces
from simbridge.server.episodes import Episode
from simbridge.wire.columns import ALL_AGENTS
from simbridge.wire.errors import (BridgeError, Reason, failed_precondition, invalid_argument, not_found,
                                   resource_exhausted)
from simbridge.wire.v1 import simbridge_pb2 as pb

log = logging.getLogger("simbridge")


class SpaceSpec:
    """An observation/action space pair, with the wire form kept for comparison."""

    def __init__(self, obs_space, act_space):
        self.obs_space = obs_space
        self.act_space = act_space
        self.key = space_key(obs_space, act_space)
        # Observations of these spaces, decoded and validated as spaces.decode_value does,
        # compiled once: every GetAction and Step of the session's agents decodes them.
        self.decode_obs = leaf_codec.batch_decoder(obs_space)
        # What one open episode (one agent) of these spaces makes the server keep, at most: its
        # observation and action at 8 bytes an element, twice (slot tables grow by doubling),
        # and the episode's own objects.
        self.row_bytes = 16 * (sb_spaces.space_elements(obs_space) + sb_spaces.space_elements(act_space)) \
            + EPISODE_OVERHEAD_BYTES
        # The spaces themselves (Box bounds): the wire form, and gymnasium's arrays.
        self.space_bytes = 3 * (len(self.key[0]) + len(self.key[1]))
        # frame_stack.py: this spec's stacked views by depth k, and, on such a view, its Stacker.
        self.stacked: Dict[int, "SpaceSpec"] = {}
        self.frames = None


# An open episode's Python objects (Episode, AgentState, dicts) and its id, measured ~1.5 KB.
EPISODE_OVERHEAD_BYTES = 2048


class ClientState:
    """What one client (a session owner) holds on the server: its live sessions, and the bytes
    its sessions' spaces, open episodes and slots make the server keep (runtime lock held for
    every change). Bounded by max_sessions_per_client and max_client_state_bytes."""
    __slots__ = ("sessions", "state_bytes")

    def __init__(self):
        self.sessions = 0
        self.state_bytes = 0


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
        self.owner = ""
        self.client: Optional[ClientState] = None   # shared by the owner's sessions
        self.fixed_bytes = 0                        # its spaces and slots, charged to the client
        self.last_seq = 0
        self.serving_seq = 0    # the seq being applied now (0: none)
        # seq -> (request digest, its answer: a response, or the BridgeError it failed with, its size)
        self.responses: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()
        self.responses_bytes = 0
        self.closed = False
        self.episodes_ended = 0
        self.slots = None   # slots.SlotBank of a batched simulator (CreateSession.num_slots)
        # The bookkeeping of the last streamed call, answered but not yet applied (settle()).
        self.pending: Optional[Callable[[], None]] = None
        self.local = None   # uploads state of a client that acts locally

    def spec_for(self, agent_id: str) -> SpaceSpec:
        return self.agent_specs.get(agent_id, self.default)

    def open_episodes(self) -> int:
        """The row calls' open episodes, and a Step session's: one per slot until its final Step."""
        bank = self.slots
        return len(self.episodes) + (bank.n if bank is not None and not bank.closed else 0)

    def settle(self) -> bool:
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


_WHOLE = 16 << 10   # bodies up to this are hashed whole; beyond, their ends and a CRC of the rest


def request_digest(method: str, req) -> bytes:
    """What identifies a request for resends: the call and the request's deterministic bytes
    without its header (a stream may leave session_id out where a unary call sets it). The
    header is field 1, serialized first: its tag, length and bytes are skipped, not re-encoded.

    A body over 16 KiB (a camera's frame) is its length, its first and last 4 KiB under
    SHA-256 and the whole under CRC-32: SHA-256 of a 320x240 frame cost 160 µs a call, a third
    of the bridge's work per step. The digest guards a client against its own mistake (a seq
    reused for another request: SEQ_REUSED), not against an adversary: only a session's owner
    reaches its answers. A reused seq whose request differs only inside the frame goes unnoticed
    once in 2**32."""
    data = req.SerializeToString(deterministic=True)
    skip = 0
    if req.HasField("header"):
        n = req.header.ByteSize()
        skip = 1 + max(1, (n.bit_length() + 6) // 7) + n
        assert data[:1] == b"\n", "RequestHeader is field 1 of every request"
    body = memoryview(data)[skip:]
    h = hashlib.sha256(method.encode())
    if len(body) <= _WHOLE:
        h.update(body)
    else:
        h.update(struct.pack("<QI", len(body), zlib.crc32(body)))
        h.update(body[:4096])
        h.update(body[-4096:])
    return h.digest()[:16]


def check_state(client: "ClientState", more: int, limit: int, what: str) -> None:
    """Lock held. RESOURCE_EXHAUSTED / TOO_MANY_EPISODES unless the client may keep `more` bytes."""
    if client.state_bytes + more > limit:
        raise resource_exhausted(
            f"{what} would take the server's memory for this client past its limit of {limit:,} bytes "
            f"(ServerLimits.max_client_state_bytes; it holds {client.state_bytes:,}, open episodes count "
            f"by their spaces' size): end episodes or close sessions first", Reason.TOO_MANY_EPISODES)


def not_owner() -> BridgeError:
    return BridgeError(grpc.StatusCode.PERMISSION_DENIED, "this session belongs to another credential",
                       Reason.NOT_SESSION_OWNER)


def _other_service(s: Session) -> str:
    return "ExternalMultiAgentEnv" if s.multi_agent else "ExternalEnv"


class SessionTable:
    def __init__(self, config, lock):
        self.config = config
        self._lock = lock           # the runtime's lock
        self._sessions: Dict[str, Session] = {}
        self._clients: Dict[str, ClientState] = {}   # owner -> what it holds

    def resume(self, session_id: str, multi_agent: bool, client: str = "") -> Optional[Session]:
        """The live session to resume, or None (gone: the caller creates a new one)."""
        checks.ids((session_id,), self.config.max_id_bytes, "resume_session_id")
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return None
            if s.owner != client:
                raise not_owner()
            if s.multi_agent != multi_agent:
                raise failed_precondition(f"session {s.session_id!r} belongs to {_other_service(s)}: "
                                          f"resume it there", Reason.WRONG_SESSION)
            s.detached_since = None
            s.last_active = time.monotonic()
        log.info("session %s resumed (%d open episodes)", s.session_id, s.open_episodes())
        return s

    def create(self, req: pb.CreateSessionRequest, multi_agent: bool,
               make_bank: Callable[[Session, pb.CreateSessionRequest], object], client: str = "") -> Session:
        """A new session from CreateSession, owned by `client`; make_bank gives its slots (runs
        without the lock: it may create a policy)."""
        limit = self.config.max_id_bytes
        checks.ids((req.client_name,), limit, "client_name")
        checks.ids([a.agent_id for a in req.agents], limit, "agent id")
        if not req.HasField("observation_space") or not req.HasField("action_space"):
            raise invalid_argument("CreateSession needs observation_space and action_space")
        default = SpaceSpec(self._space(req.observation_space, "observation_space"),
                            self._space(req.action_space, "action_space"))
        agent_specs = {}
        if req.agents and not multi_agent:
            raise invalid_argument("ExternalEnv sessions have one agent: use ExternalMultiAgentEnv to declare agents")
        for a in req.agents:
            if not a.agent_id or a.agent_id == ALL_AGENTS:
                raise invalid_argument(f"invalid agent id {a.agent_id!r}")
            where = f"agent {a.agent_id!r}"
            obs = self._space(a.observation_space, f"{where} observation_space") \
                if a.HasField("observation_space") else default.obs_space
            act = self._space(a.action_space, f"{where} action_space") \
                if a.HasField("action_space") else default.act_space
            agent_specs[a.agent_id] = SpaceSpec(obs, act)
        fixed = default.space_bytes + sum(spec.space_bytes for spec in agent_specs.values()) \
            + max(0, req.num_slots) * default.row_bytes
        with self._lock:
            self._check_room(client, fixed)   # before the bank: it may build a policy
        s = Session(uuid.uuid4().hex, multi_agent, default, agent_specs, req.client_name)
        s.owner = client
        s.slots = make_bank(s, req)
        with self._lock:
            self._check_room(client, fixed)   # others may have been created meanwhile
            self._sessions[s.session_id] = s
            s.client = self._clients.setdefault(client, ClientState())
            s.client.sessions += 1
            s.client.state_bytes += fixed
            s.fixed_bytes = fixed
        log.info("session %s created for %r (%s)", s.session_id, req.client_name,
                 "multi-agent" if multi_agent else "single-agent")
        return s

    def _space(self, msg: pb.Space, what: str):
        space = sb_spaces.space_from_proto(msg, what)
        limit = self.config.max_space_elements
        n = sb_spaces.space_elements(space)
        if n > limit:
            raise resource_exhausted(f"{what} has {n} elements, more than the server's limit of {limit} "
                                     f"(ServerLimits.max_space_elements): send smaller observations or "
                                     f"actions, or raise the server's max_space_elements", Reason.SPACE_TOO_LARGE)
        return space

    def _check_room(self, client: str, fixed: int) -> None:
        """Lock held."""
        c = self.config
        held = self._clients.get(client) or ClientState()
        if held.sessions >= c.max_sessions_per_client:
            raise resource_exhausted(f"this client already holds {c.max_sessions_per_client} live sessions, the "
                                     f"server's limit (ServerLimits.max_sessions_per_client): close sessions "
                                     f"(CloseSession) before creating more", Reason.TOO_MANY_SESSIONS)
        check_state(held, fixed, c.max_client_state_bytes, "this session's spaces and slots")

    def get(self, session_id: str, multi_agent: Optional[bool] = None, client: Optional[str] = None) -> Session:
        """The live session; multi_agent: the service asking (None: either); client: the caller,
        which must own it (None: not checked, the session's own stream or an inspection)."""
        with self._lock:
            s = self._sessions.get(session_id)
        if s is None:
            checks.ids((session_id,), self.config.max_id_bytes, "session_id")
            raise not_found(f"unknown session {session_id!r} (expired, closed, or from before a server "
                            f"restart): call CreateSession again", Reason.SESSION_UNKNOWN)
        if client is not None and s.owner != client:
            raise not_owner()
        if multi_agent is not None and s.multi_agent != multi_agent:
            raise failed_precondition(f"session {session_id!r} was created on {_other_service(s)}: "
                                      f"call that service", Reason.WRONG_SESSION)
        return s

    def remove(self, s: Session) -> None:
        """Lock held. The session is closed: forget it."""
        s.closed = True
        if self._sessions.pop(s.session_id, None) is not None:
            s.client.sessions -= 1
            s.client.state_bytes -= s.fixed_bytes   # its episodes were released as they ended
            if not s.client.sessions:
                del self._clients[s.owner]

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
                            "reconnect", s.session_id, s.open_episodes(), self.config.reconnect_grace_s)

    def gone(self, now: float) -> List[Session]:
        """Sessions whose client is gone: stream detached past the grace, or unary idle too long."""
        c = self.config
        with self._lock:
            return [s for s in self._sessions.values() if s.streams == 0 and (
                (s.detached_since is not None and now - s.detached_since > c.reconnect_grace_s)
                or (s.detached_since is None and now - s.last_active > c.session_timeout_s))]

    def stuck(self, now: float) -> List[Session]:
        """Sessions with open episodes or live slots whose simulator made no call for longer than
        step_timeout_s, stream attached or not (a stopped or hung simulator keeps its stream).
        Clients acting locally upload when their buffer fills: session_timeout_s covers them."""
        timeout = self.config.step_timeout_s
        if timeout <= 0:
            return []
        with self._lock:
            return [s for s in self._sessions.values() if now - s.last_active > timeout and (
                s.episodes or (s.slots is not None and not s.slots.closed))]

    # ---- resends: a call's answer is kept by seq and digest, a resend gets it again
    def answered(self, s: Session, seq: int, digest: bytes):
        """None when seq is to be applied now (0, or last_seq + 1: then it is being served until
        remember() or forget()); the kept answer (a response, or the BridgeError to raise again)
        of a resend. Raises for a seq that is neither. Marks the session active."""
        with self._lock:
            s.last_active = time.monotonic()
            if not seq:
                return None
            if seq == s.last_seq + 1:
                if s.serving_seq == seq:
                    raise failed_precondition(f"request seq {seq} is still being served: wait for its answer",
                                              Reason.CALL_IN_PROGRESS)
                s.serving_seq = seq
                return None
            if seq > s.last_seq:
                raise invalid_argument(f"request seq {seq} skips ahead: the session's next seq is "
                                       f"{s.last_seq + 1} (seqs count up by one per request; a "
                                       f"resumed session's CreateSessionResponse.last_seq says where it is)",
                                       Reason.SEQ_OUT_OF_ORDER)
            kept = s.responses.get(seq)
            if kept is None:
                raise failed_precondition(f"request seq {seq} was already applied and its answer is "
                                          f"no longer kept (last applied: {s.last_seq})", Reason.ALREADY_APPLIED)
            if kept[0] != digest:
                raise invalid_argument(f"request seq {seq} was already applied to another request: a resend "
                                       f"repeats its request exactly; a new request takes the next seq "
                                       f"({s.last_seq + 1})", Reason.SEQ_REUSED)
            return kept[1]

    def remember(self, s: Session, seq: int, digest: bytes, answer) -> None:
        """seq was applied (or refused for good): its answer, a response or a BridgeError, is kept
        for resends."""
        c = self.config
        size = answer.ByteSize() if not isinstance(answer, BridgeError) else len(answer.message) + 64
        with self._lock:
            s.last_seq = max(s.last_seq, seq)
            s.serving_seq = 0
            if size > c.response_cache_bytes:   # never kept: a resend of it is ALREADY_APPLIED
                return
            s.responses[seq] = (digest, answer, size)
            s.responses_bytes += size
            while len(s.responses) > c.response_cache_size or s.responses_bytes > c.response_cache_bytes:
                s.responses_bytes -= s.responses.popitem(last=False)[1][2]

    def forget(self, s: Session, seq: int) -> None:
        """seq had no effect and may be sent again (a full queue, a call in progress)."""
        with self._lock:
            if s.serving_seq == seq:
                s.serving_seq = 0
