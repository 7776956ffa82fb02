#!/usr/bin/env python
"""Server CPU per round trip of a bare bytes echo on a bidi stream: grpcio's sync server (what
simbridge serves with) against grpc.aio's, as an async iterator and with read()/write().

Whether another of grpcio's server APIs would cost less per message than the sync server's
hand-off between its polling thread and the stream's thread (docs/benchmarks.md, "where a
Step's server time goes"). Each server runs in a process of its own; the client is this
process, on the simulators' stream (simbridge/client/direct_stream.py, as bench/throughput.py's
echo_step1 case: a 1-slot Step's sizes, 69 bytes out, 54 back). Servers alternate, 1 s warm-up,
--seconds windows, --rounds rounds.

    nice -n 5 .venv/bin/python bench/grpc_server_floor.py      # ~30 s, one JSON line
"""
import sys
from pathlib import Path

if __package__ in (None, ""):   # run as `python bench/grpc_server_floor.py`: the checkout, for `bench.`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import proc_cpu_s  # noqa: E402  (first: it sets gRPC's TCP path)
import argparse  # noqa: E402
import json  # noqa: E402
import multiprocessing as mp  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

from bench.sims import FloorClient  # noqa: E402

def sync_server(q, stop):
    os.dup2(2, 1)
    from concurrent import futures
    import grpc
    h = {"PingStream": grpc.stream_stream_rpc_method_handler(lambda it, ctx: (m for m in it))}
    s = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    s.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", h),))
    port = s.add_insecure_port("127.0.0.1:0"); s.start(); q.put(f"127.0.0.1:{port}"); stop.wait(); s.stop(0)

def _serve_aio(q, stop, echo):
    """An asyncio server of `echo` as bench.Echo/PingStream until `stop`; its address into `q`."""
    import asyncio, grpc
    async def main():
        h = {"PingStream": grpc.stream_stream_rpc_method_handler(echo)}
        s = grpc.aio.server()
        s.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", h),))
        port = s.add_insecure_port("127.0.0.1:0"); await s.start(); q.put(f"127.0.0.1:{port}")
        while not stop.is_set(): await asyncio.sleep(0.1)
        await s.stop(0)
    asyncio.run(main())

def aio_server(q, stop):
    os.dup2(2, 1)
    async def echo(it, ctx):
        async for m in it:
            yield m
    _serve_aio(q, stop, echo)

def aio_rw_server(q, stop):
    os.dup2(2, 1)
    import grpc
    async def echo(it, ctx):
        while True:
            m = await ctx.read()
            if m is grpc.aio.EOF: return
            await ctx.write(m)
    _serve_aio(q, stop, echo)

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    a = p.parse_args()
    ctx = mp.get_context("spawn"); out = {}
    for rnd in range(a.rounds):
        for name, fn in (("sync", sync_server), ("aio_iter", aio_server), ("aio_rw", aio_rw_server)):
            q, stop = ctx.Queue(), ctx.Event()
            p = ctx.Process(target=fn, args=(q, stop), daemon=True); p.start()
            c = FloorClient(q.get(timeout=30), "stream:69:54", 0)
            t = time.perf_counter() + 1
            while time.perf_counter() < t: c.step(False)
            s0, t0, n = proc_cpu_s(p.pid), time.perf_counter(), 0
            while time.perf_counter() - t0 < a.seconds: c.step(False); n += 1
            s1, dt = proc_cpu_s(p.pid), time.perf_counter() - t0
            c.close(); stop.set(); p.join(10)
            out.setdefault(name + "_server_cpu_us", []).append(round(1e6 * (s1 - s0) / n, 1))
            out.setdefault(name + "_rt_per_s", []).append(round(n / dt))
    out["load"] = os.getloadavg()[0]
    print(json.dumps(out))

if __name__ == "__main__":
    main()
