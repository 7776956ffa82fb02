"""The presets live in one place (trainer/learners/presets.py); the shipped config files the CLI
takes (trainer/configs/) must give the learner the same config, or a user running a shipped file
gets something other than what the docs' figures measured."""
import pytest

from simbridge.trainer.config.trainer_config import CONFIG_DIR, load_config
from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.trainer.learners.ppo import PPOLearner
from simbridge.trainer.learners.presets import DQN_CARTPOLE, PPO_CARTPOLE, PRESETS, SAC_PENDULUM
from simbridge.trainer.learners.sac import SACLearner


@pytest.mark.parametrize("file, cls, preset", [
    ("cartpole_dqn.toml", DQNLearner, DQN_CARTPOLE),
    ("pendulum_sac.toml", SACLearner, SAC_PENDULUM),
    ("cartpole_ppo.toml", PPOLearner, PPO_CARTPOLE),
])
def test_each_shipped_config_gives_its_learner_the_preset(file, cls, preset):
    table = load_config(CONFIG_DIR / file).policies["default_policy"].config
    defaults = cls.config_defaults()
    assert {**defaults, **table} == {**defaults, **preset}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_key_is_a_key_of_its_learner(name):
    algorithm, preset = PRESETS[name]
    cls = {"dqn": DQNLearner, "sac": SACLearner, "ppo": PPOLearner}[algorithm]
    assert set(preset) <= set(cls.config_defaults()), set(preset) - set(cls.config_defaults())
