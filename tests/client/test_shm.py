"""The shared-memory step channel (shm+unix:PATH; simbridge/server/shm_server.py,
simbridge/client/shm_channel.py, simbridge/wire/shm_ring.py): the same answers and counts as gRPC,
exactly-once resend after a broken channel, the same errors, a SIGKILLed simulator's episodes ended
truncated, an owner-only handover and region, and a bounded ring."""
import os
import shutil
import socket
import stat
import threading
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.client.policy_client import PolicyClient
from simbridge.client.shm_channel import ShmStream
from simbridge.client.slot_client import SlotClient
from simbridge.server.policies import ActionBatch, Policy
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.wire import shm_ring
from simbridge.wire.addresses import shm_handover_path
from simbridge.wire.errors import BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OBS = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
ACT = gym.spaces.Discrete(3)


class SignPolicy(Policy):
    """Deterministic: the action says the sign pattern of the observation's first two values."""

    def compute_actions(self, obs_batch, explore: bool = True):
        obs = np.asarray(obs_batch)
        return ActionBatch(((obs[:, 0] > 0).astype(np.int64) + (obs[:, 1] > 0)).astype(np.int64))


def _run_slots(address, steps=40, n=4):
    """A fixed slot episode script; the actions it got back."""
    rng = np.random.default_rng(7)
    c = SlotClient(address, OBS, ACT, n)
    got = [c.step(rng.uniform(-1, 1, (n, 2)).astype(np.float32))]
    for t in range(steps):
        term = np.zeros(n, bool)
        term[t % n] = t % 5 == 4
        got.append(c.step(rng.uniform(-1, 1, (n, 2)).astype(np.float32), np.full(n, 0.5, np.float32), term,
                          np.zeros(n, bool)))
    c.close(np.ones(n, np.float32), np.zeros(n, bool), np.ones(n, bool), np.zeros((n, 2), np.float32))
    return np.stack(got), c


@pytest.mark.nets("tcp", "uds", "shm")
def test_slot_client_gets_the_same_answers_and_counts_on_every_transport(make_server, net):
    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=8))
    rt.add_policy("default_policy", SignPolicy(OBS, ACT))
    srv = make_server(runtime=rt)
    actions, c = _run_slots(srv.address)
    assert type(c._conn._stream).__name__ == ("ShmStream" if net == "shm" else "DirectStream")
    rng = np.random.default_rng(7)   # the same observations again: the answers follow from them
    obs = [rng.uniform(-1, 1, (4, 2)).astype(np.float32) for _ in range(41)]
    assert actions.tolist() == [((o[:, 0] > 0).astype(int) + (o[:, 1] > 0)).tolist() for o in obs]
    rt.flush()
    snap = rt.snapshot()
    assert snap["env_steps"] == 4 * 41 and not rt.session_ids()
    ends = rt.metrics.recent
    assert sum(s["length"] for s in ends) == 4 * 41
    assert sum(s["end_reason"] == "terminated" for s in ends) == 8


@pytest.mark.nets("shm")
def test_a_resend_after_a_broken_channel_counts_once(make_server, net):
    srv = make_server()
    c = SlotClient(srv.address, OBS, ACT, 3)
    obs, ones, no = np.zeros((3, 2), np.float32), np.ones(3, np.float32), np.zeros(3, bool)
    c.step(obs)
    for _ in range(5):
        c.step(obs, ones, no, no)
    channel = srv._shm._channels[c.session_id]
    put = channel.region.outgoing.put

    def lose_the_answer(data, **kw):   # applied, then the channel breaks before its answer goes
        channel.region.outgoing.put = put
        channel.close()
    channel.region.outgoing.put = lose_the_answer
    assert c.step(obs, ones, no, no).shape == (3,)     # resent on a new channel, answered from memory
    assert c._conn.reconnects == 1 and type(c._conn._stream) is ShmStream
    for _ in range(5):
        c.step(obs, ones, no, no)
    c.close(ones, no, np.ones(3, bool), obs)
    srv.runtime.flush()
    assert srv.runtime.snapshot()["env_steps"] == 3 * 12   # every Step applied once, for each slot
    assert [s["length"] for s in srv.runtime.metrics.recent] == [12, 12, 12]


@pytest.mark.nets("tcp", "uds", "shm")
def test_bad_input_gets_the_precise_status_on_every_transport(make_server, net):
    srv = make_server()
    c = SlotClient(srv.address, OBS, ACT, 2)
    with pytest.raises(BridgeError) as bad:
        c.step(np.zeros((3, 2), np.float32))            # 3 rows for 2 slots
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and "Step observations" in bad.value.message
    c.step(np.zeros((2, 2), np.float32))                # nothing was lost: the Step can be corrected
    p = PolicyClient(srv.address, OBS, ACT)
    eid = p.start_episode()
    with pytest.raises(BridgeError) as bad:
        p.get_action("no-such-episode", np.zeros(2, np.float32))
    assert bad.value.code == grpc.StatusCode.NOT_FOUND
    assert p.get_action(eid, np.zeros(2, np.float32)) in (0, 1, 2)
    if net == "shm":   # bytes that are no StreamRequest: the stream's own answer
        stream = c._conn._stream
        stream.send(b"\xff\xff\xff")
        resp = pb.StreamResponse.FromString(stream.recv())
        err = BridgeError.from_status(resp.error)
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.reason == Reason.UNDECODABLE
    p.close()
    c.close()


@pytest.mark.nets("shm")
def test_a_message_bigger_than_the_ring_is_refused_in_words(make_server, monkeypatch, net):
    monkeypatch.setenv("SIMBRIDGE_SHM_RING_BYTES", "8192")
    srv = make_server()
    c = SlotClient(srv.address, OBS, ACT, 2048)           # 16 KiB of observations: more than the ring
    with pytest.raises(BridgeError) as big:
        c.step(np.zeros((2048, 2), np.float32))
    assert big.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and big.value.reason == Reason.MESSAGE_TOO_LARGE
    assert "8188 bytes" in big.value.message
    c.close()


@pytest.mark.nets("shm")
def test_the_handover_socket_and_region_are_owner_only(make_server, net):
    srv = make_server()
    path = shm_handover_path(srv.address)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    c = SlotClient(srv.address, OBS, ACT, 1)
    with socket.socket(socket.AF_UNIX) as s:              # the handover, by hand
        s.connect(path)
        s.sendall(shm_ring.hello(c.session_id))
        data, fds, _, _ = socket.recv_fds(s, 4096, 3)
        try:
            assert shm_ring.parse_answer(data)[0] == 0 and len(fds) == 3
            assert stat.S_IMODE(os.fstat(fds[0]).st_mode) == 0o600
            assert os.readlink(f"/proc/self/fd/{fds[0]}").startswith("/memfd:")   # no name in any directory
        finally:
            for fd in fds:
                os.close(fd)
    with socket.socket(socket.AF_UNIX) as s:              # a session nobody opened
        s.connect(path)
        s.sendall(shm_ring.hello("0" * 32))
        code, reason, _, message = shm_ring.parse_answer(s.recv(4096))
        assert code == grpc.StatusCode.NOT_FOUND.value[0] and reason == Reason.SESSION_UNKNOWN
    c.close()
    srv.stop(grace=0)
    assert not os.path.exists(path)


@pytest.mark.nets("shm")
def test_pipelined_requests_beyond_a_full_ring_never_stall(make_server, monkeypatch, net):
    """3,000 pipelined requests before a read, through rings of 8 KiB (a few hundred messages):
    the client takes answers while it waits for room, so neither end waits on the other."""
    monkeypatch.setenv("SIMBRIDGE_SHM_RING_BYTES", "8192")
    srv = make_server(experience_queue_size=100_000)
    c = PolicyClient(srv.address, OBS, ACT, coalesce_rewards=False)   # each log_returns its own message
    assert type(c._conn._stream) is ShmStream
    eid = c.start_episode()
    c.get_action(eid, np.zeros(2, np.float32))
    done = threading.Event()

    def pipeline():
        for _ in range(3_000):
            c.log_returns(eid, 1.0)
        c.flush()
        done.set()

    threading.Thread(target=pipeline, daemon=True).start()
    assert done.wait(30), "the pipelined requests stalled"
    c.end_episode(eid, np.zeros(2, np.float32))
    c.close()
    assert srv.runtime.metrics.recent[-1]["total_reward"] == 3_000.0


def test_a_shared_memory_address_is_one_host_not_one_of_a_list():
    with pytest.raises(BridgeError, match="names one bridge on this host") as e:
        SlotClient("shm+unix:/tmp/a.sock,unix:/tmp/b.sock", OBS, ACT, 1, connect_timeout_s=1)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.nets("shm")
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv (util-linux) "
                                                                          "to run a probe as another user")
def test_another_user_cannot_open_a_channel(make_server, net):
    import subprocess
    import sys
    srv = make_server()
    path = shm_handover_path(srv.address)
    os.chmod(os.path.dirname(path), 0o711)    # the directory passable: the socket's own mode must refuse
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
             "    print('connected')\nexcept PermissionError:\n    print('refused')\n")
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable   # one `nobody` may run
    # setpriv, not a preexec_fn: Python code in the forked child of a process running gRPC can be
    # aborted by gRPC's fork handlers (tests/support/signals.py)
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-I", "-c", probe,
                          path], capture_output=True, text=True, timeout=30, cwd="/")
    assert out.stdout.strip() == "refused", out.stdout + out.stderr


@pytest.mark.nets("shm")
def test_spinning_ends_get_the_same_answers(make_server, monkeypatch, net):
    monkeypatch.setenv(shm_ring.CLIENT_SPIN_ENV, "200")
    monkeypatch.setenv(shm_ring.SERVER_SPIN_ENV, "50")
    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=8))
    rt.add_policy("default_policy", SignPolicy(OBS, ACT))
    srv = make_server(runtime=rt)
    assert srv._shm.spin_s == 50e-6
    actions, c = _run_slots(srv.address)
    rng = np.random.default_rng(7)
    obs = [rng.uniform(-1, 1, (4, 2)).astype(np.float32) for _ in range(41)]
    assert actions.tolist() == [((o[:, 0] > 0).astype(int) + (o[:, 1] > 0)).tolist() for o in obs]
    rt.flush()
    assert rt.snapshot()["env_steps"] == 4 * 41


@pytest.mark.nets("shm")
def test_a_missing_handover_socket_is_named(make_server, net):
    srv = make_server()
    os.unlink(shm_handover_path(srv.address))
    with pytest.raises(BridgeError, match="could not open the shared-memory channel at .*bridge0.sock.shm") as e:
        SlotClient(srv.address, OBS, ACT, 1)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    # as for a trainer on unix:PATH dialled at shm+unix:PATH: the fix named (newcomer audit)
    assert "its own address is shm+unix:PATH" in e.value.message and "or dial unix:" in e.value.message


@pytest.mark.nets("shm")
def test_a_stopping_server_closes_its_channels_at_once(make_server, net):
    """stop() closed the open channels only after its accept loop's 0.5 s timeout: a stopping
    server went on applying a fast simulator's steps (thousands) for that half second."""
    srv = make_server()
    c = SlotClient(srv.address, OBS, ACT, 1, reconnect_timeout_s=0.5)
    obs, one, no = np.zeros((1, 2), np.float32), np.ones(1, np.float32), np.zeros(1, bool)
    c.step(obs)
    go, errors = threading.Event(), []

    def simulate():
        go.set()
        try:
            for _ in range(200_000):
                c.step(obs, one, no, no)
        except BridgeError as e:
            errors.append(e)
    t = threading.Thread(target=simulate, daemon=True)
    t.start()
    go.wait(5)
    deadline = time.monotonic() + 10
    while srv.runtime.metrics.env_steps < 200 and time.monotonic() < deadline:   # the simulator is running
        time.sleep(0.001)
    before = srv.runtime.metrics.env_steps
    srv.stop(grace=0)
    after = srv.runtime.metrics.env_steps
    t.join(30)
    assert not t.is_alive() and errors, "the simulator never noticed the stop"
    assert after - before <= 20, f"{after - before} steps were applied while the server stopped"


@pytest.mark.nets("shm")
def test_open_channel_takes_a_shared_memory_address(make_server, tmp_path, net):
    """The Unity connector checks its server with open_channel before starting Unity: an
    shm+unix: address ended in a ValueError traceback (parsed as HOST:PORT)."""
    from simbridge.client.channels import open_channel
    srv = make_server()
    open_channel(srv.address, 5.0).close()
    with pytest.raises(BridgeError, match="no simbridge trainer at unix:") as e:
        open_channel(f"shm+unix:{tmp_path}/none.sock", 0.5)
    assert f"--address shm+unix:{tmp_path}/none.sock" in e.value.message


@pytest.mark.nets("shm")
def test_wait_for_health_takes_a_shared_memory_address(make_server, net):
    from simbridge.trainer.run.launch import wait_for_health
    srv = make_server()
    wait_for_health(srv.address, timeout=5)   # it dialled "shm+unix:..." as a gRPC target and timed out
