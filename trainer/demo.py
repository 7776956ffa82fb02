"""`make demo` (python -m simbridge.trainer.demo): the trainer daemon learns CartPole from simulator processes.

Starts `simbridge-trainer run` (DQN, the embedded cartpole_dqn.toml) on a free
loopback port, waits for its health check, launches two reference CartPole
simulators as separate processes (one stepping 4 envs together), and shows the
trainer's progress lines until the mean return of the last 10 episodes reaches
--target or --seconds pass. Then it stops everything (SIGTERM: the trainer
writes its checkpoint), draws the learning curves to PNG and prints a summary.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

from simbridge.console import Console, StopEvent, on_hangup
from simbridge.trainer.run.launch import Proc, python_module, start_server
from simbridge.wire.columns import DEFAULT_POLICY

SIMULATORS = [
    ("cartpole", "gym_sim CartPole-v1, 1 env", ["simbridge.sims.gym_sim", "--env", "CartPole-v1", "--seed", "1"]),
    ("cartpole-x4", "gym_sim CartPole-v1, 4 envs batched",
     ["simbridge.sims.gym_sim", "--env", "CartPole-v1", "--slots", "4", "--seed", "2"]),
]


class _Console:
    def __init__(self):
        self._lock = threading.Lock()
        # Once the target is reached, the trainer's later progress lines are not shown: the one
        # its stop writes counts the episodes the stop cut short (and so do not the plot's curves).
        self.hide_after: Optional[int] = None   # env steps
        # Nobody reading any more (the demo piped into `head`, its terminal closed) must not stop
        # the demo halfway: a print that raised there skipped its clean-up, and the trainer and
        # simulators (sessions of their own) ran on. The main loop sees `gone` and stops them in
        # order, quietly, as on Ctrl-C.
        self._out = Console(sys.stdout)

    @property
    def gone(self) -> bool:
        """stdout's reader left."""
        return self._out.gone

    def say(self, msg: str) -> None:
        self._print(f"demo: {msg}")

    def say_from_a_signal_handler(self, msg: str) -> None:
        """One write to the descriptor, no lock: the handler runs in the main thread, which may be
        inside `_print` holding the lock (a second Ctrl-C then hung the demo) or inside the
        stream's own write (a reentrant write raises)."""
        if self._out.gone:
            return
        try:
            os.write(self._out.stream.fileno(), f"demo: {msg}\n".encode())
        except (OSError, ValueError):
            pass   # nobody reading, or no descriptor: nothing to say

    def _print(self, text: str) -> None:
        with self._lock:
            print(text, file=self._out, flush=True)

    def on_line(self, name: str, line: str) -> None:
        if line.startswith("{"):  # the simulators' JSON summaries: shown in the summary instead
            return
        if self.hide_after is not None and line.startswith("[trainer] env steps "):
            steps = line[len("[trainer] env steps "):].split(" ", 1)[0].replace(",", "")
            if steps.isdigit() and int(steps) > self.hide_after:
                return
        self._print(line if line.startswith("[trainer]") else f"[{name}] {line}")


def last_metrics(logdir: Path) -> Optional[dict]:
    try:
        lines = (logdir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def take_the_terminal():
    """Ctrl-C at a terminal signals its foreground process group: under `make demo` that is make's
    too, and make dies of it (status 130) whatever the demo returns. As a shell's job control
    does for a job, the demo becomes the terminal's foreground group while it runs: Ctrl-C
    reaches it alone, it stops in order, and make reports its exit status. Only under make
    (MAKELEVEL, which make sets for its recipes): a program that runs the demo as its child keeps
    its terminal. Nothing to do without a terminal, in the background, or when already a group of
    its own. Returns the function that gives the terminal back."""
    if "MAKELEVEL" not in os.environ:
        return lambda: None
    try:
        fd = os.open("/dev/tty", os.O_RDWR)
    except OSError:
        return lambda: None
    try:
        before = os.tcgetpgrp(fd)
        if before != os.getpgrp() or os.getpgrp() == os.getpid():
            os.close(fd)
            return lambda: None
        os.setpgid(0, 0)
        _as_foreground(fd, os.getpgrp())
    except OSError:
        os.close(fd)
        return lambda: None

    def give_back() -> None:
        try:
            _as_foreground(fd, before)
        except OSError:
            pass   # make is gone: the shell takes its terminal back itself
        finally:
            os.close(fd)
    return give_back


def _as_foreground(fd: int, pgrp: int) -> None:
    # Not the foreground group (after setpgid), tcsetpgrp sends us SIGTTOU, which would stop us.
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgrp)
    finally:
        signal.signal(signal.SIGTTOU, old)


def main(argv=None) -> int:
    give_back = take_the_terminal()
    try:
        return _main(argv)
    finally:
        give_back()


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m simbridge.trainer.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600.0, help="stop after this long at most (default: %(default)s)")
    p.add_argument("--target", type=float, default=475.0,
                   help="stop once the mean return of the last 10 episodes reaches this (default: %(default)s)")
    p.add_argument("--logdir", default=None, help="run directory (default: runs/demo-<time>)")
    args = p.parse_args(argv)
    logdir = Path(args.logdir or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}").resolve()

    console = _Console()
    stopping = StopEvent()   # set by the signal handler and the main thread: simbridge/console.py

    signalled = []

    def _interrupt(signum, _frame):
        # Ctrl-C reaches the demo only (its children have sessions of their own): the first one
        # stops the run in order, the trainer writing its checkpoint; later ones only say so.
        if stopping.is_set():
            console.say_from_a_signal_handler("still stopping (the trainer writes its checkpoint) ...")
            return
        stopping.set()
        signalled.append("Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    on_hangup(_interrupt)   # its terminal closed: its children, sessions of their own, get no SIGHUP

    address = "127.0.0.1:0"   # the trainer takes a free port and says which
    console.say(f"starting the trainer daemon (DQN on CartPole), logs in {logdir} ...")
    t0 = time.monotonic()
    try:
        trainer = start_server("trainer", python_module("simbridge.trainer.cli", "run", "--address", address,
                                                        "--logdir", str(logdir), "--log-level", "WARNING"),
                               address, timeout=120.0, on_line=console.on_line, own_session=True)
    except RuntimeError as e:
        console.say(f"the trainer did not start: {e}")
        return 1
    except KeyboardInterrupt:
        console.say("interrupted while the trainer was starting: stopped")
        return 0
    address = trainer.address
    console.say(f"trainer healthy on {address} after {time.monotonic() - t0:.1f} s; starting {len(SIMULATORS)} "
                f"simulators:")
    sims: List[Proc] = []
    failed: Optional[str] = None
    reached: Optional[dict] = None
    t_run = time.monotonic()
    try:
        for name, what, cmd in SIMULATORS:
            proc = Proc(name, python_module(*cmd, "--address", address, "--quiet"), console.on_line,
                        own_session=True)
            sims.append(proc)
            console.say(f"  {name:12s} pid {proc.pid:7d}  {what}")
        console.say(f"learning until the last 10 episodes average {args.target:g} or {args.seconds:.0f} s pass "
                    f"(Ctrl-C stops early) ...")
        deadline = t_run + args.seconds
        while time.monotonic() < deadline and not console.gone:   # nobody reading: stop as on Ctrl-C
            if trainer.poll() is not None:
                failed = f"the trainer exited early (code {trainer.poll()})"
                break
            dead = [s for s in sims if s.poll() is not None]
            if dead:
                failed = ", ".join(f"{s.name} exited early (code {s.poll()})" for s in dead)
                break
            rec = last_metrics(logdir)
            r10 = (rec or {}).get("return_mean_10", {}).get(DEFAULT_POLICY)
            if r10 is not None and r10 >= args.target:
                reached = rec  # reported below: stopping cuts open episodes short, which would count
                console.hide_after = rec["env_steps"]
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        console.say(f"interrupted ({signalled[0] if signalled else 'Ctrl-C'})")
    finally:
        stopping.set()
        elapsed = time.monotonic() - t_run
        console.say("stopping the simulators, then the trainer (it writes a checkpoint) ...")
        for s in sims:
            s.stop(timeout=10.0)
        trainer.stop(timeout=30.0)
    rec = reached or last_metrics(logdir) or {}
    plot = Proc("plot", python_module("simbridge.trainer.cli", "plot", str(logdir), "--target", f"{args.target:g}"),
                console.on_line, own_session=True)
    plot.popen.wait(timeout=120.0)
    plot.wait_output()
    r10 = rec.get("return_mean_10", {}).get(DEFAULT_POLICY)
    metric = f"return(10) {'-' if r10 is None else f'{r10:.1f}'} (the mean return of the last 10 episodes)"
    console.say(f"{'target reached' if reached else 'stopped'} after {rec.get('wall_s', elapsed):.0f} s at "
                f"{rec.get('env_steps', 0):,} env steps, {rec.get('episodes', 0):,} episodes: {metric}"
                f"{f' >= target {args.target:g}' if reached else f', target {args.target:g}'}")
    console.say(f"learning curves: {logdir / 'learning_curves.png'}; TensorBoard: tensorboard --logdir {logdir}")
    # the demo served a free port; simbridge-sim's default is 50051
    console.say(f"go on from the checkpoint: simbridge-trainer run --resume --logdir {logdir} --address 127.0.0.1:50051")
    if failed:
        console.say(f"FAILED: {failed}")
        return 1
    return 0   # stopped in order, interrupted or not: the checkpoint is written


if __name__ == "__main__":
    sys.exit(main())
