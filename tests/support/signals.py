"""SIGHUP and SIGINT as the process under test would have them at a terminal, whatever the test
runner's own: a run under nohup (or a CI runner that ignores SIGHUP) passes its SIG_IGN to every
child, and the programs keep an ignored SIGHUP ignored on purpose (simbridge.console.on_hangup); a
suite started in the background by a non-interactive shell ignores SIGINT too (POSIX), and Python
then never makes a Ctrl-C its KeyboardInterrupt.

A prefix for the child's argv (GNU env resets or ignores the signal, then execs), not a Popen
preexec_fn: that runs Python in the forked child of a test process whose gRPC threads did not come
along, and gRPC's fork handlers aborted such children (SIGABRT, "epoll_wait error: Bad file
descriptor") in a fresh clone's run."""
import subprocess

import pytest

AT_A_TERMINAL = ["env", "--default-signal=HUP,INT"]   # SIGHUP's and SIGINT's defaults, as at a terminal
UNDER_NOHUP = ["env", "--ignore-signal=HUP"]      # SIGHUP ignored, as nohup starts a program

# coreutils 8.31 and later (Debian 11+); elsewhere the tests that need it skip
ENV_SETS_SIGNALS = subprocess.run([*AT_A_TERMINAL, "true"], capture_output=True).returncode == 0
NEEDS_ENV_SIGNALS = pytest.mark.skipif(not ENV_SETS_SIGNALS, reason="needs GNU env's --default-signal "
                                                                    "(coreutils >= 8.31)")


def signal_state(pid: int) -> str:
    """A process's pending, blocked, ignored and caught signals (/proc), for a test whose process
    ran on after a signal."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return " ".join(line.strip() for line in f if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn",
                                                                         "SigCgt")))
    except OSError as e:
        return f"no /proc status ({e})"
