"""The bridge's runtime: one call in, one answer out, for every transport.

Transport-free: every call takes the request message and returns the response
message, so the unary RPCs and the Stream share one code path (service.py).
The runtime looks the session up, answers resends from the session's cache,
dispatches through an explicit table to the room that serves the call (rows.py,
slots.py, uploads.py) and remembers the answer. The rooms share one
ServerContext (context.py): configuration, lock, policies, collector, queue,
metrics. Each call validates everything first and raises BridgeError before
changing any state.
"""
import logging
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import grpc
import numpy as np

from simbridge.server.batcher import DynamicBatcher
from simbridge.server.context import PolicyMappingFn, ServerContext
from simbridge.server.experience import ExperienceQueue
from simbridge.server.mapping import DEFAULT_POLICY
from simbridge.server.policies import Policy, PolicyRegistry, random_policy_factory
from simbridge.server.rows import RowCalls
from simbridge.server.sessions import Session, SessionTable, request_digest, space_key
from simbridge.server.slots import SlotCalls
from simbridge.server.uploads import UploadCalls
from simbridge.wire import checks
from simbridge.wire.errors import (SEQ_NOT_SPENT, BridgeError, Reason, failed_precondition, invalid_argument,
                                   not_found)
from simbridge.wire.v1 import simbridge_pb2 as pb

log = logging.getLogger("simbridge")

SERVER_VERSION = "simbridge 0.1.0"

PolicyFactory = Callable[[str, object, object], Policy]



@dataclass
class BridgeConfig:
    rollout_fragment_length: int = 200
    batch_mode: str = "truncate_episodes"      # or "complete_episodes"
    count_steps_by: str = "env_steps"          # or "agent_steps"
    max_message_bytes: int = 64 * 1024 * 1024
    max_rows_per_request: int = 16384
    max_open_episodes_per_session: int = 10_000  # also bounds a local client's upload table
    session_timeout_s: float = 120.0           # unary sessions: idle this long -> closed
    reconnect_grace_s: float = 30.0            # stream sessions: detached this long -> closed
    max_batch_rows: int = 4096                 # dynamic batcher
    max_wait_ms: float = 0.0
    experience_queue_size: int = 64
    response_cache_size: int = 256             # answers kept for resent requests
    finished_ids_kept: int = 100               # for precise "already ended" errors, per session
    upload_queue_wait_s: float = 0.2           # UploadExperience: wait this long for room in the
                                               # experience queue, then refuse (RESOURCE_EXHAUSTED)
    # Limits no client can break (ServerLimits in the proto says what each refuses with).
    max_concurrent_calls: int = 512            # open calls, streams included, server-wide
    max_calls_per_client: int = 256            # ... from one client (credential, or host)
    max_calls_per_connection: int = 256        # ... on one HTTP/2 connection (clients of one process
                                               # share one: grpc pools connections by target)
    max_sessions_per_client: int = 256
    max_id_bytes: int = 256                    # episode ids, agent ids, client names
    # What one client's sessions make the server keep: their spaces, slots and open episodes
    # (each by its spaces' size, SpaceSpec.row_bytes), docs/limits.md.
    max_client_state_bytes: int = 2 << 30
    response_cache_bytes: int = 4 << 20        # answers kept for resends, per session
    max_space_elements: int = 1 << 20          # elements of one observation or action
    step_timeout_s: float = 0.0                # open episodes, no call this long: closed (0: never)
    # Streamed GetAction/Step are answered before their bookkeeping is applied (settle()), while
    # the simulator steps; False applies it first (a journal then holds every answered step).
    answer_before_commit: bool = True


class BridgeRuntime:
    def __init__(self, config: Optional[BridgeConfig] = None,
                 policy_mapping_fn: Optional[PolicyMappingFn] = None,
                 policy_factory: Optional[PolicyFactory] = None,
                 experience: Optional[ExperienceQueue] = None,
                 frame_stacks: Optional[Dict[str, int]] = None):
        self.config = c = config or BridgeConfig()
        self.policy_factory = policy_factory or random_policy_factory
        # The registry calls the factory through the runtime: it may be replaced after start.
        self.policies = PolicyRegistry(
            lambda pid, obs_space, act_space: self.policy_factory(pid, obs_space, act_space),
            space_key, lambda policy, explore=True: DynamicBatcher(policy, c.max_batch_rows, c.max_wait_ms, explore))
        self.frame_stacks = frame_stacks or {}
        self.over: Optional[str] = None   # end_training's words: every call but CloseSession is refused
        self.episode_end_callbacks: List[Callable[[dict], None]] = []
        self.ctx = ServerContext(c, self.policies,
                                 policy_mapping_fn or (lambda agent_id, episode: DEFAULT_POLICY),
                                 experience or ExperienceQueue(c.experience_queue_size),
                                 self.episode_end_callbacks)
        self.experience = self.ctx.experience
        self.collector = self.ctx.collector
        self.metrics = self.ctx.metrics
        self.sessions = SessionTable(c, self.ctx.lock)
        self.rows = RowCalls(self.ctx)
        self.slots = SlotCalls(self.ctx)
        self.uploads = UploadCalls(self.ctx)
        # Every call a session may make, by the name service.py gives it. Each takes
        # (session, request, defer): defer=True (a stream) may leave the call's bookkeeping
        # pending for settle(), after the answer is sent (GetAction, Step).
        self._calls = {
            "start_episode": self.rows.start_episode,
            "get_action": self.rows.get_action,
            "log_action": self.rows.log_action,
            "log_returns": self.rows.log_returns,
            "end_episode": self.rows.end_episode,
            "step": self.slots.step,
            "get_policy": self.uploads.get_policy,
            "upload_experience": self.uploads.upload_experience,
            "close_session": lambda s, req, defer: self.close_session(s, req),
        }

    @property
    def frame_stacks(self) -> Dict[str, int]:
        """Policy id -> the frames it stacks per agent (frame_stack.py; absent: 1). Set before serving."""
        return self.policies.frame_stacks

    @frame_stacks.setter
    def frame_stacks(self, stacks: Dict[str, int]) -> None:
        self.policies.frame_stacks = {pid: int(k) for pid, k in stacks.items() if k != 1}

    @property
    def policy_mapping_fn(self) -> PolicyMappingFn:
        return self.ctx.policy_mapping_fn

    @policy_mapping_fn.setter
    def policy_mapping_fn(self, fn: PolicyMappingFn) -> None:
        self.ctx.policy_mapping_fn = fn

    # ------------------------------------------------------------ policies

    def add_policy(self, policy_id: str, policy: Policy) -> None:
        self.policies.add(policy_id, policy)

    def policy(self, policy_id: str) -> Policy:
        return self.policies[policy_id]

    def batcher(self, policy_id: str) -> DynamicBatcher:
        return self.policies.batcher(policy_id)

    # ------------------------------------------------------------ sessions

    def create_session(self, req: pb.CreateSessionRequest, multi_agent: bool,
                       client: str = "") -> pb.CreateSessionResponse:
        """client: the caller's identity from the transport (credential, or host), which owns the
        session; "" for in-process callers."""
        if self.over is not None:
            raise self._over()
        if req.resume_session_id:
            s = self.sessions.resume(req.resume_session_id, multi_agent, client)
            if s is not None:
                return self._session_response(s, resumed=True)
        s = self.sessions.create(req, multi_agent, self.slots.create_bank, client)
        return self._session_response(s, resumed=False)

    def end_training(self, why: str) -> None:
        """From now on every call but CloseSession is answered TRAINING_OVER, a simulator's normal
        end (the trainer's run reached its end: total_env_steps); the calls already in flight finish."""
        self.over = why

    def _refuse_over(self, s: Session, req, defer: bool):
        raise self._over()

    def _over(self) -> BridgeError:
        return failed_precondition(f"training is over ({self.over}): nothing more will be served",
                                   Reason.TRAINING_OVER)

    def _session_response(self, s: Session, resumed: bool) -> pb.CreateSessionResponse:
        c = self.config
        return pb.CreateSessionResponse(
            session_id=s.session_id, server_version=SERVER_VERSION, resumed=resumed, last_seq=s.last_seq,
            limits=pb.ServerLimits(max_message_bytes=c.max_message_bytes,
                                   max_rows_per_request=c.max_rows_per_request,
                                   max_open_episodes_per_session=c.max_open_episodes_per_session,
                                   session_timeout_s=c.session_timeout_s,
                                   reconnect_grace_s=c.reconnect_grace_s,
                                   max_concurrent_calls=c.max_concurrent_calls,
                                   max_calls_per_client=c.max_calls_per_client,
                                   max_calls_per_connection=c.max_calls_per_connection,
                                   max_sessions_per_client=c.max_sessions_per_client,
                                   max_id_bytes=c.max_id_bytes,
                                   max_space_elements=c.max_space_elements,
                                   step_timeout_s=c.step_timeout_s,
                                   max_client_state_bytes=c.max_client_state_bytes,
                                   response_cache_bytes=c.response_cache_bytes))

    def session(self, session_id: str, multi_agent: Optional[bool] = None) -> Session:
        """The live session (NOT_FOUND when it is not); multi_agent: the service asking, which
        must be the session's own (None: either, for inspection)."""
        return self.sessions.get(session_id, multi_agent)

    def session_ids(self) -> List[str]:
        """The ids of the live sessions."""
        return self.sessions.ids()

    def attach_stream(self, s: Session) -> None:
        self.sessions.attach(s)

    def detach_stream(self, s: Session) -> None:
        self.sessions.detach(s)

    def close_session(self, s: Session, req=None, reason: str = "session_closed") -> pb.CloseSessionResponse:
        with self.ctx.lock:
            s.settle()   # its last call was answered: it counts
            ended = self.rows.end_all(s, reason)
            self.slots.close_bank(s, reason)
            self.sessions.remove(s)
            batch = self.ctx.ready()
        self.ctx.deliver(batch)
        return pb.CloseSessionResponse(truncated_episode_ids=ended)

    def reap(self, now: Optional[float] = None) -> List[str]:
        """Close sessions whose client is gone, or stuck past step_timeout_s; returns their ids."""
        now = time.monotonic() if now is None else now
        dead = self.sessions.gone(now)
        for s in dead:
            log.warning("session %s (%s) is gone: ending its %d open episodes as truncated",
                        s.session_id, s.client_name, s.open_episodes())
            self.close_session(s, reason="client_lost")
        stuck = [s for s in self.sessions.stuck(now) if not s.closed]
        for s in stuck:
            log.warning("session %s (%s) made no call for %.1fs (step_timeout_s %.1fs) with %d open "
                        "episodes: closing it, its episodes end as truncated", s.session_id, s.client_name,
                        now - s.last_active, self.config.step_timeout_s, s.open_episodes())
            self.close_session(s, reason="step_timeout")
            with self.ctx.lock:
                self.metrics.sessions_timed_out += 1
        return [s.session_id for s in dead + stuck]

    # ------------------------------------------------------------ dispatch

    def handle(self, method: str, req, multi_agent: bool, bound: Optional[Session] = None,
               client: str = ""):
        """Run one call: session lookup (the caller must own it, unless the call comes on the
        session's own stream), resend detection, the call, delivery."""
        call = self._calls.get(method)
        if call is None:
            raise invalid_argument(f"unknown call {method!r}")
        if self.over is not None and method != "close_session":
            call = self._refuse_over   # a refusal like any other: it spends its seq, and a close follows
        header = req.header
        if bound is not None:
            if header.session_id and header.session_id != bound.session_id:
                checks.ids((header.session_id,), self.config.max_id_bytes, "session_id")
                raise invalid_argument(f"this stream is bound to session {bound.session_id!r}, "
                                       f"the request names {header.session_id!r}")
            if bound.closed:   # closed under the stream: timed out (step_timeout_s) or reaped
                raise not_found(f"session {bound.session_id!r} was closed by the server (no call for "
                                f"step_timeout_s, or closed by another call); its open episodes ended "
                                f"as truncated: create a new session", Reason.SESSION_UNKNOWN)
            s = bound
        else:
            if not header.session_id:
                raise invalid_argument("request header has no session_id: call CreateSession first")
            s = self.sessions.get(header.session_id, multi_agent, client)
        seq = header.seq
        self.settle(s)   # the previous call's bookkeeping, if its stream has not applied it yet
        if not seq:
            return call(s, req, bound is not None and self.config.answer_before_commit)
        digest = request_digest(method, req)
        kept = self.sessions.answered(s, seq, digest)
        if kept is not None:
            if isinstance(kept, BridgeError):
                raise kept
            return kept
        try:
            resp = call(s, req, bound is not None and self.config.answer_before_commit)
        except BridgeError as e:
            if e.reason in SEQ_NOT_SPENT:
                self.sessions.forget(s, seq)
            else:
                self.sessions.remember(s, seq, digest, e)
            raise
        except Exception:   # a bug: the seq is spent (the session goes on), a resend hears of it
            self.sessions.remember(s, seq, digest, BridgeError(
                grpc.StatusCode.INTERNAL, f"{method} seq {seq} failed inside the server", Reason.SERVER_FAILURE))
            raise
        self.sessions.remember(s, seq, digest, resp)
        return resp

    def settle(self, s: Session) -> None:
        """Apply the session's answered-but-pending bookkeeping, if any, and deliver what it
        completes (see ServerContext.settle)."""
        self.ctx.settle(s)

    def settle_all(self, timeout: float = 10.0) -> None:
        """Apply every answered call's pending bookkeeping and wait until the experience it
        completed is in the queue (whichever thread settles it)."""
        for s in self.sessions.all():
            self.ctx.settle(s)
        self.ctx.wait_settled(timeout)

    # ------------------------------------------------------------ introspection

    def flush(self) -> None:
        """Hand whatever experience is collected to the queue now."""
        with self.ctx.lock:
            for s in self.sessions.all():
                s.settle()
                self.slots.hand_over(s)
            batch = self.ctx.ready(flush=True)
        self.ctx.deliver(batch)
        self.settle_all()

    def snapshot(self) -> dict:
        with self.ctx.lock:
            sessions = self.sessions.all()
            for s in sessions:   # answered calls count, settled or not
                s.settle()
            returns = [x["total_reward"] for x in self.metrics.returns()]
            return {
                "sessions": len(sessions),
                "open_episodes": sum(s.open_episodes() for s in sessions),
                "episodes": self.metrics.episodes,
                "episodes_cut": self.metrics.episodes_cut,
                "env_steps": self.metrics.env_steps,
                "agent_steps": self.metrics.agent_steps,
                "episode_return_mean": float(np.mean(returns)) if returns else None,
                "policy_return_mean": self.metrics.policy_return_means(),
                "policy_return_mean_10": self.metrics.policy_return_means(10),
                "policy_length_mean_10": self.metrics.policy_length_means(10),
                "policy_eval_return_mean": self.metrics.policy_return_means(evaluation=True),
                "policy_versions": self.policies.versions(),
                "experience_queue": self.experience.qsize(),
                "experience_blocked_puts": self.experience.blocked_puts,
                "experience_blocked_s": self.experience.blocked_s,
                "empty_episodes": self.metrics.empty_episodes,
                "sessions_timed_out": self.metrics.sessions_timed_out,
                "errors": dict(self.metrics.errors),
                "refused": dict(self.metrics.refused),
                "uploaded_steps": self.metrics.uploaded_steps,
                "upload_refused_chunks": self.metrics.upload_refused_chunks,
                "upload_refused_steps": self.metrics.upload_refused_steps,
            }
