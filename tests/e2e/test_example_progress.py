"""The library examples (docs/examples/*_ppo_cartpole.py) show progress while they learn: where
they listen, then a line every --print-every seconds (env steps, episodes, mean return), then
their one JSON line last. Short runs (1,024 env steps, far from the target), as a user starts
them; the full solves are tests/e2e/test_sb3_vecenv.py's.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
LINE = re.compile(r": env steps +([\d,]+) \| episodes +(\d+) \| return mean\((\d+)\) +(-|[\d.]+) \| +\d+ steps/s")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("example, budget", [("sb3_ppo_cartpole.py", "--max-steps"),
                                             ("cleanrl_ppo_cartpole.py", "--total-steps")])
def test_an_example_prints_progress_lines_then_its_json(example, budget):
    if example.startswith("sb3"):
        pytest.importorskip("stable_baselines3")
    p = subprocess.run([sys.executable, str(EXAMPLES / example), "--address", "127.0.0.1:0", budget, "1024",
                        "--target", "1e9", "--print-every", "0.2"], capture_output=True, text=True, timeout=280)
    lines = p.stdout.splitlines()
    assert p.returncode == 1 and lines, p.stdout[-2000:] + p.stderr[-2000:]   # 1: the target was not reached
    assert "listening on 127.0.0.1:" in lines[0] and "waiting for simulators" in lines[0], lines[0]
    out = json.loads(lines[-1])
    progress = [LINE.search(ln) for ln in lines[1:-1]]
    assert len(progress) >= 2 and all(progress), lines   # ~3 s of learning at least, a line per 0.2 s
    steps = [int(m.group(1).replace(",", "")) for m in progress]
    assert steps == sorted(steps) and steps[-1] == out["env_steps"], (steps, out)   # the last line: the end
    episodes, window = int(progress[-1].group(2)), int(progress[-1].group(3))
    assert episodes > 0 and window == min(episodes, 100), progress[-1].group(0)
