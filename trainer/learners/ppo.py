"""PPO (clipped surrogate, Schulman et al. 2017) as a Learner the bridge serves actions from.

Read top to bottom:

1. Experience. The bridge hands over fragments (rows of several episodes and agents, possibly
   interleaved). `add` keeps the rows PPO can learn from in a rollout buffer:
   - dropped and counted in `last_metrics["rows_dropped_logged"]`: rows whose action the simulator
     chose itself (LogAction: policy_version -1, action_logp NaN), and any row without a recorded
     logp (an action served with explore=False). Their behaviour distribution is unknown, so no
     importance ratio exists for them.
   - dropped and counted in `rows_dropped_greedy`: categorical rows whose recorded logp is exactly
     0, i.e. acted deterministically (a client acting locally from the exported greedy head below;
     act() itself reports at most MAX_CATEGORICAL_LOGP, so a sure policy's rows are not mistaken).
   - dropped and counted in `rows_dropped_stale`: rows acted by weights more than `max_policy_lag`
     versions older than the weights they would train (default None: older than the weights
     published before the current ones, i.e. more than one iteration behind).
   - corrected: every other row, including rows acted by the previous weights (they arrive while
     an iteration trains, or sit in the bridge's queue meanwhile). The clipped ratio uses the logp
     recorded with the action, pi_new(a|s) / pi_behaviour(a|s), as RLlib's PPO does with
     ACTION_LOGP; `rows_lagged` counts the rows trained with a behaviour older than the weights at
     the start of their iteration.

2. Iterations. Once `train_batch_size` rows are buffered, an iteration takes all of them: values
   of obs and new_obs with the current value network, then advantages and value targets per
   segment (trainer/learners/advantages.py: GAE, bootstrapped from V(new_obs) where a fragment ends
   without termination, truncated included; 0 after termination). Then `num_epochs` passes over
   the rows in shuffled minibatches of about `minibatch_size`: one gradient update each, the
   version counting them like the other learners' updates. `updates_due()` is the number of
   updates left in the iteration (or of the next one, once enough rows wait), so the daemon's
   chunks of `train(max_updates=64)` run it through; rows added meanwhile wait for the next
   iteration. The acting weights change only when an iteration ends (`sync_acting`). There is no
   replay: the base class's n_step, buffer_size, batch_size, learning_starts and
   updates_per_step do not apply, and setting them is an error.

3. Loss, per minibatch (advantages normalised in the minibatch if `normalize_advantages`):
       ratio = exp(logp_new - logp_behaviour)
       policy_loss = -mean(min(ratio * A, clip(ratio, 1 - clip_param, 1 + clip_param) * A))
       loss = policy_loss + vf_loss_coeff * mean((V(s) - value_target)^2) - entropy_coeff * entropy
   Adam over both networks, global gradient norm clipped to `grad_clip`, learning rate linear from
   `lr` to `lr_final` over `lr_timesteps` agent steps when lr_final is set.

4. Networks (trainer/learners/ppo_policy.py): a policy MLP and a separate value MLP (tanh, orthogonal init
   as in CleanRL). Separate, so the value loss's scale (returns of 100s in CartPole) never competes
   with the policy gradient in a shared trunk, vf_loss_coeff needs no tuning, and the export is the
   policy MLP alone.

5. Actions (`ActionLayout`): the policy's output holds the logits of every categorical branch side
   by side, then the means of the Box part.
   - Discrete / MultiDiscrete: independent categoricals, one per branch, logp summed.
   - Box: a Gaussian squashed by tanh into the bounds, as SAC's actor (trainer/learners/sac.py), with a
     state-independent log_std; logp is the env-space density of the action, whether acting,
     training (atanh of the recorded action) or exported.
   - Unity hybrid, Dict{"continuous": Box, "discrete": Discrete | MultiDiscrete} (sims/unity/
     spaces.py): both, independent, logp and entropy summed.
   - Action masks: an observation Dict key "action_mask" (1 = allowed, all branches side by side,
     the connector's convention) masks the logits when acting and training; a branch that allows
     nothing allows all, as in DQN.
   explore=True samples and returns logp; explore=False is deterministic (argmax per branch, tanh
   of the mean) and returns no logp.

6. Export (PortablePolicy / ONNX): the deterministic policy. Categorical: the policy MLP and head
   "q_argmax" with epsilon 0 (the argmax of the logits, masks included). Box: head "tanh_gaussian"
   with deterministic = 1, the last layer extended with the log_std outputs. Hybrid: no portable
   head exists for it (export_layers returns None).
"""
import threading
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import nn

from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.learners import capture, export, optim
from simbridge.trainer.learners.advantages import compute_advantages, segments
from simbridge.trainer.learners import encoders
from simbridge.trainer.learners.base import COMMON_DEFAULTS, Learner
from simbridge.trainer.learners.ppo_policy import MASK_KEY, ActionLayout, PolicyNet, tanh_mlp
from simbridge.trainer.learners.replay import ReplayBuffer
from simbridge.wire.columns import (ACTION_LOGP, ACTIONS, AGENT_INDEX, EPS_ID, NEW_OBS, OBS, POLICY_VERSION,
                                    REWARDS, T, TERMINATEDS, TRUNCATEDS)
from simbridge.wire.preprocess import dict_key_columns, flat_dim
from simbridge.wire.v1 import simbridge_pb2 as pb

PPO_DEFAULTS = {
    "hidden": [64, 64],
    "lr": 3e-4,
    "lr_final": None,              # None: constant lr; else linear decay to it ...
    "lr_timesteps": 100_000,       # ... over this many agent steps, then constant
    "adam_eps": 1e-5,
    "train_batch_size": 2048,      # rows buffered before an iteration starts
    "minibatch_size": 256,         # rows per gradient update (about: the rows are split evenly)
    "num_epochs": 10,              # passes over the iteration's rows
    "lambda_": 0.95,               # GAE lambda
    "use_gae": True,               # False: discounted returns minus V as advantages
    "clip_param": 0.2,
    "vf_loss_coeff": 0.5,
    "entropy_coeff": 0.0,
    "grad_clip": 0.5,              # max global grad norm; None disables
    "normalize_advantages": True,
    "max_policy_lag": None,        # versions; None: rows of the current and the previous weights
    "log_std_init": 0.0,           # Box actions: initial log_std of the pre-tanh Gaussian
}
# act() reports categorical logp of at most this, so that exactly 0 means a deterministic behaviour
# (the exported greedy head); the ratio error it makes is 1e-7.
MAX_CATEGORICAL_LOGP = -1e-7
MINIBATCH_KEYS = ("obs", "idx", "a", "logp", "adv", "targets")   # an update_step's inputs
REPLAY_KEYS = ("n_step", "buffer_size", "batch_size", "learning_starts", "updates_per_step", "replay_store")


class PPOLearner(Learner):
    ON_POLICY = True   # iterations over its rows, not draws from a replay buffer (trainer/distributed/group.py)
    NETWORKS = 2       # policy and value
    PARAM_COPIES = 5   # weights, acting copy, gradients, Adam's two moments
    DEFAULTS = PPO_DEFAULTS
    CONFIG_TYPES = {"lr_final": float, "max_policy_lag": int}

    @classmethod
    def memory_estimate(cls, observation_space, action_space, config=None) -> Dict[str, int]:
        """As Learner's, with the rollout buffer in place of a replay buffer: up to two iterations'
        rows (one training, one arriving meanwhile)."""
        est = super().memory_estimate(observation_space, action_space, config)
        cfg = {**COMMON_DEFAULTS, **cls.DEFAULTS, **(config or {})}
        est["replay"] = 2 * int(cfg["train_batch_size"]) * est["transition"]
        return est

    # ------------------------------------------------------------ build

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        changed = [k for k in REPLAY_KEYS if cfg[k] != COMMON_DEFAULTS[k]]
        if changed:
            raise ValueError(f"PPO has no replay buffer: {changed} do not apply; use train_batch_size, "
                             f"minibatch_size and num_epochs")
        if cfg["train_batch_size"] < 1 or cfg["minibatch_size"] < 1 or cfg["num_epochs"] < 1:
            raise ValueError("PPO needs train_batch_size, minibatch_size and num_epochs >= 1")

    def new_replay(self) -> ReplayBuffer:
        # The daemon sizes journal replays by replay.capacity: PPO keeps no old rows to refill.
        return ReplayBuffer(0, self.device)

    def build(self) -> None:
        cfg = self.config
        self.layout = ActionLayout(self.action_space)
        # images: a CNN before each network (separate, as ML-Agents' PPO without shared_critic)
        space = self.observation_space
        self.policy = encoders.network(space, cfg, lambda f: PolicyNet(f, self.layout, cfg["hidden"], cfg["log_std_init"]))
        self.policy = self.policy.to(self.device)
        self.value = encoders.network(space, cfg, lambda f: tanh_mlp([f, *cfg["hidden"], 1], 1.0)).to(self.device)
        params = list(self.policy.parameters()) + list(self.value.parameters())
        self.optimizer = self.adam(params, cfg["lr"], eps=cfg["adam_eps"])
        self.mask_columns = dict_key_columns(self.observation_space, MASK_KEY)
        if self.mask_columns is not None and self.mask_columns.stop - self.mask_columns.start != self.layout.n_logits:
            raise ValueError(f"observation key {MASK_KEY!r} has {self.mask_columns.stop - self.mask_columns.start} "
                             f"entries; the action space {self.action_space} needs one per discrete action, "
                             f"{self.layout.n_logits}")
        # rows waiting for the next iteration; the lock lets add() run beside train() (a learner thread)
        self._incoming_lock = threading.Lock()
        self.incoming: List[Dict[str, np.ndarray]] = []
        self.incoming_rows = 0
        self.iteration: Optional[dict] = None            # the iteration being trained
        self.previous_version = 0                        # weights published before the current ones
        self.counters = {"rows_dropped_logged": 0, "rows_dropped_greedy": 0, "rows_dropped_stale": 0,
                         "rows_lagged": 0, "rows_trained": 0, "iterations": 0}

    def modules_for_acting(self) -> nn.Module:
        return self.policy

    def allowed(self, obs: torch.Tensor) -> Optional[torch.Tensor]:
        return None if self.mask_columns is None else self.layout.allowed(obs[:, self.mask_columns])

    # ------------------------------------------------------------ acting

    def act(self, module: nn.Module, obs: torch.Tensor, explore: bool):
        out = module(obs)
        idx, a, logp = self.layout.sample(out, module.log_std, self.allowed(obs), explore, self.act_generator)
        actions = self.layout.to_env(idx.cpu().numpy(), a.cpu().numpy())
        if not explore:
            return actions, None
        logp = logp.cpu().numpy().astype(np.float32)
        return actions, (np.minimum(logp, MAX_CATEGORICAL_LOGP) if self.layout.act_dim == 0 else logp)

    # ------------------------------------------------------------ portable form

    def export_layers(self, acting: nn.Module) -> export.Exported:
        lay = self.layout
        if lay.n_logits and lay.act_dim:
            return None   # no head acts on hybrid actions
        layers = export.mlp_layers(acting.net)
        if lay.n_logits:
            head = pb.ActionHead(kind="q_argmax", branch_sizes=[int(n) for n in lay.nvec])
            head.params["epsilon"] = 0.0
            if self.mask_columns is not None:
                head.params["action_mask_offset"] = float(self.mask_columns.start)
            return layers, head
        # tanh_gaussian reads [mean, log_std] from the last layer: log_std as zero weights + bias
        _, w, b = layers[-1]
        log_std = acting.log_std.detach().cpu().double().clamp(*lay.LOG_STD_RANGE).numpy()
        layers[-1] = ("linear", np.concatenate([w, np.zeros_like(w)]), np.concatenate([b, log_std]))
        head = pb.ActionHead(kind="tanh_gaussian")
        head.params.update({"log_std_min": lay.LOG_STD_RANGE[0], "log_std_max": lay.LOG_STD_RANGE[1],
                            "deterministic": 1.0})
        return layers, head

    # ------------------------------------------------------------ experience

    def fresh_from(self) -> int:
        """The oldest policy_version a row may have been acted with and still train."""
        lag = self.config["max_policy_lag"]
        return self.previous_version if lag is None else self.version - int(lag)

    def add(self, batch: SampleBatch) -> None:
        if not self.trainable or batch.count == 0:
            return
        self.agent_steps += batch.count
        version = np.asarray(batch[POLICY_VERSION], np.int64)
        logp = np.asarray(batch[ACTION_LOGP], np.float32)
        logged = (version < 0) | np.isnan(logp)
        greedy = ~logged & (logp == 0.0) & (self.layout.act_dim == 0)
        stale = ~logged & ~greedy & (version < self.fresh_from())
        keep = ~(logged | greedy | stale)
        chunk = None
        if keep.any():
            idx, a = self.layout.from_env(batch[ACTIONS])
            rows = {OBS: encoders.obs_rows(self.observation_space, batch[OBS]), "idx": idx, "a": a,
                    NEW_OBS: encoders.obs_rows(self.observation_space, batch[NEW_OBS]), POLICY_VERSION: version,
                    ACTION_LOGP: logp}
            for k in (REWARDS, TERMINATEDS, TRUNCATEDS, EPS_ID, AGENT_INDEX, T):
                rows[k] = np.asarray(batch[k])
            chunk = {k: v[keep] for k, v in rows.items()}
        with self._incoming_lock:
            self.counters["rows_dropped_logged"] += int(logged.sum())
            self.counters["rows_dropped_greedy"] += int(greedy.sum())
            self.counters["rows_dropped_stale"] += int(stale.sum())
            if chunk is not None:
                self.incoming.append(chunk)
                self.incoming_rows += int(keep.sum())
            # the counters in the progress records stay current between iterations (a new dict:
            # the reporter may be reading the old one)
            self.last_metrics = {**self.last_metrics, **{k: float(v) for k, v in self.counters.items()}}

    def drop_stale(self) -> None:
        """Drops waiting rows that the weights published since they were added made stale."""
        oldest = self.fresh_from()
        with self._incoming_lock:
            kept = []
            for rows in self.incoming:
                fresh = rows[POLICY_VERSION] >= oldest
                self.counters["rows_dropped_stale"] += int((~fresh).sum())
                if fresh.any():
                    kept.append(rows if fresh.all() else {k: v[fresh] for k, v in rows.items()})
            self.incoming = kept
            self.incoming_rows = sum(len(r[REWARDS]) for r in kept)

    # ------------------------------------------------------------ iterations

    def updates_due(self) -> int:
        if not self.trainable:
            return 0
        if self.iteration is not None:
            return len(self.iteration["steps"]) - self.iteration["done"]
        if self.incoming_rows < self.config["train_batch_size"]:
            return 0
        return self.config["num_epochs"] * self.minibatches(self.incoming_rows)

    def updates_made_due(self, rows_from: int, rows_to: int) -> float:
        # every row counts towards an iteration: num_epochs passes of minibatch_size rows per update
        return (rows_to - rows_from) * self.config["num_epochs"] / self.config["minibatch_size"]

    def minibatches(self, rows: int) -> int:
        return max(1, round(rows / self.config["minibatch_size"]))

    def waiting_rows(self) -> int:
        return self.incoming_rows

    @torch.no_grad()
    def start_iteration(self, per_epoch: Optional[int] = None, take_rows: bool = True) -> dict:
        """The iteration on every waiting row, in `per_epoch` minibatches per epoch (default: about
        minibatch_size rows each). take_rows False: an iteration of empty minibatches that leaves the
        rows waiting (a rank of a group sitting this one out, trainer/distributed/group.py)."""
        cfg = self.config
        with self._incoming_lock:
            chunks = self.incoming if take_rows else []
            if take_rows:
                self.incoming, self.incoming_rows = [], 0
        rows = {k: np.concatenate([r[k] for r in chunks]) for k in chunks[0]} if chunks else self._no_rows()
        order, ends = segments(rows[EPS_ID], rows[AGENT_INDEX], rows[T], rows[TERMINATEDS] | rows[TRUNCATEDS])
        rows = {k: v[order] for k, v in rows.items()}
        dev = self.device
        obs = torch.as_tensor(rows[OBS], device=dev)
        values = self.value(obs).squeeze(-1)
        next_values = self.value(torch.as_tensor(rows[NEW_OBS], device=dev)).squeeze(-1)
        adv, targets = compute_advantages(rows[REWARDS], values.cpu().numpy(), next_values.cpu().numpy(),
                                          rows[TERMINATEDS], ends, cfg["gamma"], cfg["lambda_"], cfg["use_gae"])
        n = len(adv)
        lagged = int((rows[POLICY_VERSION] < self.version).sum())
        self.counters["rows_lagged"] += lagged
        self.counters["rows_trained"] += n
        # every epoch's shuffled minibatches, drawn now: updates_due() counts them down
        k = per_epoch or self.minibatches(n)
        steps = [mb for _ in range(cfg["num_epochs"])
                 for mb in torch.randperm(n, device=dev, generator=self.generator).tensor_split(k)]
        optim.set_lr(self.optimizer, self.learning_rate())
        self.updater.clear()   # the iteration's metrics: averaged over its minibatches at its end
        return {"obs": obs, "idx": torch.as_tensor(rows["idx"], device=dev), "a": torch.as_tensor(rows["a"], device=dev),
                "logp": torch.as_tensor(rows[ACTION_LOGP], device=dev), "adv": torch.as_tensor(adv, device=dev),
                "targets": torch.as_tensor(targets, device=dev), "steps": steps, "done": 0, "kept": False,
                "rows": n, "lagged": lagged, "values": values}

    def train(self, max_updates: Optional[int] = None) -> Dict[str, float]:
        due = self.updates_due()
        if max_updates is not None:
            due = min(due, max_updates)
        if due == 0:
            return {}
        if self.iteration is None:
            self.iteration = self.start_iteration()
        self.run_updates(due)
        return self.last_metrics

    def run_updates(self, n: int, keep_metrics: bool = True) -> None:
        """The iteration's next n minibatch updates (ending it after its last)."""
        it = self.iteration
        it["kept"] |= keep_metrics
        for _ in range(n):
            mb = it["steps"][it["done"]]
            self.updater.run({k: it[k][mb] for k in MINIBATCH_KEYS})
            it["done"] += 1
            self.updates += 1
        if it["done"] == len(it["steps"]):
            self.finish_iteration(it)

    def _no_rows(self) -> Dict[str, np.ndarray]:
        """Zero rows with the columns' shapes (start_iteration without rows)."""
        lay = self.layout
        rows = {OBS: np.zeros((0, flat_dim(self.observation_space)), np.float32),
                "idx": np.zeros((0, len(lay.nvec)), np.int64), "a": np.zeros((0, lay.act_dim), np.float32),
                POLICY_VERSION: np.zeros(0, np.int64), ACTION_LOGP: np.zeros(0, np.float32)}
        rows[NEW_OBS] = rows[OBS]
        for k, dt in ((REWARDS, np.float32), (TERMINATEDS, bool), (TRUNCATEDS, bool), (EPS_ID, np.int64),
                      (AGENT_INDEX, np.int64), (T, np.int64)):
            rows[k] = np.zeros(0, dt)
        return rows

    def finish_iteration(self, it: dict) -> None:
        self.iteration = None
        self.counters["iterations"] += 1
        m = self.updater.mean() if it["kept"] else {}   # the iteration's one read-back of the step's metrics
        m.update({k: float(v) for k, v in self.counters.items()})
        m.update({"lr": self.learning_rate(), "iteration_rows": float(it["rows"]),
                  "iteration_lagged": float(it["lagged"]), "value_mean": float(it["values"].mean())})
        self.last_metrics = m
        self.previous_version = self.version
        self.sync_acting()
        self.drop_stale()

    METRICS = ("policy_loss", "vf_loss", "entropy", "approx_kl", "clip_frac")

    def update_step(self, mb: Dict[str, torch.Tensor]) -> torch.Tensor:
        """One clipped-surrogate gradient update on a minibatch (MINIBATCH_KEYS); its metrics stay on
        the device (averaged over the iteration, read back once at its end)."""
        cfg = self.config
        obs = mb["obs"]
        logp, entropy = self.layout.log_prob(self.policy(obs), self.policy.log_std, self.allowed(obs), mb["idx"], mb["a"])
        adv = mb["adv"]
        if cfg["normalize_advantages"] and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        log_ratio = (logp - mb["logp"]).clamp(-20.0, 20.0)   # a wildly off row must not overflow exp
        ratio = log_ratio.exp()
        clip = cfg["clip_param"]
        policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
        vf_loss = (self.value(obs).squeeze(-1) - mb["targets"]).pow(2).mean()
        loss = policy_loss + cfg["vf_loss_coeff"] * vf_loss - cfg["entropy_coeff"] * entropy.mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg["grad_clip"] is not None:
            optim.clip_grad_norm(list(self.policy.parameters()) + list(self.value.parameters()), cfg["grad_clip"])
        self.optimizer.step()
        with torch.no_grad():
            # (ratio - 1) - log ratio: the low-variance KL estimator (Schulman's blog, CleanRL)
            return capture.stack([policy_loss, vf_loss, entropy.mean(), ((ratio - 1) - log_ratio).mean(),
                                  ((ratio - 1).abs() > clip).float().mean()])

    # ------------------------------------------------------------ checkpoints

    def state_dict(self, include_replay: bool = False) -> dict:
        """The base's, plus the drop counters. Buffered rows are not kept (include_replay or not):
        on resume they would train weights newer than those that acted them."""
        state = super().state_dict(include_replay=False)
        state.update(counters=dict(self.counters), previous_version=self.previous_version)
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.counters.update(state.get("counters", {}))
        self.previous_version = state.get("previous_version", self.version)
        with self._incoming_lock:
            self.incoming, self.incoming_rows, self.iteration = [], 0, None
