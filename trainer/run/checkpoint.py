"""checkpoint.pt: written atomically, and read back for `run --resume`.

A checkpoint holds, per policy, its algorithm, version, spaces and (learners) networks,
optimizers, update counts and, with keep_replay_in_checkpoint, the replay buffer; and the
run's counters (env/agent steps, episodes, wall time, the last 100 episode summaries,
checkpoints written, the next episode number) and, with a journal, where it goes on (its next
segment, and the rows each policy had ingested). Only tensors, plain containers, numbers,
strings and bytes: load_checkpoint reads it with torch's safe loader and nothing else. On resume every policy is re-created from the spaces saved with it,
before any simulator connects.
"""
import io
import logging
import os
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from simbridge.server.policies import Policy
from simbridge.trainer.config.trainer_config import ConfigError, TrainerConfig
from simbridge.trainer.learners.base import Learner
from simbridge.trainer.run.rundir import CHECKPOINT, SAVED_CONFIG
from simbridge.wire import spaces as sb_spaces
from simbridge.wire.v1 import simbridge_pb2 as pb

log = logging.getLogger("simbridge.trainer")

CHECKPOINT_FORMAT = "simbridge-trainer/1"

def state_bytes(obj) -> bytes:
    """A state (tensors, plain containers) as bytes for a pipe or a collective, read back by
    state_from_bytes: torch's format, never pickled objects."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def state_from_bytes(data: bytes):
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


Build = Callable[[str, object, object], Policy]   # (policy id, observation space, action space) -> Policy


def save_checkpoint(path: Path, state: dict) -> None:
    """torch.save to a temporary file next to `path`, fsync, then rename over it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    """The checkpoint at `path`, read with torch's safe loader only (tensors, plain containers,
    numbers, strings, bytes). Everything the trainer saves is made of those, so a file that needs
    more was not written by it: unpickling it in full would run whatever code it names. Such a
    file, a truncated one and one that is not a checkpoint at all are refused alike."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:   # UnpicklingError, a torn zip (RuntimeError), EOFError, OSError...
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{path} is not a valid simbridge-trainer checkpoint and was not loaded "
                          f"({type(e).__name__}: {why[:200]}); it is never unpickled in full. If the file "
                          f"was damaged, restore it from a copy, or start a new run with another --logdir "
                          f"(or move the file away)") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT \
            or not isinstance(state.get("policies"), dict) or not isinstance(state.get("counters"), dict):
        raise ConfigError(f"{path} is not a simbridge-trainer checkpoint ({CHECKPOINT_FORMAT}): restore the "
                          f"run's own checkpoint.pt, or start a new run with another --logdir")
    return state


def space_bytes(space) -> bytes:
    return sb_spaces.space_to_proto(space).SerializeToString(deterministic=True)


def space_from_bytes(data: bytes):
    msg = pb.Space()
    msg.ParseFromString(data)
    return sb_spaces.space_from_proto(msg)


def policy_entry(algorithm: str, policy: Policy, trains: bool, keep_replay: bool) -> dict:
    entry = {"algorithm": algorithm, "version": int(policy.version), "trainable": trains,
             "observation_space": space_bytes(policy.observation_space),
             "action_space": space_bytes(policy.action_space), "state": None}
    if isinstance(policy, Learner):   # acting-only policies have no state to keep
        entry["state"] = policy.state_dict(include_replay=keep_replay)
        # A learner process's state may be some updates past the weights this process acts with.
        entry["version"] = int(entry["state"]["updates"])
    return entry


class Checkpoints:
    """One run's checkpoint.pt: how many were written, and at how many env steps the last one."""

    def __init__(self, logdir: Path, keep_replay: bool):
        self.logdir = logdir
        self.path = logdir / CHECKPOINT
        self.keep_replay = keep_replay
        self.count = 0
        self.env_steps = 0

    def save(self, policies: Dict[str, dict], counters: dict, journal: Optional[dict] = None) -> None:
        """policies: policy_entry()s; counters: the run's, without "checkpoints" (counted here);
        journal: where the journal goes on after this checkpoint (trainer/run/journal.py), or None."""
        self.count += 1
        state = {"format": CHECKPOINT_FORMAT, "policies": policies,
                 "counters": {**counters, "checkpoints": self.count}}
        if journal is not None:
            state["journal"] = journal
        t0 = time.monotonic()
        save_checkpoint(self.path, state)
        self.env_steps = counters["env_steps"]
        log.info("checkpoint %d written at %d env steps (%.2fs): %s", self.count, self.env_steps,
                 time.monotonic() - t0, self.path)

    def load_for_resume(self) -> dict:
        if not self.path.exists():
            raise ConfigError(f"--resume: no {CHECKPOINT} in {self.logdir}: run without --resume to start "
                              f"fresh, or pass the run's --logdir")
        state = load_checkpoint(self.path)
        c = state["counters"]
        self.count = c.get("checkpoints", 0)
        self.env_steps = c["env_steps"]
        return state

    def restore_policies(self, state: dict, cfg: TrainerConfig, build: Build) -> List[Tuple[str, Policy]]:
        """The checkpoint's policies that the config still has, re-created from their saved spaces
        with their saved state and version; a config that no longer fits them is refused."""
        out = []
        for pid, entry in state["policies"].items():
            spec = cfg.policies.get(pid)
            if spec is None:
                log.warning("checkpoint policy %r is not in the config: left out", pid)
                continue
            if entry["algorithm"] != spec.algorithm:
                raise ConfigError(f"[policies.{pid}] algorithm = {spec.algorithm!r}, but the checkpoint's "
                                  f"policy {pid!r} was built with {entry['algorithm']!r}: set it back, or "
                                  f"start a new run with another --logdir")
            obs, act = space_from_bytes(entry["observation_space"]), space_from_bytes(entry["action_space"])
            if spec.observation_space is not None and (
                    space_bytes(spec.policy_observation_space) != entry["observation_space"]
                    or space_bytes(spec.action_space) != entry["action_space"]):
                raise ConfigError(f"[policies.{pid}] declares observation {spec.policy_observation_space}, "
                                  f"action {spec.action_space}; the checkpoint's has observation {obs}, action {act}")
            policy = build(pid, obs, act)
            if entry.get("state") is not None:
                try:
                    policy.load_state_dict(entry["state"])
                except (RuntimeError, KeyError, ValueError) as e:
                    raise ConfigError(f"[policies.{pid}]: the checkpoint's networks do not fit the configured "
                                      f"learner ({e}); restore the config the run used ({self.logdir / SAVED_CONFIG}) "
                                      f"or start a new run with another --logdir") from None
            policy.version = entry["version"]
            out.append((pid, policy))
        return out
