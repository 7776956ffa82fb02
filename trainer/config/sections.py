"""The trainer config's flat sections, [server] and [run]: each key a dataclass field (its type and
default), each section's `check(where)` for what a type cannot say (ranges, addresses, names).

`section_from_table` reads a section's TOML table against the field annotations (values.py's
typed checks); config.parse_config reads every section in SECTIONS that way, then checks it. A new
section: a dataclass here with `check(self, where)`, a line in SECTIONS and a field of
config.TrainerConfig.
"""
import typing
from dataclasses import dataclass
from typing import Optional

from simbridge.server.experience import BATCH_MODES
from simbridge.trainer.config.values import ConfigError, check_table_keys, check_type, require_type
from simbridge.wire.addresses import address_problem


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
        problem = address_problem(self.address)   # its words name the fix (no port, past 65535, a path too long)
        if problem:
            raise ConfigError(f"{where}: [server] {problem}")
        if self.batch_mode not in BATCH_MODES:
            raise ConfigError(f"{where}: [server] batch_mode = {self.batch_mode!r}: use one of {list(BATCH_MODES)}")
        if self.count_steps_by not in ("env_steps", "agent_steps"):
            raise ConfigError(f"{where}: [server] count_steps_by = {self.count_steps_by!r}: use \"env_steps\" "
                              f"or \"agent_steps\"")
        if self.rollout_fragment_length < 1:
            raise ConfigError(f"{where}: [server] rollout_fragment_length must be >= 1")
        if self.experience_queue_size < 1:
            raise ConfigError(f"{where}: [server] experience_queue_size must be >= 1 (small values, like 4, "
                              f"make a slow learner slow the simulators down)")
        if self.max_wait_ms < 0:
            raise ConfigError(f"{where}: [server] max_wait_ms must be >= 0")
        if self.step_timeout_s < 0:
            raise ConfigError(f"{where}: [server] step_timeout_s must be >= 0 (0: never time a simulator out)")
        if self.max_policy_memory_mb < 1:
            raise ConfigError(f"{where}: [server] max_policy_memory_mb must be >= 1 (MiB a learner's replay "
                              f"buffer and networks may take)")


@dataclass
class RunSection:
    logdir: str = "runs/cartpole_dqn"
    checkpoint_every_env_steps: int = 10_000
    keep_replay_in_checkpoint: bool = False
    device: str = "auto"
    # Where the policies' acting copies run the simulators' forward passes: "auto" (the CPU for small
    # networks on flat observations, the learner's device for large ones or images), "cpu", or
    # "learner" (the learner's device). trainer/learners/placement.py
    acting_device: str = "auto"
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
    # overlap; trainer/run/learner_process.py); false: in the daemon's loop, between intakes.
    learner_process: bool = True
    # The rate limiter's tolerance: intake waits while a learner process owes more updates than
    # this (its ratio is the policy's updates_per_step).
    max_updates_behind: int = 256

    def check(self, where: str) -> None:
        if self.checkpoint_every_env_steps < 0:
            raise ConfigError(f"{where}: [run] checkpoint_every_env_steps must be >= 0 (0: only at exit)")
        if self.total_env_steps < 0:
            raise ConfigError(f"{where}: [run] total_env_steps must be >= 0 (0: run until stopped)")
        if self.torch_threads < 0:
            raise ConfigError(f"{where}: [run] torch_threads must be >= 0 (0: torch's default)")
        if self.print_every_s <= 0:
            raise ConfigError(f"{where}: [run] print_every_s must be > 0")
        if not self.logdir:
            raise ConfigError(f"{where}: [run] logdir must not be empty")
        if self.journal_fsync_s < 0:
            raise ConfigError(f"{where}: [run] journal_fsync_s must be >= 0 (0: leave flushing to the kernel)")
        if self.max_updates_behind < 1:
            raise ConfigError(f"{where}: [run] max_updates_behind must be >= 1 (updates a learner process may "
                              f"owe before intake waits)")
        if self.acting_device not in ("auto", "cpu", "learner"):
            raise ConfigError(f"{where}: [run] acting_device = {self.acting_device!r}: use \"auto\" (the CPU for "
                              f"small networks, the learner's device for large ones), \"cpu\" or \"learner\"")
        dev = self.device
        if not (dev in ("auto", "cpu", "mps") or dev == "cuda" or dev.startswith("cuda:")):
            raise ConfigError(f"{where}: [run] device = {dev!r}: use \"auto\", \"cpu\", \"cuda\", \"cuda:N\" or \"mps\"")


# The flat [tables] of the config: name -> dataclass (typed fields with defaults and a `check`).
SECTIONS = {"server": ServerSection, "run": RunSection}


def section_from_table(cls, raw, what: str, name: str):
    """A flat table -> dataclass, each value checked against the field's annotation."""
    require_type(raw, dict, what)
    hints = typing.get_type_hints(cls)
    check_table_keys(raw, hints, what)
    out = cls()
    for key, value in raw.items():
        try:
            setattr(out, key, check_type(f"{name}.{key}", value, hints[key]))
        except ConfigError as e:
            raise ConfigError(f"{what.rpartition(': ')[0]}: {e}") from None
    return out
