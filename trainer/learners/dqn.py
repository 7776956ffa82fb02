"""DQN for Discrete and MultiDiscrete actions, as a Learner the bridge serves actions from.

Read top to bottom:

1. The Q-network maps a flat observation to Q-values shaped (rows, branches, max_actions).
   A Discrete(n) space is one branch of n actions. A MultiDiscrete(nvec) space gets one head
   per branch ("action branching", Tavakoli et al. 2018, "Action Branching Architectures for
   Deep RL"): branch b scores its own sub-action, Q_b(s, a_b). Branches with fewer actions than
   the widest one are padded with -inf, so argmax and max never pick a padded slot.
   With `dueling`, Q_b(s, a_b) = V(s) + A_b(s, a_b) - mean_a A_b(s, a) (one V for all branches).

2. Acting is epsilon-greedy over the joint action: with probability epsilon a row takes a
   uniformly random action (every branch drawn uniformly), otherwise the greedy action (argmax
   per branch). Epsilon decays linearly from `epsilon_initial` to `epsilon_final` over the first
   `epsilon_timesteps` agent steps added to the learner. The returned logp is the
   log-probability of the chosen action under that distribution:
       p(a) = epsilon * prod_b 1/n_b + (1 - epsilon) * [a == greedy]
   With explore=False epsilon is 0: greedy, logp 0.

3. The update regresses every branch onto one shared target (the "mean" target of the paper):
       y = r + discount * mean_b Q_target_b(s', a*_b)
       a*_b = argmax_a Q_online_b(s', a)   (double_q, the default)
            = argmax_a Q_target_b(s', a)   (double_q=False: plain max)
   `r` and `discount` come from the replay's n-step columns: r is the n-step return and
   discount is gamma^m, already 0 when the trajectory terminated (a truncated one still
   bootstraps from its last observation). The loss averages Huber (or squared) errors of
   Q_b(s, a_b) - y over branches and rows. For a Discrete space (one branch) this is exactly
   (double) DQN. Since the target only uses (s, a, r, s'), transitions logged by the simulator
   itself (LogAction: other policies, humans, scripts) are learned from like our own. When the
   simulator keeps choosing a share of the actions while the policy acts, `logged_actions =
   "environment"` makes the target count on it (LOGGED_ACTIONS below).

4. Target network: every `target_update_interval` gradient updates,
       target <- tau * online + (1 - tau) * target
   tau = 1 is the classic hard copy; interval 1 with a small tau is Polyak averaging.

5. Adam, with the global gradient norm clipped to `grad_clip`; with `lr_final` set, the
   learning rate decays linearly from `lr` to `lr_final` over `lr_timesteps` agent steps.

6. Action masks: when the observation space is a Dict with an "action_mask" key (MultiBinary
   over all branches side by side, 1 = allowed; the Unity connector's convention), masked
   actions are never chosen: greedy takes the argmax over allowed actions, exploration draws
   uniformly among them, and the target's a*_b is the best allowed action in s'. The mask is
   read from the flat observation, so it is also an input of the network.

The replay ratio (`updates_per_step`), `learning_starts`, `n_step`, `gamma`, `batch_size`,
`buffer_size`, `hidden` and `seed` are the Learner base's COMMON_DEFAULTS.
"""
from typing import Dict

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.learners import capture, export, optim, splitk
from simbridge.trainer.learners import encoders
from simbridge.trainer.learners.base import Learner
from simbridge.trainer.learners.heads import action_branches, action_start
from simbridge.trainer.learners.nstep import DISCOUNTS
from simbridge.wire.columns import ACTION_LOGP, ACTIONS, NEW_OBS, OBS, POLICY_VERSION, REWARDS
from simbridge.wire.preprocess import dict_key_columns
from simbridge.wire.v1 import simbridge_pb2 as pb

MASK_KEY = "action_mask"

DQN_DEFAULTS = {
    "lr": 5e-4,
    "lr_final": None,                # None: constant lr; else linear decay to it ...
    "lr_timesteps": 50_000,          # ... over this many agent steps, then constant
    "adam_eps": 1e-8,
    "double_q": True,
    "dueling": False,
    "loss": "huber",                 # "huber" (smooth L1, delta 1) or "mse"
    "grad_clip": 10.0,               # max global grad norm; None disables
    "target_update_interval": 1,     # gradient updates between target updates
    "tau": 0.005,                    # 1.0 = hard copy
    "epsilon_initial": 1.0,
    "epsilon_final": 0.02,
    "epsilon_timesteps": 10_000,     # agent steps over which epsilon decays linearly
    "logged_actions": "ignore",      # or "environment": see LOGGED_ACTIONS
}

# How the target treats the actions the simulator chooses itself (LogAction rows: policy_version
# -1, action_logp NaN).
#   "ignore" (the default): plain DQN. The logged rows are learned from like the learner's own,
#       and the target assumes the learner chooses every action from s' on: right for
#       demonstrations and datasets, which will not choose for it while it acts.
#   "environment": the simulator keeps choosing some actions (a script, a human taking over), so
#       they are part of the world the policy acts in. A share p of the decisions (the running
#       fraction of logged rows this learner has seen) is not the learner's and the simulator's
#       choice is unknown, so the target values s' as the mix
#           (1 - p) * Q'(s', a*) + p * mean over allowed a of Q'(s', a)
#       (uniform: nothing says which action the simulator prefers); with no logged rows, p = 0
#       and this is plain DQN. Those uniform choices are exploration too: the learner's own
#       epsilon decays to max(0, (epsilon_final - p) / (1 - p)) instead of epsilon_final (see
#       epsilon()). Not the default: a learner fed only logged rows (a dataset) would get p = 1
#       and learn the values of the uniform policy. What it and the other candidates reached on
#       CartPole with 30% of the actions logged: docs/benchmarks.md, "Logged actions and SAC's
#       temperature".
LOGGED_ACTIONS = ("environment", "ignore")





class QNetwork(nn.Module):
    """Flat obs (B, obs_dim) -> Q-values (B, branches, max_actions), padding at -inf."""

    def __init__(self, obs_dim: int, nvec: np.ndarray, hidden, dueling: bool):
        super().__init__()
        layers, last = [], obs_dim
        for h in hidden:
            layers += [splitk.Linear(last, h), nn.ReLU()]
            last = h
        self.body = nn.Sequential(*layers)
        self.dueling = dueling
        self.advantage = splitk.Linear(last, int(nvec.sum()))  # all branches' heads side by side
        self.value = splitk.Linear(last, 1) if dueling else None
        # gather index (branches, max_actions) into the side-by-side heads, and the valid slots
        width = int(nvec.max())
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        slots = np.arange(width)
        valid = slots[None, :] < nvec[:, None]
        index = np.where(valid, offsets[:, None] + slots[None, :], 0)
        self.uniform = bool((nvec == width).all())  # Discrete, or equal branches: a plain view
        self.register_buffer("index", torch.as_tensor(index, dtype=torch.long), persistent=False)
        self.register_buffer("valid", torch.as_tensor(valid), persistent=False)
        self.register_buffer("n", torch.as_tensor(nvec, dtype=torch.float32), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        z = self.body(obs)
        if self.uniform:
            heads = self.advantage(z).view(len(z), *self.index.shape)
            if self.dueling:
                heads = self.value(z).unsqueeze(-1) + heads - heads.mean(-1, keepdim=True)
            return heads                                           # (B, branches, actions)
        heads = self.advantage(z)[:, self.index]                  # (B, branches, max_actions)
        if self.dueling:
            adv_mean = heads.masked_fill(~self.valid, 0.0).sum(-1, keepdim=True) / self.n[:, None]
            heads = self.value(z).unsqueeze(-1) + heads - adv_mean
        return heads.masked_fill(~self.valid, float("-inf"))


class DQNLearner(Learner):
    DEFAULTS = DQN_DEFAULTS
    CONFIG_TYPES = {"lr_final": float}

    # ------------------------------------------------------------ networks

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg["loss"] not in ("huber", "mse"):
            raise ValueError(f"DQN loss must be 'huber' or 'mse', got {cfg['loss']!r}")
        if cfg["logged_actions"] not in LOGGED_ACTIONS:
            raise ValueError(f"DQN logged_actions must be one of {LOGGED_ACTIONS}, got {cfg['logged_actions']!r}")

    def build(self) -> None:
        cfg = self.config
        self.nvec = action_branches(self.action_space)
        self.start = action_start(self.action_space)
        q_net = lambda features: QNetwork(features, self.nvec, cfg["hidden"], cfg["dueling"])   # noqa: E731
        self.q = encoders.network(self.observation_space, cfg, q_net).to(self.device)   # images: a CNN first
        self.q_target = encoders.network(self.observation_space, cfg, q_net).to(self.device)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.optimizer = self.adam(self.q.parameters(), cfg["lr"], eps=cfg["adam_eps"])
        # (1 - p, p) for p = logged_share(), on the device for the target's mix (kept current by
        # count_rows: a captured update reads them there); 1 - p computed on the host, as a float
        self.share = torch.tensor([1.0, 0.0], device=self.device)
        # rows seen, and those whose action the simulator chose (float64: exact counts, kept in checkpoints)
        self.row_counts = torch.zeros(2, dtype=torch.float64)
        self.mask_columns = dict_key_columns(self.observation_space, MASK_KEY)
        self.slot_index, self.slot_valid = self.q.index, self.q.valid  # flat action -> (branch, slot)
        if self.mask_columns is not None:
            width = self.mask_columns.stop - self.mask_columns.start
            if width != int(self.nvec.sum()):
                raise ValueError(f"observation key {MASK_KEY!r} has {width} entries; the action space "
                                 f"{self.action_space} needs one per action, {int(self.nvec.sum())}")

    def allowed(self, obs: torch.Tensor):
        """(B, branches, max_actions) bool of the actions the observations' masks allow (padding
        is never allowed), or None without masks. A branch whose mask allows nothing allows all."""
        if self.mask_columns is None:
            return None
        ok = (obs[:, self.mask_columns] > 0.5)[:, self.slot_index] & self.slot_valid
        return ok | (~ok.any(-1, keepdim=True) & self.slot_valid)

    def modules_for_acting(self) -> nn.Module:
        return self.q

    # ------------------------------------------------------------ acting

    def epsilon(self) -> float:
        """The learner's own exploration rate. With logged_actions "environment" its floor counts
        the simulator's uniform choices: with a share p of them, the learner explores only the
        rest, max(0, (epsilon_final - p) / (1 - p)), so all actions together are random at
        epsilon_final (0 from the learner when p >= epsilon_final: see LOGGED_ACTIONS)."""
        cfg = self.config
        final, p = cfg["epsilon_final"], self.logged_share()
        if p > 0.0:
            final = max(0.0, (final - p) / (1.0 - p)) if p < 1.0 else 0.0
        frac = min(1.0, self.agent_steps / max(1, cfg["epsilon_timesteps"]))
        return cfg["epsilon_initial"] + frac * (final - cfg["epsilon_initial"])

    def act(self, module: nn.Module, obs: torch.Tensor, explore: bool):
        q = module(obs)
        allowed = self.allowed(obs)
        if allowed is not None:
            q = q.masked_fill(~allowed, float("-inf"))
        greedy = q.argmax(-1).cpu().numpy()                       # (N, branches)
        eps = self.epsilon() if explore else 0.0
        n_rows = len(greedy)
        explore_rows = self.rng.random(n_rows) < eps
        if allowed is None:
            random_actions = self.rng.integers(0, self.nvec, size=greedy.shape)
            n_choices = float(np.prod(self.nvec, dtype=np.float64))
        else:
            ok = allowed.cpu().numpy()
            draw = np.where(ok, self.rng.random(ok.shape), -1.0)  # uniform over the allowed ones
            random_actions = draw.argmax(-1)
            n_choices = ok.sum(-1).prod(-1).astype(np.float64)
        actions = np.where(explore_rows[:, None], random_actions, greedy)
        is_greedy = (actions == greedy).all(axis=1)
        p = eps / n_choices + (1.0 - eps) * is_greedy
        logp = np.log(p).astype(np.float32)
        return self.to_env_actions(actions), logp

    def to_env_actions(self, indices: np.ndarray) -> np.ndarray:
        """(N, branches) indices from 0 -> actions of the env's space (start, shape, dtype)."""
        actions = indices + self.start
        shape = () if isinstance(self.action_space, gym.spaces.Discrete) else self.action_space.shape
        return actions.reshape((len(indices),) + shape).astype(self.action_space.dtype)

    def store_actions(self, actions: np.ndarray) -> np.ndarray:
        """Env actions (N,) or (N, *nvec.shape) -> int64 indices (N, branches) from 0."""
        return np.asarray(actions, np.int64).reshape(len(actions), -1) - self.start

    # ------------------------------------------------------------ portable form

    def export_layers(self, acting: nn.Module) -> export.Exported:
        """The Q-network's body and its side-by-side branch heads as one final linear layer giving
        every branch's Q-values (sum(nvec) outputs, no -inf padding); head "q_argmax" with the
        current epsilon and, with action masks, where they start in the flat observation."""
        layers = export.mlp_layers(acting.body)
        _, w, b = export.linear(acting.advantage)
        if acting.dueling:
            # Q_b(a) = V + A_b(a) - mean_a' A_b(a') is linear in the last hidden layer: folded into
            # the final layer, so the exported outputs are the Q-values themselves.
            nvec = np.asarray(self.nvec, np.int64)
            branch = np.repeat(np.arange(len(nvec)), nvec)
            mean = (branch[:, None] == branch[None, :]) / nvec[branch][:, None]   # block averaging
            _, wv, bv = export.linear(acting.value)
            w = w - mean @ w + wv
            b = b - mean @ b + bv
        layers.append(("linear", w, b))
        head = pb.ActionHead(kind="q_argmax", branch_sizes=[int(n) for n in self.nvec])
        head.params["epsilon"] = float(self.epsilon())
        if self.mask_columns is not None:
            head.params["action_mask_offset"] = float(self.mask_columns.start)
        return layers, head

    # ------------------------------------------------------------ learning

    def count_rows(self, batch: SampleBatch) -> None:
        logged = np.zeros(batch.count, bool)              # as the bridge records LogAction rows
        if POLICY_VERSION in batch:
            logged |= np.asarray(batch[POLICY_VERSION]) < 0
        if ACTION_LOGP in batch:
            logged |= np.isnan(np.asarray(batch[ACTION_LOGP], np.float64))
        self.row_counts += torch.tensor([batch.count, int(logged.sum())], dtype=torch.float64)
        if self.config["logged_actions"] == "environment" and self.row_counts[1] > 0:
            self.set_share()

    def logged_share(self) -> float:
        """p: the fraction of rows whose action the simulator chose (0 with logged_actions "ignore")."""
        if self.config["logged_actions"] == "ignore" or self.row_counts[0] == 0:
            return 0.0
        return float(self.row_counts[1] / self.row_counts[0])

    @torch.no_grad()
    def td_target(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """y = r + discount * mean_b V_b(s'), V_b = (1 - p) Q_target_b(s', a*_b) + p mean_a Q_target_b(s', a),
        a* from the online net if double_q; p = logged_share() (0 without logged rows)."""
        next_q_target = self.q_target(batch[NEW_OBS])             # (B, branches, max_actions)
        chooser = self.q(batch[NEW_OBS]) if self.config["double_q"] else next_q_target
        allowed = self.allowed(batch[NEW_OBS])
        if allowed is not None:
            chooser = chooser.masked_fill(~allowed, float("-inf"))
        next_actions = chooser.argmax(-1)
        next_q = next_q_target.gather(-1, next_actions.unsqueeze(-1)).squeeze(-1)  # (B, branches)
        if self.config["logged_actions"] == "environment":
            # (1 - p, p) as device tensors (self.share), so a captured update reads the current ones
            ok = self.slot_valid if allowed is None else allowed   # (branches, max) or (B, branches, max)
            ok = ok.expand_as(next_q_target)
            uniform = next_q_target.masked_fill(~ok, 0.0).sum(-1) / ok.sum(-1)
            next_q = self.share[0] * next_q + self.share[1] * uniform
        return batch[REWARDS] + batch[DISCOUNTS] * next_q.mean(-1)

    METRICS = ("loss", "q_mean", "grad_norm")

    def prepare_update(self):
        """The learning rate and logged share of this update; the key: whether it updates the target."""
        optim.set_lr(self.optimizer, self.learning_rate())
        self._target_turn = (self.updates + 1) % self.config["target_update_interval"] == 0
        return self._target_turn

    def host_metrics(self) -> Dict[str, float]:
        return {"epsilon": self.epsilon()}

    def update_step(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        cfg = self.config
        batch = self.rows(inputs)
        y = self.td_target(batch)                                  # (B,)
        actions = batch[ACTIONS].long().view(len(y), -1)           # (B, branches)
        q = self.q(batch[OBS]).gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # (B, branches)
        y = y.unsqueeze(-1).expand_as(q)
        if cfg["loss"] == "huber":
            loss = F.smooth_l1_loss(q, y)
        else:
            loss = F.mse_loss(q, y)

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg["grad_clip"] is not None:
            grad_norm = optim.clip_grad_norm(self.q.parameters(), cfg["grad_clip"])
        else:
            grad_norm = torch.zeros((), device=self.device)
        self.optimizer.step()

        if self._target_turn:
            optim.soft_update(self.q_target.parameters(), self.q.parameters(), cfg["tau"])
        return capture.stack([loss, q.mean(), grad_norm])

    # ------------------------------------------------------------ checkpoints

    def nets_state(self) -> dict:
        state = super().nets_state()
        state["row_counts"] = self.row_counts.clone()
        return state

    def load_nets_state(self, state: dict) -> None:
        state = dict(state)
        if "row_counts" in state:        # checkpoints from before logged_actions have none
            self.row_counts = state.pop("row_counts").clone()
        super().load_nets_state(state)
        self.set_share()

    def set_share(self) -> None:
        p = self.logged_share()
        self.share[0].fill_(1.0 - p)   # two fills, not a copy from the host: no synchronisation
        self.share[1].fill_(p)
