"""`simbridge-trainer`: the bridge server with learners behind it, in one process.

    simbridge-trainer run [--config FILE] [--resume] [--address HOST:PORT]
                          [--total-env-steps N] [--logdir DIR]
    simbridge-trainer plot RUN_DIR [--out PNG]

`run` serves the policies of the config (default: the embedded
trainer/configs/cartpole_dqn.toml) on a BridgeServer; simulators connect
whenever they like. Each policy is created when the first simulator using it
connects (its handshake gives the spaces), or at startup when the config
declares the spaces or a resumed checkpoint knows them.

The main thread is the learner loop: take a MultiAgentBatch from the bridge's
experience queue, add each policy's SampleBatch to its learner (trainable
policies only), then run the updates the replay ratio makes due before taking
more. The queue is small, so a learner that falls behind blocks the bridge's
puts and slows the simulators instead of falling behind.

What a run leaves in its logdir:
  metrics.jsonl          one JSON object per line every print_every_s (env_steps, wall_s,
                         return_mean per policy, updates, versions, losses, ...); appended on resume
  events.out.tfevents.*  TensorBoard scalars (env/return_mean/<policy>, env/steps_per_s,
                         learner/<policy>/<metric>, ...): `tensorboard --logdir DIR`
  checkpoint.pt          written atomically every checkpoint_every_env_steps and at exit
                         (SIGTERM, Ctrl-C, total_env_steps reached)
  config.toml            the config the run started with; `run --resume --logdir DIR` reuses it

`--resume` loads checkpoint.pt: counters (env steps, episodes, wall time, the
last 100 episode returns) continue, and every policy is re-created at startup
from the spaces saved with it, with its networks, optimizers, update counts
(= policy version) and, if kept, replay buffer. Simulators connected to the
previous process lose their session (their client raises SessionLost, and the
reference simulators exit with code 2): start them again.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/grpc_tuning.py
import argparse
import collections
import json
import logging
import math
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from simbridge.wire import spaces as sb_spaces
from simbridge.wire.errors import invalid_argument
from simbridge.server.mapping import pattern_mapping
from simbridge.server.policies import Policy, RandomPolicy
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.trainer.config import (DEFAULT_CONFIG, ConfigError, TrainerConfig, load_config,
                            resolve_algorithm)

log = logging.getLogger("simbridge.trainer")

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
SAVED_CONFIG = "config.toml"
CHECKPOINT_FORMAT = "simbridge-trainer/1"
TRAIN_CHUNK = 64          # updates between checks for signals and progress lines


# ---------------------------------------------------------------- checkpoints

def save_checkpoint(path: Path, state: dict) -> None:
    """torch.save to a temporary file next to `path`, fsync, then rename over it."""
    import torch
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    import torch
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # A learner kept something beyond tensors and plain containers; the file is our own.
        log.warning("%s holds more than plain tensors and containers; loading it in full", path)
        state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} is not a simbridge-trainer checkpoint ({CHECKPOINT_FORMAT})")
    return state


def _space_bytes(space) -> bytes:
    return sb_spaces.space_to_proto(space).SerializeToString(deterministic=True)


def _space_from_bytes(data: bytes):
    from simbridge.wire.v1 import simbridge_pb2 as pb
    msg = pb.Space()
    msg.ParseFromString(data)
    return sb_spaces.space_from_proto(msg)


def _warm_up_torch() -> None:
    """Import what a learner's first optimizer imports (torch._dynamo, seconds on a slow machine)
    now, not in a simulator's first call, where the runtime's lock is held meanwhile."""
    import torch
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])


# ---------------------------------------------------------------- the daemon

class TrainerDaemon:
    """Runtime + server + learners + logging for one run. `run()` blocks until stopped."""

    def __init__(self, cfg: TrainerConfig, resume: bool = False, out=None):
        self.cfg = cfg
        self.out = out or sys.stdout
        self.logdir = Path(cfg.run.logdir)
        self.ckpt_path = self.logdir / CHECKPOINT
        self.metrics_path = self.logdir / METRICS
        self.resume = resume
        self.stop_event = threading.Event()
        self.stop_reason = ""
        # Classes first: an unknown module or config key fails here, before serving.
        self.classes = {pid: resolve_algorithm(spec) for pid, spec in cfg.policies.items()}
        self._lock = threading.Lock()
        self.policies: Dict[str, Policy] = {}
        self.recent = collections.deque(maxlen=100)  # episode summaries, as the runtime's metrics keep them
        self.base_wall_s = 0.0
        self.checkpoints = 0
        self.checkpoint_env_steps = 0  # env steps at the last checkpoint

        s = cfg.server
        bridge_cfg = BridgeConfig(rollout_fragment_length=s.rollout_fragment_length, batch_mode=s.batch_mode,
                                  count_steps_by=s.count_steps_by, max_wait_ms=s.max_wait_ms,
                                  experience_queue_size=s.experience_queue_size)
        self.runtime = BridgeRuntime(bridge_cfg, policy_mapping_fn=self._mapping_fn(),
                                     policy_factory=self._policy_factory)
        self.runtime.episode_end_callbacks.append(self._on_episode_end)

        if any(c is not None for c in self.classes.values()):
            _warm_up_torch()
        state = self._load_for_resume() if resume else None
        for pid, spec in cfg.policies.items():
            if pid in self.policies:
                continue
            if spec.observation_space is not None:
                try:
                    self._add(pid, self._build(pid, spec.observation_space, spec.action_space))
                except (ValueError, TypeError) as e:
                    raise ConfigError(f"[policies.{pid}]: cannot create it for observation "
                                      f"{spec.observation_space}, action {spec.action_space}: {e}") from None
        self.resumed_env_steps = state["counters"]["env_steps"] if state else 0

    # ---------------------------------------------------------- policies

    def _mapping_fn(self):
        m = self.cfg.mapping
        fn = pattern_mapping(m.rules, default=m.default or "")

        def mapping(agent_id: str, episode=None) -> str:
            pid = fn(agent_id, episode)
            if not pid:
                raise invalid_argument(
                    f"agent {agent_id!r} matches no [mapping] rule of the trainer config and no default "
                    f"policy is set: add a rule for it or set [mapping] default")
            return pid
        return mapping

    def _build(self, pid: str, obs_space, act_space) -> Policy:
        from simbridge.trainer.learner import Learner
        spec, cls = self.cfg.policies[pid], self.classes[pid]
        run = self.cfg.run
        seed = None if run.seed is None else run.seed + list(self.cfg.policies).index(pid)
        if cls is None:
            return RandomPolicy(obs_space, act_space, seed=spec.config.get("seed", seed))
        if issubclass(cls, Learner):
            config = dict(spec.config)
            if seed is not None:
                config.setdefault("seed", seed)
            return cls(obs_space, act_space, config=config, device=run.device,
                       trainable=self.cfg.trainable(pid))
        return cls(obs_space, act_space, **spec.config)

    def _policy_factory(self, pid: str, obs_space, act_space) -> Policy:
        """Called by the runtime (a gRPC thread, runtime lock held) on a policy's first use."""
        if pid not in self.cfg.policies:
            raise invalid_argument(f"policy {pid!r} is not defined in the trainer config: add "
                                   f"[policies.{pid}] or map the agent to one of {sorted(self.cfg.policies)}")
        try:
            policy = self._build(pid, obs_space, act_space)
        except Exception as e:
            log.error("cannot create policy %r for observation %s, action %s: %s", pid, obs_space,
                      act_space, e)
            raise invalid_argument(
                f"the trainer cannot create policy {pid!r} (algorithm {self.cfg.policies[pid].algorithm!r}) "
                f"for observation space {obs_space}, action space {act_space}: {e}; map these agents "
                f"to a policy whose algorithm fits (dqn: Discrete actions, sac: Box actions)") from None
        with self._lock:
            self.policies[pid] = policy
        log.info("policy %r created (%s) for observation %s, action %s%s", pid, type(policy).__name__,
                 obs_space, act_space, "" if self._trains(policy) else ", not trained")
        return policy

    def _add(self, pid: str, policy: Policy) -> None:
        """A policy known before any simulator connects (declared spaces, or resumed)."""
        with self._lock:
            self.policies[pid] = policy
        self.runtime.add_policy(pid, policy)

    def _trains(self, policy) -> bool:
        return bool(getattr(policy, "trainable", False)) and hasattr(policy, "train")

    def _learners(self) -> List[tuple]:
        with self._lock:
            return list(self.policies.items())

    # ---------------------------------------------------------- resume

    def _load_for_resume(self) -> dict:
        if not self.ckpt_path.exists():
            raise ConfigError(f"--resume: no {CHECKPOINT} in {self.logdir}: run without --resume to start "
                              f"fresh, or pass the run's --logdir")
        state = load_checkpoint(self.ckpt_path)
        for pid, entry in state["policies"].items():
            spec = self.cfg.policies.get(pid)
            if spec is None:
                log.warning("checkpoint policy %r is not in the config: left out", pid)
                continue
            if entry["algorithm"] != spec.algorithm:
                raise ConfigError(f"[policies.{pid}] algorithm = {spec.algorithm!r}, but the checkpoint's "
                                  f"policy {pid!r} was built with {entry['algorithm']!r}: set it back, or "
                                  f"start a new run with another --logdir")
            obs, act = _space_from_bytes(entry["observation_space"]), _space_from_bytes(entry["action_space"])
            if spec.observation_space is not None and (
                    _space_bytes(spec.observation_space) != entry["observation_space"]
                    or _space_bytes(spec.action_space) != entry["action_space"]):
                raise ConfigError(f"[policies.{pid}] declares observation {spec.observation_space}, action "
                                  f"{spec.action_space}; the checkpoint's has observation {obs}, action {act}")
            policy = self._build(pid, obs, act)
            if entry.get("state") is not None:
                try:
                    policy.load_state_dict(entry["state"])
                except (RuntimeError, KeyError, ValueError) as e:
                    raise ConfigError(f"[policies.{pid}]: the checkpoint's networks do not fit the configured "
                                      f"learner ({e}); restore the config the run used ({self.logdir / SAVED_CONFIG}) "
                                      f"or start a new run with another --logdir") from None
            policy.version = entry["version"]
            self._add(pid, policy)
        c = state["counters"]
        m = self.runtime.metrics  # nothing is serving yet: safe to set
        m.env_steps, m.agent_steps, m.episodes = c["env_steps"], c["agent_steps"], c["episodes"]
        m.recent.extend(c["recent"])
        self.recent.extend(c["recent"])
        self.base_wall_s = c["wall_s"]
        self.checkpoints = c.get("checkpoints", 0)
        self.checkpoint_env_steps = c["env_steps"]
        return state

    def _on_episode_end(self, summary: dict) -> None:
        # Whole summaries (small, plain types): the runtime's return means read several of their keys.
        with self._lock:
            self.recent.append(dict(summary))

    # ---------------------------------------------------------- checkpoint

    def checkpoint(self) -> None:
        from simbridge.trainer.learner import Learner
        snap = self.runtime.snapshot()
        with self._lock:
            recent = list(self.recent)
        policies = {}
        for pid, p in self._learners():
            entry = {"algorithm": self.cfg.policies[pid].algorithm, "version": int(p.version),
                     "trainable": self._trains(p), "observation_space": _space_bytes(p.observation_space),
                     "action_space": _space_bytes(p.action_space), "state": None}
            if isinstance(p, Learner):
                entry["state"] = p.state_dict(include_replay=self.cfg.run.keep_replay_in_checkpoint)
            policies[pid] = entry
        self.checkpoints += 1
        state = {"format": CHECKPOINT_FORMAT, "policies": policies, "counters": {
            "env_steps": snap["env_steps"], "agent_steps": snap["agent_steps"], "episodes": snap["episodes"],
            "wall_s": self.wall_s(), "recent": recent, "checkpoints": self.checkpoints}}
        t0 = time.monotonic()
        save_checkpoint(self.ckpt_path, state)
        self.checkpoint_env_steps = snap["env_steps"]
        log.info("checkpoint %d written at %d env steps (%.2fs): %s", self.checkpoints, snap["env_steps"],
                 time.monotonic() - t0, self.ckpt_path)

    # ---------------------------------------------------------- progress

    def wall_s(self) -> float:
        return self.base_wall_s + time.monotonic() - self._t0

    def record(self, event: Optional[str] = None) -> dict:
        snap = self.runtime.snapshot()
        now = time.monotonic()
        rate = (snap["env_steps"] - self._last_steps) / max(now - self._last_t, 1e-9)
        self._last_steps, self._last_t = snap["env_steps"], now
        rec = {"env_steps": snap["env_steps"], "agent_steps": snap["agent_steps"], "episodes": snap["episodes"],
               "wall_s": round(self.wall_s(), 3), "steps_per_s": round(rate, 1),
               "sessions": snap["sessions"], "episode_return_mean": snap["episode_return_mean"],
               "return_mean": snap["policy_return_mean"], "return_mean_10": snap["policy_return_mean_10"],
               "updates": {}, "versions": {}, "losses": {},
               "experience_queue": snap["experience_queue"],
               "experience_blocked_puts": snap["experience_blocked_puts"]}
        for pid, p in sorted(self._learners()):
            rec["versions"][pid] = int(p.version)
            if hasattr(p, "updates"):
                rec["updates"][pid] = int(p.updates)
            m = {k: float(v) for k, v in (getattr(p, "last_metrics", None) or {}).items()
                 if isinstance(v, (int, float, np.floating)) and math.isfinite(float(v))}
            if m:
                rec["losses"][pid] = m
        if event:
            rec["event"] = event
        self._metrics_file.write(json.dumps(rec) + "\n")
        self._metrics_file.flush()
        self._tensorboard(rec)
        return rec

    def _tensorboard(self, rec: dict) -> None:
        w = self._writer
        if w is None:
            return
        step = rec["env_steps"]
        w.add_scalar("env/steps_per_s", rec["steps_per_s"], step)
        w.add_scalar("env/episodes", rec["episodes"], step)
        if rec["episode_return_mean"] is not None:
            w.add_scalar("env/episode_return_mean", rec["episode_return_mean"], step)
        for pid, v in rec["return_mean"].items():
            w.add_scalar(f"env/return_mean/{pid}", v, step)
        for pid, v in rec["updates"].items():
            w.add_scalar(f"learner/{pid}/updates", v, step)
        for pid, v in rec["versions"].items():
            w.add_scalar(f"learner/{pid}/version", v, step)
        for pid, m in rec["losses"].items():
            for k, v in m.items():
                w.add_scalar(f"learner/{pid}/{k}", v, step)
        w.flush()

    @staticmethod
    def progress_line(rec: dict, queue_max: int) -> str:
        parts = [f"env steps {rec['env_steps']:,} ({rec['steps_per_s']:,.0f}/s)",
                 f"episodes {rec['episodes']:,}", f"sessions {rec['sessions']}"]
        if rec["return_mean"]:
            parts.append("return(100) " + " ".join(f"{pid} {v:.2f}" for pid, v in sorted(rec["return_mean"].items())))
        for pid, v in rec["versions"].items():
            s = f"{pid}: v{v}"
            if pid in rec["updates"]:
                s += f" upd {rec['updates'][pid]:,}"
            m = rec["losses"].get(pid, {})
            shown = {k: x for k, x in m.items() if "loss" in k} or dict(list(m.items())[:2])
            s += "".join(f" {k} {x:.4g}" for k, x in shown.items())
            parts.append(s)
        parts.append(f"queue {rec['experience_queue']}/{queue_max}")
        return "[trainer] " + " | ".join(parts)

    def _report(self, event: Optional[str] = None) -> None:
        rec = self.record(event)
        print(self.progress_line(rec, self.cfg.server.experience_queue_size), file=self.out, flush=True)

    # ---------------------------------------------------------- learning

    def _ingest(self, batch) -> None:
        with self._lock:
            policies = dict(self.policies)
        for pid, b in batch.policy_batches.items():
            p = policies.get(pid)
            if p is not None and self._trains(p):
                p.add(b)

    def _train_due(self, next_report: List[float]) -> None:
        """Runs every due update (in chunks, staying responsive to signals and the clock)."""
        while not self.stop_event.is_set():
            busy = False
            for _, p in self._learners():
                if self._trains(p) and p.updates_due() > 0:
                    p.train(max_updates=TRAIN_CHUNK)
                    busy = True
            if not busy:
                return
            self._maybe_report(next_report)

    def _maybe_report(self, next_report: List[float]) -> None:
        now = time.monotonic()
        if now >= next_report[0]:
            self._report()
            next_report[0] = now + self.cfg.run.print_every_s

    def _loop(self) -> None:
        run = self.cfg.run
        next_report = [time.monotonic() + run.print_every_s]
        every = run.checkpoint_every_env_steps
        next_ckpt = (self.checkpoint_env_steps // every + 1) * every if every else math.inf
        while not self.stop_event.is_set():
            batch = self.runtime.experience.get(timeout=0.05)
            if batch is not None:
                self._ingest(batch)
            self._train_due(next_report)
            self._maybe_report(next_report)
            steps = self.runtime.metrics.env_steps
            if steps >= next_ckpt:
                self.checkpoint()
                next_ckpt = (steps // every + 1) * every
            if run.total_env_steps and steps >= run.total_env_steps:
                self.stop_reason = f"total_env_steps {run.total_env_steps} reached"
                self.stop_event.set()

    # ---------------------------------------------------------- run

    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason
        self.stop_event.set()

    def run(self) -> int:
        from simbridge.server.service import BridgeServer
        if self.cfg.run.torch_threads:
            import torch
            torch.set_num_threads(self.cfg.run.torch_threads)
        self.logdir.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            (self.logdir / SAVED_CONFIG).write_text(self.cfg.text)
        self._metrics_file = open(self.metrics_path, "a")
        self._writer = self._open_tensorboard()
        self._t0 = self._last_t = time.monotonic()
        self._last_steps = self.runtime.metrics.env_steps
        try:
            server = BridgeServer(self.runtime, self.cfg.server.address).start()
        except RuntimeError as e:
            print(f"simbridge-trainer: {e}; pick another with --address HOST:PORT", file=sys.stderr)
            self._close()
            return 2
        self.address = server.address
        what = f"resumed at {self.resumed_env_steps:,} env steps" if self.resume else "fresh run"
        print(f"simbridge-trainer listening on {server.address} ({what}); logdir {self.logdir}; policies "
              + ", ".join(f"{pid}={s.algorithm}{'' if self.cfg.trainable(pid) else ' (frozen)'}"
                          for pid, s in self.cfg.policies.items()), file=self.out, flush=True)
        self._report("resume" if self.resume else "start")
        try:
            self._loop()
        finally:
            self._shutdown(server)
        return 0

    def _open_tensorboard(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            log.warning("no TensorBoard event files (%s); metrics.jsonl is still written", e)
            return None
        # purge_step: on resume, TensorBoard hides what an earlier process logged past the checkpoint.
        return SummaryWriter(str(self.logdir), purge_step=self.resumed_env_steps if self.resume else None)

    def _shutdown(self, server) -> None:
        print(f"simbridge-trainer: stopping ({self.stop_reason or 'error'}): writing the checkpoint",
              file=self.out, flush=True)
        # Keep taking experience while the server stops, so no RPC thread stays blocked on the queue.
        done = threading.Event()

        def drain():
            while not done.is_set():
                b = self.runtime.experience.get(timeout=0.05)
                if b is not None:
                    self._ingest(b)
        t = threading.Thread(target=drain, name="trainer-drain", daemon=True)
        t.start()
        server.stop(grace=0.5)
        done.set()
        t.join()
        for b in self.runtime.experience.get_all():
            self._ingest(b)
        self.runtime.flush()  # transitions of episodes still open (their sessions are gone with the server)
        for b in self.runtime.experience.get_all():
            self._ingest(b)
        self._report("stop")
        self.checkpoint()
        print(f"simbridge-trainer: checkpoint {self.ckpt_path} at {self.checkpoint_env_steps:,} env steps",
              file=self.out, flush=True)
        self._close()

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._metrics_file.close()


# ---------------------------------------------------------------- plot

def read_metrics(path: Path) -> List[dict]:
    """metrics.jsonl records; a "resume" record drops earlier records past its env_steps
    (logged after the checkpoint by a process that did not stop cleanly)."""
    out: List[dict] = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if rec.get("event") == "resume":
                out = [r for r in out if r["env_steps"] <= rec["env_steps"]]
            out.append(rec)
    return out


def plot(run_dir: Path, out: Optional[Path] = None) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = run_dir / METRICS
    if not path.exists():
        raise ConfigError(f"no {METRICS} in {run_dir}: pass a trainer run's logdir ([run] logdir)")
    recs = read_metrics(path)
    out = out or run_dir / "learning_curves.png"
    fig, (ax_r, ax_l) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    returns: Dict[str, list] = collections.defaultdict(list)
    losses: Dict[str, list] = collections.defaultdict(list)
    for r in recs:
        for pid, v in r.get("return_mean", {}).items():
            returns[pid].append((r["env_steps"], v))
        for pid, m in r.get("losses", {}).items():
            shown = {k: v for k, v in m.items() if "loss" in k} or m  # else whatever the learner reports
            for k, v in shown.items():
                losses[f"{pid} {k}"].append((r["env_steps"], v))
    for name, pts in sorted(returns.items()):
        ax_r.plot(*zip(*pts), label=name)
    for name, pts in sorted(losses.items()):
        ax_l.plot(*zip(*pts), label=name)
    ax_r.set_ylabel("episode return, mean of last 100")
    ax_r.set_title(f"{run_dir}")
    ax_l.set_ylabel("learner loss (last update)")
    ax_l.set_xlabel("env steps")
    if losses and all(v > 0 for pts in losses.values() for _, v in pts):
        ax_l.set_yscale("log")
    for ax, series, empty in ((ax_r, returns, "no finished episodes yet"), (ax_l, losses, "no updates yet")):
        if series:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# ---------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="simbridge-trainer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="serve and train (until SIGTERM / Ctrl-C or total_env_steps)")
    r.add_argument("--config", help=f"TOML config (default: {DEFAULT_CONFIG.name}, embedded; with --resume: "
                                    f"the run's saved {SAVED_CONFIG})")
    r.add_argument("--resume", action="store_true", help=f"continue from LOGDIR/{CHECKPOINT}")
    r.add_argument("--address", help="host:port to serve on (overrides [server] address)")
    r.add_argument("--total-env-steps", type=int, help="stop at this many env steps (overrides [run]; 0: never)")
    r.add_argument("--logdir", help="run directory (overrides [run] logdir)")
    r.add_argument("--log-level", default="INFO")
    pl = sub.add_parser("plot", help="draw learning curves from RUN_DIR/metrics.jsonl")
    pl.add_argument("run_dir", metavar="RUN_DIR")
    pl.add_argument("--out", help="PNG to write (default: RUN_DIR/learning_curves.png)")
    return p


def _config_for(args) -> TrainerConfig:
    if args.config:
        cfg = load_config(args.config)
    else:
        cfg = load_config(DEFAULT_CONFIG)
        saved = Path(args.logdir or cfg.run.logdir) / SAVED_CONFIG
        if args.resume and saved.exists():
            cfg = load_config(saved)
            cfg.run.logdir = str(saved.parent)
    if args.address:
        cfg.server.address = args.address
    if args.total_env_steps is not None:
        if args.total_env_steps < 0:
            raise ConfigError("--total-env-steps must be >= 0 (0: run until stopped)")
        cfg.run.total_env_steps = args.total_env_steps
    if args.logdir:
        cfg.run.logdir = args.logdir
    return cfg


def _check_logdir(cfg: TrainerConfig, resume: bool) -> None:
    logdir = Path(cfg.run.logdir)
    if resume:
        return
    for name in (CHECKPOINT, METRICS):
        f = logdir / name
        if f.exists() and f.stat().st_size > 0:
            raise ConfigError(f"{logdir} already holds a run ({name}): pass --resume to continue it, or "
                              f"choose another --logdir")


def cmd_run(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = _config_for(args)
        _check_logdir(cfg, args.resume)
        daemon = TrainerDaemon(cfg, resume=args.resume)
    except ConfigError as e:
        print(f"simbridge-trainer: error: {e}", file=sys.stderr)
        return 2

    def on_signal(signum, frame):
        if daemon.stop_event.is_set():
            raise KeyboardInterrupt  # a second signal: stop without waiting (the last checkpoint stays)
        daemon.request_stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return daemon.run()
    except KeyboardInterrupt:
        print("simbridge-trainer: interrupted again: exiting without a final checkpoint", file=sys.stderr)
        return 130


def cmd_plot(args) -> int:
    try:
        out = plot(Path(args.run_dir), Path(args.out) if args.out else None)
    except ConfigError as e:
        print(f"simbridge-trainer: error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return cmd_run(args) if args.command == "run" else cmd_plot(args)


if __name__ == "__main__":
    sys.exit(main())
