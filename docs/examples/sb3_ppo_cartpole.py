"""Stable-Baselines3's PPO learns CartPole from external simulators, through simbridge.

The learner hosts the bridge (BridgeVectorEnv, wrapped as SB3's VecEnv); the simulators are
separate `simbridge-sim` processes stepping their own CartPoles, 4 slots each:

    python docs/examples/sb3_ppo_cartpole.py                 # starts 2 simulators itself
    python docs/examples/sb3_ppo_cartpole.py --sims 0 &      # or start them yourself:
    simbridge-sim --address 127.0.0.1:50051 --slots 4 &
    simbridge-sim --address 127.0.0.1:50051 --slots 4

It stops when the mean return of the last 100 training episodes reaches --target (SB3's
`ep_rew_mean`, from VecMonitor) or after --max-steps env steps. A progress line every
--print-every seconds (env steps, episodes, mean return of the last 100), then one JSON line.
PPO's settings are rl-zoo's for CartPole-v1 (8 envs, n_steps 32, batch 256, 20 epochs,
gamma 0.98, GAE lambda 0.8, lr and clip range linear from 1e-3 and 0.2). Needs the sb3 extra.
"""
import argparse
import json
import time
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import VecMonitor

from simbridge.trainer.run.launch import Proc, python_module
from simbridge.trainer.adapters.progress import Progress
from simbridge.trainer.adapters.sb3 import SB3VecEnv
from simbridge.trainer.adapters.vector_env import BridgeVectorEnv


def linear(start: float):
    return lambda progress_remaining: progress_remaining * start


def rl_zoo_ppo(env, seed: int = 0) -> PPO:
    """rl-zoo's PPO for CartPole-v1 (n_envs 8)."""
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed, device="cpu",
                verbose=0)
    # SB3's default logger makes an empty SB3-<date> folder in the temp directory at every learn();
    # the progress lines are Progress's
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


class StopAtMeanReturn(BaseCallback):
    """Stops learn() once the mean of the last `episodes` episodes reaches `target`."""

    def __init__(self, target: float, episodes: int = 100):
        super().__init__()
        self.target, self.episodes = target, episodes
        self.reached_at = None

    def mean_return(self):
        buf = list(self.model.ep_info_buffer)[-self.episodes:]
        return float(np.mean([e["r"] for e in buf])) if len(buf) >= self.episodes else None

    def _on_step(self) -> bool:
        m = self.mean_return()
        if m is not None and m >= self.target:
            self.reached_at = self.num_timesteps
            return False
        return True


class PrintProgress(BaseCallback):
    """The progress line, from VecMonitor's episodes."""

    def __init__(self, progress: Progress):
        super().__init__()
        self.progress, self.episodes = progress, 0

    def _on_step(self) -> bool:
        self.episodes += sum("episode" in info for info in self.locals["infos"])
        self.progress.update(self.num_timesteps, self.episodes, self._recent())
        return True

    def _on_training_end(self) -> None:
        self.progress.update(self.num_timesteps, self.episodes, self._recent(), force=True)

    def _recent(self):
        return [e["r"] for e in list(self.model.ep_info_buffer)[-100:]]


def learn(venv, target: float, max_steps: int, seed: int, progress: Optional[Progress] = None) -> dict:
    """PPO on an SB3 VecEnv until the target or the step budget; the run's figures."""
    model = rl_zoo_ppo(VecMonitor(venv), seed)
    stop = StopAtMeanReturn(target)
    t0 = time.monotonic()
    model.learn(max_steps, callback=stop if progress is None else CallbackList([stop, PrintProgress(progress)]))
    return {"reached": stop.reached_at is not None, "env_steps": int(model.num_timesteps),
            "steps_to_target": stop.reached_at, "mean_return_100": stop.mean_return(),
            "wall_s": round(time.monotonic() - t0, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default="127.0.0.1:50051", help="where the bridge listens (port 0: any free)")
    p.add_argument("--sims", type=int, default=2, help="simulator processes to start here (0: start them yourself)")
    p.add_argument("--slots", type=int, default=4, help="CartPoles per simulator")
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-every", type=float, default=5.0, metavar="S", help="seconds between progress lines")
    a = p.parse_args(argv)
    torch.set_num_threads(1)   # a 64x64 MLP: more threads only contend with the simulators
    space = gym.make("CartPole-v1")
    num_envs = 2 * a.slots if a.sims == 0 else a.sims * a.slots
    env = BridgeVectorEnv(num_envs, space.observation_space, space.action_space, address=a.address)
    sims = [Proc(f"sim{i}", python_module("simbridge.sims.gym_sim", "--address", env.address, "--slots", a.slots,
                                          "--seed", a.seed + 100 * i, "--quiet"))
            for i in range(a.sims)]
    progress = Progress("sb3_ppo_cartpole", a.print_every)
    progress.say(f"listening on {env.address}; waiting for simulators whose --slots add up to {num_envs}"
                 + (f" (starting {a.sims} x --slots {a.slots} here)" if a.sims else ""))
    try:
        out = learn(SB3VecEnv(env), a.target, a.max_steps, a.seed, progress)
    except KeyboardInterrupt:   # Ctrl-C: a line, not a traceback; the simulators stop below all the same
        progress.say("interrupted")
        return 130
    finally:
        env.close()   # the simulators hear that training is over: they stop (exit 0)
        for s in sims:
            s.stop()
    print(json.dumps({"sims": a.sims, "slots": a.slots, **out}))
    return 0 if out["reached"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
