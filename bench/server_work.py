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

A replay runs hot (the same code back to back); inside a serving process the same work
shares the cores and caches with gRPC's threads and costs more. So each case also runs
the simulator against a real server in another process, twice (`--insitu-seconds` each,
after a 1 s warm-up): `full`, where the handler thread's CPU inside the runtime's
handle() and settle() is summed (`*_insitu_work_us_per_call`) beside the whole process's
CPU per simulator step (`*_insitu_server_cpu_us_per_step`); and `canned`, where the
call itself (Step, GetAction) answers with the answer it gave last instead of computing
one, everything else as served (session, seq and digest, servicer, gRPC):
`*_canned_server_cpu_us_per_step` is what a step costs the server beyond simbridge's work.

The camera cases (`--cases camera84,camera`: a Dict of an 84x84x3 or 240x320x3 uint8 frame and
7 joints, lockstep on the row calls, as the Gazebo plugin sends them) are left out by default.

    nice -n 5 .venv/bin/python bench/server_work.py                 # ~1 min, one JSON line
    nice -n 5 .venv/bin/python bench/server_work.py --profile lockstep   # + cProfile to stderr
"""
import sys
from pathlib import Path

if __package__ in (None, ""):   # run as `python bench/server_work.py`: the checkout, for `bench.`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import proc_cpu_s  # noqa: E402  (first: it sets gRPC's TCP path)
import argparse  # noqa: E402
import copy  # noqa: E402
import cProfile  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from bench.sims import SIMS  # noqa: E402  (the simulators of the throughput cases)

from simbridge.server.cli import drain  # noqa: E402
from simbridge.server.runtime import BridgeConfig, BridgeRuntime  # noqa: E402
from simbridge.server.service import BridgeServer  # noqa: E402

# case -> (the simulator of bench/throughput.py, simulator steps recorded)
CASES = {"stream": ("lockstep", 3000), "step_lockstep": ("step_lockstep", 3000),
         "batched64": ("slots64", 1500), "batched256": ("slots256", 600),
         "camera84": ("camera84", 1000), "camera": ("camera", 600)}


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
        sim = SIMS[sim_kind](server.address, "stream", seed=0)
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


def _insitu_server(mode: str, address_q, stop, work_q) -> None:
    """Child process: a served runtime, its calls timed (full) or answered from the last
    answer (canned: after 200 real calls, so episodes and slots are set up as served)."""
    os.dup2(2, 1)
    rt, stop_drain = _runtime()
    acc = [0.0, 0]
    if mode == "canned":
        kept = {}
        for method in ("step", "get_action"):
            def canned(session, req, defer, method=method, call=rt._calls[method]):
                if acc[1] > 200 and method in kept:
                    return kept[method]
                acc[1] += 1
                kept[method] = call(session, req, defer)
                return kept[method]
            rt._calls[method] = canned
    else:
        def timed(fn, counts):
            def run(*args, **kwargs):
                t0 = time.thread_time()
                try:
                    return fn(*args, **kwargs)
                finally:
                    acc[0] += time.thread_time() - t0
                    acc[1] += counts
            return run
        rt.handle, rt.settle = timed(rt.handle, 1), timed(rt.settle, 0)
    server = BridgeServer(rt, "127.0.0.1:0").start()
    address_q.put(server.address)
    stop.wait()
    work_q.put(tuple(acc))
    server.stop(0)
    stop_drain.set()


def insitu(case: str, mode: str, seconds: float) -> dict:
    import multiprocessing as mp

    sim_kind = CASES[case][0]
    ctx = mp.get_context("spawn")
    address_q, work_q, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_insitu_server, args=(mode, address_q, stop, work_q), daemon=True)
    proc.start()
    try:
        sim = SIMS[sim_kind](address_q.get(timeout=60), "stream", seed=0)
        warm = time.perf_counter() + 1.0
        while time.perf_counter() < warm:
            sim.step(False)
        cpu0, t0, steps = proc_cpu_s(proc.pid), time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            sim.step(False)
            steps += 1
        cpu1 = proc_cpu_s(proc.pid)
        sim.close()
        stop.set()
        work, calls = work_q.get(timeout=30)
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    out = {f"{case}_{'insitu' if mode == 'full' else 'canned'}_server_cpu_us_per_step":
           round(1e6 * (cpu1 - cpu0) / steps, 1)}
    if mode == "full":   # the whole run's calls, warm-up included: a mean per call
        out[f"{case}_insitu_work_us_per_call"] = round(1e6 * work / max(1, calls), 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default=",".join(c for c in CASES if not c.startswith("camera")),
                   help=f"of {','.join(CASES)} (default: all but the cameras)")
    p.add_argument("--repeats", type=int, default=3, help="replays per case; the least is reported")
    p.add_argument("--insitu-seconds", type=float, default=3.0, help="per served run (0: replays only)")
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
        if a.insitu_seconds > 0:
            for mode in ("full", "canned"):
                out.update(insitu(case, mode, a.insitu_seconds))
    out["load"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
