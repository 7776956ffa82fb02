"""The learners' tuned configs for the reference tasks: the one place tests, benches and docs take
them from. Each is a learner config dict, used as `DQNLearner(obs_space, act_space, {**DQN_CARTPOLE,
"seed": 0})` or written into a config file's policy table as `config = <toml_value(preset)>`
(simbridge.trainer.config.values);
trainer/configs/*.toml hold the same values for the CLI (tests/trainer/test_presets.py keeps them equal).
What each reached, over which seeds, and what was tried: docs/benchmarks.md, "Robustness across seeds".

On a GPU the presets run as they are (their updates captured as CUDA graphs: `update_path`,
trainer/learners/capture.py), but were tuned on one CPU thread, where an update's cost grows with
its batch. On a GPU it grows far less, so a learner there consumes experience faster with a larger
`batch_size` and a higher replay ratio `updates_per_step` (e.g. 1024 and 2: what that did on an
H200 is in docs/benchmarks.md, "The GPU"); check the target with bench/learning.py's `--set`.
"""
from typing import Dict

# CartPole-v1, mean of the last 10 episodes >= 475 within 50k env steps. n-step 3, Huber loss and a
# slow soft target (tau 0.005; 0.01 let some seeds' Q-values diverge past 1/(1-gamma)) keep it robust.
DQN_CARTPOLE = {
    "gamma": 0.99,
    "n_step": 3,
    "lr": 5e-4,
    "lr_final": 1e-4,
    "lr_timesteps": 50_000,
    "batch_size": 128,
    "buffer_size": 100_000,
    "learning_starts": 1_000,
    "updates_per_step": 1.0,
    "hidden": [128, 128],
    "double_q": True,
    "dueling": False,
    "loss": "huber",
    "grad_clip": 10.0,
    "target_update_interval": 1,
    "tau": 0.005,
    "epsilon_initial": 1.0,
    "epsilon_final": 0.02,
    "epsilon_timesteps": 10_000,
}

# Pendulum-v1, mean of the last 10 episodes >= -200 within 10k env steps. The same values as
# COMMON_DEFAULTS + SAC_DEFAULTS, spelled out so that changing a default does not move them.
SAC_PENDULUM = {
    "actor_lr": 1e-3,
    "critic_lr": 1e-3,
    "alpha_lr": 1e-3,
    "gamma": 0.99,
    "n_step": 1,
    "batch_size": 256,
    "buffer_size": 100_000,
    "learning_starts": 1_000,
    "updates_per_step": 1.0,
    "hidden": [256, 256],
    "tau": 0.005,
    "initial_alpha": 0.01,
    "target_entropy": "auto",
    "random_warmup": True,
}

# CartPole-v1, >= 475 within 100k env steps: short iterations (256 rows), 20 epochs, gamma 0.98 and
# GAE lambda 0.8 learn fast; lr decaying to 0 over the budget keeps 500 once reached.
PPO_CARTPOLE = {
    "gamma": 0.98,
    "lambda_": 0.8,
    "hidden": [64, 64],
    "lr": 1e-3,
    "lr_final": 0.0,
    "lr_timesteps": 100_000,
    "train_batch_size": 256,
    "minibatch_size": 256,
    "num_epochs": 20,
    "clip_param": 0.2,
    "vf_loss_coeff": 0.5,
    "entropy_coeff": 0.0,
    "grad_clip": 0.5,
    "normalize_advantages": True,
}

# Pendulum-v1 (Box actions), >= -200 within 100k env steps.
PPO_PENDULUM = {
    "gamma": 0.9,
    "lambda_": 0.95,
    "hidden": [64, 64],
    "lr": 1e-3,
    "train_batch_size": 1024,
    "minibatch_size": 64,
    "num_epochs": 10,
    "log_std_init": -0.5,
    "clip_param": 0.2,
    "entropy_coeff": 0.0,
    "grad_clip": 0.5,
}

# The name benches and tests use: (algorithm, config).
PRESETS: Dict[str, tuple] = {
    "dqn-cartpole": ("dqn", DQN_CARTPOLE),
    "sac-pendulum": ("sac", SAC_PENDULUM),
    "ppo-cartpole": ("ppo", PPO_CARTPOLE),
    "ppo-pendulum": ("ppo", PPO_PENDULUM),
}

