"""LocalPolicyClient: local inference, as RLlib's PolicyClient(inference_mode="local").

The simulator's calls are PolicyClient's (start_episode, get_action,
log_action, log_returns, end_episode, close), but actions are computed here,
with numpy (simbridge.client.local_policy; no torch on this side), from a copy of the
server's policy, and no call waits for the network:

* Experience. Every completed transition (obs, action, reward, next obs,
  terminated, truncated, the acting policy's version, logp) is written into
  preallocated columns of `chunk_steps` rows. Full chunks (and, after
  `flush_interval_s`, partial ones) are uploaded by a background thread with
  UploadExperience on the client's own unary channel, with their finished
  episodes' summaries for the server's metrics.
* Policy. The first policy is fetched at construction; a background thread
  asks for a newer one every `update_interval_s` (GetPolicy with the version
  held: an unchanged policy costs a few bytes) and at once when an upload's
  answer reports a newer version. The new policy replaces the old between two
  steps; nothing waits for it.
* Backpressure. When the learner falls behind, the server refuses chunks
  (RESOURCE_EXHAUSTED, nothing applied); the uploader keeps the chunk and
  resends it with backoff. Meanwhile the simulator goes on into the remaining
  chunks, up to `max_buffered_steps`; when those are full too, the call that
  completes a transition blocks until a chunk is accepted: the simulator slows
  down to the learner's pace. Nothing is dropped; `stats()` counts refusals,
  blocked seconds and uploaded steps.

Exactly once: each chunk has its own RequestHeader.seq and is resent under the
same seq until answered (after a broken connection too), so the server applies
it once. GetPolicy is read-only and goes with seq 0 (the server then keeps no
copy of the weights in its answer cache).

A session the server no longer knows (it restarted) raises SessionLost on the
next call, with the count of buffered steps that could not be delivered, as
PolicyClient does; start over with a new client. Given several addresses, a
client whose server stays unreachable for FAILOVER_AFTER_S raises SessionLost
the same way; the new client connects to another of them (docs/scaling.md).

This module holds the simulator's calls; the experience columns are in
local_buffer, the two background threads in local_uploader (with the
connection engine's channel, unary calls and retry policy), acting in
local_policy.
"""
import collections
import logging
import math
import threading
import time
import uuid
from typing import Any, Dict, Optional

import grpc
import gymnasium as gym
import numpy as np

from simbridge.client.channels import close_in_background
from simbridge.client.connection import connect_first
from simbridge.client.local_buffer import Chunk, EpisodeState, converter, invalid, nbytes_of
from simbridge.client.local_layers import has_nan
from simbridge.client.local_policy import LocalPolicy
from simbridge.client.local_uploader import ServerSync
from simbridge.client.retry import call_unary
from simbridge.client.security import ClientSecurity
from simbridge.client.stopping import STOP_GRACE_S, check_stopping, stopping
from simbridge.client.policy_client import PolicyClient
from simbridge.wire import spaces as sb_spaces
from simbridge.wire.errors import BridgeError
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc

log = logging.getLogger("simbridge.local_client")

_FINISHED_KEPT = 10_000   # ended ids remembered, so a reused id fails here and not in an upload


def make_policy_client(address: str, observation_space: gym.Space, action_space: gym.Space,
                       inference_mode: str = "remote", **kwargs):
    """PolicyClient (remote inference) or LocalPolicyClient (local), as RLlib's inference_mode picks."""
    if inference_mode == "remote":
        return PolicyClient(address, observation_space, action_space, **kwargs)
    if inference_mode == "local":
        return LocalPolicyClient(address, observation_space, action_space, **kwargs)
    raise ValueError(f"inference_mode must be 'remote' or 'local', got {inference_mode!r}")


class LocalPolicyClient(ServerSync):
    """ExternalEnv client that acts locally (see the module doc)."""

    def __init__(self, address: str, observation_space: gym.Space, action_space: gym.Space,
                 update_interval_s: float = 1.0, chunk_steps: int = 128, max_buffered_steps: int = 1024,
                 include_onnx: bool = False, flush_interval_s: float = 1.0, client_name: str = "python-local-client",
                 connect_timeout_s: float = 30.0, reconnect_timeout_s: float = 60.0, rpc_timeout_s: float = 30.0,
                 seed: Optional[int] = None, security: Optional[ClientSecurity] = None):
        if chunk_steps < 1 or max_buffered_steps < chunk_steps:
            raise ValueError(f"need 1 <= chunk_steps <= max_buffered_steps, got {chunk_steps} and "
                             f"{max_buffered_steps}")
        if update_interval_s <= 0:
            raise ValueError("update_interval_s must be positive")
        self.address = address
        self.observation_space = observation_space
        self.action_space = action_space
        self.update_interval_s = update_interval_s
        self.chunk_steps = chunk_steps
        self.max_buffered_steps = max_buffered_steps
        self.include_onnx = include_onnx
        self.flush_interval_s = flush_interval_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._seeds = np.random.SeedSequence(seed)
        self._obs_in = converter(observation_space)
        self._act_in = converter(action_space)
        self._copy_action = not isinstance(action_space, gym.spaces.Discrete)

        self.addresses, self.address, self._channel = connect_first(address, connect_timeout_s, security)
        self._stub = pb_grpc.ExternalEnvStub(self._channel)
        try:
            created = call_unary(self._stub.CreateSession, pb.CreateSessionRequest(
                client_name=client_name, observation_space=sb_spaces.space_to_proto(observation_space),
                action_space=sb_spaces.space_to_proto(action_space)), rpc_timeout_s)
            self.session_id = created.session_id
            self.limits = created.limits
            if chunk_steps > self.limits.max_rows_per_request:
                raise ValueError(f"chunk_steps {chunk_steps} exceeds the server's max_rows_per_request "
                                 f"{self.limits.max_rows_per_request}")
            row_bytes = 2 * nbytes_of(observation_space) + nbytes_of(action_space) + 64
            if self.limits.max_message_bytes and chunk_steps * row_bytes > 0.9 * self.limits.max_message_bytes:
                raise ValueError(f"chunks of {chunk_steps} transitions (~{row_bytes} bytes each) would exceed the "
                                 f"server's message limit of {self.limits.max_message_bytes} bytes: lower chunk_steps")
            self._policy: LocalPolicy = self._fetch_policy(-1)  # the first policy, before any step
        except BaseException:
            self._channel.close()
            raise

        self._lock = threading.Lock()            # the simulator's calls (and the policy's buffers)
        self._cond = threading.Condition()       # chunks, between the simulator and the uploader
        n_chunks = -(-max_buffered_steps // chunk_steps)
        self._free = [Chunk(observation_space, action_space, chunk_steps) for _ in range(n_chunks)]
        self._current: Optional[Chunk] = self._free.pop()
        self._ready: "collections.deque[Chunk]" = collections.deque()
        self._in_flight = 0
        self._episodes: Dict[str, EpisodeState] = {}
        self._finished: "collections.OrderedDict[str, None]" = collections.OrderedDict()
        self._seq = 0
        self._fatal: Optional[BridgeError] = None     # raised by every call from then on
        self._deferred: Optional[BridgeError] = None  # raised once by the next call
        self._closing = False
        self._closed = False
        self._abort = False
        self._stop = threading.Event()
        self._refresh_now = threading.Event()
        self._stats = collections.Counter()      # counted by the background threads
        self._stats_lock = threading.Lock()
        # counted by the simulator's thread, under self._lock
        self._n_actions = self._n_transitions = self._n_episodes = self._n_blocked_calls = 0
        self._uploader = threading.Thread(target=self._upload_loop, name="simbridge-uploader", daemon=True)
        self._refresher = threading.Thread(target=self._refresh_loop, name="simbridge-policy", daemon=True)
        self._uploader.start()
        self._refresher.start()

    # ------------------------------------------------------------ the simulator's calls

    @property
    def policy(self) -> LocalPolicy:
        return self._policy

    @property
    def policy_version(self) -> int:
        return self._policy.version

    @property
    def onnx_model(self) -> bytes:
        """The current policy's ONNX model (include_onnx=True), for engines."""
        return self._policy.onnx_model

    def start_episode(self, episode_id: Optional[str] = None, training_enabled: bool = True,
                      evaluation: bool = False) -> str:
        if evaluation:   # the exported policy explores here; greedy actions come from the trainer
            raise BridgeError(grpc.StatusCode.INVALID_ARGUMENT, "evaluation episodes need remote inference "
                              "(PolicyClient): the trainer serves their greedy actions")
        with self._lock:
            self._raise_failures()
            eid = episode_id or uuid.uuid4().hex
            if eid in self._episodes:
                raise BridgeError(grpc.StatusCode.ALREADY_EXISTS, f"episode {eid!r} is already running")
            if eid in self._finished:
                raise BridgeError(grpc.StatusCode.ALREADY_EXISTS,
                                  f"episode id {eid!r} was already used by an episode that ended")
            self._episodes[eid] = EpisodeState(eid, training_enabled)
            return eid

    def get_action(self, episode_id: str, observation) -> Any:
        with self._lock:
            self._raise_failures()
            ep = self._episode(episode_id)
            obs = self._obs_in(observation, "observation")
            policy = self._policy  # one policy for the whole call, whatever the refresher does
            try:
                action, logp = policy.act(obs)
            except ValueError as e:
                raise invalid(f"observation: {e}") from None
            self._acted(ep, obs, action.copy() if self._copy_action else action, logp, policy.version)
            return action

    def log_action(self, episode_id: str, observation, action) -> None:
        """An action the simulator chose itself (off-policy); its transition carries version -1."""
        with self._lock:
            self._raise_failures()
            ep = self._episode(episode_id)
            obs = self._checked_obs(observation, "observation")
            act = self._act_in(action, "action")
            sb_spaces.check_contains(self.action_space, act, None, "action")
            self._acted(ep, obs, act, math.nan, -1)

    def log_returns(self, episode_id: str, reward: float, info: Optional[dict] = None) -> None:
        """Adds to the reward of the episode's last action (infos stay on the simulator's side)."""
        with self._lock:
            self._raise_failures()
            ep = self._episode(episode_id)
            r = float(reward)
            if not math.isfinite(r):
                raise invalid(f"reward {reward} is not a finite number")
            ep.reward_acc += r
            ep.total += r

    def end_episode(self, episode_id: str, observation, truncated: bool = False, stopping: bool = False) -> None:
        """stopping: as PolicyClient.end_episode's (its summary says so: not a return of the policy)."""
        with self._lock:
            self._raise_failures()
            ep = self._episode(episode_id)
            obs = self._checked_obs(observation, "final observation")
            if ep.pending:
                self._complete(ep, obs, not truncated, bool(truncated))
            self._end(ep, bool(truncated), stopping)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Hand over everything recorded so far and wait until the server accepted it.
        False when `timeout_s` passed first."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        with self._cond:
            if self._current is not None and not self._current.empty():
                self._rotate()
            while self._ready or self._in_flight:
                if self._fatal is not None:
                    raise self._fatal
                if stopping() and time.monotonic() - t0 > STOP_GRACE_S:   # a server that does not answer
                    check_stopping(f"uploading experience to the simbridge trainer at {self.address}")
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        self._raise_failures()
        return True

    def stats(self) -> dict:
        with self._stats_lock:
            out = dict(self._stats)
        out.update(actions=self._n_actions, transitions=self._n_transitions, episodes=self._n_episodes,
                   blocked_calls=self._n_blocked_calls)
        with self._cond:
            buffered = sum(c.n for c in self._ready) + (self._current.n if self._current else 0)
        for k in ("transitions", "actions", "uploaded_steps", "uploaded_chunks", "refusals", "refused_steps",
                  "blocked_calls", "rejected_steps", "lost_steps", "policy_updates", "refresh_errors",
                  "upload_retries", "episodes"):
            out.setdefault(k, 0)
        out["blocked_s"] = round(out.get("blocked_s", 0.0), 4)
        out["buffered_steps"] = buffered
        if self._fatal is not None:  # the session or the server is gone: nothing buffered will arrive
            out["lost_steps"] += buffered
        out["policy_version"] = self._policy.version
        return out

    def close(self, timeout_s: float = 30.0) -> None:
        """Ends the open episodes (truncated and cut short, out of the returns; their last actions
        had no outcome and are dropped, as the server does for a closed session), uploads
        everything (waiting up to `timeout_s`) and closes the session."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            try:
                for ep in list(self._episodes.values()):
                    ep.pending = False
                    self._end(ep, truncated=True, stopping=True)
            except BridgeError:  # the server is gone: these summaries cannot be delivered
                pass
        with self._cond:
            self._closing = True
            if self._current is not None and not self._current.empty():
                self._rotate()
            self._cond.notify_all()
        self._uploader.join(timeout_s)
        if self._uploader.is_alive():
            self._abort = True
            with self._cond:
                lost = sum(c.n for c in self._ready)
            log.warning("closing with %d steps not accepted by the server after %.0fs", lost, timeout_s)
            self._count(lost_steps=lost)
        self._stop.set()
        self._refresh_now.set()
        self._refresher.join(5.0)
        if self._fatal is None:
            try:
                # seq 0: unnumbered, so a chunk whose seq the server kept unspent is no gap here
                call_unary(self._stub.CloseSession, pb.CloseSessionRequest(header=self._header(0)),
                           self.rpc_timeout_s)
            except BridgeError:
                pass
        close_in_background(self._channel)

    def _close_without_flush(self) -> None:
        self._abort = True
        self.close(timeout_s=0.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ recording

    def _episode(self, episode_id: str) -> EpisodeState:
        ep = self._episodes.get(episode_id)
        if ep is None:
            if episode_id in self._finished:
                raise BridgeError(grpc.StatusCode.FAILED_PRECONDITION, f"episode {episode_id!r} already ended")
            raise BridgeError(grpc.StatusCode.NOT_FOUND, f"unknown episode {episode_id!r}: call start_episode first")
        return ep

    def _checked_obs(self, observation, what: str):
        obs = self._obs_in(observation, what)
        if has_nan(obs):
            raise invalid(f"{what} contains NaN")
        return obs

    def _acted(self, ep: EpisodeState, obs, action, logp: float, version: int) -> None:
        """Lock held. The new observation completes the previous action's transition."""
        if ep.pending:
            self._complete(ep, obs, False, False)
        ep.obs, ep.action, ep.logp, ep.version = obs, action, logp, version
        ep.pending = True
        ep.reward_acc = 0.0  # a reward before the episode's first action rewards no action
        ep.length += 1
        self._n_actions += 1

    def _complete(self, ep: EpisodeState, new_obs, terminated: bool, truncated: bool) -> None:
        """Lock held. Writes the pending transition into the current chunk (waiting for room)."""
        ep.pending = False
        if ep.training:
            with self._cond:
                c = self._writable()
                c.add(ep, new_obs, terminated, truncated)
                if c.n == self.chunk_steps:
                    self._rotate()
            self._n_transitions += 1
        ep.t += 1

    def _end(self, ep: EpisodeState, truncated: bool, stopping: bool = False) -> None:
        """Lock held. The episode's summary goes with the chunk of its last transition."""
        del self._episodes[ep.id]
        self._finished[ep.id] = None
        while len(self._finished) > _FINISHED_KEPT:
            self._finished.popitem(last=False)
        summary = pb.EpisodeSummary(episode_id=ep.id, total_reward=ep.total, length=ep.length, truncated=truncated,
                                    stopping=stopping and truncated)
        with self._cond:
            c = self._writable()
            if c.empty():
                c.since = time.monotonic()
            c.summaries.append(summary)
        self._n_episodes += 1

    def _raise_failures(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._deferred is not None:
            err, self._deferred = self._deferred, None
            raise err
        if self._closed:
            raise BridgeError(grpc.StatusCode.FAILED_PRECONDITION, "the client is closed")

    def _count(self, **kv) -> None:
        with self._stats_lock:
            self._stats.update(kv)
