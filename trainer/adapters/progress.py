"""A learner's progress line on the console, for scripts that train through BridgeVectorEnv.

A training run prints its figures once, at its end; until then a user sees nothing for minutes
and cannot tell a slow run from a hung one. `Progress.update` prints one line every `every_s`
seconds (env steps, episodes, the mean return of the recent ones, steps per second):

    progress = Progress("sb3_ppo_cartpole")
    progress.say(f"waiting for simulators on {env.address}")
    ... progress.update(env_steps, episodes, recent_returns)   # as often as you like
"""
import sys
import time
from typing import Optional, Sequence, TextIO


class Progress:
    def __init__(self, prog: str, every_s: float = 5.0, out: Optional[TextIO] = None):
        if every_s <= 0:
            raise ValueError(f"every_s must be > 0, got {every_s}")
        self.prog, self.every_s = prog, every_s
        self.out = out or sys.stdout
        self._t0: Optional[float] = None   # the first update's time: the wait for simulators is not training
        self._last_t = 0.0
        self._last_steps = 0
        self.lines = 0

    def say(self, text: str) -> None:
        print(f"{self.prog}: {text}", file=self.out, flush=True)

    def update(self, env_steps: int, episodes: int, recent_returns: Sequence[float], force: bool = False) -> bool:
        """Print the line when every_s passed since the last one (or `force`); whether it did."""
        now = time.monotonic()
        if self._t0 is None:
            self._t0, self._last_t, self._last_steps = now, now, env_steps
        if not force and now - self._last_t < self.every_s:
            return False
        rate = (env_steps - self._last_steps) / max(now - self._last_t, 1e-9)
        mean = f"{sum(recent_returns) / len(recent_returns):7.1f}" if len(recent_returns) else "      -"
        self.say(f"env steps {env_steps:8,d} | episodes {episodes:6,d} | return mean({len(recent_returns)}) {mean} | "
                 f"{rate:6.0f} steps/s | {now - self._t0:5.0f} s")
        self._last_t, self._last_steps = now, env_steps
        self.lines += 1
        return True
