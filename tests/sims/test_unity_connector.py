"""simbridge-unity as a user runs it: several instances, the Editor, and the ways a run ends
(a budget, SIGTERM, Unity quitting, Unity never connecting, a refused package, no server)."""
import json
import signal
import subprocess
import sys
import threading
import time

import numpy as np

from simbridge.trainer.run.launch import child_env, free_port
from support.signals import AT_A_TERMINAL, NEEDS_ENV_SIGNALS
from unity_peer.harness import PEER, ROOT, Bridge, check_replay, free_base_port, run_connector


def test_several_instances_use_consecutive_ports_and_sessions_of_their_own(tmp_path):
    bridge = Bridge(["Ball*=ball", "Reach*=reach"])
    base = free_base_port(2)
    try:
        run = run_connector(bridge.address, tmp_path, args=["--max-steps", 400], num_envs=2, base_port=base,
                            peer_args=["--scene", "ball,reach", "--agents", 3])
    finally:
        bridge.stop()
    assert run.code == 0, run.explain()
    s = run.summary
    assert s["num_envs"] == 2 and [i["port"] for i in s["instances"]] == [base, base + 1]
    assert all(i["stopped_by"] == "max_steps" and i["steps"] >= 200 for i in s["instances"])
    assert s["steps"] == sum(i["steps"] for i in s["instances"])
    # each instance is its own player on its own port, and each behavior of each instance its own session
    for trace in run.traces:
        assert trace and trace[-1]["reason"] == "status 400"
    sessions = {}
    for summ in bridge.summaries:
        (aid, pid), = summ["agent_policies"].items()
        sessions.setdefault(pid, set()).add(summ["session_id"])
        assert (pid == "ball") == aid.startswith("Ball?team=0/")
    assert {k: len(v) for k, v in sessions.items()} == {"ball": 2, "reach": 2}
    assert str(bridge.policies["reach"].action_space) == "Box(-1.0, 1.0, (1,), float32)"
    # both instances use the same Unity agent ids (and so episode ids): their episodes never mix
    episodes = bridge.episodes("ball")
    assert len({key.split(":")[1] for key in episodes}) < len(episodes)   # ids do repeat across sessions
    for rows in episodes.values():
        assert [int(r["t"]) for r in rows] == list(range(len(rows)))
        for a, b in zip(rows, rows[1:]):
            np.testing.assert_array_equal(a["new_obs"], b["obs"])       # one agent's consecutive steps


def test_a_build_that_never_connects_fails_with_the_fix_in_the_message(tmp_path):
    bridge = Bridge([])
    t0 = time.monotonic()
    try:
        run = run_connector(bridge.address, tmp_path, args=["--timeout-wait", 3], peer_args=["--never-connect"])
    finally:
        bridge.stop()
    took = time.monotonic() - t0
    assert run.code == 3, run.explain()
    assert "did not connect on port" in run.stderr and "within 3s" in run.stderr
    assert "--no-graphics" in run.stderr and "--timeout-wait" in run.stderr and "Behavior Type" in run.stderr
    assert took < 20 and not bridge.summaries
    assert json.loads(run.stdout.strip().splitlines()[-1])["error"].startswith("the Unity build")


def test_unity_quitting_ends_its_episodes_without_inventing_outcomes(tmp_path):
    bridge = Bridge(["Ball*=ball"])
    try:
        run = run_connector(bridge.address, tmp_path, peer_args=["--scene", "ball", "--agents", 4,
                                                                 "--quit-after", 25])
    finally:
        bridge.stop()
    assert run.code == 3, run.explain()
    assert "Unity environment on port" in run.stderr and "quit after 24 steps" in run.stderr
    assert run.trace[-1] == {"kind": "quit", "reason": "quit_after", "step": 25}
    closed = [s for s in bridge.summaries if s["end_reason"] == "session_closed"]
    assert len(closed) == 4   # one open episode per agent, ended by the connector's CloseSession
    # their last actions had no outcome: no transition for them; everything before is exact
    assert check_replay(bridge, run.trace, "Ball?team=0", "ball") >= 4 * 20


def test_a_1_0_lts_player_is_refused_with_the_upgrade_to_make(tmp_path):
    bridge = Bridge([])
    try:
        run = run_connector(bridge.address, tmp_path, peer_args=["--package-version", "1.0.8", "--api", "1.0.0"])
    finally:
        bridge.stop()
    assert run.code == 3, run.explain()
    assert "com.unity.ml-agents 1.0.8" in run.stderr and "upgrade the package to 1.9" in run.stderr
    assert "timed out" not in run.stdout + run.stderr, run.explain()   # the player is ended, not waited for


def test_no_server_fails_before_starting_unity(tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    run = run_connector(dead, tmp_path, args=["--connect-timeout", 1])
    assert run.code == 2, run.explain()
    assert f"no simbridge trainer at {dead}" in run.stderr
    assert not list(tmp_path.glob("trace-*.jsonl"))  # the player was never started


@NEEDS_ENV_SIGNALS
def test_several_instances_stop_in_order_when_their_terminal_closes(tmp_path):
    """SIGHUP to the connector running two instances (a terminal closed under it) killed the parent
    at once, and the instances, processes of their own, ran on. Now it forwards SIGHUP as SIGTERM,
    and the instances end their episodes and the merged summary comes as on SIGTERM."""
    bridge = Bridge(["Ball*=ball"])
    base = free_base_port(2)
    cmd = [*AT_A_TERMINAL, sys.executable, "-m", "simbridge.sims.unity.connector", "--address", bridge.address,
           "--env", str(PEER), "--base-port", str(base), "--num-envs", "2", "--timeout-wait", "30",
           "--connect-timeout", "10", "--log-folder", str(tmp_path), "--no-graphics", "--quiet",
           "--max-steps", "20000", "--env-args", "--scene", "ball", "--agents", "2", "--step-delay", "0.005"]
    conn = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env({"SIMBRIDGE_PEER_PYTHON": sys.executable}), cwd=str(ROOT))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len({s["session_id"] for s in bridge.summaries}) < 2:
            time.sleep(0.1)   # both instances have ended an episode
        conn.send_signal(signal.SIGHUP)
        out, err = conn.communicate(timeout=30)
    finally:
        if conn.poll() is None:
            conn.kill()
        bridge.stop()
    assert conn.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["num_envs"] == 2 and [i["stopped_by"] for i in summary["instances"]] == ["SIGTERM"] * 2, summary


def test_attaching_to_the_editor_and_stopping_with_sigterm(tmp_path):
    """No --env: the connector listens and waits for the Editor's Play; here the peer plays
    the Editor. SIGTERM ends the open episodes as truncated at their latest observation."""
    bridge = Bridge(["Ball*=ball"])
    port = free_base_port(1)
    trace = tmp_path / "editor.jsonl"
    env = child_env()
    conn = subprocess.Popen([sys.executable, "-m", "simbridge.sims.unity.connector", "--address", bridge.address,
                             "--base-port", str(port), "--timeout-wait", "30", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    editor = None
    try:
        time.sleep(1.0)
        editor = subprocess.Popen([str(PEER), "--mlagents-port", str(port), "--scene", "ball", "--agents", "2",
                                   "--step-delay", "0.01", "--trace", str(trace)],
                                  env=child_env({"SIMBRIDGE_PEER_PYTHON": sys.executable}),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(bridge.summaries) < 3:
            time.sleep(0.1)
        conn.send_signal(signal.SIGTERM)
        out, err = conn.communicate(timeout=30)
        assert editor.wait(timeout=10) == 0       # the non-200 reply made the "Editor" stop
    finally:
        for p in (conn, editor):
            if p is not None and p.poll() is None:
                p.kill()
        bridge.stop()
    assert conn.returncode == 0, err
    assert f"listening on port {port}: press Play in the Unity Editor" in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_by"] == "SIGTERM" and summary["episodes"] >= 3
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert check_replay(bridge, lines, "Ball?team=0", "ball") > 20
    # truncated episodes: those Unity interrupted (max step); those the stop cut short count apart
    # (issue 27 #5: not returns of the policy)
    interrupted = sum(i["done"] and i["max_step"] for r in lines if r["kind"] == "sent"
                      for i in r["behaviors"]["Ball?team=0"])
    truncated = sum(s["end_reason"] == "truncated" for s in bridge.summaries)
    cut = sum(s["end_reason"] in ("simulator_stopped", "session_closed") for s in bridge.summaries)
    assert summary["cut_at_exit"] >= 1 and truncated == interrupted and cut == summary["cut_at_exit"]


def test_ctrl_c_while_waiting_for_the_editor_stops_at_once(tmp_path):
    """It ran on to the end of --timeout-wait (60 s by default) and then blamed the Editor for not
    connecting (newcomer audit)."""
    bridge = Bridge(["Ball*=ball"])
    conn = subprocess.Popen([sys.executable, "-m", "simbridge.sims.unity.connector", "--address", bridge.address,
                             "--base-port", str(free_base_port(1)), "--timeout-wait", "60", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=str(ROOT))
    try:
        assert "press Play in the Unity Editor" in conn.stderr.readline()
        time.sleep(0.5)
        t0 = time.monotonic()
        conn.send_signal(signal.SIGINT)
        out, err = conn.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if conn.poll() is None:
            conn.kill()
        bridge.stop()
    assert conn.returncode == 0 and took < 5, (conn.returncode, took, err)
    assert "did not connect" not in err and "Traceback" not in err, err
    assert json.loads(out.strip().splitlines()[-1])["stopped"].startswith("stopped while waiting for Unity")
    assert "(SIGINT)" in err


def test_no_training_episodes_give_metrics_but_no_experience(tmp_path):
    bridge = Bridge(["Ball*=ball"])
    try:
        run = run_connector(bridge.address, tmp_path, args=["--max-steps", 200, "--no-training"],
                            peer_args=["--scene", "ball", "--agents", 4])
    finally:
        bridge.stop()
    assert run.code == 0, run.explain()
    assert bridge.summaries and not any(s["training_enabled"] for s in bridge.summaries)
    assert sum(b.count for b in bridge.batches["ball"]) == 0
    assert np.isfinite(run.summary["return_mean"])


def test_a_restarted_trainer_gets_new_episodes_from_the_same_unity_run(tmp_path):
    """The server goes away mid-run and a new one comes up on the same address (a trainer
    restarted): the connector's clients reconnect, find their sessions gone, and every agent
    starts a new episode there; Unity never notices."""
    address = f"127.0.0.1:{free_port()}"
    first = Bridge(["Ball*=ball"], address=address)
    trace = tmp_path / "trace.jsonl"
    conn = subprocess.Popen([sys.executable, "-m", "simbridge.sims.unity.connector", "--address", address, "--env", str(PEER),
                             "--base-port", str(free_base_port(1)), "--quiet", "--env-args", "--scene", "ball",
                             "--agents", "3", "--step-delay", "0.005", "--trace", str(trace)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env({"SIMBRIDGE_PEER_PYTHON": sys.executable}), cwd=str(ROOT))
    second = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(first.summaries) < 3:
            time.sleep(0.05)
        first.stop()
        time.sleep(0.5)
        second = Bridge(["Ball*=ball"], address=address)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(second.summaries) < 3:
            time.sleep(0.05)
        conn.send_signal(signal.SIGTERM)
        out, err = conn.communicate(timeout=30)
    finally:
        if conn.poll() is None:
            conn.kill()
        if second is not None:
            second.stop()
    assert conn.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["behaviors"]["Ball?team=0"]["session_losses"] == 1
    assert len(first.summaries) >= 3 and len(second.summaries) >= 3
    # on the new server: fresh episodes only, each a clean chain of one agent's steps
    for rows in second.episodes("ball").values():
        assert [int(r["t"]) for r in rows] == list(range(len(rows)))
        for a, b in zip(rows, rows[1:]):
            np.testing.assert_array_equal(a["new_obs"], b["obs"])
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    quits = [r for r in lines if r["kind"] == "quit"]
    assert quits == [lines[-1]] and quits[0]["reason"] == "status 400"   # Unity ran on through the restart


def test_an_older_communication_api_is_warned_about_and_still_trained(tmp_path):
    bridge = Bridge(["Ball*=ball"])
    try:
        run = run_connector(bridge.address, tmp_path, args=["--max-steps", 40],
                            peer_args=["--api", "1.4.0", "--package-version", "1.8.0"])
    finally:
        bridge.stop()
    assert run.code == 0, run.explain()
    assert "speaks communication API 1.4.0 (package 1.8.0)" in run.stderr
    assert run.summary["steps"] >= 40


def test_options_masks_off_group_reward_weight_and_an_episode_budget(tmp_path):
    bridge = Bridge(["Masked*=masked", "Group*=group"])
    try:
        run = run_connector(bridge.address, tmp_path, args=["--action-masks", "off", "--group-reward-weight", 0,
                                                            "--episodes", 12],
                            peer_args=["--scene", "masked,group", "--agents", 2])
    finally:
        bridge.stop()
    assert run.code == 0, run.explain()
    assert run.summary["stopped_by"] == "episodes" and run.summary["episodes"] >= 12
    # masks off: the policy's observation is the sensor alone, and the connector says what it drops
    assert str(bridge.policies["masked"].observation_space) == "Box(-inf, inf, (2,), float32)"
    assert "sends action masks" in run.stderr and "--action-masks on" in run.stderr
    # weight 0: rewards without the group reward (the metric still reports it)
    assert check_replay(bridge, run.trace, "Group?team=0", "group", group_weight=0.0) > 10
    assert any(s["custom_metrics"].get("group_reward", 0) > 0 for s in bridge.summaries)


def test_a_taken_port_is_refused_at_once_with_the_fix(tmp_path):
    import socket
    bridge = Bridge([])
    base = free_base_port(2)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("localhost", base + 1))   # instance 1's port
        taken.listen()
        try:
            run = run_connector(bridge.address, tmp_path, args=["--max-steps", 50], num_envs=2, base_port=base)
        finally:
            bridge.stop()
    assert run.code == 3, run.explain()
    assert f"port {base + 1} is in use" in run.stderr and "--base-port" in run.stderr
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr, run.stderr   # mlagents' atexit
    worker1 = run.summary["instances"][1]
    assert worker1["error"].startswith(f"port {base + 1} is in use") and run.summary["instances"][0]["steps"] >= 25
    assert (worker1["worker_id"], worker1["port"]) == (1, base + 1)   # which instance failed, and where


def test_a_log_folder_that_does_not_exist_yet_is_made(tmp_path):
    """The player writes DIR/Player-<i>.log and does not make DIR: a missing one ended the player."""
    bridge = Bridge([])
    logs = tmp_path / "logs" / "unity"
    try:
        run = run_connector(bridge.address, tmp_path, args=["--max-steps", 30, "--log-folder", logs])
    finally:
        bridge.stop()
    assert run.code == 0, run.explain()
    assert (logs / "Player-0.log").exists()


def test_training_over_ends_the_connector_as_its_own_end(tmp_path):
    """The trainer's run reached its end (TRAINING_OVER on every call): the connector stops the
    player and exits 0, as at its own budget, not 2 (a server problem)."""
    bridge = Bridge([])
    ended = threading.Timer(3.0, bridge.runtime.end_training, args=("total_env_steps 100 reached",))
    ended.start()
    try:
        run = run_connector(bridge.address, tmp_path)   # no budget of its own: only the trainer ends it
    finally:
        ended.cancel()
        bridge.stop()
    assert run.code == 0, run.explain()
    assert run.summary["steps"] > 0 and run.summary["ended"] == "training_over", run.explain()
