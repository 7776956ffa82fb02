"""The cases of bench/throughput.py: a registry whose docstrings make `--help` and `--list`.

A case is a function `(children, seconds) -> {figure: value}` that starts what it measures as child
processes (bench/harness.py) and returns flat figures; REGISTRY maps each name `--cases` takes to
its function and text. The variants (uds_*, shm_*, iter_*, spin_*, cspin_*, cpp_uds_*, cpp_shm_*)
run a base case on another transport or with other settings and prefix its figures; a family's text
is written once.
"""
import functools
import inspect
import logging
import tempfile
import time
from typing import Callable, NamedTuple, Optional

import numpy as np

from bench import cpp_cases, echo
from bench.harness import (WARMUP_S, environ, key, proc_cpu_s, run_clients, start_bridge_server,
                           start_dqn_trainer, summary, dying_with_parent)
from bench.sims import BATCH

log = logging.getLogger("bench")


class Case(NamedTuple):
    run: Callable          # (children, seconds) -> {figure: value}
    doc: str               # its --help text; the first line is its --list line
    family: Optional[str]  # variants of one kind share their text in --help
    default: bool          # run when --cases is not given


REGISTRY = {}   # name -> Case, in the order a full run takes them
ALIASES = {"stream_lockstep": "stream", "unary_lockstep": "unary"}   # the lockstep cases by their figures' prefix
FAMILIES = {}   # family -> its --help text


def register(name, run, doc=None, family=None, default=True):
    REGISTRY[name] = Case(run, inspect.cleandoc(doc or run.__doc__), family, default)


# ---------------------------------------------------------------- the bridge's cases

def _bridge_case(children, seconds, prefix, n, sim_kind, transport, per_agent=False, net="tcp"):
    """n simulators of bench.sims' `sim_kind` against a fresh server on `net`: figures <prefix>_*."""
    proc, address = start_bridge_server(children, net=net)
    try:
        res = run_clients(children, n, sim_kind, address, transport, seconds, proc.pid)
    finally:
        children.stop(proc)
    return summary(key(net, prefix), res, per_agent)


def unary(children, seconds):
    """One CartPole-v1 simulator on PolicyClient, transport="unary": unary_lockstep_*.

    Per step get_action + log_returns, end_episode/start_episode at episode ends."""
    return _bridge_case(children, seconds, "unary_lockstep", 1, "lockstep", "unary")


def stream(children, seconds, net="tcp"):
    """One CartPole-v1 simulator on PolicyClient, transport="stream" (log_returns etc. pipelined): stream_lockstep_*."""
    return _bridge_case(children, seconds, "stream_lockstep", 1, "lockstep", "stream", net=net)


def four_sims(children, seconds):
    """Four stream simulators at once, one process each: four_sims_* (aggregate steps/s)."""
    return _bridge_case(children, seconds, "four_sims", 4, "lockstep", "stream")


def step_lockstep(children, seconds, net="tcp"):
    """One gymnasium CartPole-v1 as a 1-slot simulator on Step (SlotClient): step_lockstep_*.

    Reward, episode end and next observation in one message each way."""
    return _bridge_case(children, seconds, "step_lockstep", 1, "step_lockstep", "stream", net=net)


def batched64(children, seconds, net="tcp"):
    """One batched simulator of 64 slots on Step (SlotClient): batched64_agent_steps_per_s, ...

    The numpy CartPoles of sims/vector_cartpole.py: one message each way per step for all 64,
    per-slot auto-reset."""
    return _bridge_case(children, seconds, "batched64", 1, "slots64", "stream", per_agent=True, net=net)


def batched256(children, seconds, net="tcp"):
    """One batched simulator of 256 slots on Step (SlotClient): batched256_agent_steps_per_s, ..."""
    return _bridge_case(children, seconds, "batched256", 1, "slots256", "stream", per_agent=True, net=net)


def rows64(children, seconds):
    """64 CartPoles as 64 episodes on the row calls (PolicyClient): rows64_*.

    get_actions for 64 ids, log_returns_batch, end_episodes/start_episodes for the finished ones
    (the form a multi-agent simulator uses). Stepped by the bench's own numpy CartPole
    (bench/sims.py's BenchVectorCartPole): gymnasium's SyncVectorEnv costs ~2 ms per step of 64
    copies, more than the bridge, so it would measure gymnasium. Its cost is reported as
    rows64_env_step_us, and SyncVectorEnv's as syncvector64_env_step_us for reference."""
    out = _bridge_case(children, seconds, f"rows{BATCH}", 1, "rows64", "stream", per_agent=True)
    out[f"syncvector{BATCH}_env_step_us"] = syncvector_env_step_us()
    return out


def syncvector_env_step_us(duration_s=0.3):
    """Reference: gymnasium SyncVectorEnv of 64 CartPole-v1 (same-step autoreset), per step."""
    try:
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        env = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(BATCH)],
                            autoreset_mode=AutoresetMode.SAME_STEP)
        env.reset(seed=0)
        actions = np.zeros(BATCH, np.int64)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < duration_s:
            env.step(actions)
            n += 1
        us = 1e6 * (time.perf_counter() - t0) / n
        env.close()
        return round(us, 1)
    except Exception as e:  # only a reference figure
        log.warning("SyncVectorEnv reference failed: %r", e)
        return None


def bare(children, seconds, net="tcp"):
    """The least a Python simulator can do per Step against the real server: bare_step{1,64,256}_*.

    RawStepSim (bench/sims.py): a bare grpcio stream, a prebuilt StepRequest whose seq alone changes,
    answers not decoded; 1, 64 and 256 slots, each against a fresh server. step_lockstep_vs_bare,
    batched64_vs_bare, batched256_vs_bare put SlotClient against it (and *_vs_bare_without_env with
    the simulator's own step time left out: the bare client steps none)."""
    out = {}
    for n in (1, 64, 256):
        out.update(_bridge_case(children, max(1.0, seconds / 2), f"bare_step{n}", 1, f"bare{n}", "stream",
                                per_agent=n > 1, net=net))
    return out


LOCAL_NOTES = ("local*: LocalPolicyClient library defaults; latency = get_action, computed in the "
               "simulator's process; local_dqn*: trainer daemon serving a frozen DQN [128, 128]")


def local(children, seconds):
    """One CartPole-v1 simulator with local inference (LocalPolicyClient): local_*, local_dqn_*.

    Numpy forward passes in the simulator's process, experience uploaded in chunks by a background
    thread: local_steps_per_s against the server's random policy, local_dqn_* against a frozen DQN
    of the CartPole preset's size (4-128-128-2, epsilon 0.02) served by the trainer daemon."""
    out = _bridge_case(children, seconds, "local", 1, "local", "unary")
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        proc, address = start_dqn_trainer(children, tmp)
        try:
            res = run_clients(children, 1, "local", address, "unary", seconds, proc.pid)
        finally:
            children.stop(proc, grace=30.0)
    out.update(summary("local_dqn", res))
    return out


_TCP_ENV = ("GRPC_EXPERIMENTS", "GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "SIMBRIDGE_GRPC_EVENT_ENGINE")
_TCP_ROUNDS = 3


def _on_tcp_path(path, fn):
    """fn() with every process it starts on gRPC's `path`: "iomgr" (what simbridge's programs
    choose, grpc_tuning.py) or "eventengine" (gRPC's own default)."""
    with environ(**dict.fromkeys(_TCP_ENV)):
        if path == "eventengine":
            with environ(SIMBRIDGE_GRPC_EVENT_ENGINE=1):
                return fn()
        from simbridge.wire.grpc_tuning import prefer_iomgr_tcp
        prefer_iomgr_tcp()
        return fn()


def tcp_paths(children, seconds):
    """step_lockstep and batched256 on each of gRPC's TCP paths: iomgr_vs_eventengine_*.

    Every process on gRPC's iomgr TCP path (what simbridge's programs choose,
    simbridge/wire/grpc_tuning.py) and on its default EventEngine path, alternating, 3 short runs
    each (this machine's speed drifts over tens of seconds: only runs next to each other compare):
    each path's median, its runs, and the ratio of the medians."""
    window = max(1.0, seconds / 2)
    out = {}
    for case, figure in ((step_lockstep, "step_lockstep_steps_per_s"), (batched256, "batched256_agent_steps_per_s")):
        got = {"iomgr": [], "eventengine": []}
        for _ in range(_TCP_ROUNDS):
            for path in got:
                got[path].append(_on_tcp_path(path, lambda: case(children, window))[figure])
        med = {path: float(np.median(v)) for path, v in got.items()}
        for path, v in got.items():
            out[f"tcp_{path}_{figure}"] = round(med[path], 1)
            out[f"tcp_{path}_{figure}_runs"] = v
        out[f"iomgr_vs_eventengine_{figure}"] = round(med["iomgr"] / med["eventengine"], 3)
    return out


def cpp(children, seconds, case):
    """A C++ example (bench/cpp_cases.py) against a fresh server, or `<case>_skipped` and why."""
    build, why = cpp_cases.ensure_built()
    if build is None:
        log.warning("%s skipped: %s", case, why)
        return {f"{case}_skipped": why}
    proc, address = start_bridge_server(children, net=cpp_cases.net_of(case))
    try:
        got = cpp_cases.run_example(children, case, address, seconds, WARMUP_S,
                                    functools.partial(proc_cpu_s, proc.pid), dying_with_parent)
    finally:
        children.stop(proc)
    return cpp_cases.summarize(case, got)


# ---------------------------------------------------------------- variants

_SPINS = {"spin": (50, 50),     # both ends spin up to 50 us before they block
          "cspin": (300, 0)}    # the simulator spins up to 300 us for its answer; the bridge blocks


def _spin(children, seconds, case, kind):
    """A shared-memory case whose ends spin on the ring before they block (SIMBRIDGE_SHM_SPIN_US for
    the simulators, SIMBRIDGE_SHM_SERVER_SPIN_US for the server; inherited)."""
    client_us, server_us = _SPINS[kind]
    with environ(SIMBRIDGE_SHM_SPIN_US=client_us, SIMBRIDGE_SHM_SERVER_SPIN_US=server_us):
        out = REGISTRY[case].run(children, seconds)
    return {f"{kind}_{k}": v for k, v in out.items()}


def _iterator(children, seconds, case):
    """A TCP case with the simulators on grpcio's public stream API (spawned simulators inherit it)."""
    with environ(SIMBRIDGE_GRPC_STREAM="iterator"):
        out = REGISTRY[case].run(children, seconds)
    return {f"iter_{k}": v for k, v in out.items()}


def _family(family, members, doc=None, default=True):
    """Register variants of one kind (members: name -> run); their --help text is written once."""
    if doc is not None:
        FAMILIES[family] = inspect.cleandoc(doc)
    first_line = FAMILIES[family].split("\n")[0]
    for name, run in members.items():
        register(name, run, first_line, family, default)


_SPUN = ("shm_step_lockstep", "shm_batched64", "cpp_shm_lockstep", "cpp_shm_batched64")   # spin_, cspin_


def _cpp(*cases):
    return {case: functools.partial(cpp, case=case) for case in cases}


def _spun(kind, cases):
    return {f"{kind}_{case}": functools.partial(_spin, case=case, kind=kind) for case in cases}


# The registry, in the order a full run takes the cases.
register("floor", echo.floor)
register("unary", unary)
register("stream", stream)
register("step_lockstep", step_lockstep)
_family("cpp", _cpp("cpp_lockstep"), """The C++ SDK's CartPole examples (sims/cpp): cpp_*, cpp_*_vs_python_*.

    Built into build/cpp when missing or stale, run against a fresh server and measured the same way
    inside the C++ process: lockstep on PolicyClient's stream, and SlotClient with 64/256 slots on
    Step. Reported beside ratios to the Python client's figures of the same run:
    cpp_lockstep_vs_python_stream_lockstep (the same API, PolicyClient on the stream),
    cpp_lockstep_vs_python_step_lockstep (Python's one-message-each-way lockstep, a 1-slot
    SlotClient), cpp_batchedN_vs_python_batchedN. The C++ simulators step plain C++ CartPoles, the
    Python ones gymnasium's or numpy's (their *_env_step_us), so a ratio is simulator process against
    simulator process. Skipped, with the reason, when the build tools are absent
    (bench/cpp_cases.py).""")
register("four_sims", four_sims)
register("batched64", batched64)
_family("cpp", _cpp("cpp_batched64"))
register("rows64", rows64)
register("batched256", batched256)
_family("cpp", _cpp("cpp_batched256"))
register("local", local)
register("tcp_paths", tcp_paths)
register("bare", bare)
_family("uds", {f"uds_{fn.__name__}": functools.partial(fn, net="uds")
                for fn in (echo.floor, bare, stream, step_lockstep, batched64, batched256)},
        """A case with the server on a Unix socket: uds_<the TCP name>, uds_vs_tcp_* ratios.

        unix:PATH in a private temporary directory, removed at exit (docs/transports.md).""")
_family("iter", {f"iter_{case}": functools.partial(_iterator, case=case)
                 for case in ("stream", "step_lockstep", "batched64", "batched256")},
        """A TCP case on grpcio's public stream API: iter_<its names>, direct_vs_iterator_*.

        The simulators' stream is a queue-fed request iterator drained by gRPC's thread
        (SIMBRIDGE_GRPC_STREAM=iterator): the client as it was before simbridge/client/direct_stream.py.""")
register("shm_floor", echo.shm_floor)
_family("shm", {f"shm_{fn.__name__}": functools.partial(fn, net="shm")
                for fn in (bare, stream, step_lockstep, batched64, batched256)},
        """A case with the steps through shared memory: shm_<the TCP name>, shm_vs_tcp_*, shm_vs_uds_*.

        shm+unix:PATH: the session on the Unix socket, every later message in the rings.
        shm_*_vs_bare puts SlotClient against the bare replay of its Steps, on shm too; shm_*_vs_echo
        against shm_floor's echo.""")
_family("spin", _spun("spin", _SPUN[:2]), """A shared-memory case, both ends spinning up to 50 us before they block: spin_*.

    SIMBRIDGE_SHM_SPIN_US for the simulators (the C++ SDK reads it too),
    SIMBRIDGE_SHM_SERVER_SPIN_US for the server: spinning weighed against blocking in one run. The
    C++ ones run only when named.""")
_family("cspin", _spun("cspin", _SPUN[:2]), """A shared-memory case, the simulator alone spinning up to 300 us for its answer: cspin_*.

    The bridge blocks (SIMBRIDGE_SHM_SERVER_SPIN_US=0). The C++ ones run only when named.""")
_family("cpp_net", _cpp(*(c for c in cpp_cases.CPP_CASES if c not in REGISTRY)),
        """A C++ case on a Unix socket or through shared memory: cpp_uds_*, cpp_shm_*.

        The server on unix:PATH or shm+unix:PATH (the C++ SDK's sims/cpp/src/shm_channel.cpp):
        cpp_<net>_vs_tcp_* against the C++ TCP figure of the same run, cpp_<net>_*_vs_python_<net>_*
        against the Python client's on the same transport.""")
_family("spin", _spun("spin", _SPUN[2:]), default=False)
_family("cspin", _spun("cspin", _SPUN[2:]), default=False)

DEFAULT = tuple(name for name, c in REGISTRY.items() if c.default)


def resolve(words):
    """The registry's names for --cases' words (comma separated names, aliases taken); raises
    ValueError naming the unknown."""
    names = [n.strip() for word in words for n in word.split(",")]
    cases = [ALIASES.get(n, n) for n in names if n]
    unknown = [c for c in cases if c not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown case(s) {unknown}; `--list` shows them all")
    return cases


def help_text(width=100):
    """Every case with its text, a family's once: the epilog of throughput.py's --help."""
    import textwrap

    lines, done = [], set()
    for name, c in REGISTRY.items():
        if c.family in done:
            continue
        names, doc = [name], c.doc
        if c.family is not None:
            done.add(c.family)
            names = [n for n, other in REGISTRY.items() if other.family == c.family]
            doc = FAMILIES[c.family]
        lines += textwrap.wrap(", ".join(names), width, initial_indent="  ", subsequent_indent="  ",
                               break_on_hyphens=False)
        lines += [("      " + line).rstrip() for line in doc.split("\n")]
    return "\n".join(lines)
