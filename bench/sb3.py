"""SB3 PPO to solve CartPole through BridgeVectorEnv vs on gymnasium's CartPole in-process.

Same PPO (docs/examples/sb3_ppo_cartpole.py: rl-zoo's CartPole settings, 8 envs), same seed,
same stop rule (the mean return of the last 100 training episodes >= --target), one torch
thread each. Through the adapter, the 8 envs are 2 `simbridge-sim --slots 4` processes;
in-process, SB3's make_vec_env (DummyVecEnv). Prints one JSON object. Not in the test suite.

    python bench/sb3.py [--seeds 0 1 2] [--target 475] [--max-steps 200000]
"""
import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "examples"))
import sb3_ppo_cartpole as example  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--max-steps", type=int, default=200_000)
    a = p.parse_args()
    torch.set_num_threads(1)
    runs = []
    for seed in a.seeds:
        inproc = example.learn(make_vec_env("CartPole-v1", n_envs=8, seed=seed), a.target, a.max_steps, seed)
        # The adapter run as the example runs it (its main prints the same figures as JSON).
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            example.main(["--address", "127.0.0.1:0", "--sims", "2", "--slots", "4", "--target", str(a.target),
                          "--max-steps", str(a.max_steps), "--seed", str(seed)])
        adapter = json.loads(buf.getvalue().strip().splitlines()[-1])
        runs.append({"seed": seed, "in_process": inproc, "adapter": adapter})

    def med(key, which):
        vals = [r[which][key] for r in runs if r[which]["reached"]]
        return statistics.median(vals) if vals else None
    summary = {w: {"solved": sum(r[w]["reached"] for r in runs), "runs": len(runs),
                   "median_steps_to_target": med("steps_to_target", w), "median_wall_s": med("wall_s", w)}
               for w in ("in_process", "adapter")}
    print(json.dumps({"machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread, "
                                 f"{len(os.sched_getaffinity(0))} cores",
                      "target": a.target, "max_steps": a.max_steps, "summary": summary, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
