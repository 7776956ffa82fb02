"""Learners of the presets with a replay already full of synthetic rows, as the equality tests build
them (one setting changed, the same updates expected)."""
import gymnasium as gym
import numpy as np

from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.trainer.learners.nstep import DISCOUNTS
from simbridge.trainer.learners.presets import DQN_CARTPOLE, SAC_PENDULUM
from simbridge.trainer.learners.sac import SACLearner
from simbridge.wire.columns import ACTIONS, NEW_OBS, OBS, REWARDS


def filled(kind: str, **cfg):
    """A "dqn" (CartPole) or "sac" (Pendulum) learner, batch 1,024, 3,000 rows in its replay; cfg
    overrides the preset (device= picks the device)."""
    env, cls, preset = {"dqn": (gym.make("CartPole-v1"), DQNLearner, DQN_CARTPOLE),
                        "sac": (gym.make("Pendulum-v1"), SACLearner, SAC_PENDULUM)}[kind]
    device = cfg.pop("device", "cpu")
    base = {"hidden": [32, 32], "batch_size": 1024, "learning_starts": 100, "buffer_size": 4000, "seed": 0}
    lrn = cls(env.observation_space, env.action_space, {**preset, **base, **cfg}, device=device)
    rng = np.random.default_rng(0)
    rows = 3000
    obs = rng.uniform(-1, 1, (rows,) + env.observation_space.shape).astype(np.float32)
    env.action_space.seed(0)
    actions = np.stack([env.action_space.sample() for _ in range(rows)])
    lrn.replay.add({OBS: obs, NEW_OBS: obs * 0.9, ACTIONS: lrn.store_actions(actions),
                    REWARDS: rng.standard_normal(rows).astype(np.float32),
                    DISCOUNTS: np.where(rng.random(rows) < 0.1, 0.0, 0.99).astype(np.float32)})
    lrn.agent_steps += rows
    return lrn


def weights(lrn) -> list:
    """The acting networks' parameters, copied to the CPU."""
    return [t.detach().cpu().clone() for t in lrn.modules_for_acting().state_dict().values()]
