#!/usr/bin/env python
"""The server's own CPU per call, without gRPC: what simbridge does per Step / GetAction.

bench/throughput.py measures the server process's CPU per call (`*_server_cpu_us_per_call`),
which is gRPC's work (its completion-queue thread, the hand-offs to the handler's thread,
HTTP/2 on the socket) plus simbridge's. This separates the two: real simulators of the
throughput cases (the same classes) drive an in-process server on loopback while every
request its runtime handles is recorded; then the recording is replayed into a fresh
BridgeRuntime as the stream's handler calls it (handle() bound to the session, then
settle()), with a drain thread standing in for the learner as in `simbridge-server`.
The replay's thread CPU per call is the server's own work: validation, exactly-once
(seq + SHA-256), the policy's forward pass (the random policy), the experience rows,
metrics. Every replayed call must succeed (an error stops the bench).

    nice -n 5 .venv/bin/python bench/server_work.py                 # ~30 s, one JSON line
    nice -n 5 .venv/bin/python bench/server_work.py --profile lockstep   # + cProfile to stderr
"""
import argparse
import copy
import cProfile
import json
import os
import pstats
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import throughput as T  # noqa: E402  (the simulators of the throughput cases; sets gRPC's TCP path)

from simbridge.server.cli import drain  # noqa: E402
from simbridge.server.runtime import BridgeConfig, BridgeRuntime  # noqa: E402
from simbridge.server.service import BridgeServer  # noqa: E402

# case -> (the simulator of bench/throughput.py, simulator steps recorded)
CASES = {"stream": ("lockstep", 3000), "step_lockstep": ("step_lockstep", 3000),
         "batched64": ("slots64", 1500), "batched256": ("slots256", 600)}


def _runtime():
    rt = BridgeRuntime(BridgeConfig())
    stop = threading.Event()
    threading.Thread(target=drain, args=(rt, stop), daemon=True, name="drain").start()
    return rt, stop


def record(sim_kind: str, steps: int) -> list:
    """[(create request, multi_agent), (method, request), ...] of one simulator's stream."""
    rt, stop = _runtime()
    log = []
    handle, create = rt.handle, rt.create_session

    def recording_handle(method, req, multi_agent, bound=None, client=""):
        kept = type(req)()
        kept.CopyFrom(req)
        log.append((method, kept))
        return handle(method, req, multi_agent, bound=bound, client=client)

    def recording_create(req, multi_agent, client=""):
        log.append((copy.deepcopy(req), multi_agent))
        return create(req, multi_agent, client=client)

    rt.handle, rt.create_session = recording_handle, recording_create
    server = BridgeServer(rt, "127.0.0.1:0").start()
    try:
        sim = T.SIMS[sim_kind](server.address, "stream", seed=0)
        for _ in range(steps):
            sim.step(False)
        sim.close()
    finally:
        server.stop()
        stop.set()
    return log


def replay(log: list, profile=None) -> float:
    """Thread CPU µs per call of the recorded calls handled by a fresh runtime."""
    rt, stop = _runtime()
    creq, multi_agent = log[0]
    s = rt.session(rt.create_session(creq, multi_agent, client="bench").session_id, multi_agent)
    rt.attach_stream(s)
    calls = [c for c in log[1:] if c[0] != "close_session"]
    try:
        t0 = time.thread_time()
        if profile:
            profile.enable()
        for seq, (method, req) in enumerate(calls, 1):
            req.header.seq = seq
            rt.handle(method, req, multi_agent, bound=s, client="bench")
            rt.settle(s)
        if profile:
            profile.disable()
        return 1e6 * (time.thread_time() - t0) / len(calls)
    finally:
        stop.set()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--repeats", type=int, default=3, help="replays per case; the least is reported")
    p.add_argument("--profile", metavar="CASE", help="print a cProfile of one more replay of CASE to stderr")
    a = p.parse_args()
    out = {}
    for case in a.cases.split(","):
        log = record(*CASES[case])
        out[f"{case}_server_work_us_per_call"] = round(min(replay(log) for _ in range(a.repeats)), 1)
        out[f"{case}_calls"] = len(log) - 1
        if a.profile == case:
            prof = cProfile.Profile()
            replay(log, prof)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    out["load"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
