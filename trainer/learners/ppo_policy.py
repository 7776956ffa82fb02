"""PPO's policy network and action distributions: one output read as categorical branches and a
squashed Gaussian.

`ActionLayout(space)` says where each part of an action lives in the policy network's output:
the logits of every categorical branch side by side (Discrete: one branch; MultiDiscrete: one
per entry of nvec, as trainer/learners/dqn.py's branches), then the means of the Box part. The Unity
connector's hybrid actions, Dict{"continuous": Box, "discrete": Discrete | MultiDiscrete}
(sims/unity/spaces.py), use both. The parts are independent: log-probabilities and entropies add.

The Box part is SAC's squashed Gaussian (trainer/learners/sac.py: `squashed_sample`): a = tanh(u),
u ~ N(mean, exp(log_std)), scaled into the bounds. Its log density is that of the env-space action
(normalised density minus sum(log scale)), the number simbridge.client.local_policy's tanh_gaussian
head reports too. To score a recorded action, u = atanh(a), with a clipped to +-(1 - 1e-6) like
SAC's stored actions: an action saturated in float32 scores as if at that edge.
"""
import math
from typing import List, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from simbridge.trainer.learners import splitk
from simbridge.trainer.learners.heads import (HALF_LOG_2PI, LOG_STD_MAX, LOG_STD_MIN, STORE_CLIP, action_branches,
                                             action_start, squashed_sample)

MASK_KEY = "action_mask"
CONTINUOUS_KEY, DISCRETE_KEY = "continuous", "discrete"   # the Unity connector's hybrid action keys
MASKED_LOGIT = -1e9   # not -inf: entropy's p * log p stays 0 * finite for masked actions


class ActionLayout:
    LOG_STD_RANGE = (LOG_STD_MIN, LOG_STD_MAX)

    def __init__(self, space: gym.Space):
        self.space = space
        self.hybrid = isinstance(space, gym.spaces.Dict) and set(space.spaces) == {CONTINUOUS_KEY, DISCRETE_KEY}
        if self.hybrid:
            disc, box = space[DISCRETE_KEY], space[CONTINUOUS_KEY]
        elif isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            disc, box = space, None
        elif isinstance(space, gym.spaces.Box):
            disc, box = None, space
        else:
            raise ValueError(f"PPO needs a Discrete, MultiDiscrete or Box action space, or Dict"
                             f"{{{CONTINUOUS_KEY!r}: Box, {DISCRETE_KEY!r}: Discrete | MultiDiscrete}}; got {space}")
        if box is not None and not isinstance(box, gym.spaces.Box):
            raise ValueError(f"the {CONTINUOUS_KEY!r} actions must be a Box, got {box}")
        self.disc, self.box = disc, box
        self.nvec = action_branches(disc) if disc is not None else np.zeros(0, np.int64)
        self.start = action_start(disc) if disc is not None else np.zeros(0, np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.nvec)]).astype(int)
        self.n_logits = int(self.nvec.sum())
        self.act_dim = 0
        if box is not None:
            low, high = box.low.reshape(-1).astype(np.float64), box.high.reshape(-1).astype(np.float64)
            if not (np.isfinite(low).all() and np.isfinite(high).all() and (high > low).all()):
                raise ValueError(f"PPO needs finite Box bounds with high > low, got {box}")
            self.low, self.high, self.scale = low, high, (high - low) / 2.0
            self.log_scale_sum = float(np.log(self.scale).sum())
            self.act_dim = low.size
        self.out_dim = self.n_logits + self.act_dim

    # ------------------------------------------------------------ env space <-> network space

    def to_env(self, idx: np.ndarray, a: np.ndarray):
        """(N, branches) indices from 0 and (N, A) in [-1, 1] -> a batch of env actions."""
        n = len(idx)
        disc = box = None
        if self.disc is not None:
            shape = () if isinstance(self.disc, gym.spaces.Discrete) else self.disc.shape
            disc = (idx + self.start).reshape((n,) + shape).astype(self.disc.dtype)
        if self.box is not None:
            env = np.clip(self.low + (a.astype(np.float64) + 1.0) * self.scale, self.low, self.high)
            box = env.astype(self.box.dtype).reshape((n,) + self.box.shape)
        if self.hybrid:
            return {CONTINUOUS_KEY: box, DISCRETE_KEY: disc}
        return disc if self.disc is not None else box

    def from_env(self, actions) -> Tuple[np.ndarray, np.ndarray]:
        """A batch of env actions -> (int64 (N, branches) from 0, float32 (N, A) in +-(1 - 1e-6))."""
        disc, box = (actions[DISCRETE_KEY], actions[CONTINUOUS_KEY]) if self.hybrid else (actions, actions)
        n = len(disc if self.disc is not None else box)
        idx = np.zeros((n, 0), np.int64)
        a = np.zeros((n, 0), np.float32)
        if self.disc is not None:
            idx = np.asarray(disc, np.int64).reshape(n, -1) - self.start
        if self.box is not None:
            a = (np.asarray(box, np.float64).reshape(n, -1) - self.low) / self.scale - 1.0
            a = np.clip(a, -STORE_CLIP, STORE_CLIP).astype(np.float32)
        return idx, a

    def allowed(self, mask: torch.Tensor) -> torch.Tensor:
        """(N, n_logits) bool from the observations' mask columns (1 = allowed); a branch that allows
        nothing allows all."""
        ok = mask > 0.5
        for lo, hi in zip(self.offsets[:-1], self.offsets[1:]):
            none = ~ok[:, lo:hi].any(1, keepdim=True)
            ok[:, lo:hi] |= none
        return ok

    # ------------------------------------------------------------ distributions

    def branch_log_softmax(self, out: torch.Tensor, allowed: Optional[torch.Tensor]):
        logits = out[:, :self.n_logits]
        if allowed is not None:
            logits = logits.masked_fill(~allowed, MASKED_LOGIT)
        return [F.log_softmax(logits[:, lo:hi], -1) for lo, hi in zip(self.offsets[:-1], self.offsets[1:])]

    def sample(self, out: torch.Tensor, log_std: torch.Tensor, allowed: Optional[torch.Tensor], explore: bool,
               generator: torch.Generator):
        """(idx (N, branches), a (N, A) in [-1, 1], logp (N,)); explore=False: argmax and tanh(mean), logp 0."""
        n = out.shape[0]
        logp = torch.zeros(n, device=out.device)
        idx = []
        for lsm in self.branch_log_softmax(out, allowed):
            choice = torch.multinomial(lsm.exp(), 1, generator=generator) if explore else lsm.argmax(-1, keepdim=True)
            logp = logp + lsm.gather(1, choice).squeeze(1)
            idx.append(choice)
        idx_t = torch.cat(idx, 1) if idx else torch.zeros((n, 0), dtype=torch.long, device=out.device)
        mean = out[:, self.n_logits:]
        if not self.act_dim:
            return idx_t, mean, logp
        if not explore:
            return idx_t, torch.tanh(mean), logp
        log_std = log_std.clamp(*self.LOG_STD_RANGE).expand_as(mean)
        noise = torch.randn(mean.shape, device=mean.device, generator=generator)
        a, lp = squashed_sample(mean, log_std, noise)
        return idx_t, a, logp + lp - self.log_scale_sum

    def log_prob(self, out: torch.Tensor, log_std: torch.Tensor, allowed: Optional[torch.Tensor],
                 idx: torch.Tensor, a: torch.Tensor):
        """(log pi(idx, a) (N,), entropy (N,)) of recorded actions. The Box part's entropy is that of
        the Gaussian before tanh (the squashed one has no closed form)."""
        n = out.shape[0]
        logp = torch.zeros(n, device=out.device)
        entropy = torch.zeros(n, device=out.device)
        for b, lsm in enumerate(self.branch_log_softmax(out, allowed)):
            logp = logp + lsm.gather(1, idx[:, b:b + 1]).squeeze(1)
            entropy = entropy - (lsm.exp() * lsm).sum(-1)
        if self.act_dim:
            mean = out[:, self.n_logits:]
            log_std = log_std.clamp(*self.LOG_STD_RANGE).expand_as(mean)
            u = torch.atanh(a)
            _, lp = squashed_sample(mean, log_std, (u - mean) / log_std.exp())
            logp = logp + lp - self.log_scale_sum
            entropy = entropy + (log_std + 0.5 + HALF_LOG_2PI).sum(-1)
        return logp, entropy


def layer_init(layer: nn.Linear, std: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


def tanh_mlp(sizes: List[int], out_std: float) -> nn.Sequential:
    layers: List[nn.Module] = []
    for i in range(len(sizes) - 1):
        last = i == len(sizes) - 2
        layers.append(layer_init(splitk.Linear(sizes[i], sizes[i + 1]), out_std if last else math.sqrt(2)))
        if not last:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class PolicyNet(nn.Module):
    """Flat obs -> [logits of every branch, means of the Box part]; log_std a parameter."""

    def __init__(self, obs_dim: int, layout: "ActionLayout", hidden: List[int], log_std_init: float):
        super().__init__()
        self.net = tanh_mlp([obs_dim, *hidden, layout.out_dim], 0.01)
        self.log_std = nn.Parameter(torch.full((layout.act_dim,), float(log_std_init)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)
