"""The C++ SDK's cases of bench/throughput.py: sims/cpp's CartPole examples against a fresh server.

  cpp_lockstep    examples/cartpole.cpp: one C++ CartPole on PolicyClient, lockstep on the
                  stream (the reward rides with the next get_action): steps/s.
  cpp_batched64   examples/cartpole_slots.cpp: 64 C++ CartPoles on SlotClient, one Step each way
                  per step for all of them, per-slot auto-reset: agent-steps/s.
  cpp_batched256  the same with 256 slots.
  cpp_uds_*, cpp_shm_*  the same three against a server on a Unix socket (unix:PATH) and with the
                  steps through the shared-memory channel (shm+unix:PATH; the C++ SDK's
                  sims/cpp/src/shm_channel.cpp): cpp_uds_lockstep, cpp_shm_batched64, ...

Each runs its example with --warmup-s and --seconds, so the program measures itself the way the
Python clients do (a warm-up, then a fixed window, timed inside the client process) and prints the
window's figures as one JSON line as soon as the window ends (before its flush and close). It prints
{"measuring": true} when the window opens; the server's CPU time is sampled on each of the two lines.
An error in the flush or close still fails the case (exit code 1).

The build (build/cpp, Release) is brought up to date once per run, before any case is timed:
configured if it has no CMakeCache.txt, then `cmake --build` of the two examples (incremental).
Without cmake / protoc / grpc_cpp_plugin / the grpc++ headers (Debian: cmake libgrpc++-dev
protobuf-compiler-grpc libprotobuf-dev), or when the build fails, the cases report
`<case>_skipped` with the reason instead of figures.
"""
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "sims" / "cpp"
BUILD = REPO / "build" / "cpp"
TARGETS = ("cartpole", "cartpole_slots")

# case -> (program, its options, per_agent, net): per_agent cases report agent_steps_per_s and
# calls_per_s; net is the server's transport (harness.listen_address: tcp, uds, shm).
_TCP_CASES = {
    "cpp_lockstep": ("cartpole", ["--slots", "1"], False),
    "cpp_batched64": ("cartpole_slots", ["--slots", "64"], True),
    "cpp_batched256": ("cartpole_slots", ["--slots", "256"], True),
}
NETS = ("uds", "shm")   # the same-host transports (docs/transports.md): cpp_<net>_<the TCP name's rest>
CPP_CASES = {**{case: (*spec, "tcp") for case, spec in _TCP_CASES.items()},
             **{f"cpp_{net}_{case[len('cpp_'):]}": (*spec, net) for net in NETS for case, spec in _TCP_CASES.items()}}


def net_of(case):
    return CPP_CASES[case][3]

log = logging.getLogger("bench.cpp")
_built = None  # (build dir, None) or (None, why not), once per run


def missing_tools():
    missing = [t for t in ("cmake", "protoc", "grpc_cpp_plugin") if shutil.which(t) is None]
    if not os.path.exists("/usr/include/grpcpp/grpcpp.h"):
        missing.append("grpc++ headers (libgrpc++-dev)")
    return missing


def ensure_built():
    """(build dir, None) once the examples are up to date, or (None, the reason they can't be)."""
    global _built
    if _built is None:
        _built = _build()
    return _built


def _build():
    missing = missing_tools()
    if missing:
        return None, f"C++ SDK build tools absent: {', '.join(missing)}"
    steps = []
    if not (BUILD / "CMakeCache.txt").exists():
        steps.append(["cmake", "-S", str(SOURCE), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=Release"])
    steps.append(["cmake", "--build", str(BUILD), "-j2", "--target", *TARGETS])
    t0 = time.monotonic()
    for cmd in steps:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"`{' '.join(cmd)}` failed: {e!r}"
        if out.returncode != 0:
            log.error("%s failed:\n%s%s", " ".join(cmd), out.stdout[-4000:], out.stderr[-4000:])
            return None, f"`{' '.join(cmd)}` exited {out.returncode} (its output is in the log)"
    log.info("C++ examples up to date in %s (%.1f s)", BUILD, time.monotonic() - t0)
    return BUILD, None


def toolchain():
    """The C++ side's versions for the run's machine record; None when nothing was built."""
    if _built is None or _built[0] is None:
        return None

    def first_line(cmd):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    cache = (BUILD / "CMakeCache.txt").read_text(errors="replace")
    cxx = next((line.split("=", 1)[1] for line in cache.splitlines() if line.startswith("CMAKE_CXX_COMPILER:")), "c++")
    return {"grpcpp": first_line(["pkg-config", "--modversion", "grpc++"]),
            "protobuf_cpp": first_line(["pkg-config", "--modversion", "protobuf"]),
            "cxx": first_line([cxx, "--version"]), "build": "Release (-O2)"}


def _read_lines(stream, into):
    for line in stream:
        into.put(line)
    into.put(None)


def run_example(children, case, address, seconds, warmup_s, server_cpu_s, wrap=list):
    """Run `case`'s example against `address` for warmup_s + seconds; its window's figures, plus the
    server's CPU seconds over the window (server_cpu_s() is sampled when it opens and at the end).
    wrap: the example's argv as it is started (harness.dying_with_parent: ended with the bench)."""
    build, why = ensure_built()
    if build is None:
        raise RuntimeError(why)
    program, options, _, _ = CPP_CASES[case]
    cmd = [str(build / program), "--address", address, "--seconds", str(seconds), "--warmup-s", str(warmup_s),
           *options]
    proc = children.add(subprocess.Popen(wrap(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=sys.stderr.fileno(), text=True))
    lines = queue.SimpleQueue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + 120 + warmup_s + seconds
    srv0 = t0 = summary = None
    try:
        while summary is None:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{case}: {program} did not finish in time") from None
            if line is None:
                raise RuntimeError(f"{case}: {program} ended without its summary (exit code {proc.wait(5)})")
            msg = json.loads(line)
            if msg.get("measuring"):
                srv0, t0 = server_cpu_s(), time.perf_counter()
            else:
                summary = msg
        srv1, t1 = server_cpu_s(), time.perf_counter()
        if proc.wait(30) != 0:
            raise RuntimeError(f"{case}: {program} exited {proc.returncode}")
    finally:
        children.stop(proc)
    summary["server_cpu_s"] = None if srv0 is None or srv1 is None else srv1 - srv0
    summary["server_wall_s"] = None if t0 is None else t1 - t0
    return summary


def summarize(case, s):
    """The flat metrics of one C++ case, named as the Python cases' are (harness.summary)."""
    per_agent = CPP_CASES[case][2]
    rate = f"{case}_agent_steps_per_s" if per_agent else f"{case}_steps_per_s"
    out = {
        rate: s["steps_per_s"],
        f"{case}_p50_ms": s["p50_ms"], f"{case}_p99_ms": s["p99_ms"], f"{case}_mean_ms": s["mean_ms"],
        f"{case}_calls": s["calls"],
    }
    if per_agent:
        out[f"{case}_calls_per_s"] = s["calls_per_s"]
    if s["episodes"]:
        out[f"{case}_episodes"] = s["episodes"]
    if s["seconds"] > 0:
        out[f"{case}_client_cpu_cores"] = round(s["cpu_s"] / s["seconds"], 3)
    if s["server_cpu_s"] is not None and s["server_wall_s"]:
        out[f"{case}_server_cpu_cores"] = round(s["server_cpu_s"] / s["server_wall_s"], 3)
        out[f"{case}_server_cpu_us_per_call"] = round(1e6 * s["server_cpu_s"] / max(1, s["calls"]), 1)
    if s["reconnects"]:
        out[f"{case}_reconnects"] = s["reconnects"]
    return out


# (C++ figure, Python figure, ratio key): C++ / Python, when both ran in the same invocation.
_TCP_RATIOS = (
    ("cpp_lockstep_steps_per_s", "stream_lockstep_steps_per_s", "cpp_lockstep_vs_python_stream_lockstep"),
    ("cpp_lockstep_steps_per_s", "step_lockstep_steps_per_s", "cpp_lockstep_vs_python_step_lockstep"),
    ("cpp_batched64_agent_steps_per_s", "batched64_agent_steps_per_s", "cpp_batched64_vs_python_batched64"),
    ("cpp_batched256_agent_steps_per_s", "batched256_agent_steps_per_s", "cpp_batched256_vs_python_batched256"),
)
# ... on each same-host transport against the Python figure of that transport (uds_*, shm_*: the
# names throughput.py gives them), and against the C++ TCP figure of the same run (*_vs_tcp).
RATIOS = _TCP_RATIOS + tuple(
    (f"cpp_{net}_{cpp[len('cpp_'):]}", f"{net}_{py}", f"cpp_{net}_{key[len('cpp_'):]}".replace("python_", f"python_{net}_"))
    for net in NETS for cpp, py, key in _TCP_RATIOS) + tuple(
    (f"cpp_{net}_{rate}", f"cpp_{rate}", f"cpp_{net}_vs_tcp_{rate}")
    for net in NETS for rate in ("lockstep_steps_per_s", "batched64_agent_steps_per_s", "batched256_agent_steps_per_s"))


def ratios(result):
    out = {}
    for cpp, py, key in RATIOS:
        if result.get(cpp) and result.get(py):
            out[key] = round(result[cpp] / result[py], 3)
    return out


NOTES = ("cpp_*: sims/cpp/examples (cartpole: PolicyClient lockstep on the stream, the reward riding "
         "with the next get_action; cartpole_slots: SlotClient on Step) with their own C++ CartPole-v1 "
         "dynamics, build/cpp Release (-O2), timed inside the C++ process after the same warm-up; "
         "server CPU sampled when the program prints the window's start and its figures. "
         "*_vs_python_* = C++ rate / Python rate of the same run: cpp_lockstep vs stream_lockstep "
         "(same API: PolicyClient on the stream) and vs step_lockstep (Python's one-message-each-way "
         "lockstep: SlotClient, 1 slot); cpp_batchedN vs batchedN (SlotClient, N slots). The "
         "simulators differ too: Python steps gymnasium / numpy CartPoles (see *_env_step_us), C++ "
         "plain C++ ones. cpp_uds_* / cpp_shm_*: the same programs against a server on a Unix socket / "
         "with the steps through the shared-memory channel (shm+unix:); cpp_<net>_vs_tcp_* = their rate "
         "over the C++ TCP case's of the same run; cpp_<net>_*_vs_python_<net>_* against the Python "
         "client's figure on the same transport")
