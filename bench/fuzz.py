#!/usr/bin/env python
"""Fuzz every simbridge RPC and print one JSON object with what broke.

N messages spread evenly over every RPC of both services (ExternalEnv and
ExternalMultiAgentEnv, the Streams included; each request on a stream counts as
one message), a quarter random or damaged bytes, the rest typed messages
(bench/fuzzcases.py, bench/fuzzing.py: the same generators as
tests/server/test_fuzz.py, drawn from a seeded random.Random, no shrinking).
Against a `simbridge-server` subprocess it starts (or --address), with a
well-behaved CartPole PolicyClient running alongside the whole time.

Output: messages (and per RPC), crashes (the server process died), hangs
(calls past the deadline), internal (INTERNAL/UNKNOWN statuses, stream errors
included), bad_answers (an OK answer that is not the call's response),
status_codes, examples grouped by cause, server RSS before/after (MB), the
server's log (bytes, tracebacks), and the witness's steps, episodes, longest
gap between answered steps, and errors.

    .venv/bin/python bench/fuzz.py --messages 10000 --seed 1
    .venv/bin/python bench/fuzz.py --messages 500 --address 127.0.0.1:50051
"""
import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

if __package__ in (None, ""):   # run as `python bench/fuzz.py`: the checkout, for `bench.`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["no_proxy"] = os.environ["no_grpc_proxy"] = "127.0.0.1,localhost"

from simbridge.wire.grpc_tuning import prefer_iomgr_tcp  # noqa: E402

prefer_iomgr_tcp()   # before grpc loads, as simbridge's programs do
import grpc  # noqa: E402
from bench import fuzzjudge, fuzzrig  # noqa: E402
from bench.fuzzing import RandomDraw, rpcs  # noqa: E402

POOL_REFRESH_EVERY = 200   # messages: the fuzz closes and breaks sessions, make fresh ones


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--address", help="fuzz this server instead of starting one (crashes and RSS unknown)")
    p.add_argument("--raw-fraction", type=float, default=0.25)
    p.add_argument("--idle-streams", type=int, default=0,
                   help="first open this many streams that bind a session and then stay silent")
    p.add_argument("--max-hangs", type=int, default=20, help="stop fuzzing after this many hangs")
    p.add_argument("--deadline-s", type=float, default=10.0, help="a unary call past this is a hang (streams: 2x)")
    args = p.parse_args(argv)

    draw = RandomDraw(random.Random(args.seed))
    server = None if args.address else fuzzrig.ServerProcess()
    address = args.address or server.address
    judge = fuzzjudge.Judge(server, address, args.deadline_s, 2 * args.deadline_s)
    witness = fuzzrig.Witness(address, seed=args.seed).start()
    idle = fuzzrig.IdleStreams(address, args.idle_streams) if args.idle_streams else None
    time.sleep(0.5)   # the witness binds default_policy to the CartPole spaces first
    rss_before = server.rss_mb() if server else None
    stopped_early = None
    try:
        pool = fuzzrig.Pool(judge.channel)
    except grpc.RpcError as e:   # e.g. every worker held by idle streams
        judge._status("pool.CreateSession", "the fuzzer's own sessions", e.code(), e.details() or "")
        pool, stopped_early = None, f"could not create the fuzzer's sessions: {e.code().name}: {e.details()}"
    targets = rpcs()
    t0 = time.monotonic()
    next_refresh = POOL_REFRESH_EVERY
    total = 0
    i = 0
    try:
        while pool is not None and total < args.messages and not judge.crashed:
            if judge.hangs >= args.max_hangs:
                stopped_early = f"{judge.hangs} hangs (--max-hangs)"
                break
            svc, method = targets[i % len(targets)]
            i += 1
            fuzzjudge.fuzz_one(judge, pool, draw, svc, method, raw=draw.boolean(args.raw_fraction))
            total = sum(judge.sent.values())
            witness.gap_s()
            if total >= next_refresh and not judge.crashed:
                next_refresh += POOL_REFRESH_EVERY
                pool.refresh()
    finally:
        elapsed = time.monotonic() - t0
        if idle is not None:
            idle.close()
        witness_report = witness.finish()
        rss_after = server.rss_mb() if server else None
        log = server.log_stats() if server else None
        alive = server.alive() if server else None
        judge.close()
        t_stop = time.monotonic()
        final = server.stop() if server else None
        stop_s = time.monotonic() - t_stop
    out = judge.summary()
    out.update({
        "seed": args.seed, "idle_streams": args.idle_streams, "stopped_early": stopped_early,
        "seconds": round(elapsed, 1), "messages_per_s": round(out["messages"] / max(elapsed, 1e-9), 1),
        "server_alive_at_end": alive, "server_rss_mb_before": rss_before, "server_rss_mb_after": rss_after,
        "server_log": log, "witness": witness_report,
        "server_stop": {"seconds": round(stop_s, 2), "exit_code": server.proc.returncode} if server else None,
        "server_final": {k: final.get(k) for k in ("sessions", "episodes", "env_steps")} if final else None,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    })
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
