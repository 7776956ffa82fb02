"""Issue 27 #5, the simulator's side: `simbridge-sim` stopped by SIGTERM or Ctrl-C mid-episode ends
its open episodes truncated and says it stops (EndEpisodeRequest.stopping, or an upload's
EpisodeSummary.stopping when it acts locally). The trainer's reporting counts them apart
(episodes_cut), and its return(10) is the mean of the finished episodes only.

Before the fix the trainer read them as returns: under `serve` every finished episode scored 500
but the last line read `return(10) 214.40` (the simulator said `cut_at_exit: 8`).

MountainCar-v0 with a time limit of LIMIT steps and the random policy: every finished episode
ends at the limit with a return of exactly -LIMIT (a random walk never reaches the flag that
soon), so any cut episode in the returns shows.
"""
import json
import os
import signal
import subprocess

import gymnasium as gym
import numpy as np
import pytest

from simbridge.client.local_client import LocalPolicyClient
from simbridge.server.metrics import CUT_REASONS
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.trainer.run.reporting import Reporter

from support.daemon import kill, metrics, start_sim
from support.waits import wait

LIMIT = 40
ATTEMPTS = 5   # a stop that lands between two episodes cuts none with a step: run again


def _stop_mid_episode(make_server, tmp_path, sig, module, args):
    """A real server and Reporter, the simulator `module` stopped by `sig` after 3 finished
    episodes, run again while the stop landed between episodes (ATTEMPTS in all). Returns (the
    sim's summary, every filed episode summary, the last record)."""
    tries = []
    for attempt in range(ATTEMPTS):
        run_dir = tmp_path / str(attempt)
        run_dir.mkdir()
        said, filed, rec = _run(make_server, run_dir, sig, module, args)
        if len(filed) > said["episodes"]:   # the server filed an episode the sim did not finish
            return said, filed, rec
        tries.append({k: said.get(k) for k in ("episodes", "cut_at_exit", "steps", "local")} | {"filed": len(filed)})
    pytest.fail(f"{ATTEMPTS} stops all landed between episodes: nothing cut mid-episode; each try's simulator "
                f"summary and the episodes the server filed: {tries}")


def _run(make_server, tmp_path, sig, module, args):
    runtime = BridgeRuntime(BridgeConfig(experience_queue_size=100_000))   # no learner takes the rows
    filed = []
    runtime.episode_end_callbacks.append(filed.append)
    srv = make_server(runtime)
    console = open(tmp_path / "console.txt", "w")
    reporter = Reporter(runtime, tmp_path, console, 1, lambda: 0.0)
    reporter.open()
    sim = start_sim("sim", module, srv.address, *args)
    try:
        wait(lambda: runtime.snapshot()["episodes"] >= 3, 120, "3 finished episodes", [sim])
        sim.popen.send_signal(sig)
        assert sim.popen.wait(timeout=60) == 0, "\n".join(sim.lines)
        sim.wait_output()
        said = json.loads([line for line in sim.lines if line.startswith("{")][-1])
        # The local client's last upload is in before it exits; the rows' last call too.
        wait(lambda: runtime.snapshot()["sessions"] == 0, 60, "the session closed")
        rec = reporter.record("stop")
    finally:
        kill(sim)
        reporter.close()
        console.close()
    assert metrics(tmp_path)[-1]["episodes_cut"] == rec["episodes_cut"]
    return said, filed, rec


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
@pytest.mark.parametrize("args", [[], ["--slots", "2", "--slot-protocol", "rows"], ["--inference", "local"]],
                         ids=["remote", "rows", "local"])
def test_episodes_cut_when_the_simulator_stops_are_not_returns(make_server, tmp_path, sig, args):
    said, filed, rec = _stop_mid_episode(make_server, tmp_path, sig, "simbridge.sims.gym_sim", [
        "--env", "MountainCar-v0", "--max-episode-steps", str(LIMIT), *args])
    cut_steps = said["steps"] - LIMIT * said["episodes"]   # steps of the episodes cut at exit
    assert said["cut_at_exit"] >= 1 and said["episodes"] >= 3, said
    finished = [s for s in filed if s["end_reason"] not in CUT_REASONS]
    cut = [s for s in filed if s["end_reason"] in CUT_REASONS]
    assert len(finished) == said["episodes"], (said, filed)
    assert {(s["length"], s["total_reward"]) for s in finished} == {(LIMIT, -float(LIMIT))}, filed
    # Each cut episode with a step, as the simulator stopped it (one without a step is no episode).
    assert [s["end_reason"] for s in cut] == ["simulator_stopped"] * len(cut), cut
    assert 1 <= len(cut) <= said["cut_at_exit"] and sum(s["length"] for s in cut) == cut_steps, (said, cut)
    assert sum(s["total_reward"] for s in cut) == -cut_steps, cut
    assert rec["episodes"] == len(filed) and rec["episodes_cut"] == len(cut), rec
    assert rec["return_mean_10"] == {"default_policy": -float(LIMIT)}, rec
    assert rec["return_mean"] == {"default_policy": -float(LIMIT)}, rec
    assert rec["episode_return_mean"] == -float(LIMIT), rec


@pytest.mark.parametrize("game", ["simultaneous", "turn_based"])
def test_multi_agent_episodes_cut_when_the_simulator_stops_are_not_returns(make_server, tmp_path, game):
    """simbridge-multiagent-sim (MultiAgentPolicyClient.end_episode(stopping=True)): its returns
    vary: the finished ones are matched by count, and the mean return is theirs."""
    said, filed, rec = _stop_mid_episode(make_server, tmp_path, signal.SIGTERM, "simbridge.sims.multiagent_sim",
                                         ["--game", game, "--agents", "2"])
    finished = [s for s in filed if s["end_reason"] not in CUT_REASONS]
    cut = [s for s in filed if s["end_reason"] in CUT_REASONS]
    assert len(finished) == said["episodes"] and said["cut_at_exit"] == 1, (said, filed)
    assert [s["end_reason"] for s in cut] == ["simulator_stopped"], cut
    assert rec["episodes"] == len(filed) and rec["episodes_cut"] == 1, rec
    returns = [s["total_reward"] for s in finished][-100:]
    assert rec["episode_return_mean"] == pytest.approx(sum(returns) / len(returns)), rec


def test_a_closing_local_client_cuts_its_open_episodes(make_server):
    """LocalPolicyClient.close() ends the episodes still open, as CloseSession does on the server
    for remote inference: cut short (EpisodeSummary.stopping), out of the returns."""
    runtime = BridgeRuntime(BridgeConfig(experience_queue_size=100_000))
    srv = make_server(runtime)
    obs_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    c = LocalPolicyClient(srv.address, obs_space, gym.spaces.Discrete(2), seed=0)
    obs = np.zeros(2, np.float32)
    done = c.start_episode()
    c.get_action(done, obs)
    c.log_returns(done, 5.0)
    c.end_episode(done, obs, truncated=True)   # its time limit: a return
    open_ = c.start_episode()
    for _ in range(3):
        c.get_action(open_, obs)
        c.log_returns(open_, 1.0)
    c.close()
    snap = runtime.snapshot()
    assert snap["episodes"] == 2 and snap["episodes_cut"] == 1, snap
    assert snap["policy_return_mean"] == {"default_policy": 5.0}, snap
    assert [s["end_reason"] for s in runtime.metrics.recent] == ["truncated", "simulator_stopped"]


def test_the_cpp_mujoco_simulator_cuts_its_last_episode_at_its_budget(cpp_build, make_server):
    """The C++ SDK's end_episode(..., stopping): mujoco_pendulum_sim ends the episode its
    --max-steps cuts short with it; the server's returns are the finished episodes' only."""
    sim = os.path.join(cpp_build, "mujoco", "mujoco_pendulum_sim")
    if not os.path.exists(sim):
        pytest.skip("MuJoCo is not installed: mujoco_pendulum_sim was not built")
    for _ in range(ATTEMPTS):   # the budget may fall on an episode's natural end: nothing cut then
        runtime = BridgeRuntime(BridgeConfig(experience_queue_size=100_000))
        srv = make_server(runtime)
        out = subprocess.run([sim, "--address", srv.address, "--max-steps", "60"], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        said = json.loads(out.stdout.strip().splitlines()[-1])
        if said["cut_episodes"]:
            break
    else:
        pytest.fail(f"{ATTEMPTS} budgets all fell on an episode's end: nothing cut")
    snap = runtime.snapshot()
    assert said["cut_episodes"] == 1 and said["episodes"] >= 1, said
    assert snap["episodes"] == said["episodes"] + 1 and snap["episodes_cut"] == 1, snap
    assert [s["end_reason"] for s in runtime.metrics.recent][-1] == "simulator_stopped"
    assert snap["episode_return_mean"] == pytest.approx(said["mean_return"], rel=1e-5), (snap, said)
