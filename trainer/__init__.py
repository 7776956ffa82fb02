"""The trainer: learners (DQN, SAC, PPO) behind the bridge, and the daemon that runs them.

Embedding (docs/trainer.md, "Run the trainer from a script"): build and run the daemon from Python.

    from simbridge.trainer import TrainerDaemon, load_config
    daemon = TrainerDaemon(load_config(None, overrides=[("run.seed", 3)]))
    daemon.run()   # blocks until daemon.request_stop(reason) (from another thread) or total_env_steps

The names resolve when first used, so `import simbridge.trainer` needs no torch.
"""
__all__ = ["TrainerDaemon", "TrainerConfig", "ConfigError", "load_config", "parse_config", "parse_overrides",
           "config_toml"]


def __getattr__(name):
    if name == "TrainerDaemon":
        from simbridge.trainer.daemon import TrainerDaemon
        return TrainerDaemon
    if name == "parse_overrides":
        from simbridge.trainer.config.values import parse_overrides
        return parse_overrides
    if name == "config_toml":
        from simbridge.trainer.config.writer import config_toml
        return config_toml
    if name in __all__:
        from simbridge.trainer.config import trainer_config as config
        return getattr(config, name)
    raise AttributeError(f"module 'simbridge.trainer' has no attribute {name!r}")
