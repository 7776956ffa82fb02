"""Data-parallel scaling: the group's env steps/s and gradient updates/s with 1, 2 and 4 trainer
ranks (trainer/distributed/group.py), each rank with the same simulators, beside a plain single-process
trainer with the same config.

    python bench/scale.py [--ranks 1,2,4] [--sims-per-rank 1] [--slots 4] [--window-s 15] [--algorithm dqn|ppo]

Every run is real processes on loopback: R ranks started as torchrun starts them (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the environment), each serving on its own port, and
`--sims-per-rank` CartPole simulators (`simbridge-sim --slots K --vector`) per rank pointed at
that rank. DQN with CartPole's preset, updates_per_step 1: the learner sets the pace (intake waits
for the updates the replay ratio makes due), so env steps/s is what the group can learn from.
`--algorithm ppo`: PPO's CartPole preset (an iteration per 256 rows per rank; samples/s counts
each update's 256-row minibatch on every rank).
After a warm-up (learning has started on every rank), rank 0's metrics.jsonl (the group's
counts) is read over `--window-s`: env steps/s, updates/s (group updates: each averages the
gradients of a batch from every rank) and samples/s (updates x ranks x batch_size). The ranks'
final weight hashes are compared (equal, or the run is marked wrong).

Prints one JSON object: per mode its figures, and `ranks2_vs_ranks1`, `ranks4_vs_ranks1` (ratios
of env steps/s and of samples/s), `ranks1_vs_single`. On a 2-core machine the ranks share the cores:
the ratios show the cost of a rank and of the all-reduce, not a speed-up.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from simbridge.trainer.run.launch import Proc, child_env, free_port, python_module, wait_for_health  # noqa: E402

# algorithm -> (its config, rows per rank in one update: DQN's batch, PPO's minibatch)
PRESETS = {
    "dqn": ('{ gamma = 0.99, n_step = 3, lr = 0.0005, batch_size = 128, buffer_size = 100000, learning_starts = 1000, '
            'updates_per_step = 1.0, hidden = [128, 128], tau = 0.005, epsilon_timesteps = 10000, seed = 0 }', 128),
    # trainer/learners/presets.py's PPO_CARTPOLE: an iteration per 256 rows per rank, 20 updates of 256 rows
    "ppo": ('{ gamma = 0.98, lambda_ = 0.8, hidden = [64, 64], lr = 0.001, lr_final = 0.0, lr_timesteps = 100000, '
            'train_batch_size = 256, minibatch_size = 256, num_epochs = 20, clip_param = 0.2, grad_clip = 0.5, '
            'seed = 0 }', 256),
}


def config(path: Path, logdir: Path, address: str, algorithm: str) -> None:
    path.write_text(f"""[server]
address = "{address}"
rollout_fragment_length = 32
[run]
logdir = "{logdir}"
print_every_s = 0.5
checkpoint_every_env_steps = 100000000
seed = 0
[policies.default_policy]
algorithm = "{algorithm}"
config = {PRESETS[algorithm][0]}
""")


def records(logdir: Path):
    path = logdir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def one(ranks: int, args, root: Path) -> dict:
    """ranks 0: a plain single-process trainer."""
    tag = f"ranks{ranks}" if ranks else "single"
    logdir, cfg = root / tag, root / f"{tag}.toml"
    base = free_port()
    while any(_busy(base + i) for i in range(1, max(ranks, 1))):
        base = free_port()
    config(cfg, logdir, f"127.0.0.1:{base}", args.algorithm)
    master = free_port()
    procs, sims = [], []
    try:
        for r in range(max(ranks, 1)):
            extra = {} if not ranks else {"RANK": str(r), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(r),
                                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master),
                                          "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
            procs.append(Proc(f"rank{r}", python_module("simbridge.trainer.cli", "run", "--config", cfg, "--logdir",
                                                       logdir if r == 0 else root / f"{tag}-rank{r}"),
                              env=child_env(extra)))
        for r in range(max(ranks, 1)):
            wait_for_health(f"127.0.0.1:{base + r}", timeout=120, proc=procs[r])
            for _ in range(args.sims_per_rank):
                sims.append(subprocess.Popen(python_module(
                    "simbridge.sims.gym_sim", "--address", f"127.0.0.1:{base + r}", "--slots", args.slots,
                    "--vector", "--quiet"), env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:   # warm-up: updates are running
            recs = records(logdir)
            if recs and recs[-1]["updates"].get("default_policy", 0) > 200:
                break
            time.sleep(0.5)
        first = records(logdir)[-1]
        time.sleep(args.window_s)
        last = records(logdir)[-1]
    finally:
        for s in sims:
            s.send_signal(signal.SIGTERM)
        for p in procs:
            if p.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.popen.wait(60)
            except subprocess.TimeoutExpired:
                p.popen.kill()
            p.stop()
        for s in sims:
            try:
                s.wait(30)
            except subprocess.TimeoutExpired:
                s.kill()
    dt = last["wall_s"] - first["wall_s"]
    env = (last["env_steps"] - first["env_steps"]) / dt
    upd = (last["updates"]["default_policy"] - first["updates"]["default_policy"]) / dt
    hashes = [re.findall(r"weights sha256 (\w+)", "\n".join(p.lines)) for p in procs]
    out = {"ranks": ranks, "simulators": max(ranks, 1) * args.sims_per_rank, "slots_per_simulator": args.slots,
           "window_s": round(dt, 1), "env_steps_per_s": round(env, 1), "updates_per_s": round(upd, 1),
           "samples_per_s": round(upd * max(ranks, 1) * PRESETS[args.algorithm][1], 1),
           "env_steps_per_s_per_rank": round(env / max(ranks, 1), 1)}
    if ranks:
        out["weights_equal"] = bool(hashes[0]) and all(h == hashes[0] for h in hashes)
    return out


def _busy(port: int) -> bool:
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--sims-per-rank", type=int, default=1)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--window-s", type=float, default=15.0)
    p.add_argument("--algorithm", choices=sorted(PRESETS), default="dqn",
                   help="dqn (replay ratio 1) or ppo (on-policy iterations, DD-PPO across ranks)")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="simbridge-scale-"))
    try:
        out = {"machine": f"{os.cpu_count()} CPUs", "algorithm": args.algorithm,
               "rows_per_update_per_rank": PRESETS[args.algorithm][1], "single": one(0, args, root)}
        for r in [int(x) for x in args.ranks.split(",")]:
            out[f"ranks{r}"] = one(r, args, root)
        r1 = out.get("ranks1")
        for r in (2, 4):
            if r1 and f"ranks{r}" in out:
                rr = out[f"ranks{r}"]
                out[f"ranks{r}_vs_ranks1"] = {
                    "env_steps_per_s": round(rr["env_steps_per_s"] / r1["env_steps_per_s"], 3),
                    "samples_per_s": round(rr["samples_per_s"] / r1["samples_per_s"], 3)}
        if r1:
            out["ranks1_vs_single"] = round(r1["env_steps_per_s"] / out["single"]["env_steps_per_s"], 3)
        out["load_after"] = os.getloadavg()
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
