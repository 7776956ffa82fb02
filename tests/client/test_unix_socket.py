"""The bridge on a Unix domain socket (`unix:PATH`, docs/transports.md): created owner-only, a
stale file replaced but a live one never taken, the clients' words for a socket that does not
answer, and a simulator killed mid-step on either transport ending its episodes the same way.
(The client tests marked with `net` run on both transports: tests/conftest.py.)"""
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np
import pytest

from simbridge.client.channels import parse_addresses
from simbridge.client.diagnosis import NO_SOCKET_FILE, STALE_SOCKET, diagnose
from simbridge.client.policy_client import PolicyClient
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.service import BridgeServer
from simbridge.wire.errors import BridgeError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OBS = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
ACT = gym.spaces.Discrete(2)


@pytest.fixture
def sockdir():
    d = tempfile.mkdtemp(prefix="sb-uds-")
    yield d
    for name in os.listdir(d):
        os.unlink(os.path.join(d, name))
    os.rmdir(d)


def _stale_socket(path):
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()   # the file stays, nothing listens: a server that died


def test_the_socket_is_owner_only_serves_and_goes_at_stop(sockdir):
    os.chmod(sockdir, 0o755)    # a directory others may enter: the socket's own mode must keep them out
    path = os.path.join(sockdir, "b.sock")
    srv = BridgeServer(BridgeRuntime(BridgeConfig()), f"unix:{path}").start()
    try:
        assert srv.address == f"unix:{path}"
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        c = PolicyClient(f"unix://{path}", OBS, ACT)    # gRPC's URI spelling works too
        eid = c.start_episode()
        assert c.get_action(eid, np.zeros(2, np.float32)) in (0, 1)
        c.end_episode(eid, np.zeros(2, np.float32))
        c.close()
    finally:
        srv.stop(grace=0)
    assert not os.path.exists(path)


def test_a_live_socket_is_never_taken_and_a_stale_one_is_replaced(sockdir):
    path = os.path.join(sockdir, "b.sock")
    _stale_socket(path)
    srv = BridgeServer(BridgeRuntime(BridgeConfig()), f"unix:{path}").start()   # replaces the stale file
    try:
        with pytest.raises(RuntimeError) as busy:
            BridgeServer(BridgeRuntime(BridgeConfig()), f"unix:{path}")
        assert str(busy.value) == (f"could not bind unix:{path}: another process is listening on that socket: stop "
                                   f"it, or pick another path with --address unix:PATH")
        c = PolicyClient(f"unix:{path}", OBS, ACT)   # the first server still has its socket
        c.start_episode()
        c.close()
    finally:
        srv.stop(grace=0)
    plain = os.path.join(sockdir, "notes.txt")
    open(plain, "w").close()
    with pytest.raises(RuntimeError, match="exists and is not a socket"):
        BridgeServer(BridgeRuntime(BridgeConfig()), f"unix:{plain}")
    assert os.path.exists(plain)
    with pytest.raises(RuntimeError, match="does not exist: create it"):
        BridgeServer(BridgeRuntime(BridgeConfig()), f"unix:{sockdir}/missing/b.sock")


def test_clients_say_why_a_socket_does_not_answer(sockdir):
    path = os.path.join(sockdir, "b.sock")
    assert diagnose(f"unix:{path}") == (NO_SOCKET_FILE, False)    # a trainer may still come
    _stale_socket(path)
    assert diagnose(f"unix:{path}") == (STALE_SOCKET, False)
    plain = os.path.join(sockdir, "notes.txt")
    open(plain, "w").close()
    what, hopeless = diagnose(f"unix:{plain}")
    assert hopeless and "is not a socket" in what
    t0 = time.monotonic()
    with pytest.raises(BridgeError) as e:
        PolicyClient(f"unix:{path}", OBS, ACT, connect_timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    assert e.value.message == (f"no simbridge trainer at unix:{path}: {STALE_SOCKET}: start one with "
                               f"`simbridge-trainer run --address unix:{path}`, or pass the trainer's address")
    with pytest.raises(BridgeError, match="is not a socket"):
        PolicyClient(f"unix:{plain}", OBS, ACT, connect_timeout_s=5)


def test_unix_addresses_in_lists_and_bad_ones_name_the_fix():
    assert parse_addresses("unix:/a.sock, unix:/b.sock,127.0.0.1:1") == ["unix:/a.sock", "unix:/b.sock", "127.0.0.1:1"]
    with pytest.raises(BridgeError, match="abstract Unix sockets have no file permissions"):
        parse_addresses("unix-abstract:bridge")
    with pytest.raises(BridgeError, match="names no socket file"):
        parse_addresses("unix:")
    from simbridge.trainer.config.trainer_config import ConfigError, parse_config
    cfg = parse_config('[server]\naddress = "unix:/run/sb/bridge.sock"\n[policies.p]\nalgorithm = "random"\n')
    assert cfg.server.address == "unix:/run/sb/bridge.sock"
    with pytest.raises(ConfigError, match="abstract Unix sockets have no file permissions.*use unix:PATH"):
        parse_config('[server]\naddress = "unix-abstract:x"\n[policies.p]\nalgorithm = "random"\n')
    # the server says why an abstract socket is refused, not "beyond this machine without TLS"
    # (which pointed at --insecure, after which it said the real reason)
    out = subprocess.run([sys.executable, "-m", "simbridge.server.cli", "--address", "unix-abstract:x"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "abstract Unix sockets have no file permissions" in out.stderr, out.stderr
    assert "--insecure" not in out.stderr


def test_a_socket_path_too_long_for_unix_is_refused_in_words_not_by_grpc():
    from simbridge.wire.addresses import address_problem
    long_path = "/tmp/" + "d" * 100 + ".sock"                      # 110 bytes: over Linux's 107
    problem = address_problem("unix:" + long_path)
    assert "110 bytes, longer than the 107" in problem and "pick a shorter path" in problem
    shm_path = "/tmp/" + "d" * 95 + ".sock"                         # 105: fits, but PATH.shm would not
    assert address_problem("unix:" + shm_path) is None
    assert "longer than the 103" in address_problem("shm+unix:" + shm_path)
    with pytest.raises(RuntimeError, match="pick a shorter path"):   # the server says so before gRPC's own line
        BridgeServer(address="shm+unix:" + shm_path)


def test_simbridge_server_serves_a_socket_and_refuses_a_busy_one(sockdir):
    path = os.path.join(sockdir, "b.sock")
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "simbridge.server.cli", "--address", f"unix:{path}", "--print-every", "0"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout.readline().strip() == f"simbridge-server listening on unix:{path}"
        second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
        assert second.returncode == 2
        assert second.stderr.strip() == (f"simbridge-server: error: could not bind unix:{path}: another process is "
                                         f"listening on that socket: stop it, or pick another path with --address "
                                         f"unix:PATH")
        c = PolicyClient(f"unix:{path}", OBS, ACT)
        c.start_episode()
        c.close()
    finally:
        first.terminate()
        first.wait(10)
    assert first.returncode == 0 and not os.path.exists(path)


STEPPING_SLOTS = r"""
import sys
import numpy as np, gymnasium as gym
from simbridge.client.slot_client import SlotClient
client = SlotClient(sys.argv[1], gym.spaces.Box(-10.0, 10.0, (2,), np.float32), gym.spaces.Discrete(2), 4,
                    client_name="doomed-slots")
obs = np.zeros((4, 2), np.float32)
client.step(obs)
for t in range(1_000_000):
    client.step(obs, np.ones(4, np.float32), np.zeros(4, bool), np.zeros(4, bool))
    if t == 20:
        print("ready", flush=True)
"""


@pytest.mark.nets("tcp", "uds", "shm")   # on shm: killed while its Step is in the ring
def test_a_slot_simulator_killed_mid_step_has_its_episodes_ended_truncated(make_server, kill_simulator, net):
    srv = make_server(reconnect_grace_s=0.5)
    rt = srv.runtime
    proc = subprocess.Popen([sys.executable, "-c", STEPPING_SLOTS, srv.address], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert rt.snapshot()["open_episodes"] == 4
    finally:
        ends = kill_simulator(proc, rt)    # while it steps: a Step may be on the wire
    assert len(ends) == 4 and all(s["length"] > 20 for s in ends)    # ended as truncated: no terminal state
    # every step the server applied, all of them rewarded 1.0, counted once per slot
    assert all(s["total_reward"] == s["length"] for s in ends), ends
