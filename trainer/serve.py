"""A trained run's policies, from its checkpoint: served without learning, or exported for engines.

    simbridge-trainer serve  --checkpoint DIR [--address HOST:PORT] [--explore] [--logdir OUT]
    simbridge-trainer export --checkpoint DIR --onnx OUT.onnx [--policy ID]

Both read DIR/checkpoint.pt with the safe loader (trainer/run/checkpoint.py: never unpickled in full)
and DIR/config.toml (the run's own config: which learner each policy is), and re-create each
policy from the spaces saved with it, as `run --resume` does, but never trainable.

`serve` is the trainer daemon with every policy frozen: greedy actions (argmax, tanh of the
mean) unless --explore, no updates however much experience comes (the version stays the
checkpoint's), no journal, and nothing written into DIR: metrics, TensorBoard and its own
checkpoint go to --logdir (default runs/serve-<time>).

`export` writes the ONNX model of one policy (the one GetPolicy would send a simulator acting
locally: from the flattened observation "obs" to the action head's input "out"), runs it with
onnxruntime on observations sampled from the policy's space and checks it against torch: the
network's outputs (max abs difference) and the greedy actions of its head against the learner's
own. A mismatch, or a policy with no portable form, is an error (exit 1).
"""
import copy
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from simbridge.server.policies import ActionBatch, Policy
from simbridge.trainer.run import checkpoint
from simbridge.trainer.learners import export, placement
from simbridge.trainer.config.trainer_config import ConfigError, TrainerConfig, load_config
from simbridge.trainer.run.factory import PolicyFactory
from simbridge.trainer.run.rundir import CHECKPOINT, SAVED_CONFIG
from simbridge.wire import tree
from simbridge.wire.preprocess import flatten

TOLERANCE = 1e-4     # ONNX against torch, float32 outputs


def frozen_config(ckpt_dir: Path) -> TrainerConfig:
    """The run's config with no policy to train; ConfigError when DIR is not a run directory."""
    if not (ckpt_dir / CHECKPOINT).exists():
        raise ConfigError(f"--checkpoint {ckpt_dir}: no {CHECKPOINT} there; pass a run directory (the --logdir "
                          f"of `simbridge-trainer run`)")
    if not (ckpt_dir / SAVED_CONFIG).exists():
        raise ConfigError(f"--checkpoint {ckpt_dir}: no {SAVED_CONFIG} beside {CHECKPOINT}: it says which learner "
                          f"each policy is; copy the run's config there")
    cfg = load_config(ckpt_dir / SAVED_CONFIG)
    cfg.policies_to_train = []
    try:   # trained on a GPU, served or exported where there is none: nothing here needs that device
        placement.pick_device(cfg.run.device)
    except ValueError:
        cfg.run.device = "auto"
    cfg.dataset.warm_start = {}   # nothing learns here; [dataset] record still records what is served
    return cfg


def load_policies(ckpt_dir: Path, cfg: TrainerConfig) -> Tuple[Dict[str, Policy], dict]:
    """{policy id: policy with the checkpoint's weights, not trainable}, and the checkpoint."""
    state = checkpoint.load_checkpoint(ckpt_dir / CHECKPOINT)
    store = checkpoint.Checkpoints(ckpt_dir, keep_replay=False)
    policies = dict(store.restore_policies(state, cfg, PolicyFactory(cfg).build))
    if not policies:
        raise ConfigError(f"{ckpt_dir / CHECKPOINT} holds no policy of {ckpt_dir / SAVED_CONFIG}")
    return policies, state


class Greedy(Policy):
    """A policy served with explore=False: argmax, tanh of the mean (for learners, whose
    compute_actions takes the flag; others act as they do)."""

    def __init__(self, policy: Policy):
        super().__init__(policy.observation_space, policy.action_space)
        self.inner = policy
        self.version = policy.version

    def compute_actions(self, obs_batch: Any) -> ActionBatch:
        return self.inner.compute_actions(obs_batch, explore=False)

    def portable(self, include_onnx: bool = False):
        return self.inner.portable(include_onnx)


def serving_daemon(ckpt_dir: Path, cfg: TrainerConfig, explore: bool, logdir: Optional[str]):
    """The TrainerDaemon that serves DIR's policies frozen (greedy unless `explore`); cfg is
    frozen_config(DIR) with the command line's server settings."""
    from simbridge.trainer.daemon import TrainerDaemon   # the server: only when serving

    policies, _ = load_policies(ckpt_dir, cfg)
    cfg.run.logdir = logdir or f"runs/serve-{time.strftime('%Y%m%d-%H%M%S')}"
    if Path(cfg.run.logdir).resolve() == ckpt_dir.resolve():
        raise ConfigError("serve --logdir must not be the checkpoint's directory: serving writes its own metrics "
                          "and checkpoint, and leaves the trained run as it is")
    cfg.run.journal = False
    cfg.run.checkpoint_every_env_steps = 0
    cfg.run.total_env_steps = 0
    served = {pid: p if explore else Greedy(p) for pid, p in policies.items()}
    daemon = TrainerDaemon(cfg, preloaded=served)
    daemon.started_as = (f"serving {ckpt_dir / CHECKPOINT}, {'exploring' if explore else 'greedy'}, no training; "
                         f"metrics in {cfg.run.logdir}")
    return daemon


def export_onnx(ckpt_dir: Path, out: Path, policy_id: Optional[str], samples: int = 256,
                seed: int = 0) -> Dict[str, Any]:
    """Writes the ONNX model; returns the check's figures. ConfigError for what the user can fix."""
    import onnxruntime as ort

    cfg = frozen_config(ckpt_dir)
    policies, _ = load_policies(ckpt_dir, cfg)
    if policy_id is None:
        if len(policies) != 1:
            raise ConfigError(f"the checkpoint has policies {sorted(policies)}: choose one with --policy")
        policy_id = next(iter(policies))
    if policy_id not in policies:
        raise ConfigError(f"--policy {policy_id!r}: the checkpoint's policies are {sorted(policies)}")
    policy = policies[policy_id]
    msg = policy.portable(include_onnx=True)
    if msg is None or not msg.onnx_model:
        raise ConfigError(f"policy {policy_id!r} ({type(policy).__name__}, action space {policy.action_space}) has "
                          f"no portable form to export")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(msg.onnx_model)

    space = policy.observation_space
    space.seed(seed)
    obs = tree.stack([space.sample() for _ in range(samples)])
    flat = flatten(space, obs).astype(np.float32)
    with torch.no_grad():
        expected = export.torch_twin(policy, msg)(torch.as_tensor(flat)).numpy()
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(["out"], {"obs": flat})[0]
    diff = float(np.max(np.abs(got - expected))) if expected.size else 0.0
    same = _greedy_agreement(msg, policy, obs)
    return {"policy": policy_id, "onnx": str(out), "bytes": len(msg.onnx_model), "version": int(msg.version),
            "head": msg.head.kind, "samples": samples, "max_abs_diff": diff, "greedy_actions_equal": same,
            "ok": diff <= TOLERANCE and same == 1.0}


def _greedy_agreement(msg, policy: Policy, obs) -> float:
    """The share of sampled observations where the exported head, acting greedily on the
    network's output (numpy, as an engine would), picks the learner's own greedy action."""
    from simbridge.client.local_policy import LocalPolicy
    greedy = copy.deepcopy(msg)
    greedy.head.params["epsilon"] = 0.0
    greedy.head.params["deterministic"] = 1.0
    mine, _ = LocalPolicy(greedy, seed=0).compute_actions(obs)
    theirs = policy.compute_actions(obs, explore=False).actions
    a, b = np.asarray(mine, np.float64).reshape(len(mine), -1), np.asarray(theirs, np.float64).reshape(len(mine), -1)
    return float(np.mean(np.all(np.isclose(a, b, atol=1e-4), axis=1)))
