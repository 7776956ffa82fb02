"""How long a simulator takes to move to another bridge host when its own goes away.

    python bench/failover.py [--trials 5]

Two bare BridgeServers on loopback; a PolicyClient given both addresses acts once, the server it
is on stops (grace 0), and the time from the stop to the SessionLost raised by the client's next
call (which includes connecting to the other server and opening a new session there) is taken,
per transport. Prints one JSON object: per transport the median and maximum seconds.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import json
import logging
import time

import gymnasium as gym
import numpy as np

from simbridge.client.policy_client import PolicyClient, SessionLost
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.service import BridgeServer

OBS = gym.spaces.Box(-1, 1, (2,), np.float32)
ACT = gym.spaces.Discrete(2)


def one_move(transport: str) -> float:
    servers = {}
    for _ in range(2):
        srv = BridgeServer(BridgeRuntime(BridgeConfig()), "127.0.0.1:0").start()
        servers[srv.address] = srv
    client = PolicyClient(list(servers), OBS, ACT, transport=transport)
    try:
        eid = client.start_episode()
        client.get_action(eid, np.zeros(2, np.float32))
        servers[client._conn.address].stop(grace=0)
        t0 = time.monotonic()
        try:
            client.get_action(eid, np.zeros(2, np.float32))
        except SessionLost:
            return time.monotonic() - t0
        raise AssertionError("the client did not report the move")
    finally:
        client.close()
        for srv in servers.values():
            srv.stop(grace=0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=5)
    args = p.parse_args()
    logging.disable(logging.WARNING)
    out = {}
    for transport in ("stream", "unary"):
        times = [one_move(transport) for _ in range(args.trials)]
        out[transport] = {"move_s_median": round(float(np.median(times)), 4), "move_s_max": round(max(times), 4),
                          "trials": args.trials}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
