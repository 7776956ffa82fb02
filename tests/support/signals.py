"""SIGHUP as the process under test would have it, whatever the test runner's own: a run under
nohup (or a CI runner that ignores SIGHUP) passes its SIG_IGN to every child, and the programs keep
an ignored SIGHUP ignored on purpose (simbridge.console.on_hangup). For Popen's preexec_fn."""
import signal


def as_at_a_terminal() -> None:
    """SIGHUP's default, as for a program started at a terminal."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def as_under_nohup() -> None:
    """SIGHUP ignored, as nohup starts a program."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
