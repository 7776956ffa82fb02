"""Observations as flat float32 vectors for MLP learners, vectorised over rows.

Numpy only: the trainer feeds its networks with it and clients acting locally
(local_policy.py) run the same preprocessing before the same weights."""
from typing import Any

import gymnasium as gym
import numpy as np


def image_layout(shape) -> str:
    """"chw" or "hwc" for a rank-3 shape: the channels are the smaller of the first and last sides
    (CHW when equal). The trainer's encoders read images by it, the bridge stacks frames by it."""
    return "chw" if shape[0] <= shape[2] else "hwc"


def flat_dim(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, gym.spaces.MultiBinary):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Dict):
        return sum(flat_dim(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return sum(flat_dim(s) for s in space.spaces)
    raise ValueError(f"cannot flatten observation space {space}")


def flatten(space: gym.Space, value: Any) -> np.ndarray:
    """Batched value (rows first) -> float32 (N, flat_dim(space)); one-hot for discrete parts."""
    if isinstance(space, gym.spaces.Box):
        v = np.asarray(value)
        return v.reshape(len(v), -1).astype(np.float32, copy=False)
    if isinstance(space, gym.spaces.Discrete):
        idx = np.asarray(value, np.int64) - space.start
        out = np.zeros((len(idx), space.n), np.float32)
        out[np.arange(len(idx)), idx] = 1.0
        return out
    if isinstance(space, gym.spaces.MultiDiscrete):
        v = np.asarray(value, np.int64).reshape(len(value), -1) - np.asarray(space.start).reshape(-1)
        nvec = np.asarray(space.nvec).reshape(-1)
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        out = np.zeros((len(v), int(nvec.sum())), np.float32)
        rows = np.repeat(np.arange(len(v)), len(nvec))
        out[rows, (v + offsets).reshape(-1)] = 1.0
        return out
    if isinstance(space, gym.spaces.MultiBinary):
        v = np.asarray(value)
        return v.reshape(len(v), -1).astype(np.float32)
    if isinstance(space, gym.spaces.Dict):
        return np.concatenate([flatten(s, value[k]) for k, s in space.spaces.items()], axis=1)
    if isinstance(space, gym.spaces.Tuple):
        return np.concatenate([flatten(s, v) for s, v in zip(space.spaces, value)], axis=1)
    raise ValueError(f"cannot flatten observation space {space}")


def dict_key_columns(space: gym.Space, key: str):
    """The columns of flatten(space) that hold Dict key `key` (a slice); None if there is no such key."""
    if not isinstance(space, gym.spaces.Dict) or key not in space.spaces:
        return None
    start = 0
    for k, sub in space.spaces.items():
        if k == key:
            return slice(start, start + flat_dim(sub))
        start += flat_dim(sub)
