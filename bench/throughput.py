#!/usr/bin/env python
"""Throughput and latency of the bridge against a real server in another process.

Every case starts its server (`python -m simbridge.server.cli`, the trainer daemon for local_dqn)
as a subprocess on a free 127.0.0.1 port or a Unix socket, waits for it with the standard gRPC
health check, and drives it from client processes of their own (multiprocessing, spawn), so client
and server never share a GIL. Each measured window follows a 1 s warm-up. Latency is the wall time
of the get_action / get_actions / step call seen by the simulator. One JSON object goes to stdout;
logs go to stderr. The cases and their figures: --help, or bench/cases.py.

    .venv/bin/python bench/throughput.py --seconds 3
    .venv/bin/python bench/throughput.py --cases stream,batched64,rows64 --out runs/bench.json
    .venv/bin/python bench/throughput.py --cases stream,step_lockstep,cpp_lockstep,batched64,cpp_batched64
    .venv/bin/python bench/throughput.py --list

The pieces: bench/harness.py (servers, client processes, CPU time), bench/sims.py (the simulators),
bench/echo.py (the floor cases), bench/cases.py (the registry), bench/ratios.py (ratios of figures).
"""
import sys
from pathlib import Path

if __package__ in (None, ""):   # run as `python bench/throughput.py`: the checkout, for `bench.`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import WARMUP_S, Children, log  # noqa: E402  (first: it sets gRPC's TCP path)
import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from bench import cases as registry  # noqa: E402
from bench import cpp_cases  # noqa: E402
from bench.ratios import ratios  # noqa: E402
from bench.report import emit  # noqa: E402
from bench.sims import BATCH  # noqa: E402


def _loadavg():
    """1-minute load average: other work on the machine skews every figure here."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def machine_info():
    import google.protobuf
    import grpc
    import gymnasium

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "nproc": os.cpu_count(), "usable_cpus": affinity,
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "grpcio": grpc.__version__, "protobuf": google.protobuf.__version__,
        "numpy": np.__version__, "gymnasium": gymnasium.__version__,
        "platform": platform.platform(), "processor": platform.machine(),
        # simbridge's programs pick gRPC's iomgr TCP path unless told otherwise (grpc_tuning.py)
        "grpc_experiments": os.environ.get("GRPC_EXPERIMENTS"),
    }


def run_config(seconds, cases, t_start):
    """How the figures were made, beside them in the JSON."""
    return {
        "seconds_per_case": seconds, "warmup_s": WARMUP_S, "cases": cases,
        "total_runtime_s": round(time.monotonic() - t_start, 1),
        "server": "python -m simbridge.server.cli (random policy, default BridgeConfig), fresh per case",
        "clients": "one process per simulator (multiprocessing spawn)",
        "lockstep_env": "gymnasium CartPole-v1",
        "batched_env": "batched64/batched256: sims/vector_cartpole.py on Step (SlotClient); rows64: "
                       f"BenchVectorCartPole, the bench's own numpy CartPole-v1 x{BATCH}, same-step autoreset",
        "episode_ids": "made by the simulator (start_episode(id), pipelined on stream), "
                       "except rows64's initial start_episodes(count=64)",
        "latency": "wall time of get_action / get_actions / step",
        "client_options": "PolicyClient library defaults apart from transport (whatever they are in "
                          "this checkout, e.g. reward coalescing into the next get_action)",
        "notes": "a lockstep step is get_action + log_returns (+ end/start at episode ends) through the "
                 "public API; how many RPCs that makes depends on the client (unary: 1 or 2, the floor: "
                 "1 per round trip); *_vs_floor = steps_per_s / grpc_floor_roundtrips_per_s; "
                 "*_cpu_cores = CPU seconds per wall second (server from /proc, all its threads); "
                 "*_server_cpu_us_per_call = server CPU per get_action(s) call",
        "local": registry.LOCAL_NOTES,
        "cpp": cpp_cases.NOTES,
    }


def parser():
    """The command line: its flags, and every case with its text (bench/cases.py) in --help."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="cases (--cases; all but the C++ spinning ones by default):\n"
                                       + registry.help_text())
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per case (default 5)")
    # nargs: the docs' commands wrap a long list after a comma onto an indented line, which the
    # shell hands over as a second word
    p.add_argument("--cases", nargs="+", default=[",".join(registry.DEFAULT)], metavar="CASE,...",
                   help="the cases below, comma (or space) separated, run in that order "
                        "(default: all but the C++ spinning ones)")
    p.add_argument("--list", action="store_true", help="print every case with its line and exit")
    p.add_argument("--out", help="also write the JSON to this file")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.list:
        for name, case in registry.REGISTRY.items():
            print(f"{name:26s} {case.doc.split(chr(10))[0]}")
        return 0
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cases = registry.resolve(args.cases)
    except ValueError as e:
        p.error(str(e))
    if args.seconds <= 0:
        p.error("--seconds must be positive")

    # SIGTERM -> SystemExit, so the finally below still stops every child.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    children = Children()
    result = {}
    load_start = _loadavg()
    t_start = time.monotonic()
    if any(case in cpp_cases.CPP_CASES for case in cases):
        cpp_cases.ensure_built()  # before anything is timed
    try:
        for case in cases:
            log.info("case %s: %.1f s warm-up + %.1f s measured", case, WARMUP_S, args.seconds)
            t0 = time.monotonic()
            result.update(registry.REGISTRY[case].run(children, args.seconds))
            log.info("case %s done in %.1f s", case, time.monotonic() - t0)
    finally:
        children.stop_all()

    result.update(ratios(result))
    result["machine"] = dict(machine_info(), loadavg_1m_start=load_start, loadavg_1m_end=_loadavg())
    if cpp_cases.toolchain():
        result["machine"]["cpp"] = cpp_cases.toolchain()
    result["config"] = run_config(args.seconds, cases, t_start)
    return emit(result, args.out, indent=2)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; child processes stopped", file=sys.stderr)
        sys.exit(130)
