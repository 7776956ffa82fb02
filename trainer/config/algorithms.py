"""What a policy's `algorithm` names, and the class behind it: "dqn", "sac" or "ppo" (a learner of
this package, imported only when used), "random", or an import path "package.module:Class".

Parsing a config checks only the name (no learner is imported: the CLI reads configs without
torch); `resolve_algorithm` imports the class and checks `policies.<id>.config` against the
learner's defaults, at the daemon's start, before anything is served or written.
"""
import importlib
from typing import List

from simbridge.trainer.config.values import ConfigError, check_table_keys, check_type, hint_of_default

# Learners by name, imported only when used.
ALGORITHMS = {"dqn": "simbridge.trainer.learners.dqn:DQNLearner", "sac": "simbridge.trainer.learners.sac:SACLearner",
              "ppo": "simbridge.trainer.learners.ppo:PPOLearner"}
RANDOM = "random"


def known_algorithms() -> List[str]:
    return sorted(ALGORITHMS) + [RANDOM]


def is_import_path(s: str) -> bool:
    mod, sep, name = s.partition(":")
    return bool(sep and mod and name and all(p.isidentifier() for p in mod.split("."))
                and all(p.isidentifier() for p in name.split(".")))


def resolve_algorithm(spec, source: str = "", overrides=()):
    """The class behind spec.algorithm (None for "random"), with its config keys and their types
    checked against the learner's defaults (ints accepted for floats, which become floats).
    `spec`: a config.PolicySpec (not imported: config imports this module). `overrides`: the
    config's (dotted key, value) pairs: a bad key one of them set is blamed on `--set`, not the file."""
    # Here, not atop: parsing a config needs no torch (the CLI imports this module without it).
    from simbridge.server.policies import Policy
    from simbridge.trainer.learners.base import Learner

    if spec.is_random:
        return None
    path = ALGORITHMS.get(spec.algorithm, spec.algorithm)
    mod_name, _, attr = path.partition(":")
    where = f"{source}: " if source else ""
    what = f"{where}[policies.{spec.policy_id}] algorithm = {spec.algorithm!r}"
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"{what}: cannot import {mod_name!r} ({e}); check the module path and "
                          f"PYTHONPATH") from None
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError(f"{what}: module {mod_name!r} has no {attr!r}") from None
    if not (isinstance(obj, type) and issubclass(obj, Policy)):
        raise ConfigError(f"{what}: {path} is not a simbridge.trainer.learners.base.Learner (or simbridge.server.policies.Policy) "
                          f"subclass")
    if issubclass(obj, Learner):
        defaults, declared = obj.config_defaults(), obj.config_types()
        set_keys = {k for k, _ in overrides}

        def blame(keys) -> str:
            dotted = [f"policies.{spec.policy_id}.config.{k}" for k in sorted(keys)]
            by_set = [k for k in dotted if k in set_keys]
            return f"--set {', '.join(by_set)} (over {source or 'the config'}): " if by_set else where

        check_table_keys(spec.config, defaults, f"{blame(set(spec.config) - set(defaults))}"
                                                f"[policies.{spec.policy_id}] config ({obj.__name__})")
        for key, value in spec.config.items():
            try:
                spec.config[key] = check_type(f"policies.{spec.policy_id}.config.{key}", value,
                                              hint_of_default(defaults[key], declared.get(key)))
            except ConfigError as e:
                raise ConfigError(f"{blame([key])}{e} (the {obj.__name__} default is "
                                  f"{defaults[key]!r})") from None
        try:   # the values no space decides: refused now, not when the first simulator connects
            obj.check_config({**defaults, **spec.config})
        except ValueError as e:
            raise ConfigError(f"{blame(spec.config)}[policies.{spec.policy_id}] config ({obj.__name__}): "
                              f"{e}") from None
    return obj
