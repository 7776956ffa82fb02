"""LinearQLearner made slow on purpose, for the rate limiter's tests: every gradient update
sleeps `update_sleep_s` first. Importable by a daemon subprocess (and its learner process) as
`algorithm = "slow_learner:SlowLinearQ"` with tests/trainer on PYTHONPATH."""
import time

from linear_q_learner import LinearQLearner


class SlowLinearQ(LinearQLearner):
    DEFAULTS = {**LinearQLearner.DEFAULTS, "update_sleep_s": 0.004}

    def update(self, batch):
        time.sleep(self.config["update_sleep_s"])
        return super().update(batch)
