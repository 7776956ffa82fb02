"""The library examples learn through BridgeVectorEnv from two external simulator processes, and
show progress while they do: Stable-Baselines3's PPO (docs/examples/sb3_ppo_cartpole.py, SB3's
VecEnv wrapper, rl-zoo's CartPole settings) and a CleanRL-style PPO on the plain gymnasium
VectorEnv (docs/examples/cleanrl_ppo_cartpole.py, SAME_STEP final_obs for truncated episodes).
Each is run as a user starts it (it starts its two `simbridge-sim --slots 4` processes): where it
listens, then a progress line every --print-every s, then its one JSON line.

The test's target is a mean return of 120 over the last 100 training episodes (a random policy
averages 22): learning through the adapter, at a fraction of a full solve's cost (seed 0 reached it
at 14.6k env steps with SB3 and 13.8k with the CleanRL example, 20 CPU-s each; 200 took 38.7k and
25.1k steps, 44 and 24 CPU-s). The full solves (475, rl-zoo's budget) and
their figures are bench/sb3.py's and docs/benchmarks.md's.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
LINE = re.compile(r": env steps +([\d,]+) \| episodes +(\d+) \| return mean\((\d+)\) +(-|[\d.]+) \| +\d+ steps/s")
TARGET = 120


@pytest.mark.timeout(420)
@pytest.mark.parametrize("example, budget", [("sb3_ppo_cartpole.py", ["--max-steps", "100000"]),
                                             ("cleanrl_ppo_cartpole.py", ["--total-steps", "150000"])])
def test_an_example_learns_from_two_simulator_processes_and_shows_progress(example, budget, tmp_path):
    if example.startswith("sb3"):
        pytest.importorskip("stable_baselines3")
    p = subprocess.run([sys.executable, str(EXAMPLES / example), "--address", "127.0.0.1:0", *budget,
                        "--target", str(TARGET), "--seed", "0", "--print-every", "1"],
                       capture_output=True, text=True, timeout=400, env={**os.environ, "TMPDIR": str(tmp_path)})
    # nothing left behind in the temp directory (SB3's default logger made a folder at every run)
    assert not list(tmp_path.glob("SB3-*")), list(tmp_path.iterdir())
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and lines, p.stdout[-2000:] + p.stderr[-2000:]
    assert "listening on 127.0.0.1:" in lines[0] and "waiting for simulators" in lines[0], lines[0]
    out = json.loads(lines[-1])
    assert out["reached"] and out["mean_return_100"] >= TARGET, out
    assert out["steps_to_target"] <= int(budget[1]), out
    progress = [LINE.search(ln) for ln in lines[1:-1]]
    assert len(progress) >= 2 and all(progress), lines
    steps = [int(m.group(1).replace(",", "")) for m in progress]
    assert steps == sorted(steps) and steps[-1] == out["env_steps"], (steps, out)   # the last line: the end
    episodes, window = int(progress[-1].group(2)), int(progress[-1].group(3))
    assert episodes > 0 and window == min(episodes, 100), progress[-1].group(0)
