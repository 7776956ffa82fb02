"""PPO through the Unity connector: the trainer daemon, simbridge-unity and the test peer as its Unity
build (three processes, loopback gRPC), with the shipped trainer/configs/unity_peer_ppo.toml.

  "Hybrid" (tests/sims/unity_peer/scenes.py): 1 continuous action and discrete branches (3, 2), a
  Dict action space for the trainer; -|c - 0.5| + 1 (branch 0 = 1) + 0.5 (branch 1 = 0) per step,
  branch 0 = 2 ends the episode, 5 steps at most. Random: about -0.1; best: 7.5.
  "Masked": branches (4, 3) whose masks change every step, sent as the observation key
  "action_mask"; a masked action costs -1, any other pays 0.1, 6 steps: 0.6 unless a masked action
  is ever taken (random: about -3).

Measured on the 2-core VM (8 agents per behavior): hybrid's mean of the last 10 went from 0.1 to 6.1
at 6.1k env steps (both behaviors), 11 s of training; masked held 0.6 throughout.
"""
import json
import subprocess
import sys
import time

from simbridge.trainer.launch import child_env, free_port, stop_all, wait_for_health
from unity_peer.harness import PEER, ROOT, free_base_port

CONFIG = ROOT / "trainer" / "configs" / "unity_peer_ppo.toml"
BUDGET = 20_000
HYBRID_TARGET = 6.0


def r10(rec, pid):
    return (rec.get("return_mean_10") or {}).get(pid)


def test_ppo_learns_hybrid_actions_and_never_takes_a_masked_action_through_the_unity_connector(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    logdir = tmp_path / "run"
    env = child_env({"SIMBRIDGE_PEER_PYTHON": sys.executable})
    daemon = subprocess.Popen([sys.executable, "-m", "simbridge.trainer.cli", "run", "--config", str(CONFIG),
                               "--address", address, "--logdir", str(logdir), "--total-env-steps", str(BUDGET)],
                              env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    connector = None
    recs = []
    try:
        wait_for_health(address, timeout=120)
        connector = subprocess.Popen([sys.executable, "-m", "simbridge.sims.unity.connector", "--address", address,
                                      "--env", str(PEER), "--base-port", str(free_base_port(1)), "--no-graphics",
                                      "--seed", "0", "--quiet", "--log-folder", str(tmp_path),
                                      "--env-args", "--scene", "hybrid,masked", "--agents", "8"],
                                     env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        deadline = time.monotonic() + 150
        path = logdir / "metrics.jsonl"
        while time.monotonic() < deadline and daemon.poll() is None and connector.poll() is None:
            if path.exists():
                recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
                if recs and (r10(recs[-1], "hybrid") or -1e9) >= HYBRID_TARGET and recs[-1]["versions"]["masked"] > 0:
                    break
            time.sleep(0.5)
    finally:
        stop_all([connector, daemon])
    assert recs, "no metrics were written"
    hybrid = [r for r in recs if r10(r, "hybrid") is not None]
    masked = [r for r in recs if r10(r, "masked") is not None]
    assert hybrid and masked, f"episodes missing; connector: {connector.stderr.read() if connector else ''}"
    first, last = hybrid[0], recs[-1]
    print(f"hybrid: {r10(first, 'hybrid'):.2f} at {first['env_steps']} env steps -> {r10(last, 'hybrid'):.2f} at "
          f"{last['env_steps']}, {last['wall_s']:.1f}s of training; masked: "
          f"{sorted({round(r10(r, 'masked'), 3) for r in masked})}")
    assert r10(first, "hybrid") < 3.0                                   # starts near random
    assert r10(last, "hybrid") >= HYBRID_TARGET and last["env_steps"] <= BUDGET
    assert all(abs(r10(r, "masked") - 0.6) < 1e-4 for r in masked)    # not one masked action, trained or not
    assert last["versions"]["hybrid"] > 0 and last["versions"]["masked"] > 0
