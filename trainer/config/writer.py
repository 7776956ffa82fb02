"""The effective trainer config written back: TOML that parses to the same config (the run's
config.toml) and flat dotted keys (TensorBoard's hparams)."""
from typing import Any, Dict

from simbridge.trainer.config.spaces import space_table
from simbridge.trainer.config.values import dump_toml, flatten, toml_value

# Takes a simbridge.trainer.config.trainer_config.TrainerConfig (not imported: config imports this module).


def config_tables(cfg) -> Dict[str, Dict[str, Any]]:
    """The effective config as TOML tables ({"server": {...}, "policies.p0": {...}, ...})."""
    tables = cfg.section_tables()
    for pid, spec in cfg.policies.items():
        t: Dict[str, Any] = {"algorithm": spec.algorithm}
        if spec.config:
            t["config"] = dict(spec.config)
        if spec.frame_stack != 1:
            t["frame_stack"] = spec.frame_stack
        if spec.observation_space is not None:
            t["observation_space"] = space_table(spec.observation_space)
            t["action_space"] = space_table(spec.action_space)
        tables[f"policies.{pid}"] = t
    tables["mapping"] = {"rules": [f"{p}={pid}" for p, pid in cfg.mapping.rules], "default": cfg.mapping.default}
    return tables


def config_toml(cfg) -> str:
    """The effective config (after overrides and the CLI's flags) as TOML that parses back to it."""
    note = f"The effective config of this run: {cfg.source}"
    if cfg.overrides:
        note += "\nwith " + ", ".join(f"{k} = {toml_value(v)}" for k, v in cfg.overrides)
    return dump_toml({"policies_to_train": cfg.policies_to_train}, config_tables(cfg), header=note)


def flat_config(cfg) -> Dict[str, Any]:
    """{"run.seed": 0, "policies.p0.config.lr": 0.0005, ...}: TensorBoard's hparams."""
    tables: Dict[str, Any] = {}
    for name, t in config_tables(cfg).items():
        node = tables
        for part in name.split("."):
            node = node.setdefault(part, {})
        node.update(t)
    tables["policies_to_train"] = cfg.policies_to_train
    return flatten(tables)
