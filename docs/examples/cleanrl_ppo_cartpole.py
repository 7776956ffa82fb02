"""CleanRL-style single-file PPO learning CartPole from external simulators, through simbridge.

The gymnasium VectorEnv is BridgeVectorEnv: its sub-environments are the slots of separate
`simbridge-sim` processes (started here unless --sims 0). Autoreset is SAME_STEP: an ended
sub-environment's returned observation is its next episode's first and its last one is in
infos["final_obs"], which this PPO bootstraps from when the episode was truncated (the only
change from CleanRL's ppo.py, written for NEXT_STEP envs). Settings follow rl-zoo's CartPole
PPO (8 envs, 32 steps, 20 epochs, minibatch 256, gamma 0.98, lambda 0.8, lr 1e-3 annealed).

    python docs/examples/cleanrl_ppo_cartpole.py              # starts 2 simulators, 4 slots each

Prints a progress line every --print-every seconds (env steps, episodes, mean return of the last
100), then one JSON line: env steps, the last 100 episodes' mean return, whether --target was reached.
"""
import argparse
import collections
import json
import time
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical

from simbridge.trainer.adapters.progress import Progress
from simbridge.trainer.run.launch import Proc, python_module
from simbridge.trainer.adapters.vector_env import BridgeVectorEnv


def layer(i, o, std=np.sqrt(2)):
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, 0.0)
    return lin


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
        self.actor = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                   layer(64, n_actions, 0.01))

    def value(self, x):
        return self.critic(x).squeeze(-1)

    def act(self, x, action=None):
        dist = Categorical(logits=self.actor(x))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.value(x)


def train(envs, total_steps: int, target: float, seed: int, num_steps: int = 32, epochs: int = 20,
          minibatch: int = 256, gamma: float = 0.98, lam: float = 0.8, lr: float = 1e-3, clip: float = 0.2,
          progress: Optional[Progress] = None) -> dict:
    torch.manual_seed(seed)
    n = envs.num_envs
    agent = Agent(envs.single_observation_space.shape[0], envs.single_action_space.n)
    opt = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    obs_buf = torch.zeros((num_steps, n, envs.single_observation_space.shape[0]))
    act_buf, logp_buf, rew_buf, done_buf, val_buf, boot_buf = (torch.zeros((num_steps, n)) for _ in range(6))
    returns = collections.deque(maxlen=100)
    ep_ret = np.zeros(n)
    obs, _ = envs.reset(seed=seed)
    obs = torch.as_tensor(obs)
    steps, episodes, t0, reached = 0, 0, time.monotonic(), None
    iterations = total_steps // (num_steps * n)
    for it in range(iterations):
        frac = 1.0 - it / iterations
        opt.param_groups[0]["lr"] = frac * lr
        for s in range(num_steps):
            obs_buf[s] = obs
            with torch.no_grad():
                action, logp, _, value = agent.act(obs)
            nxt, reward, term, trunc, infos = envs.step(action.numpy())
            steps += n
            ep_ret += reward
            boot = np.zeros(n, np.float32)   # SAME_STEP: a truncated episode's value is its final obs's
            for i in np.flatnonzero(term | trunc):
                returns.append(ep_ret[i])
                episodes += 1
                ep_ret[i] = 0.0
                if trunc[i] and not term[i]:
                    with torch.no_grad():
                        final = torch.as_tensor(np.asarray(infos["final_obs"][i], np.float32))
                        boot[i] = gamma * agent.value(final).item()
            act_buf[s], logp_buf[s], val_buf[s] = action, logp, value
            rew_buf[s] = torch.as_tensor(reward + boot, dtype=torch.float32)
            done_buf[s] = torch.as_tensor(term | trunc, dtype=torch.float32)
            obs = torch.as_tensor(nxt)
            if progress is not None:
                progress.update(steps, episodes, returns)
        if len(returns) == returns.maxlen and np.mean(returns) >= target:
            reached = steps
            break
        with torch.no_grad():   # GAE; a done step does not bootstrap from the next episode's start
            adv = torch.zeros_like(rew_buf)
            last, next_value = 0.0, agent.value(obs)
            for s in reversed(range(num_steps)):
                nonterminal = 1.0 - done_buf[s]
                delta = rew_buf[s] + gamma * next_value * nonterminal - val_buf[s]
                last = delta + gamma * lam * nonterminal * last
                adv[s] = last
                next_value = val_buf[s]
            ret = adv + val_buf
        b_obs, b_act, b_logp = obs_buf.reshape(-1, obs_buf.shape[-1]), act_buf.reshape(-1), logp_buf.reshape(-1)
        b_adv, b_ret = adv.reshape(-1), ret.reshape(-1)
        for _ in range(epochs):
            for mb in torch.randperm(len(b_obs)).split(minibatch):
                _, logp, entropy, value = agent.act(b_obs[mb], b_act[mb].long())
                ratio = (logp - b_logp[mb]).exp()
                a = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg = torch.max(-a * ratio, -a * ratio.clamp(1 - clip * frac, 1 + clip * frac)).mean()
                loss = pg + 0.5 * ((value - b_ret[mb]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                opt.step()
    if progress is not None:
        progress.update(steps, episodes, returns, force=True)
    return {"reached": reached is not None, "env_steps": steps, "steps_to_target": reached,
            "mean_return_100": float(np.mean(returns)) if returns else None,
            "wall_s": round(time.monotonic() - t0, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default="127.0.0.1:50051", help="where the bridge listens (port 0: any free)")
    p.add_argument("--sims", type=int, default=2, help="simulator processes to start here (0: start them yourself)")
    p.add_argument("--slots", type=int, default=4, help="CartPoles per simulator")
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--total-steps", type=int, default=150_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-every", type=float, default=5.0, metavar="S", help="seconds between progress lines")
    a = p.parse_args(argv)
    torch.set_num_threads(1)   # a 64x64 MLP: more threads only contend with the simulators
    single = gym.make("CartPole-v1")
    num_envs = 2 * a.slots if a.sims == 0 else a.sims * a.slots
    envs = BridgeVectorEnv(num_envs, single.observation_space, single.action_space, address=a.address)
    sims = [Proc(f"sim{i}", python_module("simbridge.sims.gym_sim", "--address", envs.address, "--slots", a.slots,
                                          "--seed", a.seed + 100 * i, "--quiet"))
            for i in range(a.sims)]
    progress = Progress("cleanrl_ppo_cartpole", a.print_every)
    progress.say(f"listening on {envs.address}; waiting for simulators whose --slots add up to {num_envs}"
                 + (f" (starting {a.sims} x --slots {a.slots} here)" if a.sims else ""))
    try:
        out = train(envs, a.total_steps, a.target, a.seed, progress=progress)
    except KeyboardInterrupt:   # Ctrl-C: a line, not a traceback; the simulators stop below all the same
        progress.say("interrupted")
        return 130
    finally:
        envs.close()   # the simulators hear that training is over: they stop (exit 0)
        for s in sims:
            s.stop()
    print(json.dumps({"sims": a.sims, "slots": a.slots, **out}))
    return 0 if out["reached"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
