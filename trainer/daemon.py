"""TrainerDaemon: one run's bridge runtime, server, policies, learning loop, checkpoints and
reports, wired together. `run()` blocks until stopped. The command line is trainer/cli.py
(`simbridge-trainer`, or `python -m simbridge.trainer.cli`).

Policies live in the runtime (`runtime.policies`): each is created by the PolicyFactory when
the first simulator using it connects (its handshake gives the spaces), or here at startup
when the config declares the spaces or a resumed checkpoint knows them.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import collections
import sys
import threading
import time
from pathlib import Path

import torch

from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.security import SecurityConfigError, ServerSecurity
from simbridge.server.service import BridgeServer
from simbridge.trainer import checkpoint
from simbridge.trainer.config import ConfigError, TrainerConfig
from simbridge.trainer.factory import PolicyFactory, trains
from simbridge.trainer.loop import LearningLoop
from simbridge.trainer.reporting import Reporter
from simbridge.trainer.rundir import SAVED_CONFIG


class TrainerDaemon:
    """Runtime + server + learners + logging for one run. `run()` blocks until stopped."""

    def __init__(self, cfg: TrainerConfig, resume: bool = False, out=None):
        self.cfg = cfg
        self.out = out or sys.stdout
        self.logdir = Path(cfg.run.logdir)
        self.resume = resume
        self.stop_event = threading.Event()
        self.stop_reason = ""
        # Classes first: an unknown module or config key fails here, before serving.
        self.factory = PolicyFactory(cfg)
        self.checkpoints = checkpoint.Checkpoints(self.logdir, cfg.run.keep_replay_in_checkpoint)
        self.ckpt_path = self.checkpoints.path
        # Episode summaries as the runtime's metrics keep them, for the checkpoint.
        self.recent = collections.deque(maxlen=100)
        self._recent_lock = threading.Lock()
        self.base_wall_s = 0.0
        self._t0 = time.monotonic()

        s = cfg.server
        bridge_cfg = BridgeConfig(rollout_fragment_length=s.rollout_fragment_length, batch_mode=s.batch_mode,
                                  count_steps_by=s.count_steps_by, max_wait_ms=s.max_wait_ms,
                                  experience_queue_size=s.experience_queue_size)
        self.runtime = BridgeRuntime(bridge_cfg, policy_mapping_fn=self.factory.mapping_fn(),
                                     policy_factory=self.factory)
        self.runtime.episode_end_callbacks.append(self._on_episode_end)

        state = self._resume() if resume else None
        for pid, spec in cfg.policies.items():
            if pid in self.runtime.policies or spec.observation_space is None:
                continue
            try:
                policy = self.factory.build(pid, spec.observation_space, spec.action_space)
            except (ValueError, TypeError) as e:
                raise ConfigError(f"[policies.{pid}]: cannot create it for observation "
                                  f"{spec.observation_space}, action {spec.action_space}: {e}") from None
            self.runtime.add_policy(pid, policy)
        self.resumed_env_steps = state["counters"]["env_steps"] if state else 0
        self.reporter = Reporter(self.runtime, self.logdir, self.out, s.experience_queue_size, self.wall_s)
        self.loop = LearningLoop(self.runtime, cfg.run, self.stop_event, self.request_stop,
                                 self.reporter.report, self.checkpoint)

    # ---------------------------------------------------------- resume and checkpoints

    def _resume(self) -> dict:
        state = self.checkpoints.load_for_resume()
        for pid, policy in self.checkpoints.restore_policies(state, self.cfg, self.factory.build):
            self.runtime.add_policy(pid, policy)
        c = state["counters"]
        m = self.runtime.metrics  # nothing is serving yet: safe to set
        m.env_steps, m.agent_steps, m.episodes = c["env_steps"], c["agent_steps"], c["episodes"]
        m.recent.extend(c["recent"])
        self.recent.extend(c["recent"])
        self.base_wall_s = c["wall_s"]
        return state

    def _on_episode_end(self, summary: dict) -> None:
        # Whole summaries (small, plain types): the runtime's return means read several of their keys.
        with self._recent_lock:
            self.recent.append(dict(summary))

    def checkpoint(self) -> None:
        snap = self.runtime.snapshot()
        with self._recent_lock:
            recent = list(self.recent)
        keep_replay = self.cfg.run.keep_replay_in_checkpoint
        policies = {pid: checkpoint.policy_entry(self.cfg.policies[pid].algorithm, p, trains(p), keep_replay)
                    for pid, p in list(self.runtime.policies.items())}
        self.checkpoints.save(policies, {
            "env_steps": snap["env_steps"], "agent_steps": snap["agent_steps"], "episodes": snap["episodes"],
            "wall_s": self.wall_s(), "recent": recent})

    def wall_s(self) -> float:
        return self.base_wall_s + time.monotonic() - self._t0

    # ---------------------------------------------------------- run

    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason
        self.stop_event.set()

    def run(self) -> int:
        if self.cfg.run.torch_threads:
            torch.set_num_threads(self.cfg.run.torch_threads)
        self.logdir.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            (self.logdir / SAVED_CONFIG).write_text(self.cfg.text)
        self.reporter.open(purge_step=self.resumed_env_steps if self.resume else None)
        self._t0 = time.monotonic()
        s = self.cfg.server
        try:
            server = BridgeServer(self.runtime, s.address, security=ServerSecurity(
                tls_cert=s.tls_cert, tls_key=s.tls_key, tls_client_ca=s.tls_client_ca,
                auth_token_file=s.auth_token_file, insecure=s.insecure)).start()
        except SecurityConfigError as e:
            print(f"simbridge-trainer: error: {e}", file=sys.stderr)
            self.reporter.close()
            return 2
        except RuntimeError as e:
            print(f"simbridge-trainer: {e}; pick another with --address HOST:PORT", file=sys.stderr)
            self.reporter.close()
            return 2
        self.address = server.address
        what = f"resumed at {self.resumed_env_steps:,} env steps" if self.resume else "fresh run"
        print(f"simbridge-trainer listening on {server.address} ({what}); logdir {self.logdir}; policies "
              + ", ".join(f"{pid}={s.algorithm}{'' if self.cfg.trainable(pid) else ' (frozen)'}"
                          for pid, s in self.cfg.policies.items()), file=self.out, flush=True)
        self.reporter.report("resume" if self.resume else "start")
        try:
            self.loop.run(self.checkpoints.env_steps)
        finally:
            self._shutdown(server)
        return 0

    def _shutdown(self, server) -> None:
        print(f"simbridge-trainer: stopping ({self.stop_reason or 'error'}): writing the checkpoint",
              file=self.out, flush=True)
        self.loop.drain_while(lambda: server.stop(grace=0.5))
        self.reporter.report("stop")
        self.checkpoint()
        print(f"simbridge-trainer: checkpoint {self.ckpt_path} at {self.checkpoints.env_steps:,} env steps",
              file=self.out, flush=True)
        self.reporter.close()
