"""How long a simulator takes to move to another bridge host when its own goes away.

    python bench/failover.py [--trials 5]

Two bare BridgeServers on loopback; a PolicyClient given both addresses acts once, the server it
is on stops (grace 0), and the time from the stop to the SessionLost raised by the client's next
call (which includes connecting to the other server and opening a new session there) is taken,
per transport. Prints one JSON object: per transport the median and maximum seconds.

    python bench/failover.py --cpp build/cpp [--hung]

adds the C++ SDK's PolicyClient (sims/cpp/tools/failover_probe.cpp, built into that directory,
e.g. by the C++ tests), measured the same way: the stop, then the client's next call, timed until
its SessionLost. --hung: the lost host keeps listening on its port without answering (a bare socket
bound to it), so the C++ client moves after FAILOVER_AFTER_S and its connection attempts.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import json
import logging
import os
import socket
import subprocess
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


def one_move_cpp(build: str, hung: bool) -> float:
    """The C++ PolicyClient (tools/failover_probe): acts once, its server stops while it is idle,
    and it times its next call, which raises SessionLost; as one_move does for Python."""
    servers = {}
    for _ in range(2):
        srv = BridgeServer(BridgeRuntime(BridgeConfig()), "127.0.0.1:0").start()
        servers[srv.address] = srv
    proc = subprocess.Popen([os.path.join(build, "failover_probe"), "--address", ",".join(servers)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    hold = socket.socket()
    try:
        assert json.loads(proc.stdout.readline()) == {"ready": True}, "failover_probe did not connect"
        first = next(a for a, s in servers.items() if s.runtime.snapshot()["env_steps"] > 0)
        servers[first].stop(grace=0)
        if hung:   # something still listens there, and never answers
            hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            host, port = first.rsplit(":", 1)
            hold.bind((host, int(port)))
            hold.listen(8)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, "failover_probe failed"
        return json.loads(out.strip().splitlines()[-1])["lost_s"]
    finally:
        hold.close()
        if proc.poll() is None:   # by its own PID
            proc.kill()
            proc.wait()
        for srv in servers.values():
            srv.stop(grace=0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--cpp", metavar="BUILD_DIR", help="also the C++ SDK's lockstep example built there")
    p.add_argument("--hung", action="store_true", help="C++ only: the lost host keeps listening, never answering")
    args = p.parse_args()
    logging.disable(logging.WARNING)
    out = {}
    modes = {"stream": lambda: one_move("stream"), "unary": lambda: one_move("unary")}
    if args.cpp:
        modes["cpp_stream" + ("_hung" if args.hung else "")] = lambda: one_move_cpp(args.cpp, args.hung)
    for transport, move in modes.items():
        times = [move() for _ in range(args.trials)]
        out[transport] = {"move_s_median": round(float(np.median(times)), 4), "move_s_max": round(max(times), 4),
                          "trials": args.trials}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
