"""`simbridge-server` (the bridge alone, random actions) as a process: it stops in order, exit 0, on
SIGTERM, on SIGHUP (its terminal closed) and when the reader of its progress lines leaves (`| head`);
before, the last two killed it (SIGHUP) or ended it with a BrokenPipeError traceback."""
import signal
import subprocess

import pytest

from simbridge.trainer.run.launch import ROOT, child_env, python_module
from support.signals import AT_A_TERMINAL, NEEDS_ENV_SIGNALS, signal_state


@pytest.mark.parametrize("how", ["sigterm", pytest.param("sighup", marks=NEEDS_ENV_SIGNALS), "reader-leaves"])
def test_the_bare_bridge_stops_in_order(how):
    argv = python_module("simbridge.server.cli", "--address", "127.0.0.1:0", "--print-every", "0.1")
    if how == "sighup":
        argv = [*AT_A_TERMINAL, *argv]
    # faulthandler: a server that runs on is made to show where (below)
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**child_env(), "PYTHONFAULTHANDLER": "1"}, cwd=str(ROOT))
    try:
        for _ in range(2):   # its listening line and a first progress line
            assert server.stdout.readline(), server.stderr.read()
        if how == "reader-leaves":
            server.stdout.close()
        else:
            server.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGHUP)
        try:
            code = server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"simbridge-server ran on ({how}): {_where_it_waits(server)}")
        err = server.stderr.read()
        assert code == 0 and "Traceback" not in err, (code, err)
        if how != "reader-leaves":
            assert '"final"' in server.stdout.read()   # its last line: the final counts
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _where_it_waits(server: subprocess.Popen) -> str:
    """Its signal state (pending, blocked, ignored, caught: seen once in a fresh clone's run, where
    SIGHUP left it running) and every thread's stack (faulthandler, on SIGABRT)."""
    state = signal_state(server.pid)
    server.send_signal(signal.SIGABRT)
    try:
        _, err = server.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        err = "(no stack: it did not end on SIGABRT)"
    return f"{state}\n{err[-6000:]}"
