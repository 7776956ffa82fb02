"""`simbridge-trainer run` listens before it loads torch, and a simulator started beside it waits.

The trainer binds its port and answers health NOT_SERVING before it imports torch and builds its
learners (trainer/run/listen.py), holding the calls that come meanwhile; a simulator started
first waits for the port (its --connect-timeout), then for the trainer to serve, saying so at
each step, and runs its episodes. Real processes: the trainer CLI and simbridge-sim.
"""
import signal
import subprocess
import sys
import time

import pytest
from grpc_health.v1 import health_pb2

from simbridge.trainer.run.launch import (ROOT, Proc, child_env, free_port, python_module, start_server,
                                          wait_for_health)
from support.daemon import first_health

# Seconds from `simbridge-trainer run` to its port answering. About 1 s on a quiet 2-core VM
# (the CLI's own imports); the bound is for a machine at load 10+. Serving takes the torch import
# and the learners on top (20 s at load 16 before: the port opened only then).
BIND_BOUND_S = 12.0


def test_the_trainer_listens_before_torch_and_a_simulator_started_first_waits_for_it(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    sim = subprocess.Popen(python_module("simbridge.sims.gym_sim", "--address", address, "--episodes", "3",
                                         "--quiet"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=str(ROOT))
    trainer = None
    try:
        # The simulator's default --connect-timeout covers a trainer started after it.
        time.sleep(1.0)
        # learner_process=false: the simulator's three episodes would start a learner process (its
        # imports) that this test, about the start, does not look at
        trainer = Proc("trainer", python_module("simbridge.trainer.cli", "run", "--logdir", tmp_path / "run",
                                                "--address", address, "--set", "run.learner_process=false"))
        bound_s, status = first_health(address, trainer)
        # The port answered before the daemon was ready: torch and the learners load behind it.
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING, status
        assert bound_s < BIND_BOUND_S, f"bound after {bound_s:.1f}s"
        out, err = sim.communicate(timeout=240)
        assert sim.returncode == 0, err
        assert '"episodes": 3' in out, out
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
        if trainer is not None:
            trainer.stop(timeout=60)
    lines = list(trainer.lines)
    said = "\n".join(lines)
    bound = next(i for i, line in enumerate(lines) if f"bound {address}, not serving yet" in line)
    serving = next(i for i, line in enumerate(lines) if f"simbridge-trainer listening on {address}" in line)
    assert bound < serving, said
    assert "a simulator connected before the trainer is ready: its calls wait until it serves" in said, said
    # The simulator said what it waited for: the port, then the trainer to serve.
    assert f"no simbridge trainer at {address} yet" in err and "waiting up to 30 s" in err, err
    assert f"the simbridge trainer at {address} is still starting" in err, err


def test_ctrl_c_while_the_trainer_loads_exits_130_in_one_line(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    trainer = Proc("trainer", python_module("simbridge.trainer.cli", "run", "--logdir", tmp_path / "run",
                                            "--address", address))
    try:
        _, status = first_health(address, trainer)
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING   # still loading torch
        trainer.popen.send_signal(signal.SIGINT)
        assert trainer.popen.wait(30) == 130
    finally:
        trainer.stop(timeout=10)
    trainer.wait_output()
    said = "\n".join(trainer.lines)
    assert "simbridge-trainer: interrupted while starting (nothing served)" in said and "Traceback" not in said, said


def test_a_server_started_on_port_0_is_reached_where_it_says_and_one_that_exits_first_is_quoted():
    """launch.start_server with HOST:0 (what `make demo` does): the server takes a free port and the
    caller dials the one its "listening on" line names. Picking a port first (free_port) and passing
    it left seconds in which another process could take it: `make demo` then failed to bind at load."""
    server = start_server("bridge", python_module("simbridge.server.cli", "--address", "127.0.0.1:0"), "127.0.0.1:0",
                          timeout=60, env=child_env())
    try:
        host, port = server.address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        wait_for_health(server.address, timeout=5)
    finally:
        assert server.stop() == 0
    with pytest.raises(RuntimeError, match=r"(?s)broken exited with code 3 before serving on 127\.0\.0\.1:0:.*no port"):
        start_server("broken", [sys.executable, "-c", "import sys; print('no port for you'); sys.exit(3)"], "127.0.0.1:0",
                     timeout=60)


def test_resume_if_present_starts_a_run_and_then_continues_it(tmp_path):
    """What a supervisor (compose's restart, systemd) needs: one command, run again and again, that
    starts a run the first time and continues it after (a plain `run` refused the logdir it had
    written, so a restarted container never served again)."""
    logdir, cfg = tmp_path / "run", tmp_path / "random.toml"
    cfg.write_text('[policies.default_policy]\nalgorithm = "random"\n')
    said = []
    for i in range(2):
        address = f"127.0.0.1:{free_port()}"
        trainer = Proc(f"trainer{i}", python_module("simbridge.trainer.cli", "run", "--config", cfg, "--logdir",
                                                    logdir, "--address", address, "--resume-if-present"))
        try:
            wait_for_health(address, timeout=240, proc=trainer)
        finally:
            assert trainer.stop(timeout=60) == 0
        said.append("\n".join(trainer.lines))
    assert "holds a run" not in said[0] and "fresh run" in said[0], said[0]
    assert f"{logdir} holds a run: resuming it (--resume-if-present)" in said[1] and "resumed at" in said[1], said[1]
    plain = subprocess.run(python_module("simbridge.trainer.cli", "run", "--config", cfg, "--logdir", logdir,
                                         "--address", f"127.0.0.1:{free_port()}"), capture_output=True, text=True, timeout=120,
                           env=child_env(), cwd=str(ROOT))
    assert plain.returncode == 2 and "already holds a run" in plain.stderr, plain.stderr
