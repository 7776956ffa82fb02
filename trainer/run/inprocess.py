"""Run a Learner on a gymnasium env stepped in this process, without the bridge.

The learner sees exactly what the trainer daemon gives it behind the bridge:
SampleBatch fragments with the bridge's columns (obs, new_obs, actions, rewards,
terminateds, truncateds, eps_id, agent_index, t, policy_version, action_logp),
passed to `learner.add(batch)` and followed by `learner.train()` every `fragment`
env steps; actions come from `learner.compute_actions`, whose weights change only
in train(). Fragments are cut anywhere, across episode ends, like the bridge's
`truncate_episodes` mode (its default rollout_fragment_length is 200).

A gymnasium truncation (time limit) gives truncateds=True, terminateds=False and
new_obs = the final observation, so learners bootstrap from it.

Used by the tests, and by bench/learning.py as the no-bridge reference
(`inprocess_wall_s`).

    from simbridge.trainer.learners.dqn import DQNLearner
    from simbridge.trainer.learners.presets import DQN_CARTPOLE
    env = gym.make("CartPole-v1")
    learner = DQNLearner(env.observation_space, env.action_space, {**DQN_CARTPOLE, "seed": 0})
    out = run_inprocess(learner, "CartPole-v1", 50_000, seed=0, fragment=32, log_every=5_000)
"""
import sys
import time
from typing import Optional

import gymnasium as gym
import numpy as np
import torch

from simbridge.server.batch_builder import SampleBatchBuilder
from simbridge.wire import tree
from simbridge.wire.columns import (ACTION_LOGP, ACTIONS, AGENT_INDEX, EPS_ID, NEW_OBS, OBS, POLICY_VERSION,
                                    REWARDS, T, TERMINATEDS, TRUNCATEDS)


def run_inprocess(learner, env_id: str, total_steps: int, seed: int, log_every: Optional[int] = None,
                  fragment: int = 1, stop_at_return: Optional[float] = None, window: int = 10,
                  torch_threads: Optional[int] = 1, env_kwargs: Optional[dict] = None,
                  off_policy_fraction: float = 0.0) -> dict:
    """Step `env_id` for `total_steps` env steps with `learner` acting and learning.

    fragment: env steps per SampleBatch handed to learner.add (then learner.train()).
    stop_at_return: stop early once the mean return of the last `window` episodes reaches it (at
        that episode's end, before training on the fragment under way: wall_s is the time to it).
    torch_threads: torch.set_num_threads for the run (None leaves it alone).
    off_policy_fraction: with this probability per step the harness picks a uniformly random
        action itself, recorded as the bridge records LogAction rows (policy_version -1,
        action_logp NaN), like `simbridge-sim --off-policy-fraction`.

    Returns dict(env_steps, episodes, returns (per episode), lengths, episode_end_steps (env step
    count at each episode's end), wall_s, updates, reached_step (first env step at which the mean
    of the last `window` returns reached stop_at_return, else None)).
    """
    if fragment < 1:
        raise ValueError("fragment must be >= 1")
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    env = gym.make(env_id, **(env_kwargs or {}))
    env.action_space.seed(seed)
    coin = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    builder = SampleBatchBuilder()
    returns, lengths, end_steps = [], [], []
    eps_id, t, ep_return = 0, 0, 0.0
    reached_step = None
    start = time.perf_counter()
    steps = 0
    while steps < total_steps:
        batch_obs = tree.map_structure(lambda x: np.asarray(x)[None], obs)
        if off_policy_fraction and coin.random() < off_policy_fraction:
            action, logp, version = env.action_space.sample(), np.float32(np.nan), -1
        else:
            out = learner.compute_actions(batch_obs, explore=True)
            action = tree.take(out.actions, 0)
            logp = np.float32(np.nan) if out.logp is None else np.float32(out.logp[0])
            version = learner.version
        new_obs, reward, terminated, truncated, _ = env.step(action)
        steps += 1
        builder.add_row({OBS: obs, NEW_OBS: new_obs, ACTIONS: action, REWARDS: np.float32(reward),
                         TERMINATEDS: bool(terminated), TRUNCATEDS: bool(truncated and not terminated),
                         EPS_ID: eps_id, AGENT_INDEX: 0, T: t, POLICY_VERSION: version, ACTION_LOGP: logp})
        ep_return += float(reward)
        t += 1
        if terminated or truncated:
            returns.append(ep_return)
            lengths.append(t)
            end_steps.append(steps)
            if stop_at_return is not None and reached_step is None and len(returns) >= window \
                    and np.mean(returns[-window:]) >= stop_at_return:
                reached_step = steps
            eps_id, t, ep_return = eps_id + 1, 0, 0.0
            obs, _ = env.reset()
        else:
            obs = new_obs
        if reached_step is not None:
            break   # the wall time to the target: training on the rows after it is not part of it
        if builder.count >= fragment or steps >= total_steps:
            learner.add(builder.build())
            learner.train()
        if log_every and steps % log_every == 0:
            recent = np.mean(returns[-window:]) if returns else float("nan")
            print(f"[inprocess] steps {steps} episodes {len(returns)} mean{window} {recent:.1f} "
                  f"updates {learner.updates} {_fmt(learner.last_metrics)} "
                  f"{steps / (time.perf_counter() - start):.0f} steps/s", file=sys.stderr, flush=True)
    env.close()
    return {"env_steps": steps, "episodes": len(returns), "returns": returns, "lengths": lengths,
            "episode_end_steps": end_steps, "wall_s": time.perf_counter() - start,
            "updates": learner.updates, "reached_step": reached_step}


def first_reach(result: dict, threshold: float, window: int = 10) -> Optional[int]:
    """Env step at which the mean of the last `window` returns first reached `threshold`."""
    r = result["returns"]
    for i in range(window - 1, len(r)):
        if np.mean(r[i - window + 1:i + 1]) >= threshold:
            return result["episode_end_steps"][i]
    return None


def _fmt(metrics: dict) -> str:
    return " ".join(f"{k} {v:.3g}" for k, v in metrics.items())


def main(argv=None) -> None:
    """python -m simbridge.trainer.run.inprocess --steps 50000 --seed 0 --fragment 32  (DQN, CartPole preset)"""
    import argparse
    import json

    from simbridge.trainer.learners.dqn import DQNLearner
    from simbridge.trainer.learners.presets import DQN_CARTPOLE

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fragment", type=int, default=1)
    ap.add_argument("--config", default="{}", help="JSON overrides of DQN_CARTPOLE")
    ap.add_argument("--log-every", type=int, default=5_000)
    ap.add_argument("--device", default=None)
    ap.add_argument("--off-policy-fraction", type=float, default=0.0)
    args = ap.parse_args(argv)
    env = gym.make(args.env)
    learner = DQNLearner(env.observation_space, env.action_space,
                         {**DQN_CARTPOLE, **json.loads(args.config), "seed": args.seed}, device=args.device)
    out = run_inprocess(learner, args.env, args.steps, args.seed, log_every=args.log_every,
                        fragment=args.fragment, off_policy_fraction=args.off_policy_fraction)
    r = out["returns"]
    print(json.dumps({"seed": args.seed, "fragment": args.fragment, "env_steps": out["env_steps"],
                      "episodes": out["episodes"], "updates": out["updates"],
                      "steps_to_475": first_reach(out, 475), "steps_to_150": first_reach(out, 150),
                      "final_mean10": float(np.mean(r[-10:])) if r else None,
                      "wall_s": round(out["wall_s"], 1)}))


if __name__ == "__main__":
    main()
