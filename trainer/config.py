"""The trainer daemon's configuration: a TOML file -> dataclasses.

    [server]                       # the embedded bridge (simbridge.server.runtime.BridgeConfig)
    address = "127.0.0.1:50051"
    rollout_fragment_length = 200
    batch_mode = "truncate_episodes"   # or "complete_episodes"
    max_wait_ms = 0.0
    experience_queue_size = 4          # small: a slow learner slows the simulators down
    tls_cert = ""                      # security (docs/security.md): TLS certificate chain and key,
    tls_key = ""                       #   client roots for mutual TLS, accepted tokens (one per
    tls_client_ca = ""                 #   line); paths relative to the working directory
    auth_token_file = ""
    insecure = false                   # a non-loopback address without TLS and authentication

    [run]
    logdir = "runs/cartpole_dqn"
    checkpoint_every_env_steps = 10000
    keep_replay_in_checkpoint = false
    device = "auto"                    # "cpu", "cuda", "cuda:1", ...
    total_env_steps = 0                # 0: run until stopped
    seed = 0                           # optional
    print_every_s = 2.0                # console line, metrics.jsonl and TensorBoard interval
    torch_threads = 1                  # torch intra-op threads (0: torch's default, one per core);
                                       # on a CPU shared with gRPC threads and simulators, 1 is
                                       # ~10x faster per update than one per core on 2 cores
    learner_process = true             # each trained policy learns in a process of its own while
                                       # the bridge serves (false: in the daemon, between intakes)
    max_updates_behind = 256           # rate limiter: simulators wait to hand over a fragment while
                                       # a learner owes more updates than this (the ratio: the
                                       # policy's updates_per_step)

    [policies.default_policy]
    algorithm = "dqn"                  # "dqn", "sac", "random" or "package.module:Class"
    config = { learning_starts = 500 } # overrides of the learner's defaults
    # observation_space = { type = "Box", low = -1.0, high = 1.0, shape = [4] }
    # action_space = { type = "Discrete", n = 2 }

    [mapping]
    rules = ["player_*=nim", "cart_[02]=p0"]   # glob on agent ids = policy id; first match wins
    default = "default_policy"

    policies_to_train = ["p0"]         # top-level key (put it before the first [table]);
                                       # default: every learner policy

    [dataset]                          # record / warm start: trainer/datasets.py, docs/datasets.md

Spaces are optional: by default each policy is created when the first simulator
that uses it connects, with the spaces its handshake declares. Declared spaces
create the policy at startup, and simulators declaring other spaces are refused.
Space tables: {type="Discrete", n=, start=0}, {type="Box", low=, high=, shape=[..],
dtype="float32"}, {type="MultiDiscrete", nvec=[..]}, {type="MultiBinary", n=}.

`algorithm = "package.module:Class"` names any importable class: a
simbridge.trainer.learner.Learner subclass (built as Class(obs_space, act_space,
config=..., device=..., trainable=...)) or a simbridge.server.policies.Policy subclass
that only acts (built as Class(obs_space, act_space, **config)).

Parsing checks every key's type (config_values.py) and all else that needs no learner import;
`resolve_algorithm` checks `policies.<id>.config` against the learner's defaults (at the daemon's
start, before anything is served or written). `overrides` (`--set`) apply before the checks;
`config_toml(cfg)` is the effective config. A new section: a dataclass with `check(self, where)`,
a line in SECTIONS and a field of TrainerConfig.
"""
import dataclasses
import importlib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym

from simbridge.server.experience import BATCH_MODES
from simbridge.server.mapping import DEFAULT_POLICY, parse_rules
from simbridge.wire.addresses import address_problem
from simbridge.trainer.config_spaces import space_from_table
from simbridge.trainer.config_values import (ConfigError, Override, apply_overrides, check_keys, check_type,
                                             hint_of_default, tomllib)
from simbridge.trainer.datasets import DatasetConfigError, DatasetSection, parse_dataset_section

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "cartpole_dqn.toml"

# Learners by name, imported only when used.
ALGORITHMS = {"dqn": "simbridge.trainer.dqn:DQNLearner", "sac": "simbridge.trainer.sac:SACLearner",
              "ppo": "simbridge.trainer.ppo:PPOLearner"}
RANDOM = "random"


@dataclass
class ServerSection:
    address: str = "127.0.0.1:50051"
    rollout_fragment_length: int = 200
    batch_mode: str = "truncate_episodes"
    count_steps_by: str = "env_steps"
    max_wait_ms: float = 0.0
    experience_queue_size: int = 4
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    auth_token_file: str = ""
    insecure: bool = False
    # A session with open episodes whose simulator makes no call this long is closed, its
    # episodes truncated (docs/limits.md); 0: never.
    step_timeout_s: float = 60.0
    # A learner whose replay buffer and networks would need more is refused when a client first
    # binds it (RESOURCE_EXHAUSTED / SPACE_TOO_LARGE) instead of failing to allocate later.
    max_policy_memory_mb: int = 4096

    def check(self, where: str) -> None:
        _check_server(self, where)


@dataclass
class RunSection:
    logdir: str = "runs/cartpole_dqn"
    checkpoint_every_env_steps: int = 10_000
    keep_replay_in_checkpoint: bool = False
    device: str = "auto"
    total_env_steps: int = 0
    seed: Optional[int] = None
    print_every_s: float = 2.0
    torch_threads: int = 1
    # Write-ahead journal of experience and counters (LOGDIR/journal): a SIGKILLed trainer
    # resumes where it was, not at its last checkpoint. docs/durability.md
    journal: bool = True
    journal_fsync_s: float = 0.0      # > 0: fsync the journal this often (power loss); 0: never
    # Apply and journal a streamed GetAction/Step before answering it (every answered call
    # survives a kill); false answers first (faster; a kill may lose one answered call per simulator).
    journal_before_answer: bool = True
    # Each trainable learner trains in a process of its own beside the bridge (acting and learning
    # overlap; trainer/learner_process.py); false: in the daemon's loop, between intakes.
    learner_process: bool = True
    # The rate limiter's tolerance: intake waits while a learner process owes more updates than
    # this (its ratio is the policy's updates_per_step).
    max_updates_behind: int = 256

    def check(self, where: str) -> None:
        _check_run(self, where)


# The flat [tables] of the config: name -> dataclass (typed fields with defaults and a `check`).
SECTIONS = {"server": ServerSection, "run": RunSection}


@dataclass
class PolicySpec:
    policy_id: str
    algorithm: str
    observation_space: Optional[gym.Space] = None
    action_space: Optional[gym.Space] = None
    config: Dict[str, Any] = field(default_factory=dict)

    @property
    def is_random(self) -> bool:
        return self.algorithm == RANDOM


@dataclass
class MappingSection:
    rules: List[Tuple[str, str]] = field(default_factory=list)
    default: Optional[str] = DEFAULT_POLICY  # None: agents no rule matches are refused


@dataclass
class TrainerConfig:
    server: ServerSection
    run: RunSection
    policies: Dict[str, PolicySpec]
    mapping: MappingSection
    policies_to_train: List[str]
    source: str = "<config>"
    overrides: List[Override] = field(default_factory=list)   # --set and the CLI's flags, applied
    dataset: DatasetSection = field(default_factory=DatasetSection)   # [dataset]: trainer/datasets.py

    def trainable(self, policy_id: str) -> bool:
        return policy_id in self.policies_to_train

    def section_tables(self) -> Dict[str, Dict[str, Any]]:
        tables = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
        if self.dataset.used:   # so that --resume records and warm-starts as the run did
            tables["dataset"] = dataclasses.asdict(self.dataset)
        return tables

    @property
    def text(self) -> str:
        """The effective config as TOML (what config.toml beside the run holds)."""
        from simbridge.trainer.config_writer import config_toml
        return config_toml(self)


# ---------------------------------------------------------------- loading

def load_config(path=None, overrides: Sequence[Override] = ()) -> TrainerConfig:
    """Parse a TOML file (default: the embedded configs/cartpole_dqn.toml); `overrides`:
    (dotted key, value) pairs set before the checks, e.g. [("policies.default_policy.config.lr", 3e-4)]
    (config_values.parse_overrides reads them from "KEY=VALUE" strings)."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {str(path)!r}: {e.strerror}; pass an existing file "
                          f"with --config (examples: {CONFIG_DIR})") from None
    return parse_config(text, str(path), overrides)


def parse_config(text: str, source: str = "<config>", overrides: Sequence[Override] = ()) -> TrainerConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: not valid TOML: {e}") from None
    overrides = list(overrides)
    apply_overrides(data, overrides)
    where = source if not overrides else f"{source} (overridden: {', '.join(k for k, _ in overrides)})"
    known_top = {*SECTIONS, "policies", "mapping", "policies_to_train", "dataset"}
    _no_unknown(data, known_top, f"{where}: top level")
    sections = {}
    for name, cls in SECTIONS.items():
        sections[name] = _section(cls, data.get(name, {}), f"{where}: [{name}]", name)
        sections[name].check(where)

    raw_policies = data.get("policies")
    if not raw_policies:
        raise ConfigError(f"{where}: no [policies.<id>] table: add one, e.g.\n"
                          f"  [policies.default_policy]\n  algorithm = \"dqn\"")
    _expect(raw_policies, dict, f"{where}: [policies]")
    policies = {pid: _policy(pid, raw, where) for pid, raw in raw_policies.items()}

    mapping = _mapping(data.get("mapping", {}), policies, where)

    learners = [pid for pid, p in policies.items() if not p.is_random]
    if "policies_to_train" in data:
        ptt = data["policies_to_train"]
        if not isinstance(ptt, list) or not all(isinstance(x, str) for x in ptt):
            raise ConfigError(f"{where}: policies_to_train must be a list of policy ids, e.g. [\"p0\"]")
        for pid in ptt:
            if pid not in policies:
                raise ConfigError(f"{where}: policies_to_train names {pid!r}, which is not defined: "
                                  f"add [policies.{pid}] or use one of {sorted(policies)}")
            if policies[pid].is_random:
                raise ConfigError(f"{where}: policies_to_train names {pid!r}, whose algorithm is "
                                  f"\"random\" and cannot learn: remove it from policies_to_train")
        policies_to_train = list(dict.fromkeys(ptt))
    else:
        policies_to_train = learners
    try:   # [dataset] names policies, so it is checked after them (trainer/datasets.py)
        dataset = parse_dataset_section(data.get("dataset", {}), policies, where)
    except DatasetConfigError as e:
        raise ConfigError(str(e)) from None
    return TrainerConfig(policies=policies, mapping=mapping, policies_to_train=policies_to_train,
                         source=source, overrides=overrides, dataset=dataset, **sections)


# ---------------------------------------------------------------- sections

def _expect(value, typ, what: str):
    if not isinstance(value, typ):
        name = {dict: "a table", list: "a list", str: "a string"}.get(typ, typ.__name__)
        raise ConfigError(f"{what} must be {name}, got {value!r}")
    return value


def _no_unknown(raw: dict, known, what: str) -> None:
    hint = ""
    if "policies_to_train" in set(raw) - set(known):
        hint = ("; policies_to_train is a top-level key: put it above the first [table] "
                "(TOML files keys that follow a [table] header under that table)")
    check_keys(raw, known, what, hint)


def _section(cls, raw, what: str, name: str):
    """A flat table -> dataclass, each value checked against the field's annotation."""
    _expect(raw, dict, what)
    hints = typing.get_type_hints(cls)
    _no_unknown(raw, hints, what)
    out = cls()
    for key, value in raw.items():
        try:
            setattr(out, key, check_type(f"{name}.{key}", value, hints[key]))
        except ConfigError as e:
            raise ConfigError(f"{what.rpartition(': ')[0]}: {e}") from None
    return out


def _check_server(s: ServerSection, where: str) -> None:
    if address_problem(s.address):
        raise ConfigError(f"{where}: [server] address = {s.address!r} is not HOST:PORT "
                          f"(e.g. \"127.0.0.1:50051\") or unix:PATH (a Unix socket on this machine; shm+unix:PATH: "
                          f"the steps through shared memory too)")
    if s.batch_mode not in BATCH_MODES:
        raise ConfigError(f"{where}: [server] batch_mode = {s.batch_mode!r}: use one of {list(BATCH_MODES)}")
    if s.count_steps_by not in ("env_steps", "agent_steps"):
        raise ConfigError(f"{where}: [server] count_steps_by = {s.count_steps_by!r}: use \"env_steps\" "
                          f"or \"agent_steps\"")
    if s.rollout_fragment_length < 1:
        raise ConfigError(f"{where}: [server] rollout_fragment_length must be >= 1")
    if s.experience_queue_size < 1:
        raise ConfigError(f"{where}: [server] experience_queue_size must be >= 1 (small values, like 4, "
                          f"make a slow learner slow the simulators down)")
    if s.max_wait_ms < 0:
        raise ConfigError(f"{where}: [server] max_wait_ms must be >= 0")
    if s.step_timeout_s < 0:
        raise ConfigError(f"{where}: [server] step_timeout_s must be >= 0 (0: never time a simulator out)")
    if s.max_policy_memory_mb < 1:
        raise ConfigError(f"{where}: [server] max_policy_memory_mb must be >= 1 (MiB a learner's replay "
                          f"buffer and networks may take)")


def _check_run(r: RunSection, where: str) -> None:
    if r.checkpoint_every_env_steps < 0:
        raise ConfigError(f"{where}: [run] checkpoint_every_env_steps must be >= 0 (0: only at exit)")
    if r.total_env_steps < 0:
        raise ConfigError(f"{where}: [run] total_env_steps must be >= 0 (0: run until stopped)")
    if r.torch_threads < 0:
        raise ConfigError(f"{where}: [run] torch_threads must be >= 0 (0: torch's default)")
    if r.print_every_s <= 0:
        raise ConfigError(f"{where}: [run] print_every_s must be > 0")
    if not r.logdir:
        raise ConfigError(f"{where}: [run] logdir must not be empty")
    if r.journal_fsync_s < 0:
        raise ConfigError(f"{where}: [run] journal_fsync_s must be >= 0 (0: leave flushing to the kernel)")
    if r.max_updates_behind < 1:
        raise ConfigError(f"{where}: [run] max_updates_behind must be >= 1 (updates a learner process may "
                          f"owe before intake waits)")
    dev = r.device
    if not (dev in ("auto", "cpu", "mps") or dev == "cuda" or dev.startswith("cuda:")):
        raise ConfigError(f"{where}: [run] device = {dev!r}: use \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"")


def known_algorithms() -> List[str]:
    return sorted(ALGORITHMS) + [RANDOM]


def _policy(pid: str, raw, where: str) -> PolicySpec:
    what = f"{where}: [policies.{pid}]"
    _expect(raw, dict, what)
    _no_unknown(raw, {"algorithm", "observation_space", "action_space", "config"}, what)
    if "algorithm" not in raw:
        raise ConfigError(f"{what}: no algorithm: add algorithm = one of {known_algorithms()} "
                          f"or \"package.module:Class\"")
    algo = _expect(raw["algorithm"], str, f"{what} algorithm")
    if algo not in ALGORITHMS and algo != RANDOM and not _is_import_path(algo):
        raise ConfigError(f"{what}: unknown algorithm {algo!r}: use one of {known_algorithms()} or an "
                          f"import path \"package.module:Class\"")
    cfg = dict(_expect(raw.get("config", {}), dict, f"{what} config"))
    if algo == RANDOM:
        _no_unknown(cfg, {"seed"}, f"{what} config (algorithm \"random\")")
    obs = space_from_table(raw["observation_space"], f"{what} observation_space") if "observation_space" in raw else None
    act = space_from_table(raw["action_space"], f"{what} action_space") if "action_space" in raw else None
    if (obs is None) != (act is None):
        raise ConfigError(f"{what}: declare both observation_space and action_space, or neither "
                          f"(then the first simulator's handshake provides them)")
    return PolicySpec(pid, algo, obs, act, cfg)


def _is_import_path(s: str) -> bool:
    mod, sep, name = s.partition(":")
    return bool(sep and mod and name and all(p.isidentifier() for p in mod.split("."))
                and all(p.isidentifier() for p in name.split(".")))


def _mapping(raw, policies: Dict[str, PolicySpec], where: str) -> MappingSection:
    what = f"{where}: [mapping]"
    _expect(raw, dict, what)
    _no_unknown(raw, {"rules", "default"}, what)
    specs = raw.get("rules", [])
    if not isinstance(specs, list) or not all(isinstance(x, str) for x in specs):
        raise ConfigError(f"{what}: rules must be a list of \"PATTERN=POLICY\" strings, "
                          f"e.g. [\"player_*=nim\"]")
    try:
        rules = parse_rules(specs)
    except ValueError as e:
        raise ConfigError(f"{what}: {e}") from None
    for pattern, pid in rules:
        if pid not in policies:
            raise ConfigError(f"{what}: rule \"{pattern}={pid}\" maps to policy {pid!r}, which is not "
                              f"defined: add [policies.{pid}] or map to one of {sorted(policies)}")
    if "default" in raw:
        default = _expect(raw["default"], str, f"{what} default")
        if default not in policies:
            raise ConfigError(f"{what}: default = {default!r} is not a defined policy: add "
                              f"[policies.{default}] or set default to one of {sorted(policies)}")
    elif DEFAULT_POLICY in policies:
        default = DEFAULT_POLICY
    elif len(policies) == 1:
        default = next(iter(policies))
    else:
        default = None  # every agent must match a rule
    return MappingSection(rules, default)


# ---------------------------------------------------------------- algorithms

def resolve_algorithm(spec: PolicySpec, source: str = ""):
    """The class behind spec.algorithm (None for "random"), with its config keys and their types
    checked against the learner's defaults (ints accepted for floats, which become floats)."""
    # Here, not atop: parsing a config needs no torch (the CLI imports this module without it).
    from simbridge.server.policies import Policy
    from simbridge.trainer.learner import Learner

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
        raise ConfigError(f"{what}: {path} is not a simbridge.trainer.learner.Learner (or simbridge.server.policies.Policy) "
                          f"subclass")
    if issubclass(obj, Learner):
        defaults, declared = obj.config_defaults(), obj.config_types()
        _no_unknown(spec.config, defaults, f"{where}[policies.{spec.policy_id}] config ({obj.__name__})")
        for key, value in spec.config.items():
            try:
                spec.config[key] = check_type(f"policies.{spec.policy_id}.config.{key}", value,
                                              hint_of_default(defaults[key], declared.get(key)))
            except ConfigError as e:
                raise ConfigError(f"{where}{e} (the {obj.__name__} default is "
                                  f"{defaults[key]!r})") from None
    return obj
