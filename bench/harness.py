"""The process harness of the benches: servers and simulators in processes of their own.

A bridge server (`python -m simbridge.server.cli`) or the trainer daemon is started on a fresh
loopback port or Unix socket and waited for with the gRPC health check (simbridge.trainer.run.launch,
as the demo and the trainer start theirs); simulators run in spawned client processes, so client and
server never share a GIL, each measuring a window after a warm-up. `Children` ends every child
process whatever happened; `proc_cpu_s` reads a process's CPU time from /proc.

Importing this module puts gRPC on the TCP path simbridge's programs choose, before grpc loads
(simbridge/wire/grpc_tuning.py), and keeps loopback traffic off any proxy.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc
import contextlib  # noqa: E402
import logging  # noqa: E402
import multiprocessing as mp  # noqa: E402
import os  # noqa: E402
import queue  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bench.sims import SIMS  # noqa: E402
from simbridge.trainer.run.launch import Proc, child_env, free_port, python_module, wait_for_health  # noqa: E402

HOST = "127.0.0.1"          # everything here talks to loopback only
WARMUP_S = 1.0
log = logging.getLogger("bench")

for _var in ("no_grpc_proxy", "no_proxy"):   # gRPC honours http(s)_proxy: never for loopback
    os.environ[_var] = ",".join(filter(None, [os.environ.get(_var, ""), "127.0.0.1", "localhost"]))

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_s(pid):
    """user+system CPU seconds of a process, all its threads (Linux /proc); None elsewhere or once
    it is gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


try:  # children get SIGTERM if this process dies without cleaning up (Linux)
    import ctypes

    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError, ImportError):
    _prctl = None


def die_with_parent():
    """This process gets SIGTERM when its parent dies, even by SIGKILL (Linux). For a process of
    its own (a multiprocessing child); a child started by argv takes `dying_with_parent(argv)`."""
    if _prctl is not None:
        _prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_SETPRIV = shutil.which("setpriv")


def dying_with_parent(argv):
    """argv, started so that it gets SIGTERM when this process dies (util-linux's setpriv sets
    PR_SET_PDEATHSIG, then execs). Not a Popen preexec_fn: Python in the forked child of a process
    running gRPC threads can be aborted by gRPC's fork handlers (tests/support/signals.py)."""
    return [_SETPRIV, "--pdeathsig", "TERM", *argv] if _SETPRIV else list(argv)


class Children:
    """Every child process of the run (launch.Proc, Popen or multiprocessing.Process); stop_all()
    ends them whatever happened."""

    def __init__(self):
        self.procs = []

    def add(self, p):
        self.procs.append(p)
        return p

    def stop(self, p, grace=5.0):
        if isinstance(p, Proc):
            p.stop(grace)   # SIGTERM (server_cli stops cleanly on it), then SIGKILL
        elif isinstance(p, subprocess.Popen):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(grace)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        else:  # multiprocessing.Process
            if p.is_alive():
                p.join(0.2)
            if p.is_alive():
                p.terminate()
                p.join(grace)
            if p.is_alive():
                p.kill()
                p.join(5)
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        for p in list(self.procs):
            try:
                self.stop(p, grace=3.0)
            except Exception:
                log.exception("could not stop child %r", p)


@contextlib.contextmanager
def environ(**values):
    """os.environ with `values` set (None: unset) while the block runs, and as it was afterwards;
    spawned children inherit it."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------- servers

_SOCKDIR = []   # one private directory for every Unix socket of the run, removed at exit


def socket_dir():
    """The run's private directory for Unix sockets (made on first use, removed at exit)."""
    if not _SOCKDIR:
        import atexit
        import shutil
        import tempfile

        _SOCKDIR.append(tempfile.mkdtemp(prefix="sb-bench-"))
        atexit.register(shutil.rmtree, _SOCKDIR[0], True)
    return _SOCKDIR[0]


def listen_address(net):
    """A fresh address to serve on: a free loopback port ("tcp"), a socket path ("uds"), or a
    socket path whose steps go through shared memory ("shm": shm+unix:PATH)."""
    if net == "tcp":
        return f"{HOST}:{free_port(HOST)}"
    scheme = "shm+unix" if net == "shm" else "unix"
    return f"{scheme}:{socket_dir()}/{uuid.uuid4().hex[:8]}.sock"


def key(net, name):
    """A figure's name: the TCP names as they are, the Unix socket's with a uds_ prefix, the
    shared-memory channel's with shm_."""
    return name if net == "tcp" else f"{net}_{name}"


def _to_stderr(name, line):
    print(line, file=sys.stderr, flush=True)   # stdout belongs to the bench's JSON


def _start(children, name, argv, address, timeout_s):
    """launch.Proc of argv, once its health check answers; None if it exited with code 2 (its port
    was taken meanwhile), an error for any other failure."""
    proc = children.add(Proc(name, dying_with_parent(argv), on_line=_to_stderr, env=child_env()))
    try:
        wait_for_health(address, timeout_s, proc)
        return proc
    except BaseException:
        children.stop(proc)
        if proc.poll() == 2:
            return None
        raise


def start_bridge_server(children, timeout_s=60.0, net="tcp"):
    """`python -m simbridge.server.cli` (random policy) on a free loopback port or a Unix socket;
    returns (launch.Proc, address)."""
    for _ in range(3):
        address = listen_address(net)
        proc = _start(children, "simbridge-server", python_module(
            "simbridge.server.cli", "--address", address, "--print-every", "0", "--log-level", "WARNING"),
            address, timeout_s)
        if proc is not None:
            return proc, address
    raise RuntimeError("could not start a simbridge server on a free port")


def start_dqn_trainer(children, logdir, timeout_s=120.0):
    """`python -m simbridge.trainer.cli run` with one frozen DQN policy of the CartPole preset's size
    (4-128-128-2, epsilon 0.02) on a free loopback port; returns (launch.Proc, address)."""
    address = listen_address("tcp")
    cfg = Path(logdir) / "bench_dqn.toml"
    cfg.write_text(f"""policies_to_train = []
[server]
address = "{address}"
experience_queue_size = 64
[run]
logdir = "{Path(logdir) / 'run'}"
print_every_s = 600.0
checkpoint_every_env_steps = 0
torch_threads = 1
[policies.default_policy]
algorithm = "dqn"
config = {{ hidden = [128, 128], epsilon_initial = 0.02, epsilon_final = 0.02, seed = 0 }}
""")
    argv = python_module("simbridge.trainer.cli", "run", "--config", cfg, "--log-level", "WARNING")
    proc = _start(children, "simbridge-trainer", argv, address, timeout_s)
    if proc is None:
        raise RuntimeError(f"trainer daemon at {address}: its port was taken")
    return proc, address


# ---------------------------------------------------------------- simulators in client processes

def _client_main(idx, sim_kind, address, transport, seconds, barrier, results, server_pid):
    """Child process: set up one simulator, wait for the others, warm up, measure."""
    os.dup2(2, 1)  # stdout belongs to the parent's JSON
    die_with_parent()   # a simulator left alone would retry its server for ever
    try:
        sim = SIMS[sim_kind](address, transport, seed=idx)
        barrier.wait(timeout=120)  # all simulators of a case start together
        t_warm = time.perf_counter() + WARMUP_S
        while time.perf_counter() < t_warm:
            sim.step(False)
        cpu0, srv0 = time.process_time(), proc_cpu_s(server_pid)
        t0 = time.perf_counter()
        t_end = t0 + seconds
        steps = agent_steps = 0
        while True:
            agent_steps += sim.step(True)
            steps += 1
            if time.perf_counter() >= t_end:
                break
        elapsed = time.perf_counter() - t0
        cpu1, srv1 = time.process_time(), proc_cpu_s(server_pid)
        sim.close()
        results.put((idx, "ok", {
            "steps": steps, "agent_steps": agent_steps, "elapsed_s": elapsed,
            "lat_ms": np.asarray(sim.lat_ms), "env_s": sim.env_s, "episodes": sim.episodes,
            "client_cpu_s": cpu1 - cpu0,
            "server_cpu_s": None if srv0 is None or srv1 is None else srv1 - srv0,
        }))
    except BaseException:
        results.put((idx, "error", traceback.format_exc()))


def run_clients(children, n, sim_kind, address, transport, seconds, server_pid):
    """n client processes of bench.sims' `sim_kind`; returns their result dicts (raises if one fails)."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [children.add(ctx.Process(target=_client_main, name=f"bench-{sim_kind}-{i}", daemon=True,
                                      args=(i, sim_kind, address, transport, seconds, barrier, results,
                                            server_pid if i == 0 else None)))
             for i in range(n)]
    for p in procs:
        p.start()
    out = {}
    deadline = time.monotonic() + 120 + WARMUP_S + seconds
    try:
        while len(out) < n:
            try:
                idx, status, payload = results.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise RuntimeError(f"client process {dead[0].name} died (exit code {dead[0].exitcode})")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{sim_kind} clients did not finish in time")
                continue
            if status != "ok":
                raise RuntimeError(f"client {idx} ({sim_kind}, {transport}) failed:\n{payload}")
            out[idx] = payload
    finally:
        for p in procs:
            children.stop(p)
    return [out[i] for i in range(n)]


def summary(prefix, res, per_agent=False):
    """Flat metrics of one case from the result dicts of its client processes."""
    lat = np.concatenate([r["lat_ms"] for r in res])
    steps = sum(r["agent_steps" if per_agent else "steps"] / r["elapsed_s"] for r in res)
    p50, p99 = np.percentile(lat, [50, 99])
    out = {
        f"{prefix}_steps_per_s": round(float(steps), 1),
        f"{prefix}_p50_ms": round(float(p50), 4),
        f"{prefix}_p99_ms": round(float(p99), 4),
        f"{prefix}_mean_ms": round(float(lat.mean()), 4),
        f"{prefix}_calls": int(lat.size),
    }
    if per_agent:
        out[f"{prefix}_agent_steps_per_s"] = out.pop(f"{prefix}_steps_per_s")
        out[f"{prefix}_calls_per_s"] = round(float(sum(r["steps"] / r["elapsed_s"] for r in res)), 1)
    total_calls = sum(r["steps"] for r in res)
    if any(r["env_s"] for r in res):
        out[f"{prefix}_env_step_us"] = round(1e6 * sum(r["env_s"] for r in res) / total_calls, 2)
    if any(r["episodes"] for r in res):
        out[f"{prefix}_episodes"] = int(sum(r["episodes"] for r in res))
    window = res[0]["elapsed_s"]
    out[f"{prefix}_client_cpu_cores"] = round(sum(r["client_cpu_s"] / r["elapsed_s"] for r in res), 3)
    # CPU per call: what a client costs, steadier than rates when other work shares the machine
    out[f"{prefix}_client_cpu_us_per_call"] = round(1e6 * sum(r["client_cpu_s"] for r in res) / max(1, total_calls), 1)
    if res[0]["server_cpu_s"] is not None:
        out[f"{prefix}_server_cpu_cores"] = round(res[0]["server_cpu_s"] / window, 3)
        out[f"{prefix}_server_cpu_us_per_call"] = round(
            1e6 * res[0]["server_cpu_s"] / max(1, sum(r["steps"] for r in res)), 1)
    return out
