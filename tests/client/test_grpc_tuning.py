"""simbridge's programs ask gRPC for its iomgr TCP path before grpc is imported,
unless the user chose otherwise."""
import os
import subprocess
import sys
import time

import pytest

from simbridge.wire import grpc_tuning



from simbridge.trainer.run import launch
def test_fills_in_only_when_the_user_left_it_unset(monkeypatch):
    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    monkeypatch.delenv("SIMBRIDGE_GRPC_EVENT_ENGINE", raising=False)
    assert grpc_tuning.prefer_iomgr_tcp()
    assert os.environ["GRPC_EXPERIMENTS"] == grpc_tuning.IOMGR_TCP
    monkeypatch.setenv("GRPC_EXPERIMENTS", "")   # set, even empty: the user's choice
    assert not grpc_tuning.prefer_iomgr_tcp() and os.environ["GRPC_EXPERIMENTS"] == ""
    monkeypatch.delenv("GRPC_EXPERIMENTS")
    monkeypatch.setenv("SIMBRIDGE_GRPC_EVENT_ENGINE", "1")
    assert not grpc_tuning.prefer_iomgr_tcp() and "GRPC_EXPERIMENTS" not in os.environ


def test_grpcs_own_log_is_errors_only_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    grpc_tuning.prefer_iomgr_tcp()
    assert os.environ["GRPC_VERBOSITY"] == "ERROR"
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")
    grpc_tuning.prefer_iomgr_tcp()
    assert os.environ["GRPC_VERBOSITY"] == "DEBUG"


# Records GRPC_EXPERIMENTS at the moment something first imports grpc.
_PROBE = """
import importlib, os, sys
seen = []
class Probe:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and not seen:
            seen.append(os.environ.get("GRPC_EXPERIMENTS"))
sys.meta_path.insert(0, Probe())
importlib.import_module(sys.argv[1])
print(seen[0] if seen else "grpc never imported")
"""

PROGRAMS = ["simbridge.server.cli", "simbridge.trainer.daemon", "simbridge.sims.gym_sim", "simbridge.sims.multiagent_sim",
            "simbridge.sims.unity.connector", "simbridge.trainer.demo"]


@pytest.mark.parametrize("module", PROGRAMS)
def test_programs_choose_before_grpc_is_imported(module):
    env = {k: v for k, v in os.environ.items() if k not in ("GRPC_EXPERIMENTS", "SIMBRIDGE_GRPC_EVENT_ENGINE")}
    out = subprocess.run([sys.executable, "-c", _PROBE, module], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == grpc_tuning.IOMGR_TCP


def test_a_users_setting_wins():
    env = dict(os.environ, GRPC_EXPERIMENTS="monitoring_experiment")
    out = subprocess.run([sys.executable, "-c", _PROBE, "simbridge.server.cli"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "monitoring_experiment", out.stderr


_EARLY_CLIENT = """
import sys, time
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp
prefer_iomgr_tcp()
from simbridge.trainer.run import launch
launch.wait_for_health(sys.argv[1], timeout=30)
print(time.time(), flush=True)
"""


def test_a_simulator_started_before_its_server_connects_promptly():
    """With the iomgr path, a refused first connection used to be retried only at gRPC's
    5 s backup poll: the client must notice the server within about a second."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRPC_EXPERIMENTS", "SIMBRIDGE_GRPC_EVENT_ENGINE",
                        "GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS")}
    address = f"127.0.0.1:{launch.free_port()}"
    client = subprocess.Popen([sys.executable, "-c", _EARLY_CLIENT, address], env=env,
                              stdout=subprocess.PIPE, text=True)
    server = None
    try:
        time.sleep(1.0)   # the client's first attempts are refused
        server = subprocess.Popen([sys.executable, "-m", "simbridge.server.cli", "--address", address,
                                   "--print-every", "0"], env=env, stdout=subprocess.PIPE, text=True)
        assert "listening" in server.stdout.readline()
        listening = time.time()
        healthy = float(client.stdout.readline())
        assert client.wait(10) == 0
        assert healthy - listening < 2.0, f"connected {healthy - listening:.1f}s after the server came up"
    finally:
        client.kill()
        if server is not None:
            server.terminate()
            server.wait(10)


class _SlowHandshakeProxy:
    """Forwards TCP to `upstream`, each connection only after `delay_s`: a server whose HTTP/2
    handshake (its SETTINGS frame) comes late, as over a slow link with TLS, or from a loaded host."""

    def __init__(self, upstream: str, delay_s: float):
        import socket
        import threading
        host, port = upstream.rsplit(":", 1)
        self.upstream, self.delay_s = (host, int(port)), delay_s
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._pump, args=(conn,), daemon=True).start()

    def _pump(self, conn):
        import select
        import socket
        if self.stop.wait(self.delay_s):
            conn.close()
            return
        up = socket.create_connection(self.upstream, timeout=5)
        peers = {conn: up, up: conn}
        try:
            while not self.stop.is_set():
                ready, _, _ = select.select(list(peers), [], [], 0.2)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            conn.close()
            up.close()

    def close(self):
        self.stop.set()
        self.sock.close()


def test_a_server_whose_handshake_takes_over_a_second_is_still_reached(server):
    """grpc.min_reconnect_backoff_ms is gRPC's deadline for one connection attempt, handshake
    included: at 100 ms (growing with the backoff to its 1 s cap) a server whose HTTP/2 SETTINGS
    came later than a second was never reached, however long the client waited."""
    import gymnasium as gym
    import numpy as np

    from simbridge.client.slot_client import SlotClient
    proxy = _SlowHandshakeProxy(server.address, delay_s=1.5)
    try:
        t0 = time.monotonic()
        c = SlotClient(proxy.address, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2), 1,
                       connect_timeout_s=8.0)
        assert c.step(np.zeros((1, 2), np.float32)).shape == (1,)
        assert time.monotonic() - t0 < 6.0
        c.close(np.ones(1, np.float32), np.zeros(1, bool), np.ones(1, bool), np.zeros((1, 2), np.float32))
    finally:
        proxy.close()
