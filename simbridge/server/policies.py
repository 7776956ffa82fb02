"""The policy interface the bridge serves actions from.

A policy computes actions for a batch of observations (rows first). The bridge
calls `compute_actions` with rows from every simulator that is waiting, so one
forward pass serves them all (see batcher.py). `version` counts weight updates;
every action reply carries the version that produced it.
"""
import threading
from dataclasses import dataclass
from typing import Any, Optional

import gymnasium as gym
import numpy as np

from simbridge.wire import spaces as sb_spaces
from simbridge.wire.tree import rows
from simbridge.wire.v1 import simbridge_pb2 as pb


@dataclass
class ActionBatch:
    actions: Any                      # nested, rows first
    logp: Optional[np.ndarray] = None  # float32 (N,), log-probability when known


class Policy:
    """Base class: override compute_actions. Must be safe to call from any thread."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space):
        self.observation_space = observation_space
        self.action_space = action_space
        self.version = 0

    def compute_actions(self, obs_batch: Any) -> ActionBatch:
        raise NotImplementedError

    def portable(self, include_onnx: bool = False) -> Optional[pb.PortablePolicy]:
        """This policy's acting weights as a PortablePolicy, for clients that act locally
        (simbridge.client.local_policy); None: it cannot run outside this process. The message
        may be shared between calls: copy it before changing it."""
        return None


class RandomPolicy(Policy):
    """Uniform random actions: the default until a trainer plugs in learners."""

    def __init__(self, observation_space, action_space, seed: Optional[int] = None):
        super().__init__(observation_space, action_space)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._pool = np.zeros(0, np.int64)
        self._pos = 0
        self._portable: Optional[pb.PortablePolicy] = None

    def compute_actions(self, obs_batch):
        n = rows(obs_batch)
        sp = self.action_space
        if type(sp) is gym.spaces.Discrete:  # the common case: served from a pre-drawn pool
            with self._lock:
                if self._pos + n > len(self._pool):
                    self._pool = self._rng.integers(sp.n, size=max(4096, n)) + sp.start
                    self._pos = 0
                out = self._pool[self._pos:self._pos + n]
                self._pos += n
            return ActionBatch(out)
        return ActionBatch(sb_spaces.sample_batch_of(sp, n, self._rng))

    def portable(self, include_onnx: bool = False) -> Optional[pb.PortablePolicy]:
        if self._portable is None or self._portable.version != self.version:
            msg = pb.PortablePolicy(version=self.version, preprocessor="flatten",
                                    observation_space=sb_spaces.space_to_proto(self.observation_space),
                                    action_space=sb_spaces.space_to_proto(self.action_space))
            msg.head.kind = "random"
            self._portable = msg
        return self._portable


def random_policy_factory(policy_id: str, observation_space, action_space) -> Policy:
    return RandomPolicy(observation_space, action_space)
