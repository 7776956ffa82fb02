"""Acting from a PortablePolicy with numpy alone (the simulator side of local inference).

A PortablePolicy (see proto/simbridge/v1/simbridge.proto) is observation
preprocessing, a stack of dense layers and an action head. `LocalPolicy` turns
one into a callable:

* `act(obs)`: one observation -> (action, logp). The per-step path of a
  simulator; it allocates almost nothing: the layer outputs are preallocated
  and the random numbers come from pre-drawn pools. One caller at a time
  (LocalPolicyClient holds its lock around it).
* `compute_actions(obs_batch)` / `forward(flat)`: batched, for tests and tools.

Preprocessing "flatten" is exactly what simbridge/wire/preprocess.py feeds the
trainer's networks: gymnasium's flatten (Box reshaped, Discrete and
MultiDiscrete one-hot from their `start`, MultiBinary as is, Dict and Tuple
concatenated in space order) as float32.

Heads (ActionHead.params in parentheses):
* q_argmax: Q-values side by side per branch (branch_sizes); greedy per branch,
  a uniform joint action with probability epsilon ("epsilon"). logp is the
  chosen action's log-probability under that epsilon-greedy distribution.
  With "action_mask_offset" = k (an extension, as trainer/learners/dqn.py's action
  masks): columns k.. of the preprocessed observation hold one 0/1 entry per
  Q output; only actions whose entry is > 0.5 are chosen, greedy or random (a
  branch that allows nothing allows everything).
* tanh_gaussian: output [mean, log_std]; a = tanh(mean + exp(log_std) * noise)
  scaled into the Box bounds ("deterministic" = 1: tanh(mean)). log_std is
  clipped to ["log_std_min", "log_std_max"]; with "log_std_squash" = 1 it is
  first squashed smoothly into that range, log_std_min + (max - min) *
  (tanh(raw) + 1) / 2, as trainer/learners/sac.py's actor does (an extension of the
  wire comment: params is an open map). logp is the env-space log density.
* random: uniform over the action space (logp known for Discrete,
  MultiDiscrete and finite Boxes, else NaN).

No torch, no pickle: the weights are raw tensors; onnx_model is kept as bytes
for engines. A policy with a convolutional encoder (trainer/learners/encoders.py)
has no dense layers, only its ONNX model: it runs through onnxruntime when that
is installed, and is refused with a PolicyFormatError saying so when it is not.
"""
import math
from typing import Any, Optional, Tuple

import gymnasium as gym
import numpy as np

from simbridge.client.local_layers import LAYER_OPS, Dense, OnnxNet, PolicyFormatError, Pool, has_nan, single_flattener
from simbridge.wire import spaces as sb_spaces
from simbridge.wire.preprocess import flat_dim, flatten
from simbridge.wire.v1 import simbridge_pb2 as pb

__all__ = ["LocalPolicy", "PolicyFormatError", "PREPROCESSORS", "LAYER_OPS", "HEADS", "flatten"]

PREPROCESSORS = ("flatten",)
HEADS = ("q_argmax", "tanh_gaussian", "random")

# ---------------------------------------------------------------- the policy

class LocalPolicy:
    def __init__(self, msg: pb.PortablePolicy, seed: Optional[int] = None):
        self.policy_id = msg.policy_id
        self.version = int(msg.version)
        self.observation_space = sb_spaces.space_from_proto(msg.observation_space, "observation_space")
        self.action_space = sb_spaces.space_from_proto(msg.action_space, "action_space")
        self.onnx_model = bytes(msg.onnx_model)
        if msg.preprocessor not in PREPROCESSORS:
            raise PolicyFormatError(f"unknown preprocessor {msg.preprocessor!r} (known: {', '.join(PREPROCESSORS)})")
        self.rng = np.random.default_rng(seed)
        self.kind = msg.head.kind
        self.params = dict(msg.head.params)
        if self.kind not in HEADS:
            raise PolicyFormatError(f"unknown action head {self.kind!r} (known: {', '.join(HEADS)})")
        try:
            self.in_dim = flat_dim(self.observation_space)
        except ValueError as e:
            raise PolicyFormatError(str(e)) from None
        if not msg.layers and self.onnx_model and self.kind != "random":   # a CNN policy: ONNX only
            self.dense = OnnxNet(self.onnx_model, self.in_dim, f"policy {msg.policy_id!r} ({self.kind})")
        else:
            self.dense = Dense(msg.layers, self.in_dim)
        self._flat1 = single_flattener(self.observation_space)
        self._uniform = Pool(self.rng.random)
        getattr(self, "_init_" + self.kind)(msg.head)

    # ------------------------------------------------------------ heads: setup

    def _init_q_argmax(self, head) -> None:
        sp = self.action_space
        if isinstance(sp, gym.spaces.Discrete):
            self.start, shape = np.array([int(sp.start)]), None
        elif isinstance(sp, gym.spaces.MultiDiscrete):
            self.start, shape = np.asarray(sp.start, np.int64).reshape(-1), sp.shape
        else:
            raise PolicyFormatError(f"q_argmax needs a Discrete or MultiDiscrete action space, got {sp}")
        self.nvec = np.asarray(head.branch_sizes, np.int64)
        nvec = np.array([sp.n]) if shape is None else np.asarray(sp.nvec, np.int64).reshape(-1)
        if self.nvec.tolist() != nvec.tolist():
            raise PolicyFormatError(f"q_argmax branch_sizes {self.nvec.tolist()} do not match the action "
                                    f"space {sp} (branches {nvec.tolist()})")
        self._check_out(int(self.nvec.sum()))
        self.epsilon = float(self.params.get("epsilon", 0.0))
        if not 0.0 <= self.epsilon <= 1.0:
            raise PolicyFormatError(f"q_argmax epsilon {self.epsilon} is outside [0, 1]")
        self._shape = shape
        off = self.params.get("action_mask_offset")
        self.mask = None if off is None else slice(int(off), int(off) + int(self.nvec.sum()))
        if self.mask is not None and not (0 <= self.mask.start and self.mask.stop <= self.in_dim):
            raise PolicyFormatError(f"q_argmax action_mask_offset {off}: the mask's {int(self.nvec.sum())} "
                                    f"columns do not fit the {self.in_dim} observation features")
        self._offsets = np.concatenate([[0], np.cumsum(self.nvec)[:-1]]).tolist()
        self._p_random = self.epsilon / float(np.prod(self.nvec, dtype=np.float64))
        self._logp_greedy = math.log(self._p_random + 1.0 - self.epsilon)
        self._logp_other = math.log(self._p_random) if self._p_random > 0 else -math.inf
        self._start0 = int(self.start[0])
        if shape is None:  # Discrete: pre-drawn random actions for exploration
            self._rand_action = Pool(lambda k: self.rng.integers(0, int(self.nvec[0]), size=k))

    def _init_tanh_gaussian(self, head) -> None:
        sp = self.action_space
        if not isinstance(sp, gym.spaces.Box):
            raise PolicyFormatError(f"tanh_gaussian needs a Box action space, got {sp}")
        low, high = sp.low.reshape(-1).astype(np.float64), sp.high.reshape(-1).astype(np.float64)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise PolicyFormatError(f"tanh_gaussian needs finite Box bounds, got {sp}")
        self.act_dim = low.size
        self._check_out(2 * self.act_dim)
        self.low, self.high, self.scale = low, high, (high - low) / 2.0
        self.log_scale_sum = float(np.log(self.scale).sum())
        p = self.params
        self.log_std_min = float(p.get("log_std_min", -20.0))
        self.log_std_max = float(p.get("log_std_max", 2.0))
        self.squash = bool(p.get("log_std_squash", 0.0))
        self.deterministic = bool(p.get("deterministic", 0.0))
        a = self.act_dim
        self._noise = Pool(lambda k: self.rng.standard_normal((k, a)))

    def _init_random(self, head) -> None:
        if len(self.dense.ops):
            raise PolicyFormatError("a random head takes no layers")
        sp = self.action_space
        self._random_logp = _uniform_logp(sp)
        if type(sp) is gym.spaces.Discrete:
            start, n = int(sp.start), int(sp.n)
            self._rand_action = Pool(lambda k: self.rng.integers(start, start + n, size=k))

    def _check_out(self, expected: int) -> None:
        out = self.dense.out_dim
        if not self.dense.ops:
            raise PolicyFormatError(f"head {self.kind!r} needs layers")
        if out != expected:
            raise PolicyFormatError(f"the layers give {out} outputs; head {self.kind!r} for {self.action_space} "
                                    f"needs {expected}")

    # ------------------------------------------------------------ batched

    def preprocess(self, obs_batch: Any) -> np.ndarray:
        return flatten(self.observation_space, obs_batch)

    def forward(self, flat: np.ndarray) -> np.ndarray:
        """Preprocessed observations (N, in) -> head input (N, out): Q-values or [mean, log_std]."""
        return self.dense.forward(flat)

    def compute_actions(self, obs_batch: Any) -> Tuple[Any, np.ndarray]:
        """Batched observations -> (batched actions, logp (N,) float32)."""
        n = sb_spaces.leaf_rows(obs_batch)
        if self.kind == "random":
            if has_nan(obs_batch):
                raise ValueError("observation contains NaN")
            return (sb_spaces.sample_batch_of(self.action_space, n, self.rng),
                    np.full(n, self._random_logp, np.float32))
        flat = self.preprocess(obs_batch)
        out = self.forward(flat)
        if np.isnan(out).any():
            raise ValueError("observation contains NaN (or the policy's output is NaN)")
        if self.kind == "q_argmax":
            return self._q_batch(out, flat)
        return self._gaussian_batch(out)

    def _allowed(self, flat: np.ndarray) -> Optional[np.ndarray]:
        """(N, sum(nvec)) bool of the actions the observations' masks allow; None without masks."""
        if self.mask is None:
            return None
        ok = flat[:, self.mask] > 0.5
        for o, k in zip(self._offsets, self.nvec):
            none = ~ok[:, o:o + k].any(1)
            ok[none, o:o + k] = True
        return ok

    def _q_batch(self, q: np.ndarray, flat: np.ndarray):
        n = len(q)
        ok = self._allowed(flat)
        if ok is not None:
            q = np.where(ok, q, -np.inf)
        branches = list(zip(self._offsets, self.nvec))
        greedy = np.stack([q[:, o:o + k].argmax(1) for o, k in branches], axis=1)
        explore = self.rng.random(n) < self.epsilon
        if ok is None:
            rand = self.rng.integers(0, self.nvec, size=greedy.shape)
            p_random = np.full(n, self._p_random)
        else:  # uniform among the allowed actions of each branch
            draw = np.where(ok, self.rng.random(ok.shape), -1.0)
            rand = np.stack([draw[:, o:o + k].argmax(1) for o, k in branches], axis=1)
            choices = np.stack([ok[:, o:o + k].sum(1) for o, k in branches], axis=1)
            p_random = self.epsilon / choices.prod(1).astype(np.float64)
        idx = np.where(explore[:, None], rand, greedy)
        is_greedy = (idx == greedy).all(axis=1)
        with np.errstate(divide="ignore"):
            logp = np.log(p_random + (1.0 - self.epsilon) * is_greedy).astype(np.float32)
        actions = idx + self.start
        shape = () if self._shape is None else self._shape
        return actions.reshape((n,) + shape).astype(np.int64), logp

    def _gaussian_batch(self, out: np.ndarray):
        n, a = len(out), self.act_dim
        mean, log_std = out[:, :a].astype(np.float64), self._log_std(out[:, a:].astype(np.float64))
        if self.deterministic:
            return self._to_env(np.tanh(mean)), np.full(n, np.nan, np.float32)
        noise = self.rng.standard_normal((n, a))
        u = mean + np.exp(log_std) * noise
        logp = _gaussian_logp(u, noise, log_std) - self.log_scale_sum
        return self._to_env(np.tanh(u)), logp.astype(np.float32)

    def _log_std(self, raw):
        if self.squash:
            raw = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (np.tanh(raw) + 1.0)
        return np.clip(raw, self.log_std_min, self.log_std_max)

    def _to_env(self, a: np.ndarray) -> np.ndarray:
        env = np.clip(self.low + (a + 1.0) * self.scale, self.low, self.high)
        sp = self.action_space
        return env.astype(sp.dtype).reshape((len(env),) + sp.shape)

    # ------------------------------------------------------------ one observation

    def act(self, obs: Any) -> Tuple[Any, float]:
        """One observation (already of the space's dtype and shape) -> (action, logp).

        Discrete actions come back as Python ints, others as arrays of the
        space's shape. Raises ValueError for an observation containing NaN."""
        kind = self.kind
        if kind == "q_argmax":
            x = self._flat1(obs)
            q = self.dense.forward1(x)
            if self.mask is not None:  # the batched path, which knows masks
                if math.isnan(q.sum()):
                    raise ValueError("observation contains NaN (or the policy's output is NaN)")
                actions, logp = self._q_batch(q[None], x[None])
                return _unbatch_discrete(self.action_space, actions), float(logp[0])
            if self._shape is None:
                g = int(q.argmax())
                if math.isnan(q[g]):  # argmax lands on a NaN whenever there is one
                    raise ValueError("observation contains NaN (or the policy's output is NaN)")
                if self.epsilon and self._uniform.next() < self.epsilon:
                    a = int(self._rand_action.next())
                    return a + self._start0, self._logp_greedy if a == g else self._logp_other
                return g + self._start0, self._logp_greedy
            actions, logp = self._q_batch(q[None], x[None])
            if math.isnan(q.sum()):
                raise ValueError("observation contains NaN (or the policy's output is NaN)")
            return actions[0], float(logp[0])
        if kind == "tanh_gaussian":
            out = self.dense.forward1(self._flat1(obs))
            if math.isnan(out.sum()):
                raise ValueError("observation contains NaN (or the policy's output is NaN)")
            a = self.act_dim
            mean = out[:a].astype(np.float64)
            log_std = self._log_std(out[a:].astype(np.float64))
            if self.deterministic:
                return self._to_env(np.tanh(mean)[None])[0], math.nan
            noise = self._noise.next()
            u = mean + np.exp(log_std) * noise
            logp = float(_gaussian_logp(u, noise, log_std)) - self.log_scale_sum
            return self._to_env(np.tanh(u)[None])[0], logp
        if has_nan(obs):
            raise ValueError("observation contains NaN")
        if type(self.action_space) is gym.spaces.Discrete:
            return int(self._rand_action.next()), self._random_logp
        actions = sb_spaces.sample_batch_of(self.action_space, 1, self.rng)
        return sb_spaces.unbatch_row0(self.action_space, actions), self._random_logp


def _gaussian_logp(u, noise, log_std):
    """log density of tanh(u), u = mean + std * noise, in [-1, 1]^A, summed over the last axis."""
    log_det = 2.0 * (math.log(2.0) - u - np.logaddexp(0.0, -2.0 * u))  # log(1 - tanh(u)^2), stable
    return (-0.5 * noise * noise - log_std - 0.5 * math.log(2 * math.pi) - log_det).sum(-1)


def _uniform_logp(space: gym.Space) -> float:
    if isinstance(space, gym.spaces.Discrete):
        return -math.log(int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return -float(np.log(np.asarray(space.nvec, np.float64)).sum())
    if isinstance(space, gym.spaces.Box) and space.dtype.kind == "f":
        width = space.high.astype(np.float64) - space.low.astype(np.float64)
        if np.isfinite(width).all() and (width > 0).all():
            return -float(np.log(width).sum())
    return math.nan


def _unbatch_discrete(space: gym.Space, actions: np.ndarray) -> Any:
    return int(actions[0]) if isinstance(space, gym.spaces.Discrete) else actions[0]

