"""Simulators and several bridge hosts: a client given [A, B] connects to one, moves to the other
when its server goes away (a new session there, its open episodes ended, nothing reported twice),
spreads over the addresses, and names every address when none answers. Real BridgeServers on
loopback; a real simulator process for the CLI's --address "A,B". Budget: ~25 s on 2 cores."""
import json
import socket
import subprocess
import time

import gymnasium as gym
import numpy as np
import pytest

from simbridge.client import channels
from simbridge.client.connection import SessionLost, parse_addresses
from simbridge.client.policy_client import MultiAgentPolicyClient, PolicyClient
from simbridge.client.slot_client import SlotClient
from simbridge.server.sample_batch import MultiAgentBatch
from simbridge.trainer.run.launch import ROOT, child_env, free_ports, python_module
from simbridge.wire.errors import BridgeError, Reason
from support.waits import wait

OBS = gym.spaces.Box(-1, 1, (2,), np.float32)
ACT = gym.spaces.Discrete(2)


def _pair(make_server, **config):
    a, b = make_server(**config), make_server(**config)
    return {a.address: a, b.address: b}


def _steps(srv) -> int:
    return srv.runtime.snapshot()["env_steps"]



def _run_episodes(client, episodes, length, sent):
    for _ in range(episodes):
        eid = client.start_episode()
        obs = np.zeros(2, np.float32)
        for t in range(length):
            client.get_action(eid, obs)
            sent[0] += 1
            client.log_returns(eid, 1.0)
        client.end_episode(eid, obs)
    return eid


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_policy_client_moves_to_the_other_host_and_counts_stay_exact(make_server, caplog, transport, net):
    servers = _pair(make_server)
    client = PolicyClient(",".join(servers), OBS, ACT, reconnect_timeout_s=10.0, transport=transport)
    first = client._conn.address
    (second,) = set(servers) - {first}
    sent = [0]
    _run_episodes(client, 3, 10, sent)
    eid = client.start_episode()
    client.get_action(eid, np.zeros(2, np.float32))
    sent[0] += 1
    client.log_returns(eid, 1.0)
    client.flush()
    servers[first].stop(grace=0)
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="simbridge.client"), pytest.raises(SessionLost) as lost:
        client.get_action(eid, np.zeros(2, np.float32))
    assert time.monotonic() - t0 < 8.0
    assert first in lost.value.message and second in lost.value.message
    assert client._conn.address == second
    moved = [r.getMessage() for r in caplog.records if "went away" in r.getMessage()]
    assert moved and first in moved[0] and second in moved[0] and "1 open episode(s) ended" in moved[0]
    # The episode that died with A is refused by the client, saying so.
    with pytest.raises(BridgeError, match="already ended") as ended:
        client.get_action(eid, np.zeros(2, np.float32))
    assert ended.value.reason == Reason.EPISODE_ENDED
    _run_episodes(client, 3, 10, sent)
    client.flush()
    assert _steps(servers[first]) + _steps(servers[second]) == sent[0]
    assert _steps(servers[second]) == 30
    assert servers[second].runtime.snapshot()["episodes"] == 3
    client.close()


def test_a_host_that_listens_but_does_not_answer_gets_the_grace_then_the_client_moves(make_server):
    """A closed port moves the client at once; a port where something still listens (a hung
    host, here a bare socket) gets FAILOVER_AFTER_S to come back first."""
    servers = _pair(make_server)
    client = PolicyClient(list(servers), OBS, ACT, reconnect_timeout_s=10.0)
    first = client._conn.address
    eid = client.start_episode()
    client.get_action(eid, np.zeros(2, np.float32))
    servers[first].stop(grace=0)
    host, port = first.rsplit(":", 1)
    with socket.socket() as hung:
        hung.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hung.bind((host, int(port)))
        hung.listen(8)
        t0 = time.monotonic()
        with pytest.raises(SessionLost, match="does not answer as a gRPC server"):
            client.get_action(eid, np.zeros(2, np.float32))
        waited = time.monotonic() - t0
    assert channels.FAILOVER_AFTER_S <= waited < channels.FAILOVER_AFTER_S + 5
    assert client._conn.address != first
    client.close()


def test_multi_agent_client_moves_and_goes_on_with_new_episodes(make_server, net):
    servers = _pair(make_server)
    client = MultiAgentPolicyClient(list(servers), OBS, ACT, reconnect_timeout_s=10.0)
    first = client._conn.address
    (second,) = set(servers) - {first}
    obs = {"a": np.zeros(2, np.float32), "b": np.ones(2, np.float32) * 0.5}
    eid = client.start_episode()
    client.get_action(eid, obs)
    servers[first].stop(grace=0)
    with pytest.raises(SessionLost, match="the 1 open episode"):
        client.log_returns(eid, {"a": 1.0, "b": 1.0})
        client.get_action(eid, obs)
    with pytest.raises(BridgeError, match="already ended"):
        client.log_returns(eid, {"a": 1.0})
    eid = client.start_episode()
    assert set(client.get_action(eid, obs)) == {"a", "b"}
    client.log_returns(eid, {"a": 1.0, "b": 0.0}, multiagent_done_dict={"__all__": True})
    client.flush()
    assert servers[second].runtime.snapshot()["episodes"] == 1
    assert (_steps(servers[first]), _steps(servers[second])) == (1, 1)
    client.close()


def test_slot_client_with_8_slots_moves_and_counts_stay_exact(make_server, net):
    servers = _pair(make_server)
    rng = np.random.default_rng(0)
    client = SlotClient(list(servers), OBS, ACT, num_slots=8, reconnect_timeout_s=10.0)
    first = client._conn.address
    (second,) = set(servers) - {first}
    obs = rng.uniform(-1, 1, (8, 2)).astype(np.float32)
    served = 0            # env steps whose actions came back (what a server counts, once)
    client.step(obs)
    served += 8
    for _ in range(20):
        client.step(obs, np.ones(8), np.zeros(8, bool), np.zeros(8, bool))
        served += 8
    servers[first].stop(grace=0)
    with pytest.raises(SessionLost, match="the 8 open episode"):   # its 8 slots' episodes ended with A
        client.step(obs, np.ones(8), np.zeros(8, bool), np.zeros(8, bool))
    assert client._conn.address == second
    client.step(obs)      # every slot's new episode, on B
    served += 8
    for _ in range(20):
        client.step(obs, np.ones(8), np.zeros(8, bool), np.zeros(8, bool))
        served += 8
    client.close(np.ones(8), np.zeros(8, bool), np.zeros(8, bool), obs)
    a, b = _steps(servers[first]), _steps(servers[second])
    assert (a, b) == (168, 168) and a + b == served   # the unanswered step reached neither


def test_clients_spread_over_the_addresses(make_server, monkeypatch):
    # A port an earlier test's client moved away from may be reused here: forget those marks.
    monkeypatch.setattr(channels, "_down_since", {})
    servers = _pair(make_server)
    clients = [PolicyClient(list(servers), OBS, ACT) for _ in range(4)]
    try:
        used = [c._conn.address for c in clients]
        assert set(used) == set(servers)
        for srv in servers.values():
            assert srv.runtime.snapshot()["sessions"] == 2
    finally:
        for c in clients:
            c.close()


def test_all_addresses_down_names_every_one():
    down = [f"127.0.0.1:{port}" for port in free_ports(2)]
    t0 = time.monotonic()
    with pytest.raises(BridgeError) as e:
        PolicyClient(down, OBS, ACT, connect_timeout_s=1.0)
    assert time.monotonic() - t0 < 6.0
    assert all(a in e.value.message for a in down) and "connection refused" in e.value.message


def test_bad_address_lists_name_the_fix():
    assert parse_addresses(" 127.0.0.1:1, 127.0.0.1:2 ,") == ["127.0.0.1:1", "127.0.0.1:2"]
    with pytest.raises(BridgeError, match="has no port"):
        parse_addresses("127.0.0.1:1,localhost")
    with pytest.raises(BridgeError, match="port 99999 is past 65535"):   # gRPC dialled 99999 - 65536
        parse_addresses("127.0.0.1:99999")
    with pytest.raises(BridgeError, match="no address given"):
        parse_addresses(" , ")


def _transitions(srv):
    """(eps_id, agent_index, t) of every transition the server collected; a repeat is a duplicate."""
    srv.runtime.flush()
    batches = srv.runtime.experience.get_all()
    if not batches:
        return []
    keys = []
    for b in MultiAgentBatch.concat_samples(batches).policy_batches.values():
        keys += list(zip(b["eps_id"].tolist(), b["agent_index"].tolist(), b["t"].tolist()))
    return keys


def test_local_inference_simulator_starts_over_on_the_other_host(make_server):
    """simbridge-sim --inference local: its uploads to a host that went away end the client with
    SessionLost; the simulator's new client connects to the other host and uploads there."""
    servers = _pair(make_server, experience_queue_size=100_000)
    sim = subprocess.Popen(python_module("simbridge.sims.gym_sim", "--address", ",".join(servers), "--quiet",
                                         "--inference", "local", "--chunk-steps", "16", "--seed", "0"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                           cwd=str(ROOT))
    uploaded = lambda srv: srv.runtime.snapshot()["uploaded_steps"]   # noqa: E731
    try:
        wait(lambda: any(uploaded(s) >= 64 for s in servers.values()), 30, "uploads to the first host")
        first = next(a for a, s in servers.items() if uploaded(s) > 0)
        (second,) = set(servers) - {first}
        servers[first].stop(grace=0)
        wait(lambda: uploaded(servers[second]) >= 64, 30, "uploads to the second host")
        sim.terminate()
        out, err = sim.communicate(timeout=30)
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
    assert sim.returncode == 0, err
    assert f"the bridge at {first} went away" in err, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert uploaded(servers[first]) + uploaded(servers[second]) <= summary["steps"]
    for srv in servers.values():
        keys = _transitions(srv)
        assert keys and len(keys) == len(set(keys))


@pytest.mark.parametrize("slots", ["1", "4"])
def test_simulator_process_moves_to_the_other_host(make_server, slots):
    """simbridge-sim --address "A,B": the server it is on stops; it goes on with new episodes
    on the other; the servers' step counts add up to the simulator's (bar the one step whose
    answer A never sent, which A may have counted)."""
    servers = _pair(make_server, experience_queue_size=100_000)
    sim = subprocess.Popen(python_module("simbridge.sims.gym_sim", "--address", ",".join(servers), "--quiet",
                                         "--slots", slots, "--seed", "0", "--connect-timeout", "10"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                           cwd=str(ROOT))
    try:
        wait(lambda: any(_steps(s) >= 200 for s in servers.values()), 30, "steps on the first host")
        first = next(a for a, s in servers.items() if _steps(s) > 0)
        (second,) = set(servers) - {first}
        servers[first].stop(grace=0)
        wait(lambda: _steps(servers[second]) >= 200, 30, "steps on the second host")
        sim.terminate()
        out, err = sim.communicate(timeout=30)
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
    assert sim.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert f"bridge at {first} went away" in err and f"moved to {second}" in err, err
    a, b = _steps(servers[first]), _steps(servers[second])
    assert summary["steps"] <= a + b <= summary["steps"] + int(slots), (summary, a, b)
    for srv in servers.values():
        keys = _transitions(srv)
        assert keys and len(keys) == len(set(keys))
