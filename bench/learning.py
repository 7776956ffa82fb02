"""Learning benchmarks through the bridge: the trainer daemon and simulators as separate processes.

    python bench/learning.py TASK [--seeds 0,1,2] [--learner process|inline] [--no-inprocess] [--set KEY=JSON]
                             [--out FILE]

TASK is one of: dqn-cartpole, sac-pendulum, dqn-cartpole-logged, ppo-cartpole, ppo-pendulum,
multiagent-cartpole.
Prints one JSON object: task, solved, env_steps (when solved, else at the end),
final_return (mean of the last 10 episodes), wall_s (from the first env step; the
simulators' start-up is in wall_with_startup_s), and inprocess_wall_s: the same
learner and config with the env stepped in this process, no bridge (for
multiagent-cartpole: one trained policy's learner on one CartPole), so the
bridge's overhead shows as the ratio `bridge_vs_inprocess_wall`. With --seeds, one
line per seed goes to stderr as it ends, and the JSON has each seed's run, the count
`seeds_solved` and the median `median_bridge_vs_inprocess_wall`. The ratio splits into
`bridge_vs_inprocess_updates` (the gradient updates each run had done at the target: how far the
seed's trajectory took it) and `bridge_vs_inprocess_wall_per_update` (what one update cost in
wall time, acting and the simulator included: what the bridge's overlap changes); their product
is the wall ratio.

The bridge run writes a TOML config (the learner presets of trainer/learners/presets.py), starts `python -m simbridge.trainer.cli run` on a free loopback port,
starts the reference simulators against it and polls the daemon's
metrics.jsonl until the target is met or the env-step budget is spent.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import emit, run_dir  # noqa: E402

from simbridge.trainer.run import reporting  # noqa: E402
from simbridge.trainer.run.launch import child_env, free_port, stop_all, wait_for_health  # noqa: E402
from simbridge.trainer.run.rundir import METRICS  # noqa: E402
from simbridge.wire.columns import DEFAULT_POLICY  # noqa: E402

TASKS = {
    # CartPole-v1: mean return of the last 10 episodes >= 475 within 50k env steps.
    "dqn-cartpole": dict(env="CartPole-v1", algorithm="dqn", preset="DQN_CARTPOLE", threshold=475.0,
                         budget=50_000, fragment=32, sims=[["--slots", "1"]]),
    # Pendulum-v1: >= -200 within 10k env steps.
    "sac-pendulum": dict(env="Pendulum-v1", algorithm="sac", preset="SAC_PENDULUM", threshold=-200.0,
                         budget=10_000, fragment=200, sims=[["--slots", "1"]]),
    # The simulator overrides 30% of the actions with its own choice, reported with log_action; the
    # learner counts on it doing so (trainer/learners/dqn.py's logged_actions), and explores no more itself.
    "dqn-cartpole-logged": dict(env="CartPole-v1", algorithm="dqn", preset="DQN_CARTPOLE", threshold=475.0,
                                budget=50_000, fragment=32, off_policy=0.3,
                                overrides={"logged_actions": "environment"},
                                sims=[["--slots", "1", "--off-policy-fraction", "0.3"]]),
    # PPO, on-policy from the same stream: >= 475 within 100k env steps.
    "ppo-cartpole": dict(env="CartPole-v1", algorithm="ppo", preset="PPO_CARTPOLE", threshold=475.0,
                         budget=100_000, fragment=32, sims=[["--slots", "1"]]),
    "ppo-pendulum": dict(env="Pendulum-v1", algorithm="ppo", preset="PPO_PENDULUM", threshold=-200.0,
                         budget=100_000, fragment=200, sims=[["--slots", "1"]]),
    # 4 carts on 2 trained policies (p0: cart_0, cart_2; p1: cart_1, cart_3) plus a frozen p2 (cart_4).
    "multiagent-cartpole": dict(env="CartPole-v1", algorithm="dqn", preset="DQN_CARTPOLE", threshold=300.0,
                                budget=40_000, fragment=32, multiagent=True),
}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {v!r}")


def _inline(d: dict) -> str:
    return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in d.items() if v is not None) + " }"


def learner_class(task: dict):
    """The task's Learner class, from the trainer config's algorithm registry."""
    from simbridge.trainer.config.algorithms import ALGORITHMS
    module, _, name = ALGORITHMS[task["algorithm"]].partition(":")
    return getattr(__import__(module, fromlist=[name]), name)


def preset(task: dict, seed: int) -> dict:
    from simbridge.trainer.learners import presets
    return {**getattr(presets, task["preset"]), **task.get("overrides", {}), "seed": seed}


def write_config(task: dict, seed: int, address: str, logdir: Path, path: Path, learner_process: bool,
                 max_behind: Optional[int] = None) -> List[str]:
    """The daemon's TOML; returns the trained policy ids."""
    cfg = preset(task, seed)
    lines = []
    if task.get("multiagent"):
        trained = ["p0", "p1"]
        lines.append('policies_to_train = ["p0", "p1"]')
    else:
        trained = [DEFAULT_POLICY]
    lines += ["[server]", f'address = "{address}"', f"rollout_fragment_length = {task['fragment']}",
              "experience_queue_size = 4",
              "[run]", f'logdir = "{logdir}"', f"total_env_steps = {task['budget']}", f"seed = {seed}",
              "checkpoint_every_env_steps = 1000000", "print_every_s = 0.25", "torch_threads = 1",
              f"learner_process = {'true' if learner_process else 'false'}"]
    if max_behind:
        lines.append(f"max_updates_behind = {max_behind}")
    for pid in (["p0", "p1", "p2"] if task.get("multiagent") else [DEFAULT_POLICY]):
        lines += [f"[policies.{pid}]", f'algorithm = "{task["algorithm"]}"', f"config = {_inline(cfg)}"]
    if task.get("multiagent"):
        lines += ["[mapping]", 'rules = ["cart_[02]=p0", "cart_[13]=p1", "cart_4=p2"]', 'default = "p2"']
    path.write_text("\n".join(lines) + "\n")
    return trained


def read_metrics(logdir: Path) -> List[dict]:
    path = logdir / METRICS
    return reporting.read_metrics(path) if path.exists() else []


def run_bridge(name: str, task: dict, seed: int, timeout_s: float, learner_process: bool,
               max_behind: Optional[int] = None, log_level: str = "WARNING", keep_run_dir: bool = False) -> dict:
    with run_dir(f"simbridge-{name}-", keep_run_dir) as tmp:
        return _run_bridge(tmp, name, task, seed, timeout_s, learner_process, max_behind, log_level)


def _run_bridge(tmp: Path, name: str, task: dict, seed: int, timeout_s: float, learner_process: bool,
                max_behind: Optional[int], log_level: str) -> dict:
    logdir = tmp / "run"
    address = f"127.0.0.1:{free_port()}"
    trained = write_config(task, seed, address, logdir, tmp / "config.toml", learner_process, max_behind)
    env = child_env()
    log = open(tmp / "processes.log", "w")
    procs: List[subprocess.Popen] = []
    t0 = time.monotonic()
    try:
        daemon = subprocess.Popen([sys.executable, "-m", "simbridge.trainer.cli", "run", "--config", str(tmp / "config.toml"),
                                   "--log-level", log_level], env=env, cwd=str(ROOT), stdout=log, stderr=log)
        procs.append(daemon)
        wait_for_health(address, timeout=120)
        t_start = time.monotonic()
        if task.get("multiagent"):
            sims = [["simbridge.sims.multiagent_sim", "--game", "simultaneous", "--agents", "5"]]
        else:
            sims = [["simbridge.sims.gym_sim", "--env", task["env"], *extra] for extra in task["sims"]]
        for i, cmd in enumerate(sims):
            procs.append(subprocess.Popen([sys.executable, "-m", *cmd, "--address", address, "--quiet",
                                           "--seed", str(seed + 1000 * i)], env=env, cwd=str(ROOT),
                                          stdout=log, stderr=log))
        solved_at: Optional[dict] = None
        last: Optional[dict] = None
        idle_wall = 0.0   # the daemon's wall time before the first env step (simulators starting)
        while time.monotonic() - t_start < timeout_s:
            recs = [r for r in read_metrics(logdir) if r.get("event") != "stop"]
            if recs:
                idle_wall = max([r["wall_s"] for r in recs if r["env_steps"] == 0], default=0.0)
                last = recs[-1]
                r10 = last.get("return_mean_10", {})
                if solved_at is None and all(r10.get(p, -1e9) >= task["threshold"] for p in trained) \
                        and last["env_steps"] <= task["budget"]:
                    solved_at = last
                    break
            if daemon.poll() is not None:  # reached total_env_steps (or failed)
                break
            time.sleep(0.5)
        end = solved_at or last or {}
        r10 = end.get("return_mean_10", {})
        out = {"task": name, "solved": solved_at is not None, "env_steps": end.get("env_steps", 0),
               "final_return": (min(r10[p] for p in trained) if all(p in r10 for p in trained) else None),
               # From the first env step, as the in-process run counts; with the simulators' start-up too.
               "wall_s": round(end.get("wall_s", time.monotonic() - t0) - idle_wall, 1),
               "wall_with_startup_s": round(end.get("wall_s", time.monotonic() - t0), 1), "seed": seed,
               "learner_process": learner_process,
               "threshold": task["threshold"], "budget": task["budget"],
               "return_mean_10": r10, "versions": end.get("versions", {}), "updates": end.get("updates", {})}
        if task.get("multiagent"):
            out["frozen_policy_version"] = end.get("versions", {}).get("p2")
            out["frozen_return_mean_10"] = r10.get("p2")
        return out
    finally:
        stop_all(list(reversed(procs)))
        log.close()


def run_inprocess(task: dict, seed: int) -> dict:
    import gymnasium as gym

    from simbridge.trainer.run import inprocess

    cfg = preset(task, seed)
    env = gym.make(task["env"])
    learner = learner_class(task)(env.observation_space, env.action_space, cfg, device="cpu")
    kwargs = {}
    if task.get("off_policy"):
        kwargs["off_policy_fraction"] = task["off_policy"]
    res = inprocess.run_inprocess(learner, task["env"], task["budget"], seed=seed, fragment=task["fragment"],
                                  stop_at_return=task["threshold"], **kwargs)
    return {"inprocess_wall_s": round(res["wall_s"], 1), "inprocess_solved": res["reached_step"] is not None,
            "inprocess_env_steps": res["reached_step"] or res["env_steps"], "inprocess_updates": res["updates"]}


# A run's ratios to the in-process reference; --seeds reports the median of each.
RATIOS = ("bridge_vs_inprocess_wall", "bridge_vs_inprocess_wall_per_step", "bridge_vs_inprocess_updates",
          "bridge_vs_inprocess_wall_per_update")


def run_seed(name: str, task: dict, seed: int, args) -> dict:
    result = run_bridge(name, task, seed, args.timeout, args.learner == "process", args.max_updates_behind,
                        args.log_level, args.keep_run_dir)
    if not args.no_inprocess:
        result.update(run_inprocess(task, seed))
        if result["wall_s"] and result["inprocess_wall_s"]:
            result["bridge_vs_inprocess_wall"] = round(result["wall_s"] / result["inprocess_wall_s"], 2)
            # Per env step: the two runs' random streams solve at different step counts.
            result["bridge_vs_inprocess_wall_per_step"] = round(
                (result["wall_s"] / max(result["env_steps"], 1))
                / (result["inprocess_wall_s"] / max(result["inprocess_env_steps"], 1)), 2)
            # Apart: how many updates each run needed (the seed's trajectory) and what one cost.
            bridge_updates = sum(result["updates"].values())
            if bridge_updates and result["inprocess_updates"] and not task.get("multiagent"):
                result["bridge_vs_inprocess_updates"] = round(bridge_updates / result["inprocess_updates"], 2)
                result["bridge_vs_inprocess_wall_per_update"] = round(
                    (result["wall_s"] / bridge_updates) / (result["inprocess_wall_s"] / result["inprocess_updates"]), 2)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--seed", type=int, default=0, help="one seed (see --seeds)")
    p.add_argument("--seeds", help="comma-separated seeds, run one after the other: 0,1,2")
    p.add_argument("--learner", choices=["process", "inline"], default="process",
                   help="[run] learner_process true (a learner process beside the bridge) or false")
    p.add_argument("--max-updates-behind", type=int, help="[run] max_updates_behind (default: the trainer's)")
    p.add_argument("--timeout", type=float, default=1500.0, help="wall-clock cap for the bridge run (s)")
    p.add_argument("--no-inprocess", action="store_true", help="skip the in-process reference run")
    p.add_argument("--budget", type=int, help="env-step budget (default: the task's)")
    p.add_argument("--fragment", type=int,
                   help="rows per fragment, both harnesses: the bridge's rollout_fragment_length, the "
                        "in-process env steps between train() calls (default: the task's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                   help="override a learner config key, value as JSON: --set logged_actions='\"ignore\"'")
    p.add_argument("--log-level", default="WARNING",
                   help="the trainer's, into the run's processes.log (INFO: each learner's update path and device)")
    p.add_argument("--keep-run-dir", action="store_true",
                   help="keep each bridge run's folder in the temp dir (config, processes.log, logdir); said on stderr")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    task = dict(TASKS[args.task])
    if args.budget:
        task["budget"] = args.budget
    if args.fragment:
        task["fragment"] = args.fragment
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            task["overrides"] = {**task.get("overrides", {}), key: json.loads(value)}
        except ValueError:
            p.error(f"--set {item!r}: expected KEY=JSON, such as n_step=5 or logged_actions='\"ignore\"'")
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    runs = []
    for seed in seeds:
        runs.append(run_seed(args.task, task, seed, args))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)   # progress: one line per seed
    if len(runs) == 1:
        result = runs[0]
    else:
        result = {"task": args.task, "seeds": seeds, "learner": args.learner, "threshold": task["threshold"],
                  "budget": task["budget"], "seeds_solved": sum(r["solved"] for r in runs),
                  "env_steps": [r["env_steps"] if r["solved"] else None for r in runs],
                  "wall_s": [r["wall_s"] for r in runs]}
        for ratio in RATIOS:
            got = [r[ratio] for r in runs if ratio in r]
            result[f"median_{ratio}"] = statistics.median(got) if got else None
        result["runs"] = runs
        if not args.no_inprocess:
            result["inprocess_seeds_solved"] = sum(r["inprocess_solved"] for r in runs)
    result["overrides"] = task.get("overrides", {})     # learner config keys beside the preset
    result["fragment"], result["max_updates_behind"] = task["fragment"], args.max_updates_behind
    result["machine"] = {"nproc": os.cpu_count(), "python": sys.version.split()[0]}
    return emit(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
