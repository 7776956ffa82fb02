"""SAC: soft actor-critic for Box action spaces (any shape, flattened).

Actions live in two spaces. The networks work in the normalised space [-1, 1]^A:
the actor is a Gaussian squashed by tanh, and the replay stores actions scaled
into [-1, 1] (`store_actions`), so actions the simulator chose itself (logged,
off-policy) are learned from in the same space. The bridge sees env-space
actions: `low + (a + 1) * (high - low) / 2`.

One update (Haarnoja et al. 2018, with twin critics and automatic entropy tuning):
  critic: y = r + discount * (min_i Q'_i(s', a') - alpha * log pi(a'|s')),  a' ~ pi(s')
          where `discount` is gamma^n, 0 when the episode terminated (a truncated
          episode still bootstraps from its last observation)
  actor:  minimise alpha * log pi(a|s) - min_i Q_i(s, a),  a ~ pi(s) (reparameterised)
  alpha:  minimise -log_alpha * (log pi(a|s) + target_entropy), target_entropy = -A
  target: Q' <- Q' + tau * (Q - Q')

Speed: both critics are one module whose layers are batched matmuls (one product
per layer for the pair, and one Adam over both), Adam is the fused kernel (given
large tensors in slices on cuda: optim.sliced), the temperature's gradient is
written directly (no autograd for one scalar), the target update is one
`_foreach_lerp_` (optim.soft_update), the update's noise is drawn with the
replay indices (draw_inputs), and the whole update is one step without host
synchronisation, captured as a CUDA graph on a GPU (trainer/learners/capture.py).
Scalar metrics are read back at the end of a train() call once `metrics_every`
updates ran since the last read: the metrics reported can be that many updates old.
"""
import math
from typing import Dict, List, Tuple, Union

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from simbridge.trainer.learners import capture, export, optim, splitk
from simbridge.trainer.learners import encoders
from simbridge.trainer.learners.base import Learner
from simbridge.trainer.learners.heads import LOG_STD_MAX, LOG_STD_MIN, STORE_CLIP, squashed_sample
from simbridge.trainer.learners.nstep import DISCOUNTS
from simbridge.wire.columns import ACTIONS, NEW_OBS, OBS, REWARDS
from simbridge.wire.preprocess import flat_dim
from simbridge.wire.v1 import simbridge_pb2 as pb


SAC_DEFAULTS = {
    "actor_lr": 1e-3,
    "critic_lr": 1e-3,
    "alpha_lr": 1e-3,
    "tau": 0.005,                    # Polyak rate of the target critics
    "initial_alpha": 0.01,           # small against any reward scale; tuning raises it (see below)
    "target_entropy": "auto",        # "auto": -A (size of the flattened action); or a number
    "random_warmup": True,           # uniform random actions for the first learning_starts agent steps
    "metrics_every": 100,            # read scalar metrics back after K updates at most once (a host sync)
}

# Why initial_alpha = 0.01 and not the usual 1.0: the temperature is tuned towards the target
# entropy whatever it starts at, but while it is large the entropy bonus (about alpha * 0.7 per
# action dimension and step for the first, nearly uniform policy) is paid on every step, worth
# ~alpha * 0.7 / (1 - gamma) over a long episode. Against a goal scene's rewards (-0.01 a step,
# +1 at the goal) alpha = 1 made wandering worth ~70 and arriving 1: agents learned to avoid the
# goal, and when the temperature had been tuned down (0.0004) their critics still valued wandering
# above the goal, so they never reached it again (tests/sims/test_unity_sac_goal_e2e.py; 20k env
# steps at -0.5). Started at 0.01, the bonus is small against rewards of 0.01 and up, and a
# task that needs more entropy gets it from the tuning: on Pendulum (rewards to -16 a step) alpha
# rose from 0.01 to 0.07-0.1 and -200 was reached as early as with 1.0 (docs/benchmarks.md).
#


def mlp(sizes: List[int]) -> nn.Sequential:
    layers: List[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(splitk.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class Actor(nn.Module):
    """obs -> (mean, log_std) of the pre-tanh Gaussian, A each."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: List[int]):
        super().__init__()
        self.net = mlp([obs_dim, *hidden, 2 * act_dim])

    def forward(self, obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        # squash log_std smoothly into [LOG_STD_MIN, LOG_STD_MAX]
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)
        return mean, log_std




class TwinQ(nn.Module):
    """Two critics Q_i(obs, act) as one module: layer weights are stacked (2, in, out)
    and applied with one batched matmul per layer. Returns (2, B)."""

    BATCHED_PRODUCT = True   # splitk.set_chunks: "auto" cuts these products' gradients on cuda

    def __init__(self, in_dim: int, hidden: List[int], heads: int = 2):
        super().__init__()
        sizes = [in_dim, *hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default init, per head
            self.weights.append(nn.Parameter(torch.empty(heads, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(heads, 1, fan_out).uniform_(-bound, bound)))
        self.heads = heads
        self.grad_row_chunks = 1   # splitk.set_chunks

    def forward(self, obs: torch.Tensor, act: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        """detach_params: gradients flow to the inputs only (for the actor loss)."""
        x = torch.cat([obs, act], dim=-1).expand(self.heads, -1, -1)
        n = len(self.weights)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if detach_params:
                w, b = w.detach(), b.detach()
            # bmm, then the bias, not baddbmm: its copy of the bias over every row was 9 copies,
            # 41 us of a compiled update of 4,096 rows on the H200
            x = splitk.bmm(x, w, b, self.grad_row_chunks)
            if i < n - 1:
                x = torch.relu_(x)
        return x.squeeze(-1)


class SACLearner(Learner):
    NETWORKS = 3   # the actor and the twin critics
    DEFAULTS = SAC_DEFAULTS
    CONFIG_TYPES = {"target_entropy": Union[str, float]}

    # ------------------------------------------------------------ build

    def build(self) -> None:
        space = self.action_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(f"SACLearner needs a Box action space, got {space}")
        low, high = space.low.reshape(-1).astype(np.float64), space.high.reshape(-1).astype(np.float64)
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
            raise ValueError(f"SACLearner needs finite bounds with high > low, got {space}")
        self.act_dim = low.size
        self.obs_dim = flat_dim(self.observation_space)
        self.low, self.high, self.scale = low, high, (high - low) / 2.0   # float64, env space
        # log density of env-space actions = normalised-space log density - sum(log scale)
        self.log_scale_sum = float(np.log(self.scale).sum())
        cfg = self.config
        hidden = list(cfg["hidden"])
        dev = self.device

        # images: a CNN before each network (the actor's own, one for both critics, as SB3's SAC)
        space = self.observation_space
        self.actor = encoders.network(space, cfg, lambda f: Actor(f, self.act_dim, hidden)).to(dev)
        self.critic = encoders.network(space, cfg, lambda f: TwinQ(f + self.act_dim, hidden)).to(dev)
        self.critic_target = encoders.network(space, cfg, lambda f: TwinQ(f + self.act_dim, hidden)).to(dev)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg["initial_alpha"]), device=dev, requires_grad=True)
        te = cfg["target_entropy"]
        self.target_entropy = -float(self.act_dim) if te == "auto" else float(te)

        self.actor_opt = self.adam(self.actor.parameters(), cfg["actor_lr"])
        self.critic_opt = self.adam(self.critic.parameters(), cfg["critic_lr"])
        self.alpha_opt = self.adam([self.log_alpha], cfg["alpha_lr"])
        # its gradient, made here, outside the steps that write it in place: one made inside a
        # torch.compile'd step is memory of that step's CUDA graphs, which its next run overwrites
        self.log_alpha.grad = torch.zeros_like(self.log_alpha)

    def modules_for_acting(self) -> nn.Module:
        return self.actor

    # ------------------------------------------------------------ action spaces

    def to_env(self, a: np.ndarray) -> np.ndarray:
        """Normalised (N, A) in [-1, 1] -> env-space (N, *shape)."""
        env = self.low + (np.asarray(a, np.float64) + 1.0) * self.scale
        env = np.clip(env, self.low, self.high)
        return env.astype(self.action_space.dtype).reshape((len(env),) + self.action_space.shape)

    def store_actions(self, actions: np.ndarray) -> np.ndarray:
        """Env-space actions (N, *shape) -> normalised float32 (N, A), clipped to +-(1 - 1e-6)."""
        a = np.asarray(actions, np.float64).reshape(len(actions), -1)
        a = (a - self.low) / self.scale - 1.0
        return np.clip(a, -STORE_CLIP, STORE_CLIP).astype(np.float32)

    # ------------------------------------------------------------ portable form

    def export_layers(self, acting: nn.Module) -> export.Exported:
        """The actor's MLP, whose last layer gives [mean, raw log_std]; head "tanh_gaussian" with
        log_std_squash = 1 (Actor squashes log_std with tanh into [LOG_STD_MIN, LOG_STD_MAX]).
        During the random warm-up, head "random" and no layers, as act() then."""
        cfg = self.config
        if cfg["random_warmup"] and self.agent_steps < cfg["learning_starts"]:
            return [], pb.ActionHead(kind="random")
        head = pb.ActionHead(kind="tanh_gaussian")
        head.params.update({"log_std_min": LOG_STD_MIN, "log_std_max": LOG_STD_MAX, "log_std_squash": 1.0,
                            "deterministic": 0.0})
        return export.mlp_layers(acting.net), head

    # ------------------------------------------------------------ acting

    def act(self, module: nn.Module, obs: torch.Tensor, explore: bool):
        """explore: a ~ pi(s) (uniform random during warm-up), logp its env-space log density;
        otherwise the deterministic tanh(mean) and no logp."""
        n = obs.shape[0]
        if not explore:
            mean, _ = module(obs)
            return self.to_env(torch.tanh(mean).cpu().numpy()), None
        if self.config["random_warmup"] and self.agent_steps < self.config["learning_starts"]:
            a = self.rng.uniform(-1.0, 1.0, size=(n, self.act_dim))
            logp = np.full(n, -self.act_dim * math.log(2.0) - self.log_scale_sum, np.float32)
            return self.to_env(a), logp
        mean, log_std = module(obs)
        noise = torch.randn(mean.shape, device=mean.device, generator=self.act_generator)
        a, logp = squashed_sample(mean, log_std, noise)
        return self.to_env(a.cpu().numpy()), (logp - self.log_scale_sum).cpu().numpy().astype(np.float32)

    # ------------------------------------------------------------ learning

    def critic_target_values(self, rewards: torch.Tensor, discounts: torch.Tensor, new_obs: torch.Tensor,
                             next_a: torch.Tensor, next_logp: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """y = r + discount * (min_i Q'_i(s', a') - alpha * log pi(a'|s')); discount 0 cuts the bootstrap."""
        with torch.no_grad():
            q_next = self.critic_target(new_obs, next_a).min(dim=0).values
            return rewards + discounts * (q_next - alpha * next_logp)

    METRICS = ("critic_loss", "actor_loss", "alpha", "alpha_loss", "q_mean", "entropy")

    def extra_draws(self, batch_size: int) -> Dict[str, torch.Tensor]:
        return {"noise": torch.randn((2, batch_size, self.act_dim), device=self.device, generator=self.generator)}

    def update_step(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        batch = self.rows(inputs)
        obs, new_obs = batch[OBS], batch[NEW_OBS]
        actions, rewards, discounts = batch[ACTIONS], batch[REWARDS], batch[DISCOUNTS]
        alpha = self.log_alpha.detach().exp()
        noise = inputs["noise"]

        # critic
        with torch.no_grad():
            next_a, next_logp = squashed_sample(*self.actor(new_obs), noise[1])
        y = self.critic_target_values(rewards, discounts, new_obs, next_a, next_logp, alpha)
        q = self.critic(obs, actions)                               # (2, B)
        critic_loss = 0.5 * (q - y).pow(2).mean(dim=1).sum()
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        # actor: gradients reach the actor through a_pi only, not the critic's weights
        a_pi, logp_pi = squashed_sample(*self.actor(obs), noise[0])
        q_pi = self.critic(obs, a_pi, detach_params=True).min(dim=0).values
        actor_loss = (alpha * logp_pi - q_pi).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()

        # temperature: alpha_loss = -log_alpha * mean(log pi + target_entropy); its gradient is set
        # directly (no autograd graph for one scalar)
        entropy_gap = logp_pi.detach().mean() + self.target_entropy
        if self.log_alpha.grad is None:
            self.log_alpha.grad = torch.zeros_like(self.log_alpha)
        self.log_alpha.grad.copy_(-entropy_gap)   # in place: a captured step writes where the graph reads
        self.alpha_opt.step()

        # Polyak-averaged target critics
        optim.soft_update(self.critic_target.parameters(), self.critic.parameters(), self.config["tau"])

        return capture.stack([critic_loss, actor_loss, alpha, -(alpha.log() * entropy_gap), q.mean(),
                              -logp_pi.mean()])

    # ------------------------------------------------------------ checkpoints

    def nets_state(self) -> dict:
        state = super().nets_state()
        state["log_alpha"] = self.log_alpha.detach().clone()
        return state

    def load_nets_state(self, state: dict) -> None:
        state = dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state.pop("log_alpha"))
        super().load_nets_state(state)
