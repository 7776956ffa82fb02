"""The C++ SDK with several bridge hosts: a C++ example given "A,B" connects to one, moves to the
other when its server goes away (SessionLost handled by going on with new episodes), and the two
servers' counted steps add up to the steps whose actions the example received (plus, at most, the
step in flight when the first stopped, which that server applied and counted, or not, alone); a
client idle at the stop counts exactly, and a call naming an episode of the lost session is
refused by the client (EPISODE_ENDED); a host that still listens but does not answer gets
FAILOVER_AFTER_S first; when no address answers the error names every one. Real BridgeServers on
loopback and real C++ processes (the examples and tools/failover_probe in build/cpp). Where a
process starts in the list is ctest's (unit_tests.cpp). Budget: ~20 s on 2 cores."""
import json
import os
import socket
import subprocess
import time

import pytest

from simbridge.client.channels import FAILOVER_AFTER_S
from simbridge.trainer.run.launch import free_ports
from support.waits import wait


@pytest.fixture(scope="module")
def build(cpp_build):
    return cpp_build


def _pair(make_server):
    a, b = make_server(), make_server()
    return {a.address: a, b.address: b}


def _steps(srv) -> int:
    return srv.runtime.snapshot()["env_steps"]



def _start(build, program, *args):
    return subprocess.Popen([os.path.join(build, program), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout_s=60):
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:   # only on a failed wait: the test fails below anyway
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def _stop_the_first_when_busy(servers, min_steps):
    """Stop whichever server the client is on once it counted min_steps; (its address, the other's)."""
    wait(lambda: any(_steps(s) >= min_steps for s in servers.values()), 30, "steps on the first host", every=0.02)
    first = next(a for a, s in servers.items() if _steps(s) > 0)
    (second,) = set(servers) - {first}
    servers[first].stop(grace=0)
    return first, second


def test_lockstep_example_moves_to_the_other_host_and_counts_add_up(build, make_server):
    servers = _pair(make_server)
    proc = _start(build, "cartpole", "--address", ",".join(servers), "--episodes", 300, "--slots", 2)
    first, second = _stop_the_first_when_busy(servers, 300)
    summary, err = _finish(proc)
    assert f"bridge at {first} went away (nothing listens there (connection refused)); moved to {second}" in err, err
    assert "open episode(s) of session" in err and "start new episodes" in err, err
    assert summary["lost_sessions"] == 1 and summary["episodes"] == 300, summary
    a, b = _steps(servers[first]), _steps(servers[second])
    # The get_action in flight when A stopped: A applied and counted it or not, alone (never resent to B).
    assert b > 0 and summary["steps"] <= a + b <= summary["steps"] + 1, (summary, a, b)


def test_mujoco_pendulum_moves_to_the_other_host_and_goes_on(build, make_server):
    """The MuJoCo simulator (sims/cpp/mujoco) handles SessionLost as the examples do: the episode under
    way ends with the old session, the next starts on the new one (it stopped with exit 1 before)."""
    sim = os.path.join(build, "mujoco", "mujoco_pendulum_sim")
    if not os.path.exists(sim):
        pytest.skip("mujoco_pendulum_sim was not built: install the mujoco extra (mujoco-core) and reconfigure")
    servers = _pair(make_server)
    proc = _start(build, os.path.join("mujoco", "mujoco_pendulum_sim"), "--address", ",".join(servers),
                  "--seed", 0, "--max-steps", 3000)
    first, second = _stop_the_first_when_busy(servers, 300)
    summary, err = _finish(proc)
    assert f"bridge at {first} went away" in err and f"moved to {second}" in err, err
    assert summary["lost_sessions"] == 1 and summary["stopped"] == "max_steps", summary
    assert summary["env_steps"] == 3000 and summary["cut_episodes"] >= 1, summary
    a, b = _steps(servers[first]), _steps(servers[second])
    assert b > 0 and summary["env_steps"] <= a + b <= summary["env_steps"] + 1, (summary, a, b)


def test_slot_example_moves_and_every_served_step_is_counted_once(build, make_server):
    servers = _pair(make_server)
    proc = _start(build, "cartpole_slots", "--address", ",".join(servers), "--slots", 4, "--steps", 1500)
    first, second = _stop_the_first_when_busy(servers, 400)
    summary, err = _finish(proc)
    assert f"bridge at {first} went away" in err and f"moved to {second}" in err, err
    assert "the 4 open episode(s)" in err, err
    assert summary["lost_sessions"] == 1, summary
    a, b = _steps(servers[first]), _steps(servers[second])
    # The step in flight when A stopped: A applied and counted it or not, alone (never resent to B).
    assert a > 0 and b > 0 and summary["acted_steps"] <= a + b <= summary["acted_steps"] + 4, (summary, a, b)


def _probe_move(build, servers, multi="0", hang=False):
    """tools/failover_probe given both servers: stop the one it is on while it is idle (hang: bind a
    bare listening socket to that port, a host that accepts and never answers), then let it call.
    (its summary, its stderr, the stopped server's address, the other's)."""
    proc = subprocess.Popen([os.path.join(build, "failover_probe"), "--address", ",".join(servers), "--multi", multi],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hung = socket.socket()
    try:
        assert json.loads(proc.stdout.readline()) == {"ready": True}   # bounded: it connects or exits
        first = next(a for a, s in servers.items() if _steps(s) > 0)
        (second,) = set(servers) - {first}
        servers[first].stop(grace=0)
        if hang:
            host, port = first.rsplit(":", 1)
            hung.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            hung.bind((host, int(port)))
            hung.listen(8)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        summary, err = _finish(proc, 30)
    finally:
        hung.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return summary, err, first, second


@pytest.mark.parametrize("multi", ["0", "1"])
def test_client_moves_its_lost_episode_is_refused_and_counts_stay_exact(build, make_server, multi):
    """PolicyClient (multi 0) or MultiAgentPolicyClient (multi 1), idle when its server stops: the
    next call raises SessionLost naming both addresses; a call naming the lost episode is refused
    by the client (EPISODE_ENDED); the new episode's steps reach the other server."""
    servers = _pair(make_server)
    summary, err, first, second = _probe_move(build, servers, multi)
    assert summary["lost"].startswith(f"the bridge at {first} went away (nothing listens there (connection "
                                      f"refused)); moved to {second} (new session "), summary
    assert "the 1 open episode(s) of session" in summary["lost"] and summary["lost_s"] < 5.0, summary
    assert summary["ended_reason"] == "EPISODE_ENDED" and "already ended (with its session, lost" in summary["ended"]
    assert f"moved to {second}" in err and "1 open episode(s) ended" in err, err
    assert (_steps(servers[first]), _steps(servers[second])) == (1, 10)
    assert servers[second].runtime.snapshot()["episodes"] == 1


def test_a_host_that_listens_but_does_not_answer_gets_the_grace_then_the_client_moves(build, make_server):
    """A closed port moves the client at once; a port where something still listens (a hung host,
    here a bare socket bound to the stopped server's port) gets FAILOVER_AFTER_S to come back."""
    servers = _pair(make_server)
    summary, err, first, second = _probe_move(build, servers, hang=True)
    assert FAILOVER_AFTER_S <= summary["lost_s"] < FAILOVER_AFTER_S + 6, summary
    assert summary["lost"].startswith(f"the bridge at {first} went away (something listens there but does not "
                                      f"answer as a gRPC server"), summary
    assert (_steps(servers[first]), _steps(servers[second])) == (1, 10)


def test_all_addresses_down_names_every_one(build):
    down = [f"127.0.0.1:{port}" for port in free_ports(2)]   # distinct: the SDK saw a list of one once
    t0 = time.monotonic()
    out = subprocess.run([os.path.join(build, "cartpole"), "--address", ",".join(down), "--connect-timeout", "1"],
                         capture_output=True, text=True, timeout=30)
    assert time.monotonic() - t0 < 6.0
    assert out.returncode == 1
    assert "no simbridge trainer at any of 2 addresses (" in out.stderr, out.stderr
    for a in down:   # in the order tried: from where this process starts
        assert f"{a}: nothing listens there (connection refused)" in out.stderr, out.stderr
    assert "start a trainer at one of them" in out.stderr and "Traceback" not in out.stderr


def test_a_bad_address_list_names_the_fix(build):
    out = subprocess.run([os.path.join(build, "cartpole"), "--address", "127.0.0.1:1,localhost"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "address 'localhost' has no port: pass HOST:PORT" in out.stderr, out.stderr
    assert f"[gRPC status {3}]" in out.stderr   # INVALID_ARGUMENT
    out = subprocess.run([os.path.join(build, "cartpole"), "--address", "127.0.0.1:99999"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "port 99999 is past 65535" in out.stderr, out.stderr   # not 99999 - 65536
