"""LocalPolicyClient's recording side: its experience columns (`Chunk`), the per-episode
state between two calls (`EpisodeState`) and the checks that turn a simulator's values into
owned arrays of the declared spaces."""
import math
import time
from typing import Dict

import grpc
import gymnasium as gym
import numpy as np

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors, tree
from simbridge.wire.errors import BridgeError
from simbridge.wire.v1 import simbridge_pb2 as pb


def invalid(msg: str) -> BridgeError:
    return BridgeError(grpc.StatusCode.INVALID_ARGUMENT, msg)


class Chunk:
    """Preallocated columns for `size` transitions, plus the chunk's episode ids and summaries."""

    def __init__(self, obs_space, act_space, size: int):
        self._put_obs, self._put_act = row_writer(obs_space), row_writer(act_space)
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

    def add(self, ep: "EpisodeState", new_obs, terminated: bool, truncated: bool) -> None:
        """Writes the episode's pending transition, with its outcome, into the next row."""
        i = self.n
        k = self.index.get(ep.id)
        if k is None:
            k = self.index[ep.id] = len(self.ids)
            self.ids.append(ep.id)
        self._put_obs(self.obs, i, ep.obs)
        self._put_obs(self.new_obs, i, new_obs)
        self._put_act(self.actions, i, ep.action)
        self.rewards[i] = ep.reward_acc
        self.terminated[i] = terminated
        self.truncated[i] = truncated
        self.ep_index[i] = k
        self.t[i] = ep.t
        self.versions[i] = ep.version
        self.logp[i] = ep.logp
        self.n = i + 1
        if i == 0 and not self.summaries:
            self.since = time.monotonic()

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


def row_writer(space):
    """Writes one value of `space` into row i of a column (nested columns leaf by leaf; the
    space says what nests, so a Tuple's items may come as a list)."""
    if isinstance(space, gym.spaces.Dict):
        items = [(k, row_writer(s)) for k, s in space.spaces.items()]

        def put(col, i, value):
            for k, put_leaf in items:
                put_leaf(col[k], i, value[k])
        return put
    if isinstance(space, gym.spaces.Tuple):
        items = [(j, row_writer(s)) for j, s in enumerate(space.spaces)]

        def put(col, i, value):
            for j, put_leaf in items:
                put_leaf(col[j], i, value[j])
        return put

    def put(col, i, value):
        col[i] = value
    return put


def converter(space):
    """One observation (or action) as the client keeps it: owned arrays of the space's dtype and
    shape (Discrete: an int), with precise errors for the wrong shape or value."""
    if isinstance(space, gym.spaces.Dict):
        subs = {k: converter(s) for k, s in space.spaces.items()}

        def conv(v, what):
            if not isinstance(v, dict) or set(v) != set(subs):
                raise invalid(f"{what}: expected a dict with keys {list(subs)}")
            return {k: c(v[k], f"{what}[{k!r}]") for k, c in subs.items()}
        return conv
    if isinstance(space, gym.spaces.Tuple):
        subs = [converter(s) for s in space.spaces]

        def conv(v, what):
            if not isinstance(v, (tuple, list)) or len(v) != len(subs):
                raise invalid(f"{what}: expected a tuple of {len(subs)} items")
            return tuple(c(x, f"{what}[{i}]") for i, (c, x) in enumerate(zip(subs, v)))
        return conv
    if isinstance(space, gym.spaces.Discrete):
        lo, hi = int(space.start), int(space.start + space.n)

        def conv(v, what):
            x = int(v)
            if not lo <= x < hi:
                raise invalid(f"{what}: {x} is outside {space}")
            return x
        return conv
    dtype = {gym.spaces.MultiDiscrete: np.int64, gym.spaces.MultiBinary: np.int8}.get(type(space), space.dtype)
    shape = tuple(space.shape)

    def conv(v, what):
        try:
            a = np.array(v, dtype=dtype)
        except (TypeError, ValueError) as e:
            raise invalid(f"{what}: {e}") from None
        if a.shape != shape:
            raise invalid(f"{what}: shape {a.shape}, expected {shape}")
        return a
    return conv


def nbytes_of(space) -> int:
    """Bytes of one value of `space` on the wire."""
    leaves = []
    tree.map_structure(lambda a: leaves.append(a.nbytes), sb_spaces.zeros_like_space(space, 1))
    return sum(leaves)


class EpisodeState:
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
