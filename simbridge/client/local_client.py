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
PolicyClient does; start over with a new client.
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

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors, tree
from simbridge.client.policy_client import PolicyClient, SessionLost, open_channel
from simbridge.wire.errors import BridgeError, Reason
from simbridge.client.local_policy import LocalPolicy
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc

log = logging.getLogger("simbridge.local_client")

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
_FINISHED_KEPT = 10_000   # ended ids remembered, so a reused id fails here and not in an upload
_MIN_REFRESH_GAP_S = 0.05  # upload answers may ask for a refresh this often at most
_CLOSING_RETRY_S = 2.0     # while closing, a server that stays unreachable is not waited for longer


def make_policy_client(address: str, observation_space: gym.Space, action_space: gym.Space,
                       inference_mode: str = "remote", **kwargs):
    """PolicyClient (remote inference) or LocalPolicyClient (local), as RLlib's inference_mode picks."""
    if inference_mode == "remote":
        return PolicyClient(address, observation_space, action_space, **kwargs)
    if inference_mode == "local":
        return LocalPolicyClient(address, observation_space, action_space, **kwargs)
    raise ValueError(f"inference_mode must be 'remote' or 'local', got {inference_mode!r}")


def _invalid(msg: str) -> BridgeError:
    return BridgeError(grpc.StatusCode.INVALID_ARGUMENT, msg)


class _Chunk:
    """Preallocated columns for `size` transitions, plus the chunk's episode ids and summaries."""

    def __init__(self, obs_space, act_space, size: int):
        self.obs = sb_spaces.zeros_like_space(obs_space, size)
        self.new_obs = sb_spaces.zeros_like_space(obs_space, size)
        self.actions = sb_spaces.zeros_like_space(act_space, size)
        self.rewards = np.zeros(size, np.float32)
        self.terminated = np.zeros(size, bool)
        self.truncated = np.zeros(size, bool)
        self.ep_index = np.zeros(size, np.int32)
        self.t = np.zeros(size, np.int32)
        self.versions = np.zeros(size, np.int64)
        self.logp = np.zeros(size, np.float32)
        self.n = 0
        self.ids: list = []
        self.index: Dict[str, int] = {}
        self.summaries: list = []
        self.since = 0.0  # when its first row or summary came

    def empty(self) -> bool:
        return self.n == 0 and not self.summaries

    def reset(self) -> None:
        self.terminated[:self.n] = False
        self.truncated[:self.n] = False
        self.n = 0
        self.ids, self.index, self.summaries = [], {}, []

    def encode(self, obs_space, act_space) -> pb.UploadExperienceRequest:
        n = self.n
        req = pb.UploadExperienceRequest()
        req.episode_ids.extend(self.ids)
        req.finished_episodes.extend(self.summaries)
        first = slice(0, n)
        tensors.fill_tensor(req.episode_index, self.ep_index[first])
        tensors.fill_tensor(req.t, self.t[first])
        tensors.fill_tensor(req.rewards, self.rewards[first])
        tensors.fill_tensor(req.terminated, self.terminated[first])
        tensors.fill_tensor(req.truncated, self.truncated[first])
        tensors.fill_tensor(req.policy_versions, self.versions[first])
        tensors.fill_tensor(req.action_logp, self.logp[first])
        sb_spaces.fill_value(req.observations, obs_space, tree.take(self.obs, first))
        sb_spaces.fill_value(req.next_observations, obs_space, tree.take(self.new_obs, first))
        sb_spaces.fill_value(req.actions, act_space, tree.take(self.actions, first))
        return req


def _row_writer(space):
    """Writes one value of `space` into row i of a column (nested columns leaf by leaf)."""
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        def put(col, i, value):
            tree.map_structure(lambda c, v: c.__setitem__(i, v), col, value)
        return put

    def put(col, i, value):
        col[i] = value
    return put


def _converter(space):
    """One observation (or action) as the client keeps it: owned arrays of the space's dtype and
    shape (Discrete: an int), with precise errors for the wrong shape or value."""
    if isinstance(space, gym.spaces.Dict):
        subs = {k: _converter(s) for k, s in space.spaces.items()}

        def conv(v, what):
            if not isinstance(v, dict) or set(v) != set(subs):
                raise _invalid(f"{what}: expected a dict with keys {list(subs)}")
            return {k: c(v[k], f"{what}[{k!r}]") for k, c in subs.items()}
        return conv
    if isinstance(space, gym.spaces.Tuple):
        subs = [_converter(s) for s in space.spaces]

        def conv(v, what):
            if not isinstance(v, (tuple, list)) or len(v) != len(subs):
                raise _invalid(f"{what}: expected a tuple of {len(subs)} items")
            return tuple(c(x, f"{what}[{i}]") for i, (c, x) in enumerate(zip(subs, v)))
        return conv
    if isinstance(space, gym.spaces.Discrete):
        lo, hi = int(space.start), int(space.start + space.n)

        def conv(v, what):
            x = int(v)
            if not lo <= x < hi:
                raise _invalid(f"{what}: {x} is outside {space}")
            return x
        return conv
    dtype = {gym.spaces.MultiDiscrete: np.int64, gym.spaces.MultiBinary: np.int8}.get(type(space), space.dtype)
    shape = tuple(space.shape)

    def conv(v, what):
        try:
            a = np.array(v, dtype=dtype)
        except (TypeError, ValueError) as e:
            raise _invalid(f"{what}: {e}") from None
        if a.shape != shape:
            raise _invalid(f"{what}: shape {a.shape}, expected {shape}")
        return a
    return conv


def _nbytes(space) -> int:
    """Bytes of one value of `space` on the wire."""
    leaves = []
    tree.map_structure(lambda a: leaves.append(a.nbytes), sb_spaces.zeros_like_space(space, 1))
    return sum(leaves)


def _has_nan(value) -> bool:
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, tuple):
        return any(_has_nan(v) for v in value)
    return isinstance(value, np.ndarray) and value.dtype.kind == "f" and math.isnan(value.sum())


class _Episode:
    __slots__ = ("id", "training", "obs", "action", "logp", "version", "pending", "reward_acc", "total",
                 "t", "length")

    def __init__(self, episode_id: str, training: bool):
        self.id = episode_id
        self.training = training
        self.obs = self.action = None
        self.logp = math.nan
        self.version = -1
        self.pending = False      # an action waits for its outcome
        self.reward_acc = 0.0     # since the last action
        self.total = 0.0
        self.t = 0                # transitions completed
        self.length = 0           # actions taken


class LocalPolicyClient:
    """ExternalEnv client that acts locally (see the module doc)."""

    def __init__(self, address: str, observation_space: gym.Space, action_space: gym.Space,
                 update_interval_s: float = 1.0, chunk_steps: int = 128, max_buffered_steps: int = 1024,
                 include_onnx: bool = False, flush_interval_s: float = 1.0, client_name: str = "python-local-client",
                 connect_timeout_s: float = 30.0, reconnect_timeout_s: float = 60.0, rpc_timeout_s: float = 30.0,
                 seed: Optional[int] = None):
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
        self._obs_in = _converter(observation_space)
        self._act_in = _converter(action_space)
        self._put_obs = _row_writer(observation_space)
        self._put_act = _row_writer(action_space)
        self._copy_action = not isinstance(action_space, gym.spaces.Discrete)

        self._channel = open_channel(address, connect_timeout_s)
        self._stub = pb_grpc.ExternalEnvStub(self._channel)
        try:
            created = self._stub.CreateSession(pb.CreateSessionRequest(
                client_name=client_name, observation_space=sb_spaces.space_to_proto(observation_space),
                action_space=sb_spaces.space_to_proto(action_space)), timeout=rpc_timeout_s)
            self.session_id = created.session_id
            self.limits = created.limits
            if chunk_steps > self.limits.max_rows_per_request:
                raise ValueError(f"chunk_steps {chunk_steps} exceeds the server's max_rows_per_request "
                                 f"{self.limits.max_rows_per_request}")
            row_bytes = 2 * _nbytes(observation_space) + _nbytes(action_space) + 64
            if self.limits.max_message_bytes and chunk_steps * row_bytes > 0.9 * self.limits.max_message_bytes:
                raise ValueError(f"chunks of {chunk_steps} transitions (~{row_bytes} bytes each) would exceed the "
                                 f"server's message limit of {self.limits.max_message_bytes} bytes: lower chunk_steps")
            self._policy: LocalPolicy = self._fetch_policy(-1)  # the first policy, before any step
        except grpc.RpcError as e:
            self._channel.close()
            raise BridgeError.from_rpc_error(e) from None
        except BaseException:
            self._channel.close()
            raise

        self._lock = threading.Lock()            # the simulator's calls (and the policy's buffers)
        self._cond = threading.Condition()       # chunks, between the simulator and the uploader
        n_chunks = -(-max_buffered_steps // chunk_steps)
        self._free = [_Chunk(observation_space, action_space, chunk_steps) for _ in range(n_chunks)]
        self._current: Optional[_Chunk] = self._free.pop()
        self._ready: "collections.deque[_Chunk]" = collections.deque()
        self._in_flight = 0
        self._episodes: Dict[str, _Episode] = {}
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

    def start_episode(self, episode_id: Optional[str] = None, training_enabled: bool = True) -> str:
        with self._lock:
            self._raise_failures()
            eid = episode_id or uuid.uuid4().hex
            if eid in self._episodes:
                raise BridgeError(grpc.StatusCode.ALREADY_EXISTS, f"episode {eid!r} is already running")
            if eid in self._finished:
                raise BridgeError(grpc.StatusCode.ALREADY_EXISTS,
                                  f"episode id {eid!r} was already used by an episode that ended")
            self._episodes[eid] = _Episode(eid, training_enabled)
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
                raise _invalid(f"observation: {e}") from None
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
                raise _invalid(f"reward {reward} is not a finite number")
            ep.reward_acc += r
            ep.total += r

    def end_episode(self, episode_id: str, observation, truncated: bool = False) -> None:
        with self._lock:
            self._raise_failures()
            ep = self._episode(episode_id)
            obs = self._checked_obs(observation, "final observation")
            if ep.pending:
                self._complete(ep, obs, not truncated, bool(truncated))
            self._end(ep, bool(truncated))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Hand over everything recorded so far and wait until the server accepted it.
        False when `timeout_s` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if self._current is not None and not self._current.empty():
                self._rotate()
            while self._ready or self._in_flight:
                if self._fatal is not None:
                    raise self._fatal
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
        """Ends the open episodes (truncated; their last actions had no outcome and are dropped,
        as the server does for a closed session), uploads everything (waiting up to
        `timeout_s`) and closes the session."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            try:
                for ep in list(self._episodes.values()):
                    ep.pending = False
                    self._end(ep, truncated=True)
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
                self._seq += 1
                self._stub.CloseSession(pb.CloseSessionRequest(header=self._header(self._seq)),
                                        timeout=self.rpc_timeout_s)
            except grpc.RpcError:
                pass
        self._channel.close()

    def _close_without_flush(self) -> None:
        self._abort = True
        self.close(timeout_s=0.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ recording

    def _episode(self, episode_id: str) -> _Episode:
        ep = self._episodes.get(episode_id)
        if ep is None:
            if episode_id in self._finished:
                raise BridgeError(grpc.StatusCode.FAILED_PRECONDITION, f"episode {episode_id!r} already ended")
            raise BridgeError(grpc.StatusCode.NOT_FOUND, f"unknown episode {episode_id!r}: call start_episode first")
        return ep

    def _checked_obs(self, observation, what: str):
        obs = self._obs_in(observation, what)
        if _has_nan(obs):
            raise _invalid(f"{what} contains NaN")
        return obs

    def _acted(self, ep: _Episode, obs, action, logp: float, version: int) -> None:
        """Lock held. The new observation completes the previous action's transition."""
        if ep.pending:
            self._complete(ep, obs, False, False)
        ep.obs, ep.action, ep.logp, ep.version = obs, action, logp, version
        ep.pending = True
        ep.reward_acc = 0.0  # a reward before the episode's first action rewards no action
        ep.length += 1
        self._n_actions += 1

    def _complete(self, ep: _Episode, new_obs, terminated: bool, truncated: bool) -> None:
        """Lock held. Writes the pending transition into the current chunk (waiting for room)."""
        ep.pending = False
        if ep.training:
            with self._cond:
                c = self._writable()
                i = c.n
                k = c.index.get(ep.id)
                if k is None:
                    k = c.index[ep.id] = len(c.ids)
                    c.ids.append(ep.id)
                self._put_obs(c.obs, i, ep.obs)
                self._put_obs(c.new_obs, i, new_obs)
                self._put_act(c.actions, i, ep.action)
                c.rewards[i] = ep.reward_acc
                c.terminated[i] = terminated
                c.truncated[i] = truncated
                c.ep_index[i] = k
                c.t[i] = ep.t
                c.versions[i] = ep.version
                c.logp[i] = ep.logp
                c.n = i + 1
                if i == 0 and not c.summaries:
                    c.since = time.monotonic()
                if c.n == self.chunk_steps:
                    self._rotate()
            self._n_transitions += 1
        ep.t += 1

    def _end(self, ep: _Episode, truncated: bool) -> None:
        """Lock held. The episode's summary goes with the chunk of its last transition."""
        del self._episodes[ep.id]
        self._finished[ep.id] = None
        while len(self._finished) > _FINISHED_KEPT:
            self._finished.popitem(last=False)
        summary = pb.EpisodeSummary(episode_id=ep.id, total_reward=ep.total, length=ep.length, truncated=truncated)
        with self._cond:
            c = self._writable()
            if c.empty():
                c.since = time.monotonic()
            c.summaries.append(summary)
        self._n_episodes += 1

    def _writable(self) -> _Chunk:
        """Cond held. The chunk to write into; blocks while every chunk waits for the server."""
        if self._current is not None:
            return self._current
        if self._free:
            self._current = self._free.pop()
            return self._current
        t0 = time.monotonic()
        self._n_blocked_calls += 1
        try:
            while not self._free:
                if self._fatal is not None:
                    raise self._fatal
                if self._abort:
                    raise BridgeError(grpc.StatusCode.UNAVAILABLE, "the client is closing")
                self._cond.wait(0.5)
        finally:
            self._count(blocked_s=time.monotonic() - t0)
        self._current = self._free.pop()
        return self._current

    def _rotate(self) -> None:
        """Cond held. The current chunk goes to the uploader; the next one comes from the free list."""
        self._ready.append(self._current)
        self._current = self._free.pop() if self._free else None
        self._cond.notify_all()

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

    # ------------------------------------------------------------ uploading

    def _header(self, seq: int) -> pb.RequestHeader:
        return pb.RequestHeader(session_id=self.session_id, seq=seq)

    def _upload_loop(self) -> None:
        while True:
            with self._cond:
                while not self._ready:
                    if self._closing or self._abort or self._fatal is not None:
                        return
                    c = self._current
                    if c is not None and not c.empty() and time.monotonic() - c.since >= self.flush_interval_s:
                        self._rotate()  # a partial chunk, so that a slow simulator's experience still flows
                        continue
                    self._cond.wait(min(0.1, self.flush_interval_s))
                chunk = self._ready[0]
                self._in_flight = 1
            try:
                self._send(chunk)
            except Exception as e:  # keep the simulator informed rather than dying silently
                log.exception("uploader failed")
                self._fatal = self._fatal or BridgeError(grpc.StatusCode.INTERNAL, f"experience uploader failed: {e!r}")
            with self._cond:
                self._in_flight = 0
                if self._fatal is not None:  # what is left stays buffered: stats() counts it lost
                    self._cond.notify_all()
                    return
                self._ready.popleft()
                chunk.reset()
                self._free.append(chunk)
                self._cond.notify_all()

    def _send(self, chunk: _Chunk) -> None:
        """Uploads one chunk, resending it under the same seq until the server answers."""
        req = chunk.encode(self.observation_space, self.action_space)
        self._seq += 1
        req.header.CopyFrom(self._header(self._seq))
        n = chunk.n
        refused_delay, net_delay, net_since = 0.01, 0.05, None
        while not self._abort:
            try:
                resp = self._stub.UploadExperience(req, timeout=self.rpc_timeout_s)
            except grpc.RpcError as e:
                err = BridgeError.from_rpc_error(e)
                code, details = err.code, err.message
                if err.reason == Reason.QUEUE_FULL:
                    self._count(refusals=1, refused_steps=n)
                    time.sleep(refused_delay)  # the server already waited for room before refusing
                    refused_delay = min(refused_delay * 2, 0.2)
                    continue
                if code in _RETRYABLE:
                    now = time.monotonic()
                    net_since = net_since or now
                    patience = min(self.reconnect_timeout_s, _CLOSING_RETRY_S) if self._closing else \
                        self.reconnect_timeout_s
                    if now - net_since < patience:
                        self._count(upload_retries=1)
                        time.sleep(net_delay)
                        net_delay = min(net_delay * 2, 1.0)
                        continue
                    self._fatal = BridgeError(grpc.StatusCode.UNAVAILABLE,
                                              f"lost the simbridge server at {self.address} for "
                                              f"{patience:.0f}s: {details}")
                    return
                if err.reason == Reason.SESSION_UNKNOWN:
                    self._session_lost()
                    return
                # The server refused the chunk itself: it would fail again. Say so on the next call.
                self._count(rejected_steps=n)
                self._deferred = BridgeError(code, f"the server refused an experience chunk of {n} steps, which "
                                                   f"is discarded: {details}", err.reason)
                log.error("experience chunk refused: %s: %s", code.name, details)
                return
            self._count(uploaded_steps=n, uploaded_chunks=1)
            if resp.policy_version > self._policy.version:
                self._refresh_now.set()
            return

    def _session_lost(self) -> None:
        with self._cond:
            lost = sum(c.n for c in self._ready) + (self._current.n if self._current else 0)
            err = SessionLost(grpc.StatusCode.UNAVAILABLE,
                              f"the server no longer has session {self.session_id} (restarted or expired): "
                              f"{lost} buffered steps could not be delivered; start over with a new client")
            err.close_connection = self._close_without_flush
            self._fatal = self._fatal or err
            self._cond.notify_all()

    # ------------------------------------------------------------ policy refresh

    def _fetch_policy(self, known: int) -> Optional[LocalPolicy]:
        req = pb.GetPolicyRequest(header=self._header(0), known_version=known, include_onnx=self.include_onnx)
        resp = self._stub.GetPolicy(req, timeout=self.rpc_timeout_s)
        if resp.unchanged:
            return None
        return LocalPolicy(resp.policy, seed=self._seeds.spawn(1)[0])

    def _refresh_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            # Every update_interval_s, or sooner when an upload's answer names a newer version,
            # but not more often than _MIN_REFRESH_GAP_S.
            self._refresh_now.wait(max(0.0, last + self.update_interval_s - time.monotonic()))
            self._refresh_now.clear()
            gap = last + _MIN_REFRESH_GAP_S - time.monotonic()
            if gap > 0:
                self._stop.wait(gap)
            if self._stop.is_set():
                return
            last = time.monotonic()
            try:
                new = self._fetch_policy(self._policy.version)
            except grpc.RpcError as e:
                self._count(refresh_errors=1)
                if BridgeError.from_rpc_error(e).reason == Reason.SESSION_UNKNOWN:
                    self._session_lost()  # said here too: an idle simulator uploads nothing
                    return
                log.debug("policy refresh failed: %s", e)
            except ValueError as e:  # a policy this client cannot run: acting goes on with the old one
                self._count(refresh_errors=1)
                log.error("cannot run the server's new policy: %s", e)
            else:
                if new is not None:
                    self._policy = new
                    self._count(policy_updates=1)
                    with self._stats_lock:
                        self._stats["last_refresh_s"] = round(time.monotonic() - last, 6)
