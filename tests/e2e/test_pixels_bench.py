"""bench/pixels.py runs end to end for a short budget (ale-py as the simulator process, the trainer
daemon on loopback) and prints its JSON. Skipped without the atari extra (ale-py, OpenCV)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stack_in,seen", [("simulator", "4x84x84"), ("trainer", "84x84x4")])
def test_the_pixels_bench_runs_pong_through_the_bridge_and_prints_its_curve(stack_in, seen, tmp_path):
    """The 4 frames stacked by the simulator (CHW), or sent one by one and stacked by the trainer
    (frame_stack = 4: HWC single frames, so the network reads 84x84x4)."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "pixels.py"), "--env-steps", "300", "--timeout-s", "180",
                          "--stack-in", stack_in], capture_output=True, text=True, timeout=230, cwd=str(ROOT),
                         # the bench keeps its run's folder (35 MB: replay, checkpoint) for a user to read;
                         # the test's goes where pytest clears it
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["game"] == "PongNoFrameskip-v4" and res["config"]["vis_encode_type"] == "nature_cnn"
    # The budget ends the run; steps already on their way (fragments of 32, the queue) still count.
    assert 300 <= res["env_steps"] <= 500 and res["curve"] and res["curve"][-1]["env_steps"] == res["env_steps"]
    assert res["reference"]["mean_return"] == 17.8
    assert Path(res["logs"]).is_relative_to(tmp_path), res["logs"]   # not left in /tmp
    log = (Path(res["logs"]) / "processes.log").read_text()
    assert f"{seen} uint8 image through nature_cnn" in log   # the frames arrived as bytes, stacked
    assert res["stack_in"] == stack_in
