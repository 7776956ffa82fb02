"""TrainerDaemon: one run's bridge runtime, server, policies, learning loop, checkpoints and
reports, wired together. `run()` blocks until stopped. The command line is trainer/cli.py
(`simbridge-trainer`, or `python -m simbridge.trainer.cli`).

Policies live in the runtime (`runtime.policies`): each is created by the PolicyFactory when
the first simulator using it connects (its handshake gives the spaces), or here at startup
when the config declares the spaces or a resumed checkpoint knows them.

Durability ([run] journal, docs/durability.md): the bridge writes experience and counters to
the run's journal as each call is applied, before it is answered (answer_before_commit off);
`--resume` loads the checkpoint, then replays the journal: counters and episode summaries come
back exactly, the learners get the transitions they had not seen (and their replay buffers
are refilled), and episodes open at the kill end as truncated. Gradient updates are not
replayed: those done since the checkpoint are lost, and reported.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import inspect
import sys
import threading
import time
from pathlib import Path

import torch

from simbridge.console import Console, StopEvent
from simbridge.server.metrics import count_cut
from simbridge.server.runtime import BridgeRuntime
from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.config.dataset import DatasetConfigError
from simbridge.trainer.config.trainer_config import ConfigError, TrainerConfig
from simbridge.trainer.config.writer import flat_config
from simbridge.trainer.data.attach import attach_datasets
from simbridge.trainer.learners.base import Learner, trains
from simbridge.trainer.run import checkpoint, journal, listen, recovery
from simbridge.trainer.run.factory import PolicyFactory
from simbridge.trainer.run.learner_process import LearnerProcessDied
from simbridge.trainer.run.loop import LearningLoop
from simbridge.trainer.run.reporting import Reporter
from simbridge.trainer.run.rundir import SAVED_CONFIG
from simbridge.wire import tree


def simulator_flags(server) -> str:
    """The flags a simulator needs beside --address for this [server] table (the waiting line's
    example): TLS roots and a name the server's certificate holds (the bound address, 0.0.0.0 say,
    is none), a client certificate for mutual TLS, a token."""
    flags = " --tls-ca CA.pem --tls-server-name CERT_NAME" if server.tls_cert else ""
    flags += " --tls-cert CLIENT.pem --tls-key CLIENT.key" if server.tls_client_ca else ""
    return flags + (" --auth-token-file TOKEN_FILE" if server.auth_token_file else "")


class TrainerDaemon:
    """Runtime + server + learners + logging for one run. `run()` blocks until stopped."""

    def __init__(self, cfg: TrainerConfig, resume: bool = False, out=None, preloaded=None, rank=None,
                 server=None):
        """preloaded: {policy id: Policy} served as they are (`simbridge-trainer serve`). rank: this
        process's place in a data-parallel group (trainer/distributed/group.py); only rank 0 writes files.
        server: the run's server, already listening with its calls held (trainer/run/listen.py:
        the CLI binds it before torch loads); None: run() binds one."""
        self.cfg = cfg
        self.rank = rank
        self.writes = rank is None or rank.writes
        # its reader leaving (`| head`, a closed terminal) stops the run in order (simbridge/console.py)
        self.out = Console(out or sys.stdout, on_gone=lambda: self.request_stop("its console closed"))
        self.logdir = Path(cfg.run.logdir)
        self.resume = resume
        self.started_as = "fresh run"   # the listening line's words for a start that is not a resume (serve: its own)
        self.stop_event = StopEvent()   # request_stop runs in signal handlers: simbridge/console.py
        self.serving = threading.Event()   # set once bound and serving on self.address
        self.address = ""
        self.stop_reason = ""
        self.exit_code = 0   # 1: a learner process died (no final checkpoint), or the dataset failed
        # Classes first: an unknown module or config key fails here, before serving.
        self.factory = PolicyFactory(cfg)
        self.checkpoints = checkpoint.Checkpoints(self.logdir, cfg.run.keep_replay_in_checkpoint)
        self.ckpt_path = self.checkpoints.path
        self.base_wall_s = 0.0
        self._t0 = time.monotonic()

        s = cfg.server
        self._server = server
        self._serving = None   # the server run() serves with: abort() cancels its calls
        if server is None:
            self.runtime = BridgeRuntime(listen.bridge_config(cfg), policy_mapping_fn=self.factory.mapping_fn(),
                                         policy_factory=self.factory)
        else:   # its calls wait until run() serves: nothing reaches the runtime before that
            self.runtime = server.runtime
            self.runtime.policy_mapping_fn = self.factory.mapping_fn()
            self.runtime.policy_factory = self.factory
        # Before any policy is built or served: the policies that stack frames (frame_stack.py).
        self.runtime.frame_stacks = {pid: p.frame_stack for pid, p in cfg.policies.items() if p.frame_stack > 1}
        self.runtime.episode_end_callbacks.append(self._on_episode_end)
        self.journal = None
        self.resume_info: dict = {}
        self.open_from = 0   # episode numbers below this one are never "open at a kill"

        state = self._resume() if resume and self.writes else None
        for pid, policy in (preloaded or {}).items():
            self.runtime.add_policy(pid, policy)
        for pid, spec in cfg.policies.items():
            if pid in self.runtime.policies or spec.observation_space is None:
                continue
            self.runtime.add_policy(pid, self.factory.build_at_start(
                pid, spec.policy_observation_space, spec.action_space, f"[policies.{pid}]"))
        self.resumed_env_steps = state["counters"]["env_steps"] if state else 0
        if rank is None:
            self.reporter = Reporter(self.runtime, self.logdir, self.out, s.experience_queue_size, self.wall_s)
            self.loop = LearningLoop(self.runtime, cfg.run, self.stop_event, self.request_stop,
                                     self.reporter.report, self.checkpoint)
        else:
            from simbridge.trainer.distributed import loop as distributed_loop
            self.reporter, self.loop = distributed_loop.attach(self)
        if state is not None:
            self.loop.ingested.update(self._ingested_after_resume)
        try:   # reads the warm-start datasets; the recorder writes nothing before the first episode
            self.dataset_notes = attach_datasets(self) if cfg.dataset.used else []
        except DatasetConfigError as e:
            raise ConfigError(str(e)) from None
        self._state = state   # the journal opens in run(), once the port is bound

    # ---------------------------------------------------------- resume and checkpoints

    def _resume(self) -> dict:
        state = self.checkpoints.load_for_resume()
        for pid, policy in self.checkpoints.restore_policies(state, self.cfg, self.factory.build):
            self.runtime.add_policy(pid, policy)
        c = state["counters"]
        m = self.runtime.metrics  # nothing is serving yet: safe to set
        m.env_steps, m.agent_steps, m.episodes = c["env_steps"], c["agent_steps"], c["episodes"]
        m.episodes_cut = c.get("episodes_cut", 0)   # checkpoints before 28 Nov 2026 have none
        # training's last 100 episodes and evaluation's, apart (before 28 Nov: the last 100 of both)
        recent = list(c["recent"])
        self.base_wall_s = c["wall_s"]
        js = state.get("journal")
        ingested = dict(js["ingested"]) if js else {}
        self.open_from = js.get("open_from", 0) if js else 0
        self._ingested_after_resume = ingested
        self._recovered = None
        eps_next = c.get("eps_next", 1)
        if js is not None:
            rec = self._replay(js, ingested)
            if rec.counters is not None:
                m.env_steps, m.agent_steps = rec.counters["env_steps"], rec.counters["agent_steps"]
                m.episodes = rec.counters["episodes"]
            lost = rec.open_episodes(self.open_from)
            m.episodes += len(lost)
            m.episodes_cut += count_cut(rec.summaries + lost)   # those open at the kill among them
            recent += rec.summaries + lost
            eps_next = max(eps_next, rec.max_eps_id + 1)
            self._recovered = (rec, lost)
        m.file_recent(recent)   # training and evaluation returns, apart
        self.runtime.ctx.start_episode_numbers(eps_next)
        return state

    def _replay(self, js: dict, ingested: dict) -> recovery.Recovered:
        """The journal after the checkpoint `js` into the learners: rows they had not ingested are
        added (and counted); without a replay buffer in the checkpoint, the rows before those
        refill it first (not counted). Their due updates are forgiven: gradient updates are not
        replayed."""
        keep_replay = self.cfg.run.keep_replay_in_checkpoint
        learners = {pid: p for pid, p in self.runtime.policies.items() if isinstance(p, Learner) and trains(p)}
        need = dict(ingested)
        for pid, p in learners.items():
            need[pid] = ingested.get(pid, 0) - (0 if keep_replay else p.replay.capacity)
        rec = recovery.recover(self.logdir / journal.DIRNAME, js["segment"], need)
        ends = rec.rows_end()
        info = {"journal_records": rec.records, "journal_torn": rec.torn, "transitions_replayed": 0,
                "updates_lost": {}, "updates_forgiven": {}}
        for pid, chunks in rec.rows.items():
            p = learners.get(pid)
            if p is None:
                ingested[pid] = max(ingested.get(pid, 0), ends[pid])
                continue
            ing, counted = ingested.get(pid, 0), p.agent_steps
            for first, cols, n, _ in chunks:
                lo = max(need[pid] - first, 0)   # rows before this are neither new nor needed
                if lo < n:
                    p.add(SampleBatch({k: tree.take(v, slice(lo, n)) for k, v in cols.items()}))
                    info["transitions_replayed"] += n - lo
            p.agent_steps = counted + max(0, ends[pid] - ing)
            ingested[pid] = max(ing, ends[pid])
            due = p.updates_due()
            p.updates_forgiven += due
            info["updates_forgiven"][pid] = due
        for pid, p in learners.items():
            info["updates_lost"][pid] = max(0, rec.updates.get(pid, p.updates) - p.updates)
        self.resume_info = info
        return rec

    def _open_journal(self, state) -> None:
        """The writer, on a new segment after what a resume read; the episodes a resume ended
        go on record first."""
        rec = self._recovered[0] if state is not None and self._recovered else None
        js = state.get("journal") if state is not None else None
        segment = max(rec.last_segment + 1 if rec else 1, js["segment"] if js else 1)
        rows = dict(self.loop.ingested)   # the journal numbers rows as the loop counts them
        for pid, n in [*(js["rows"].items() if js else ()), *(rec.rows_end().items() if rec else ())]:
            rows[pid] = max(rows.get(pid, 0), n)
        self.journal = journal.Journal(self.logdir / journal.DIRNAME, segment, rows, self.cfg.run.journal_fsync_s)
        if rec is not None:
            self.journal.seg_ends.update(rec.seg_ends)
            self.journal.seg_ends[segment] = {}
        self.runtime.ctx.set_journal(self.journal)
        self.loop.journal = self.journal
        if rec is not None:
            with self.runtime.ctx.lock:
                for summary in self._recovered[1]:
                    self.journal.episode(summary)
                self.journal.commit(self.runtime.metrics)

    def _on_episode_end(self, summary: dict) -> None:
        if self.journal is not None:   # runtime lock held: written with the call's commit
            self.journal.episode(summary)

    def checkpoint(self, clean: bool = False) -> None:
        """clean: the final one of a stop; the episodes open now end with their sessions, so a
        resume does not end them again (as open at a kill) from their journaled transitions."""
        if not self.writes:   # rank 0 checkpoints the group
            return
        ctx = self.runtime.ctx
        with ctx.lock:   # counters, summaries and the journal's cut at one instant
            snap = self.runtime.snapshot()
            # the runtime's windows as they are (training's 100, evaluation's 100, other ranks'
            # episodes folded in): whole summaries, small and of plain types
            m = self.runtime.metrics
            recent = [dict(x) for x in (*m.recent, *m.recent_eval)]
            eps_next = ctx.next_episode_number()
            if clean:
                self.open_from = eps_next
            js = self.journal.rotate() if self.journal is not None else None
        keep_replay = self.cfg.run.keep_replay_in_checkpoint
        policies = {pid: checkpoint.policy_entry(self.cfg.policies[pid].algorithm, p, trains(p), keep_replay)
                    for pid, p in list(self.runtime.policies.items())}
        ingested = dict(self.loop.ingested)   # this thread ingests: consistent with the learners
        if js is not None:
            js["ingested"] = ingested
            js["open_from"] = self.open_from
        self.checkpoints.save(policies, {
            "env_steps": snap["env_steps"], "agent_steps": snap["agent_steps"], "episodes": snap["episodes"],
            "episodes_cut": snap["episodes_cut"], "wall_s": self.wall_s(), "recent": recent, "eps_next": eps_next},
            journal=js)
        if self.journal is not None:
            # Rows a resume may replay: those not ingested, and the capacity of each replay
            # buffer before them unless the checkpoint holds the buffers.
            need = {pid: n - (p.replay.capacity if isinstance(p, Learner) and trains(p) and not keep_replay else 0)
                    for pid, n in ingested.items() for p in [self.runtime.policies.get(pid)]}
            self.journal.prune(need)

    def wall_s(self) -> float:
        return self.base_wall_s + time.monotonic() - self._t0

    # ---------------------------------------------------------- run

    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason
        self.stop_event.set()

    def abort(self) -> None:
        """Out at once, without the final checkpoint (the CLI's second signal): the learner
        processes are killed and the server's calls cancelled, or the process would wait for them
        at exit (a signal that came before the first stop had stopped the server left a simulator's
        stream served for good)."""
        self.loop.kill()
        if self._serving is not None:
            self._serving.abort()

    def run(self) -> int:
        """Serves and trains until stopped; the exit code. The port is bound before anything is
        written: a start that fails (a busy port, bad TLS files) leaves the logdir as it was."""
        server = self._server
        if server is None:
            try:   # binds now, serves once started
                server = listen.bind_server(self.cfg, self.runtime)
            except ConfigError as e:
                print(f"simbridge-trainer: error: {e}", file=sys.stderr)
                return 2
        self._serving = server
        try:
            self._prepare()
        except BaseException:
            server.stop(grace=0)
            raise
        if self._server is None:
            server.start()
        else:   # listening since the CLI's start: the calls held meanwhile go now
            server.serve()
        self.address = self.reporter.address = server.address
        self.reporter.sim_flags = simulator_flags(self.cfg.server)
        self.serving.set()
        what = f"resumed at {self.resumed_env_steps:,} env steps" if self.resume else self.started_as
        if self.resume and not self.writes:
            what = "resuming: the weights come from rank 0's checkpoint"
        if self.resume and self.resume_info:
            i = self.resume_info
            what += (f", journal replayed to {self.runtime.metrics.env_steps:,} env steps and "
                     f"{self.runtime.metrics.episodes:,} episodes ({i['transitions_replayed']:,} transitions, "
                     f"{len(self._recovered[1])} open episodes ended as truncated; gradient updates lost "
                     f"since the checkpoint: {sum(i['updates_lost'].values()):,})")
        print(f"simbridge-trainer listening on {server.address} ({what}); logdir {self.logdir}; policies "
              + ", ".join(f"{pid}={s.algorithm}{'' if self.cfg.trainable(pid) else ' (frozen)'}"
                          for pid, s in self.cfg.policies.items()), file=self.out, flush=True)
        for note in self.dataset_notes:
            print(f"simbridge-trainer: {note}", file=self.out, flush=True)
        if self.resume and "extra" in inspect.signature(self.reporter.report).parameters:
            self.reporter.report("resume", extra=self.resume_info)
        else:   # a Reporter without `extra` (see docs/durability.md): the console line has them
            self.reporter.report("resume" if self.resume else "start")
        try:
            if self.rank is not None:
                from simbridge.trainer.distributed import loop as distributed_loop
                distributed_loop.join(self)   # waits for every rank (bounded): the loop's collectives need them
            self.loop.run(self.checkpoints.env_steps, learners_expected=len(self.factory.learners_to_train()))
        finally:
            self._shutdown(server)
        return self.exit_code

    def _stop_serving_and_record(self, server) -> None:
        if self.loop.budget_spent:
            # the run is done, not interrupted: the simulators stop as at their own end (exit 0),
            # rather than step on through the server's grace and then wait to reconnect
            self.runtime.end_training(self.stop_reason)
        self.loop.drain_while(lambda: server.stop(grace=0.5))
        if self.rank is not None:   # the last counts to rank 0; weights hashes; leaves the group
            from simbridge.trainer.distributed import loop as distributed_loop
            distributed_loop.leave(self)
        if self.loop.recorder is not None:   # every row is in: open trajectories end as truncated
            for pid, d in self.loop.recorder.close().items():
                print(f"simbridge-trainer: dataset of {pid}: {d['episodes']:,} episodes, {d['steps']:,} steps in "
                      f"{d['path']}", file=self.out, flush=True)

    def _prepare(self) -> None:
        """The run's files: the effective config, the journal, metrics, TensorBoard (with the
        config as hparams), a first checkpoint (a resume always finds one; a resumed run's journal
        replay is folded in)."""
        if self.cfg.run.torch_threads:
            torch.set_num_threads(self.cfg.run.torch_threads)
        if not self.writes:   # rank 0 writes the group's files
            return
        self.logdir.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            (self.logdir / SAVED_CONFIG).write_text(self.cfg.text)
        state, self._state = self._state, None
        if self.cfg.run.journal:
            self._open_journal(state)
        self.reporter.open(purge_step=self.resumed_env_steps if self.resume else None)
        if not self.resume:
            self.reporter.hparams(flat_config(self.cfg), self.cfg.text, self.cfg.policies_to_train)
        self._t0 = time.monotonic()
        self.checkpoint()

    def _shutdown(self, server) -> None:
        again = " (Ctrl-C again: at once, without it)" if self.stop_reason == "SIGINT" else ""   # a user's, at a terminal
        print(f"simbridge-trainer: stopping ({self.stop_reason or 'error'}): writing the checkpoint{again}",
              file=self.out, flush=True)
        try:
            self._stop_serving_and_record(server)
            # before the last record: a learner process's weights and counts come with its state
            self.checkpoint(clean=True)
            if self.writes:
                print(f"simbridge-trainer: checkpoint {self.ckpt_path} at {self.checkpoints.env_steps:,} env steps",
                      file=self.out, flush=True)
        except LearnerProcessDied as e:   # its networks are gone: the last checkpoint stays
            print(f"simbridge-trainer: no final checkpoint: {e}", file=sys.stderr, flush=True)
            self.exit_code = 1
        finally:   # whatever failed above: learner processes left running would hold the exit for good
            self.loop.close()
        if self.loop.recording_failed:
            print(f"simbridge-trainer: the dataset stopped at an error: {self.loop.recording_failed} (the "
                  f"learners kept every row; [dataset] dir or --logdir elsewhere, or free space, then --resume)",
                  file=sys.stderr, flush=True)
            self.exit_code = 1
        self.reporter.report("stop")
        if self.journal is not None:
            self.journal.close()
        self.reporter.close()
