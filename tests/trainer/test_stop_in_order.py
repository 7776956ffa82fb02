"""A trainer's stop whatever fails on the way (trainer/daemon.py `_shutdown`): its learner processes
are ended in any case, or they hold the process's exit for good (multiprocessing joins its
children) and a SIGTERM finds nothing left to stop. In process: a daemon that never serves."""
import pytest

from simbridge.trainer.config.trainer_config import parse_config
from simbridge.trainer.daemon import TrainerDaemon


def test_a_failure_while_stopping_still_ends_the_learner_processes(tmp_path, monkeypatch):
    cfg = parse_config(f'[run]\nlogdir = "{tmp_path}"\ndevice = "cpu"\n'
                       f'[policies.default_policy]\nalgorithm = "dqn"\n')
    daemon = TrainerDaemon(cfg)
    closed = []
    monkeypatch.setattr(daemon.loop, "close", lambda: closed.append("learner processes ended"))

    def drain_fails(stop_server):
        raise OSError("the disk went away")
    monkeypatch.setattr(daemon.loop, "drain_while", drain_fails)
    with pytest.raises(OSError, match="the disk went away"):   # said, as before
        daemon._shutdown(server=None)
    assert closed == ["learner processes ended"]
