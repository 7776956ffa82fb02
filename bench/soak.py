#!/usr/bin/env python
"""Soak: N CartPole PolicyClients for M minutes against one `simbridge-server` process.

The server is `python -m simbridge.server.cli` on a free loopback port (random
policy; it drains the experience itself). The clients are threads in a few
client processes (spawned; 16 clients each by default), each running
CartPole-v1 episodes with the server's actions on the default stream
transport. The server's RSS is sampled every --sample-s seconds.

Printed JSON: steps_sent (GetAction calls the clients saw answered),
steps_received (the server's env_steps from its final snapshot, printed when it
stops on SIGTERM), steps_lost (sent - received), episodes (completed by the
clients; the server's count too), the RSS samples, and three RSS slopes (least
squares, MB/min): rss_slope_mb_per_min over the steady window [warmup_s, end]
(--warmup-s, default 120 s, or half the run if that is shorter: pools, caches
and malloc arenas filling are not a leak), rss_slope_full_mb_per_min over the
whole run, and rss_slope_by_third (first, middle, last third) to show whether
growth continues or levels off; errors (count and the first few). The server
inherits the environment, so `MALLOC_ARENA_MAX=2 bench/soak.py ...` applies
to it (reported as server_env).

    .venv/bin/python bench/soak.py --clients 64 --minutes 2
    .venv/bin/python bench/soak.py --clients 64 --minutes 10     # issue 13's figure
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):   # run as `python bench/soak.py`: the checkout, for `bench.`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["no_proxy"] = os.environ["no_grpc_proxy"] = "127.0.0.1,localhost"

from simbridge.wire.grpc_tuning import prefer_iomgr_tcp  # noqa: E402

prefer_iomgr_tcp()   # before grpc loads, as simbridge's programs do

MAX_ERRORS_KEPT = 10


def _client_thread(address, seed, stop, totals, lock, errors):
    from bench.fuzzcases import ACT_SPACE, OBS_SPACE
    from bench.fuzzrig import run_cartpole
    from simbridge.client.policy_client import PolicyClient
    counters = {"steps": 0, "episodes": 0, "last_step_t": 0.0}
    try:
        with PolicyClient(address, OBS_SPACE, ACT_SPACE, client_name=f"soak-{seed}") as client:
            run_cartpole(client, stop, counters, seed)
    except Exception as e:
        with lock:
            errors.append(f"client {seed}: {e!r}"[:400])
    with lock:
        totals["steps"] += counters["steps"]
        totals["episodes"] += counters["episodes"]


def client_process(address, seeds, stop_evt, results):
    """Spawned child: one thread per client until stop_evt; puts its totals on `results`."""
    stop = threading.Event()
    totals, lock, errors = {"steps": 0, "episodes": 0}, threading.Lock(), []
    threads = [threading.Thread(target=_client_thread, args=(address, s, stop, totals, lock, errors), daemon=True)
               for s in seeds]
    for t in threads:
        t.start()
    stop_evt.wait()
    stop.set()
    for t in threads:
        t.join(60)
    stuck = sum(t.is_alive() for t in threads)
    if stuck:
        errors.append(f"{stuck} client threads did not finish within 60 s of the stop")
    results.put({"steps": totals["steps"], "episodes": totals["episodes"], "errors": errors})


def slope_mb_per_min(samples, t_from):
    """Least-squares slope of RSS (MB) against time (min) over samples at or after t_from seconds."""
    pts = [(t / 60.0, mb) for t, mb in samples if t >= t_from and mb is not None]
    if len(pts) < 2:
        return None
    mt = sum(t for t, _ in pts) / len(pts)
    mm = sum(m for _, m in pts) / len(pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    return None if var == 0 else sum((t - mt) * (m - mm) for t, m in pts) / var


def main(argv=None) -> int:
    from bench import fuzzrig
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--minutes", type=float, default=2.0)
    p.add_argument("--clients-per-process", type=int, default=16)
    p.add_argument("--sample-s", type=float, default=3.0, help="seconds between RSS samples")
    p.add_argument("--warmup-s", type=float, default=120.0,
                   help="start of the steady window for rss_slope_mb_per_min (capped at half the run)")
    args = p.parse_args(argv)

    server = fuzzrig.ServerProcess()
    ctx = mp.get_context("spawn")
    stop_evt, results = ctx.Event(), ctx.Queue()
    seeds = list(range(args.clients))
    per = max(1, args.clients_per_process)
    procs = [ctx.Process(target=client_process, args=(server.address, seeds[i:i + per], stop_evt, results),
                         daemon=True) for i in range(0, len(seeds), per)]
    samples = []
    t0 = time.monotonic()
    try:
        for pr in procs:
            pr.start()
        duration = args.minutes * 60.0
        while True:
            now = time.monotonic() - t0
            samples.append((round(now, 1), server.rss_mb()))
            if now >= duration or not server.alive():
                break
            time.sleep(min(args.sample_s, max(duration - now, 0.05)))
        elapsed = time.monotonic() - t0
        stop_evt.set()
        outs = []
        for _ in procs:
            try:
                outs.append(results.get(timeout=90))
            except Exception:
                outs.append({"steps": 0, "episodes": 0, "errors": ["a client process sent no result"]})
    finally:
        stop_evt.set()
        for pr in procs:   # stopped by PID, never by name
            pr.join(10)
            if pr.is_alive():
                pr.kill()
                pr.join(5)
        alive = server.alive()
        final = server.stop(grace_s=30.0) or {}
    sent = sum(o["steps"] for o in outs)
    errors = [e for o in outs for e in o["errors"]]
    received = final.get("env_steps")
    warmup = min(args.warmup_s, elapsed / 2)
    slope = slope_mb_per_min(samples, warmup)
    full = slope_mb_per_min(samples, 0.0)
    thirds = [slope_mb_per_min([(t, mb) for t, mb in samples if k * elapsed / 3 <= t <= (k + 1) * elapsed / 3], 0.0)
              for k in range(3)]
    rss = [mb for _, mb in samples if mb is not None]
    print(json.dumps({
        "clients": args.clients, "client_processes": len(procs), "minutes": round(elapsed / 60.0, 2),
        "steps_sent": sent, "steps_received": received,
        "steps_lost": None if received is None else sent - received,
        "steps_per_s": round(sent / elapsed, 1),
        "episodes": sum(o["episodes"] for o in outs), "server_episodes": final.get("episodes"),
        "rss_mb_first": rss[0] if rss else None, "rss_mb_last": rss[-1] if rss else None,
        "rss_mb_max": max(rss) if rss else None,
        "rss_slope_mb_per_min": None if slope is None else round(slope, 3),
        "rss_slope_window_s": [round(warmup, 1), round(elapsed, 1)], "warmup_s": round(warmup, 1),
        "rss_slope_full_mb_per_min": None if full is None else round(full, 3),
        "rss_slope_by_third": [None if x is None else round(x, 3) for x in thirds],
        "server_env": {k: os.environ[k] for k in ("MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "PYTHONMALLOC")
                       if k in os.environ},
        "rss_samples": [[t, None if mb is None else round(mb, 1)] for t, mb in samples],
        "errors": len(errors), "error_examples": errors[:MAX_ERRORS_KEPT],
        "server_alive_at_end": alive, "server_exit_code": server.proc.returncode,
        "server_log": server.log_stats(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }, indent=1))
    return 0 if not errors and math.isfinite(slope or 0.0) else 1


if __name__ == "__main__":
    sys.exit(main())
