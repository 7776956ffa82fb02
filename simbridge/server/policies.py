"""The policy interface the bridge serves actions from.

A policy computes actions for a batch of observations (rows first). The bridge
calls `compute_actions` with rows from every simulator that is waiting, so one
forward pass serves them all (see batcher.py). `version` counts weight updates;
every action reply carries the version that produced it.
"""
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional

import gymnasium as gym
import numpy as np

from simbridge.server.frame_stack import stacker
from simbridge.wire import spaces as sb_spaces
from simbridge.wire.errors import Reason, failed_precondition, invalid_argument
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

    def compute_actions(self, obs_batch: Any, explore: bool = True) -> ActionBatch:
        """explore=False: the greedy actions of evaluation episodes (argmax, tanh of the mean);
        a policy without a greedy mode ignores it."""
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

    def compute_actions(self, obs_batch, explore: bool = True):
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


@dataclass
class SlotStep:
    """One validated Step of a batched simulator (slots.py), as a StepPolicy sees it: the
    outcome of the slots' previous actions and the observations to act on next."""
    session_id: str
    n: int                             # the session's slots
    first: bool                        # the session's first Step: no outcome yet
    final: bool                        # its last Step: every slot's episode ends, nothing acts after it
    obs: Any                           # (n, ...) rows to act on (an ended slot's: its next episode's
                                       # first); None on a final Step
    rewards: Optional[np.ndarray]      # float32 (n,), None on the first Step
    terminated: Optional[np.ndarray]   # bool (n,); terminated wins over truncated
    truncated: Optional[np.ndarray]
    done_idx: np.ndarray               # the slots whose episode ended (on a final Step: all)
    finals: Any                        # (len(done_idx), ...) their last observations; None when
                                       # the simulator sent none (all of them terminated)


class StepPolicy(Policy):
    """A policy that answers whole Steps of batched simulators, outcome included, instead of
    bare observations: the seam through which a learner outside the bridge drives the
    simulators (simbridge.trainer.adapters.vector_env). The slots call compute_step directly, not
    through a DynamicBatcher: each session's Step may wait for its own answer while other
    sessions' Steps come in. Row calls (GetAction) are refused: they carry no outcome."""

    def compute_step(self, step: SlotStep) -> Optional[ActionBatch]:
        """Actions for step.n rows (None for a final Step). Runs on the simulator's call thread,
        without the runtime's lock; may block."""
        raise NotImplementedError

    def slots_closed(self, session_id: str, reason: str) -> None:
        """The session's slots stopped (its client is gone, or it closed): called with the
        runtime's lock held, so it must not block."""

    def compute_actions(self, obs_batch, explore: bool = True) -> ActionBatch:
        raise failed_precondition(
            "this server drives batched simulators only (the Step call: CreateSession.num_slots = N, "
            "e.g. `simbridge-sim --slots 4`); the row calls (GetAction) carry no rewards for it",
            Reason.WRONG_SESSION_KIND)


def random_policy_factory(policy_id: str, observation_space, action_space) -> Policy:
    return RandomPolicy(observation_space, action_space)


class _Entry:
    __slots__ = ("policy", "key", "batcher", "greedy")

    def __init__(self, policy: Policy, key: tuple, batcher, greedy):
        self.policy, self.key, self.batcher = policy, key, batcher
        self.greedy = greedy   # the batcher of evaluation episodes (explore=False)


class PolicyRegistry(Mapping):
    """The bridge's policies by id, each with its space key and its DynamicBatcher.

    A read-only Mapping of id -> Policy for everyone else; policies come in by add() or,
    on an id's first use, by the factory through ensure(). The factory (a trainer building
    networks) runs under a per-id creation lock only, never under the runtime's lock:
    sessions binding other policies carry on meanwhile, and two sessions racing on a new id
    end with one policy from one factory call. Reads take no lock (the hot path looks up a
    batcher per call); views that walk the registry (items(), iteration) take a snapshot.
    """

    def __init__(self, factory: Callable, space_key: Callable, make_batcher: Callable):
        self._factory = factory
        # Policy id -> how many frames it stacks per agent (frame_stack.py; absent: 1). Set before
        # serving (BridgeRuntime.frame_stacks); empty, the row calls skip stacking altogether.
        self.frame_stacks: Dict[str, int] = {}
        self._space_key = space_key          # (obs_space, act_space) -> comparable key
        self._make_batcher = make_batcher    # (policy, explore=True) -> DynamicBatcher
        self._entries: Dict[str, _Entry] = {}
        self._lock = threading.Lock()        # inserts; and the creation locks' table
        self._creating: Dict[str, threading.Lock] = {}

    def add(self, policy_id: str, policy: Policy) -> None:
        """Add or replace a policy."""
        entry = _Entry(policy, self._space_key(policy.observation_space, policy.action_space),
                       self._make_batcher(policy), self._make_batcher(policy, explore=False))
        with self._lock:
            self._entries = {**self._entries, policy_id: entry}   # readers see old or new, whole

    def frame_stack(self, policy_id: str) -> int:
        return self.frame_stacks.get(policy_id, 1)

    def spec_for(self, policy_id: str, spec):
        """The spaces the policy sees for agents of `spec` (a sessions.SpaceSpec): `spec` itself,
        or its stacked view when the policy stacks frames (frame_stack.py)."""
        k = self.frame_stack(policy_id)
        return spec if k <= 1 else stacker(spec, k, policy_id)

    def ensure(self, policy_id: str, spec, agent_id: str) -> None:
        """Create the policy on first use (spec: a sessions.SpaceSpec, as the simulator declared
        it; the policy gets spec_for's); refuse agents whose spaces differ from it. The caller
        must not hold the runtime's lock."""
        spec = self.spec_for(policy_id, spec)
        entry = self._entries.get(policy_id)
        if entry is None:
            with self._lock:
                creating = self._creating.setdefault(policy_id, threading.Lock())
            try:
                with creating:
                    entry = self._entries.get(policy_id)
                    if entry is None:   # nobody made it while we waited: ours to make
                        self.add(policy_id, self._factory(policy_id, spec.obs_space, spec.act_space))
                        entry = self._entries[policy_id]
            finally:
                with self._lock:
                    self._creating.pop(policy_id, None)
        if entry.key != spec.key:
            p = entry.policy
            raise invalid_argument(
                f"agent {agent_id!r} maps to policy {policy_id!r}, whose spaces are "
                f"observation {p.observation_space}, action {p.action_space}; this session declared "
                f"observation {spec.obs_space}, action {spec.act_space} for it"
                f"{_stacked_note(spec)}. To serve it: map its agents to "
                f"another policy id, created with these spaces on first use (the trainer's [mapping] rules = "
                f"[\"{agent_id}=<policy id>\"] beside a [policies.<policy id>] table), or give this simulator a "
                f"trainer of its own", Reason.SPACE_MISMATCH)

    def batcher(self, policy_id: str, greedy: bool = False):
        """The policy's DynamicBatcher; greedy: the one of evaluation episodes."""
        e = self._entries[policy_id]
        return e.greedy if greedy else e.batcher

    def versions(self) -> Dict[str, int]:
        return {pid: e.policy.version for pid, e in self._entries.items()}

    # ---- the read-only Mapping: id -> Policy
    def __getitem__(self, policy_id: str) -> Policy:
        return self._entries[policy_id].policy

    def __contains__(self, policy_id: object) -> bool:
        return policy_id in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def items(self):
        return [(pid, e.policy) for pid, e in self._entries.items()]

    def __repr__(self) -> str:
        return f"PolicyRegistry({dict(self.items())!r})"


def _stacked_note(spec) -> str:
    frames = spec.frames
    return "" if frames is None else f" (its last {frames.k} frames stacked: the policy's frame_stack)"
