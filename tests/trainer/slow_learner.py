"""LinearQLearner made slow (or failing) on purpose, for the rate limiter's tests: every gradient update
sleeps `update_sleep_s` first. Importable by a daemon subprocess (and its learner process) as
`algorithm = "slow_learner:SlowLinearQ"` with tests/trainer on PYTHONPATH."""
import time

from linear_q_learner import LinearQLearner


class SlowLinearQ(LinearQLearner):
    """`started_file`: a path it creates as its first update begins (a test's sign that the learner
    process is inside an update)."""
    DEFAULTS = {**LinearQLearner.DEFAULTS, "update_sleep_s": 0.004, "started_file": ""}

    def update(self, batch):
        if self.config["started_file"]:
            open(self.config["started_file"], "a").close()
        time.sleep(self.config["update_sleep_s"])
        return super().update(batch)


class FailingLinearQ(LinearQLearner):
    """Raises in its `fail_after`+1-th update: a learner process that fails."""
    DEFAULTS = {**LinearQLearner.DEFAULTS, "fail_after": 20}

    def update(self, batch):
        if self.updates >= self.config["fail_after"]:
            raise RuntimeError(f"deliberate failure after {self.updates} updates")
        return super().update(batch)
