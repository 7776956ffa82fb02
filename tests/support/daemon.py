"""The trainer daemon as a real process in tests: starting it, the environment its children get, when
its port first answers, simulator processes beside it, the metrics it writes and a hard kill.
Ports, the child environment and polite stops are simbridge.trainer.run.launch's (free_port,
child_env, start_server, stop_all)."""
import json
import os
import time
from pathlib import Path
from typing import List, Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from simbridge.trainer.run.launch import ROOT, Proc, child_env, python_module, start_server
from simbridge.wire.grpc_tuning import RECONNECT_OPTIONS

# tests/trainer holds the learners the tests' configs name by module (linear_q_learner, slow_learner).
LEARNERS = Path(__file__).resolve().parents[1] / "trainer"

# A config's address for a trainer that takes a free port and names it (launch.start_server): a port
# picked beforehand (free_port) could be taken by another test in the seconds the trainer loads torch.
ANY = "127.0.0.1:0"


def daemon_env() -> dict:
    """launch.child_env, with the checkout and tests/trainer importable in the child."""
    return child_env({"PYTHONPATH": os.pathsep.join([str(ROOT), str(LEARNERS)])})


def metrics(logdir: Path) -> List[dict]:
    """Every complete record of logdir/metrics.jsonl (none yet: []). A last line without its newline
    is a record the trainer is writing: left for the next read (a test polling a live run read half
    a record once, in a CI run under load). Unlike reporting.read_metrics, records a resume dropped
    are kept and a torn line before the last still fails: the tests look at what the file holds."""
    path = logdir / "metrics.jsonl"
    if not path.exists():
        return []
    complete = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in complete if line.strip()]


def start_trainer(cfg: Path, *args: str, name: str = "trainer", timeout: float = 60.0, keep: int = 5000,
                  env: Optional[dict] = None) -> Proc:
    """`simbridge-trainer run --config cfg *args`, whose config's address is ANY, once its port answers
    health; its `address` is the port it took. env: daemon_env() unless given."""
    return start_server(name, python_module("simbridge.trainer.cli", "run", "--config", str(cfg), *args), ANY,
                        timeout=timeout, env=daemon_env() if env is None else env, keep=keep)


def start_sim(name: str, module: str, address: str, *args) -> Proc:
    """A Python simulator module as a process against `address`, without its progress output."""
    return Proc(name, python_module(module, "--address", address, "--quiet", *args), env=daemon_env())


def kill(*procs) -> None:
    """SIGKILL each live process and reap it: a test's cleanup, which must not wait for a graceful
    stop (launch.stop_all is the polite one). None entries are skipped."""
    for p in procs:
        if p is not None and p.poll() is None:
            p.popen.kill()
            p.popen.wait()


def first_health(address: str, proc: Proc, timeout_s: float = 60.0):
    """(seconds until the port first answered health, the status it answered then)."""
    t0 = time.monotonic()
    # RECONNECT_OPTIONS: a channel's attempts stay close together (gRPC's own backoff grows to
    # minutes), so the first answer is seen when it comes.
    with grpc.insecure_channel(address, options=RECONNECT_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() - t0 < timeout_s:
            assert proc.poll() is None, "\n".join(proc.lines)
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status
                return time.monotonic() - t0, status
            except grpc.RpcError:
                time.sleep(0.02)
    raise AssertionError(f"the trainer's port did not answer within {timeout_s}s:\n" + "\n".join(proc.lines))
