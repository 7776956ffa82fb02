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
    algorithm = "dqn"                  # "dqn", "sac", "ppo", "random" or "package.module:Class"
    config = { learning_starts = 500 } # overrides of the learner's defaults
    frame_stack = 1                    # the policy sees each agent's last k observations as one
                                       # (cameras sending one frame per step: 4; docs/trainer.md)
    # observation_space = { type = "Box", low = -1.0, high = 1.0, shape = [4] }
    # action_space = { type = "Discrete", n = 2 }

    [mapping]
    rules = ["player_*=nim", "cart_[02]=p0"]   # glob on agent ids = policy id; first match wins
    default = "default_policy"

    policies_to_train = ["p0"]         # top-level key (put it before the first [table]);
                                       # default: every learner policy

    [dataset]                          # record / warm start: trainer/data/datasets.py, docs/datasets.md

Spaces are optional: by default each policy is created when the first simulator
that uses it connects, with the spaces its handshake declares. Declared spaces
create the policy at startup, and simulators declaring other spaces are refused.
Space tables: {type="Discrete", n=, start=0}, {type="Box", low=, high=, shape=[..],
dtype="float32"}, {type="MultiDiscrete", nvec=[..]}, {type="MultiBinary", n=}.

`algorithm = "package.module:Class"` names any importable class: a
simbridge.trainer.learners.base.Learner subclass (built as Class(obs_space, act_space,
config=..., device=..., trainable=..., acting_device=..., acting_only=...): Learner's own
keywords, which a subclass overriding __init__ passes on) or a simbridge.server.policies.Policy subclass
that only acts (built as Class(obs_space, act_space, **config)).

Parsing checks every key's type (values.py) and all else that needs no learner import;
`resolve_algorithm` (algorithms.py) checks `policies.<id>.config` against the learner's defaults
and its `check_config` (at the daemon's start, before anything is served or written). `overrides`
(`--set`) apply before the checks; `config_toml(cfg)` (writer.py) is the effective config. [server]
and [run] are dataclasses in sections.py; a new section: a dataclass there with `check(self, where)`,
a line in SECTIONS and a field of TrainerConfig.
"""
import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym

from simbridge.server.frame_stack import MAX_FRAME_STACK, Stacker, stack_problem
from simbridge.server.mapping import DEFAULT_POLICY, parse_rules
from simbridge.trainer.config.algorithms import ALGORITHMS, RANDOM, is_import_path, known_algorithms
# Re-exported: `from simbridge.trainer.config.trainer_config import resolve_algorithm` (scripts, tests) goes on working.
from simbridge.trainer.config.algorithms import resolve_algorithm  # noqa: F401
from simbridge.trainer.config.sections import SECTIONS, RunSection, ServerSection, section_from_table
from simbridge.trainer.config.spaces import space_from_table
from simbridge.trainer.config.values import (ConfigError, Override, apply_overrides, check_table_keys, require_type,
                                             tomllib)
from simbridge.trainer.config.dataset import DatasetConfigError, DatasetSection, parse_dataset_section

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "cartpole_dqn.toml"


@dataclass
class PolicySpec:
    policy_id: str
    algorithm: str
    observation_space: Optional[gym.Space] = None
    action_space: Optional[gym.Space] = None
    config: Dict[str, Any] = field(default_factory=dict)
    frame_stack: int = 1   # the last k observations of each agent, stacked (simbridge/server/frame_stack.py)

    @property
    def is_random(self) -> bool:
        return self.algorithm == RANDOM

    @property
    def policy_observation_space(self) -> Optional[gym.Space]:
        """The declared observation space as the policy sees it: stacked frame_stack deep."""
        obs = self.observation_space
        return obs if obs is None or self.frame_stack <= 1 else Stacker(obs, self.frame_stack).space


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
    dataset: DatasetSection = field(default_factory=DatasetSection)   # [dataset]: trainer/config/dataset.py

    def trainable(self, policy_id: str) -> bool:
        return policy_id in self.policies_to_train

    @property
    def where(self) -> str:
        """How errors name this config: its file, and the keys overridden."""
        return config_where(self.source, self.overrides)

    def section_tables(self) -> Dict[str, Dict[str, Any]]:
        tables = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
        if self.dataset.used:   # so that --resume records and warm-starts as the run did
            tables["dataset"] = dataclasses.asdict(self.dataset)
        return tables

    @property
    def text(self) -> str:
        """The effective config as TOML (what config.toml beside the run holds)."""
        from simbridge.trainer.config.writer import config_toml
        return config_toml(self)


# ---------------------------------------------------------------- loading

def load_config(path=None, overrides: Sequence[Override] = ()) -> TrainerConfig:
    """Parse a TOML file (default: the embedded configs/cartpole_dqn.toml); `overrides`:
    (dotted key, value) pairs set before the checks, e.g. [("policies.default_policy.config.lr", 3e-4)]
    (values.parse_overrides reads them from "KEY=VALUE" strings)."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {str(path)!r}: {e.strerror}; pass an existing file "
                          f"with --config (examples: {CONFIG_DIR})") from None
    return parse_config(text, str(path), overrides)


def config_where(source: str, overrides: Sequence[Override]) -> str:
    return source if not overrides else f"{source} (overridden: {', '.join(dict.fromkeys(k for k, _ in overrides))})"


def parse_config(text: str, source: str = "<config>", overrides: Sequence[Override] = ()) -> TrainerConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: not valid TOML: {e}") from None
    overrides = list(overrides)
    apply_overrides(data, overrides)
    where = config_where(source, overrides)
    known_top = {*SECTIONS, "policies", "mapping", "policies_to_train", "dataset"}
    check_table_keys(data, known_top, f"{where}: top level")
    sections = {}
    for name, cls in SECTIONS.items():
        sections[name] = section_from_table(cls, data.get(name, {}), f"{where}: [{name}]", name)
        sections[name].check(where)

    raw_policies = data.get("policies")
    if not raw_policies:
        raise ConfigError(f"{where}: no [policies.<id>] table: add one, e.g.\n"
                          f"  [policies.default_policy]\n  algorithm = \"dqn\"")
    require_type(raw_policies, dict, f"{where}: [policies]")
    policies = {pid: _policy(pid, raw, where, raw_policies) for pid, raw in raw_policies.items()}

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
    try:   # [dataset] names policies, so it is checked after them (trainer/data/datasets.py)
        dataset = parse_dataset_section(data.get("dataset", {}), policies, where)
    except DatasetConfigError as e:
        raise ConfigError(str(e)) from None
    return TrainerConfig(policies=policies, mapping=mapping, policies_to_train=policies_to_train,
                         source=source, overrides=overrides, dataset=dataset, **sections)


# ---------------------------------------------------------------- policies and mapping

def _policy(pid: str, raw, where: str, others: dict) -> PolicySpec:
    what = f"{where}: [policies.{pid}]"
    require_type(raw, dict, what)
    check_table_keys(raw, {"algorithm", "observation_space", "action_space", "config", "frame_stack"}, what)
    if "algorithm" not in raw:
        # Most often a misspelt id (`--set policies.default_polcy.config.lr=...` makes a new table).
        named = [p for p, r in others.items() if p != pid and isinstance(r, dict) and "algorithm" in r]
        guess = difflib.get_close_matches(pid, named, n=1)
        raise ConfigError(f"{what}: no algorithm: "
                          + (f"did you mean [policies.{guess[0]}]? Otherwise " if guess else "")
                          + f"add algorithm = one of {known_algorithms()} or \"package.module:Class\"")
    algo = require_type(raw["algorithm"], str, f"{what} algorithm")
    if algo not in ALGORITHMS and algo != RANDOM and not is_import_path(algo):
        raise ConfigError(f"{what}: unknown algorithm {algo!r}: use one of {known_algorithms()} or an "
                          f"import path \"package.module:Class\"")
    cfg = dict(require_type(raw.get("config", {}), dict, f"{what} config"))
    if "frame_stack" in cfg and algo in ALGORITHMS:   # the learner's is set from the policy's (factory.py)
        raise ConfigError(f"{what} config: frame_stack belongs to [policies.{pid}] itself "
                          f"(frame_stack = {cfg['frame_stack']!r} beside algorithm), not to its config")
    if algo == RANDOM:
        check_table_keys(cfg, {"seed"}, f"{what} config (algorithm \"random\")")
    obs = space_from_table(raw["observation_space"], f"{what} observation_space") if "observation_space" in raw else None
    act = space_from_table(raw["action_space"], f"{what} action_space") if "action_space" in raw else None
    if (obs is None) != (act is None):
        raise ConfigError(f"{what}: declare both observation_space and action_space, or neither "
                          f"(then the first simulator's handshake provides them)")
    k = _frame_stack(raw.get("frame_stack", 1), what)
    if obs is not None and k > 1 and stack_problem(obs, k):
        raise ConfigError(f"{what} frame_stack = {k}: {stack_problem(obs, k)}")
    return PolicySpec(pid, algo, obs, act, cfg, k)


def _frame_stack(k, what: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_FRAME_STACK:
        raise ConfigError(f"{what} frame_stack = {k!r}: give a whole number from 1 (no stacking) to "
                          f"{MAX_FRAME_STACK}, how many of each agent's last observations the policy sees "
                          f"as one, e.g. frame_stack = 4")
    return k


def _mapping(raw, policies: Dict[str, PolicySpec], where: str) -> MappingSection:
    what = f"{where}: [mapping]"
    require_type(raw, dict, what)
    check_table_keys(raw, {"rules", "default"}, what)
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
        default = require_type(raw["default"], str, f"{what} default")
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

