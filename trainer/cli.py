"""`simbridge-trainer`: the bridge server with learners behind it, in one process.

    simbridge-trainer run [--config FILE] [--resume | --resume-if-present] [--address HOST:PORT]
                          [--total-env-steps N] [--logdir DIR] [--seed N] [--device DEV]
                          [--set KEY=VALUE ...] [--record-dataset] [--warm-start POLICY=PATH ...]
                          [--log-level LEVEL] [TLS and token flags: docs/security.md]
    simbridge-trainer serve --checkpoint DIR [--address HOST:PORT] [--explore] [--logdir OUT]
    simbridge-trainer export --checkpoint DIR --onnx OUT.onnx [--policy ID]
    simbridge-trainer plot RUN_DIR [--out PNG] [--target RETURN]

`run` serves the policies of the config (default: the embedded
trainer/configs/cartpole_dqn.toml) on a BridgeServer; simulators connect
whenever they like. It binds its port first (about a second) and answers health
NOT_SERVING while torch, a resumed run's checkpoint and journal, and the learners
load: simulators that connect meanwhile wait, and both sides say so. Each
policy is created when the first simulator using it connects (its handshake
gives the spaces), or at startup when the config declares the spaces or a
resumed checkpoint knows them.

The main thread is the intake loop: it takes each MultiAgentBatch from the
bridge's experience queue and hands each policy's SampleBatch to its learner.
With `[run] learner_process = true` (the default) each trainable learner
trains in a process of its own and the bridge acts with the weights it sends
back after every chunk of updates; a rate limiter holds the replay ratio (the
learner never runs ahead; while it owes more than `max_updates_behind`
updates, the bridge holds the simulators' finished fragments). With false, the loop runs the due updates
itself between intakes. Either way the queue is small, so a learner that falls
behind blocks the bridge's puts and slows the simulators instead of dropping
experience.

Started by torchrun (WORLD_SIZE and RANK set), `run` is one rank of a
data-parallel group: its own server (the port plus LOCAL_RANK) and simulators,
gradients averaged over the ranks, rank 0 writing the run's files; a restart
by torchrun's --max-restarts resumes from rank 0's checkpoint (docs/scaling.md).

`serve` and `export` take a finished run's directory (trainer/serve.py): `serve`
answers simulators with its policies, greedy unless --explore, and never
learns; `export` writes one policy's ONNX model and checks it against torch.

`--resume` loads checkpoint.pt (with torch's safe loader only: a file that is
not a valid checkpoint is refused) and then replays the run's journal: counters
(env steps, episodes, wall time, the last 100 episode returns) continue from
where the previous process was, not from its last checkpoint, and every policy
is re-created at startup from the spaces saved with it, with its networks,
optimizers, update counts (= policy version, as of the checkpoint) and replay
buffer (kept in the checkpoint, or refilled from the journal). Episodes open
when a process was killed end as truncated; gradient updates since the last
checkpoint are lost, and the resume line says how many (docs/durability.md). Simulators connected to the
previous process reconnect and go on with new episodes.
"""
# This module imports neither torch nor the daemon until a command runs, so that a missing
# trainer extra is one line naming the fix, not a traceback.
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import logging
import os
import signal
import sys
from pathlib import Path

import simbridge
from simbridge.console import exit_within, on_hangup
from simbridge.extras import run_needing_extra
from simbridge.server.cli import add_log_level, add_security_args
from simbridge.server.heap import keep_freed_memory
from simbridge.server.service import address_in_use, in_use_message
from simbridge.trainer.run import rundir
from simbridge.trainer.run.gcquiet import imports_without_gc
from simbridge.trainer.run.listen import listen_early
from simbridge.trainer.config.trainer_config import DEFAULT_CONFIG, ConfigError, TrainerConfig, load_config
from simbridge.trainer.config.values import parse_overrides
from simbridge.trainer.config.dataset import dataset_overrides
from simbridge.trainer.run.reporting import plot
from simbridge.trainer.run.rundir import CHECKPOINT, SAVED_CONFIG, refuse_used

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="simbridge-trainer", description=f"{__doc__}\n{rundir.__doc__}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {simbridge.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="serve and train (until SIGTERM / Ctrl-C or total_env_steps)")
    r.add_argument("--config", help=f"TOML config (default: {DEFAULT_CONFIG.name}, embedded; with --resume: "
                                    f"the run's saved {SAVED_CONFIG})")
    again = r.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help=f"continue from LOGDIR/{CHECKPOINT}")
    again.add_argument("--resume-if-present", action="store_true",
                       help=f"continue the run in LOGDIR if it holds one (its {CHECKPOINT}), else start one: for "
                            f"a trainer that a supervisor starts again (compose, systemd, Kubernetes)")
    r.add_argument("--address", help="host:port, or unix:PATH for a Unix socket (shm+unix:PATH: the steps through shared memory), to serve on (overrides "
                                      "[server] address)")
    r.add_argument("--total-env-steps", type=int, help="stop at this many env steps (overrides [run]; 0: never)")
    r.add_argument("--logdir", help="run directory (overrides [run] logdir)")
    r.add_argument("--seed", type=int, help="seed of the learners and their exploration (overrides [run] seed)")
    r.add_argument("--device", help="torch device: auto, cpu, cuda, cuda:N, mps (overrides [run] device)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key by its dotted path, the value read as TOML, checked like the "
                        "file; repeatable. E.g. --set policies.default_policy.config.lr=3e-4 --set "
                        "run.print_every_s=10. The effective config is saved as LOGDIR/" + SAVED_CONFIG)
    r.add_argument("--record-dataset", action="store_true", help="record every transition to Minari datasets, one "
                                                                  "per policy, in LOGDIR/datasets (docs/datasets.md)")
    r.add_argument("--warm-start", action="append", default=[], metavar="POLICY=PATH",
                   help="learn from a Minari dataset before the simulators' experience (dqn, sac; repeatable)")
    add_log_level(r)
    add_security_args(r)
    sv = sub.add_parser("serve", help="serve a trained run's policies from its checkpoint, greedy, never learning")
    sv.add_argument("--checkpoint", required=True, metavar="DIR", help=f"the run directory ({CHECKPOINT}, "
                                                                      f"{SAVED_CONFIG})")
    sv.add_argument("--address", help="host:port or unix:PATH to serve on (default: the run's [server] address)")
    sv.add_argument("--explore", action="store_true", help="sample actions as in training (default: greedy)")
    sv.add_argument("--logdir", help="where serving writes its metrics (default: runs/serve-<time>; never DIR)")
    add_log_level(sv)
    add_security_args(sv)
    ex = sub.add_parser("export", help="write a policy's ONNX model from a checkpoint, checked against torch")
    ex.add_argument("--checkpoint", required=True, metavar="DIR", help=f"the run directory ({CHECKPOINT}, "
                                                                      f"{SAVED_CONFIG})")
    ex.add_argument("--onnx", required=True, metavar="OUT", help="the .onnx file to write")
    ex.add_argument("--policy", help="policy id (needed when the checkpoint has several)")
    pl = sub.add_parser("plot", help="draw learning curves from RUN_DIR/metrics.jsonl")
    pl.add_argument("run_dir", metavar="RUN_DIR")
    pl.add_argument("--out", help="PNG to write (default: RUN_DIR/learning_curves.png)")
    pl.add_argument("--target", type=float, help="draw this return as the target line, and where return(10) reached it")
    return p


def config_for(args) -> TrainerConfig:
    """The config file (or the embedded default; with --resume, the run's saved effective
    config) with --set and the flags applied as overrides, all checked as the file is."""
    overrides = parse_overrides(args.set)
    flags = (("server.address", args.address), ("run.total_env_steps", args.total_env_steps),
             ("run.logdir", args.logdir), ("run.seed", args.seed), ("run.device", args.device))
    overrides += [(key, value) for key, value in flags if value is not None]
    overrides += dataset_overrides(args.record_dataset, args.warm_start, ConfigError)
    path = args.config or DEFAULT_CONFIG
    if args.resume and not args.config:
        logdir = args.logdir or load_config(DEFAULT_CONFIG, overrides).run.logdir
        saved = Path(logdir) / SAVED_CONFIG
        if saved.exists():
            path = saved
            overrides.append(("run.logdir", str(saved.parent)))
    cfg = load_config(path, overrides)
    apply_security_args(cfg, args)
    return cfg


def apply_security_args(cfg: TrainerConfig, args) -> None:
    s = cfg.server
    s.tls_cert = args.tls_cert or s.tls_cert
    s.tls_key = args.tls_key or s.tls_key
    s.tls_client_ca = args.tls_client_ca or s.tls_client_ca
    s.auth_token_file = args.auth_token_file or s.auth_token_file
    s.insecure = s.insecure if args.insecure is None else args.insecure


def _interrupted_while_starting(signum, frame) -> None:
    """Ctrl-C while torch, a checkpoint and the learners load: the process ends here, at once.
    Nothing is written before the daemon runs (the journal, the config and the first checkpoint
    come with run()), and the listening socket closes with the process. Not by an exception: one
    raised while torch's import runs C++ that calls back into Python aborted the process
    (pybind11's terminate), ended it by SIGINT after it had returned 130, or was lost there, and
    the trainer then loaded on and served."""
    os.write(2, b"simbridge-trainer: interrupted while starting (nothing served)\n")
    os._exit(130)


def cmd_run(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = None
    signal.signal(signal.SIGINT, _interrupted_while_starting)
    try:
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        if "WORLD_SIZE" in os.environ and restart not in ("", "0") and not args.resume:
            # torchrun --max-restarts started the group again after a rank failed: from the checkpoint.
            print(f"simbridge-trainer: torchrun restart {restart}: resuming from rank 0's checkpoint", flush=True)
            args.resume = True
        cfg = config_for(args)
        if args.resume_if_present and (Path(cfg.run.logdir) / CHECKPOINT).exists():
            print(f"simbridge-trainer: {cfg.run.logdir} holds a run: resuming it (--resume-if-present)", flush=True)
            args.resume = True
            cfg = config_for(args)   # the run's saved config, where no --config is given
        rank = None
        if "WORLD_SIZE" in os.environ:   # started by torchrun: one rank of a data-parallel group
            from simbridge.trainer.distributed import ranks   # needs torch: see the comment atop
            rank = ranks.rank_from_env()
            for note in ranks.prepare_config(cfg, rank) if rank is not None else ():
                print(f"simbridge-trainer: rank {rank.rank}: {note}", flush=True)
        if not args.resume and (rank is None or rank.writes):
            refuse_used(Path(cfg.run.logdir))
        if address_in_use(cfg.server.address):   # at once, before torch and the learners load
            raise ConfigError(f"{in_use_message(cfg.server.address)} (nothing was written to {cfg.run.logdir})")
        if rank is None:   # listening before torch loads: simulators started beside it wait, not fail
            server = listen_early(cfg)
            print(f"simbridge-trainer: bound {server.address}, not serving yet: loading torch and the "
                  f"{'checkpoint' if args.resume else 'learners'}; simulators that connect meanwhile wait",
                  flush=True)
        with imports_without_gc():
            from simbridge.trainer.daemon import TrainerDaemon   # needs torch: see the comment atop
        daemon = TrainerDaemon(cfg, resume=args.resume, rank=rank, server=server)
    except BaseException as e:
        if server is not None:   # its held calls are refused (UNAVAILABLE), and the process can exit
            server.stop(grace=0)
        if not isinstance(e, ConfigError):
            raise
        print(f"simbridge-trainer: error: {e}", file=sys.stderr)
        return 2
    return run_daemon(daemon)   # replaces the SIGINT handler before anything is written


def cmd_serve(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with imports_without_gc():
        from simbridge.trainer import serve   # needs torch: see the comment atop
    try:
        ckpt = Path(args.checkpoint)
        cfg = serve.frozen_config(ckpt)
        if args.address:
            cfg.server.address = args.address
        apply_security_args(cfg, args)
        if args.logdir:
            refuse_used(Path(args.logdir), resumable=False)
        daemon = serve.serving_daemon(ckpt, cfg, args.explore, args.logdir)
    except ConfigError as e:
        print(f"simbridge-trainer: error: {e}", file=sys.stderr)
        return 2
    return run_daemon(daemon)


def cmd_export(args) -> int:
    import json
    with imports_without_gc():
        from simbridge.trainer import serve   # needs torch: see the comment atop
    try:
        result = serve.export_onnx(Path(args.checkpoint), Path(args.onnx), args.policy)
    except ConfigError as e:
        print(f"simbridge-trainer: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    if not result["ok"]:
        print(f"simbridge-trainer: error: the exported model differs from torch (max abs difference "
              f"{result['max_abs_diff']:.3g}, greedy actions equal on {result['greedy_actions_equal']:.1%} of "
              f"{result['samples']} observations)", file=sys.stderr)
        return 1
    return 0


def run_daemon(daemon) -> int:
    """Runs a TrainerDaemon until SIGTERM / Ctrl-C / SIGHUP (a second one: at once, no final checkpoint).
    SIGHUP (its terminal closed) stops it as SIGTERM does, unless ignored (nohup)."""
    signals = []   # counted apart from stop_event: a run stopping on its own (total_env_steps, a lost
                   # process group that torchrun then signals) still writes its final checkpoint

    def on_signal(signum, frame):
        if signals:
            raise KeyboardInterrupt  # a second signal: stop without waiting (the last checkpoint stays)
        signals.append(signum)
        daemon.request_stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    on_hangup(on_signal)
    try:
        return daemon.run()
    except KeyboardInterrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):   # a third must not interrupt the way out
            signal.signal(sig, signal.SIG_IGN)
        words = "simbridge-trainer: interrupted again: exiting without a final checkpoint"
        said = exit_within(1.0, 130, words)   # says them if the abort outlasts the second
        daemon.abort()   # before the print: a print to a closed terminal would raise before it
        said.set()
        try:
            print(words, file=sys.stderr)
        except OSError:
            pass
        return 130


def cmd_plot(args) -> int:
    try:
        out = plot(Path(args.run_dir), Path(args.out) if args.out else None, args.target)
    except ConfigError as e:
        print(f"simbridge-trainer: error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if argv is None and args.command in ("run", "serve"):   # the program's process, serving
        keep_freed_memory()
    commands = {"run": cmd_run, "serve": cmd_serve, "export": cmd_export, "plot": cmd_plot}
    try:
        return run_needing_extra("simbridge-trainer", "trainer", commands[args.command], args)
    except KeyboardInterrupt:   # plot and export (run and serve stop in order): a line, not a traceback
        print("simbridge-trainer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
