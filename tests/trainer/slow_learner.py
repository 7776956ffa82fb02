"""LinearQLearner made slow (or failing) on purpose, for the rate limiter's tests: every gradient update
sleeps `update_sleep_s` first. Importable by a daemon subprocess (and its learner process) as
`algorithm = "slow_learner:SlowLinearQ"` with tests/trainer on PYTHONPATH."""
import time

from linear_q_learner import LinearQLearner


class SlowLinearQ(LinearQLearner):
    DEFAULTS = {**LinearQLearner.DEFAULTS, "update_sleep_s": 0.004}

    def update(self, batch):
        time.sleep(self.config["update_sleep_s"])
        return super().update(batch)


class FailingLinearQ(LinearQLearner):
    """Raises in its `fail_after`+1-th update: a learner process that fails."""
    DEFAULTS = {**LinearQLearner.DEFAULTS, "fail_after": 20}

    def update(self, batch):
        if self.updates >= self.config["fail_after"]:
            raise RuntimeError(f"deliberate failure after {self.updates} updates")
        return super().update(batch)
