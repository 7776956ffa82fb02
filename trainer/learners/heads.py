"""Action heads the learners share: the branches of a discrete action (DQN's Q-heads, PPO's
categoricals) and the tanh-squashed Gaussian (SAC's actor, PPO's Box actions)."""
import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
STORE_CLIP = 1.0 - 1e-6


def action_branches(space: gym.Space) -> np.ndarray:
    """Number of actions of each branch: [n] for Discrete(n), nvec flattened for MultiDiscrete."""
    if isinstance(space, gym.spaces.Discrete):
        return np.array([int(space.n)])
    if isinstance(space, gym.spaces.MultiDiscrete):
        return np.asarray(space.nvec, np.int64).reshape(-1)
    raise ValueError(f"DQN needs a Discrete or MultiDiscrete action space, got {space}")


def action_start(space: gym.Space) -> np.ndarray:
    """Lowest action of each branch (gymnasium's `start`), flattened like action_branches."""
    if isinstance(space, gym.spaces.Discrete):
        return np.array([int(space.start)])
    return np.asarray(space.start, np.int64).reshape(-1)


def squashed_sample(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor):
    """a = tanh(mean + std * noise) in [-1, 1]^A and log pi(a) (normalised space), summed over A."""
    u = mean + log_std.exp() * noise
    a = torch.tanh(u)
    # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), stable for large |u|
    log_det = 2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))
    logp = (-0.5 * noise.pow(2) - log_std - HALF_LOG_2PI - log_det).sum(-1)
    return a, logp
