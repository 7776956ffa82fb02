import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from simbridge.server.runtime import BridgeConfig, BridgeRuntime  # noqa: E402
from simbridge.server.service import BridgeServer  # noqa: E402


@pytest.fixture
def make_server():
    """Start real BridgeServers on loopback; all are stopped at teardown."""
    servers = []

    def _make(runtime=None, **config):
        rt = runtime or BridgeRuntime(BridgeConfig(**config))
        srv = BridgeServer(rt, "127.0.0.1:0").start()
        servers.append(srv)
        return srv

    yield _make
    for s in servers:
        s.stop(grace=0)


@pytest.fixture
def server(make_server):
    return make_server()
