"""Acting and learning side by side: where a learning run's time goes, per learner mode.

    python bench/overlap.py [--window 8] [--modes inline,process] [--out FILE]

For each mode, a trainer daemon (DQN, the CartPole preset's network and batch) and one
CartPole simulator (`simbridge-sim --slots 1`, lockstep on Step) run as separate processes on
loopback; after a warm-up past learning_starts, it counts env steps and each process's CPU time
over `--window` seconds. Modes: `inline` ([run] learner_process = false: the daemon's loop
trains between intakes) and `process` (each learner in a process of its own, the default).
Prints one JSON object: per mode steps_per_s and CPU ms per env step of the daemon, the learner
process and the simulator, and `process_vs_inline` (the ratio of steps/s). Linux (reads /proc).
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import emit, run_dir  # noqa: E402

from bench.harness import proc_cpu_s  # noqa: E402
from simbridge.trainer.run import reporting  # noqa: E402
from simbridge.trainer.run.launch import child_env, free_port, stop_all, wait_for_health  # noqa: E402
from simbridge.trainer.run.rundir import METRICS  # noqa: E402

NET = "hidden = [128, 128], batch_size = 128, n_step = 3, lr = 5e-4"


def children(pid: int) -> list:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def env_steps(logdir: Path) -> int:
    recs = reporting.read_metrics(logdir / METRICS) if (logdir / METRICS).exists() else []
    return recs[-1]["env_steps"] if recs else 0


def run_mode(mode: str, window: float, tmp: Path) -> dict:
    logdir = tmp / mode
    address = f"127.0.0.1:{free_port()}"
    cfg = tmp / f"{mode}.toml"
    cfg.write_text(f'[server]\naddress = "{address}"\nrollout_fragment_length = 32\n'
                   f'[run]\nlogdir = "{logdir}"\nprint_every_s = 0.5\nseed = 0\n'
                   f'learner_process = {"false" if mode == "inline" else "true"}\n'
                   f'[policies.default_policy]\nalgorithm = "dqn"\n'
                   f'config = {{ learning_starts = 1000, {NET} }}\n')
    env = child_env()
    procs = []
    try:
        daemon = subprocess.Popen([sys.executable, "-m", "simbridge.trainer.cli", "run", "--config", str(cfg),
                                   "--log-level", "WARNING"], env=env, cwd=str(ROOT),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(daemon)
        wait_for_health(address, timeout=120)
        sim = subprocess.Popen([sys.executable, "-m", "simbridge.sims.gym_sim", "--env", "CartPole-v1",
                                "--slots", "1", "--address", address, "--quiet", "--seed", "1"], env=env,
                               cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(sim)
        deadline = time.monotonic() + 120
        while env_steps(logdir) < 2500 and time.monotonic() < deadline:   # past learning_starts
            time.sleep(0.2)
        learners = [k for k in children(daemon.pid) if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]
        pids = {"daemon": [daemon.pid], "learner": learners, "sim": [sim.pid]}
        before = {k: sum(proc_cpu_s(p) or 0.0 for p in v) for k, v in pids.items()}
        s0, t0 = env_steps(logdir), time.monotonic()
        time.sleep(window)
        after = {k: sum(proc_cpu_s(p) or 0.0 for p in v) for k, v in pids.items()}
        n, dt = env_steps(logdir) - s0, time.monotonic() - t0
        out = {"steps_per_s": round(n / dt, 1), "env_steps": n}
        for k in pids:
            out[f"{k}_cpu_ms_per_step"] = round(1000 * (after[k] - before[k]) / max(n, 1), 3)
        return out
    finally:
        stop_all(list(reversed(procs)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window", type=float, default=8.0, help="seconds measured per mode")
    p.add_argument("--modes", default="inline,process")
    p.add_argument("--keep-run-dir", action="store_true", help="keep the runs' folder in the temp dir")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    with run_dir("simbridge-overlap-", args.keep_run_dir) as tmp:
        result = {mode: run_mode(mode, args.window, tmp) for mode in args.modes.split(",")}
    if "inline" in result and "process" in result and result["inline"]["steps_per_s"]:
        result["process_vs_inline"] = round(result["process"]["steps_per_s"] / result["inline"]["steps_per_s"], 2)
    result["machine"] = {"nproc": os.cpu_count(), "python": sys.version.split()[0]}
    return emit(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
