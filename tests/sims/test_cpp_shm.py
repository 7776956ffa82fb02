"""The C++ SDK on the shared-memory step channel (shm+unix:PATH; sims/cpp/src/shm_channel.cpp and
shm_ring.cpp against simbridge/server/shm_server.py): a C++ simulator SIGKILLed mid-run has its
episodes ended truncated, a refusal on the handover comes back with the status and reason it
carries, a missing handover socket is named, a Step over the ring's size is refused before it is
sent, and a spinning C++ end gets the same counts. The examples on shm and the restart with
exactly-once resend are tests/sims/test_cpp_sdk.py's (parametrized on `net`); the rings' own
layout, wrap-around and bounds are ctest's (sims/cpp/tests/shm_tests.cpp).

Skipped only when the C++ build tools are absent, as every C++ test."""
import json
import os
import socket
import subprocess
import threading

import grpc
import pytest

from simbridge.wire import shm_ring
from simbridge.wire.addresses import shm_handover_path
from simbridge.wire.errors import Reason
from support.waits import wait

pytestmark = pytest.mark.nets("shm")


def _program(build, name):
    return os.path.join(build, name)


def test_a_cpp_simulator_killed_mid_run_has_its_episodes_ended_truncated(cpp_build, make_server, kill_simulator,
                                                                        net):
    srv = make_server(reconnect_grace_s=0.5)
    rt = srv.runtime
    proc = subprocess.Popen([_program(cpp_build, "cartpole_slots"), "--address", srv.address, "--steps", "10000000",
                             "--slots", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait(lambda: rt.snapshot()["env_steps"] > 2000 or proc.poll() is not None, 20, "2,000 env steps", every=0.02)
        assert proc.poll() is None, proc.communicate()
        assert rt.snapshot()["open_episodes"] == 4
    finally:
        ends = kill_simulator(proc, rt)    # while it steps: a Step may be in the ring
    # Ended as truncated (client_lost, no terminal state): each slot's episode that took a step (a
    # slot that had just reset has none, and is not an episode yet: random CartPoles reset often).
    assert 1 <= len(ends) <= 4, ends
    assert len({s["episode_id"].split("-")[1] for s in ends}) == len(ends)   # one per slot
    assert all(s["total_reward"] == s["length"] for s in ends), ends         # every applied step once


def _refusing_handover(path, answer, runtime, hellos):
    """Stands in for the bridge's handover socket at `path`: records the hello (the session it
    names, and whether `runtime` has that session live then) and answers `answer`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(4)
    sock.settimeout(15)

    def serve():
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            session = shm_ring.parse_hello(conn.recv(512))
            hellos.append((session, session in runtime.session_ids()))
            conn.sendall(answer)
        sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return sock, thread


@pytest.mark.nets("uds")   # the bridge on unix:PATH alone; the test owns PATH.shm
def test_a_refusal_on_the_handover_comes_back_with_its_status_and_reason(cpp_build, make_server, net):
    srv = make_server()
    path = shm_handover_path("shm+" + srv.address)
    hellos = []
    message = "the shared-memory channel is for the bridge's own user"
    sock, thread = _refusing_handover(
        path, shm_ring.answer(grpc.StatusCode.PERMISSION_DENIED.value[0], Reason.NOT_SESSION_OWNER, 0, message),
        srv.runtime, hellos)
    try:
        out = subprocess.run([_program(cpp_build, "cartpole"), "--address", "shm+" + srv.address, "--episodes", "1"],
                             capture_output=True, text=True, timeout=60)
    finally:
        sock.close()
        thread.join(5)
    assert len(hellos) == 1 and hellos[0][1], hellos   # the hello named the session its gRPC stream opened
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"{message} (NOT_SESSION_OWNER) [gRPC status {grpc.StatusCode.PERMISSION_DENIED.value[0]}]" in out.stderr


def test_a_missing_handover_socket_is_named(cpp_build, make_server, net):
    srv = make_server()
    os.unlink(shm_handover_path(srv.address))
    out = subprocess.run([_program(cpp_build, "cartpole"), "--address", srv.address, "--episodes", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    handover = shm_handover_path(srv.address)
    assert f"could not open the shared-memory channel at {handover}: connect: No such file or directory: " \
           f"no bridge hands over shared memory there: serve with --address {srv.address}" in out.stderr
    assert f"(SERVER_UNAVAILABLE) [gRPC status {grpc.StatusCode.UNAVAILABLE.value[0]}]" in out.stderr


def test_a_step_bigger_than_the_ring_is_refused_before_it_is_sent(cpp_build, make_server, monkeypatch, net):
    monkeypatch.setenv("SIMBRIDGE_SHM_RING_BYTES", "4096")   # read when the server starts
    srv = make_server()
    out = subprocess.run([_program(cpp_build, "cartpole_slots"), "--address", srv.address, "--slots", "256",
                          "--steps", "2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "exceeds the server's limit of 4092 bytes: send fewer rows per call (MESSAGE_TOO_LARGE)" in out.stderr
    assert srv.runtime.snapshot()["env_steps"] == 0


def test_a_spinning_cpp_end_gets_the_same_counts(cpp_build, make_server, net):
    srv = make_server(rollout_fragment_length=64)
    out = subprocess.run([_program(cpp_build, "cartpole_slots"), "--address", srv.address, "--steps", "300",
                          "--slots", "4"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, SIMBRIDGE_SHM_SPIN_US="200"))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1200 and summary["reconnects"] == 0
    srv.runtime.flush()
    snap = srv.runtime.snapshot()
    assert snap["env_steps"] == 1200 and snap["episodes"] == summary["episodes"] + summary["cut_short"]
