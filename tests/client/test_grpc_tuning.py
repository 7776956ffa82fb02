"""simbridge's programs ask gRPC for its iomgr TCP path before grpc is imported,
unless the user chose otherwise."""
import os
import subprocess
import sys
import time

import pytest

from simbridge.wire import grpc_tuning



from simbridge.trainer import launch
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
from simbridge.trainer import launch
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
