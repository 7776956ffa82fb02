"""A CartPole simulator that chooses its own actions (a balancing rule, with probability
--epsilon a random action instead) and reports them with log_action: the off-policy data of
RLlib's log_action pattern, for the dataset tests. Prints a JSON summary at the end:
{"episodes": finished episodes, "steps": env steps, "lengths": [...]}.

    python tests/trainer/scripted_cartpole.py --address 127.0.0.1:50051 --episodes 40 --epsilon 0.5
"""
import argparse
import json

import gymnasium as gym
import numpy as np

from simbridge.client import PolicyClient


def rule(obs) -> int:
    """Push the cart toward where the pole falls (pole angle and angular velocity first)."""
    return int(obs[2] + 0.5 * obs[3] + 0.05 * obs[1] + 0.01 * obs[0] > 0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--epsilon", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(args.seed)
    client = PolicyClient(args.address, env.observation_space, env.action_space)
    lengths = []
    for ep in range(args.episodes):
        obs, _ = env.reset(seed=args.seed + ep)
        eid = client.start_episode()
        n = 0
        while True:
            action = rule(obs) if rng.random() >= args.epsilon else int(rng.integers(2))
            client.log_action(eid, obs, action)
            obs, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(eid, reward)
            n += 1
            if terminated or truncated:
                client.end_episode(eid, obs, truncated=truncated and not terminated)
                break
        lengths.append(n)
    client.close()
    print(json.dumps({"episodes": len(lengths), "steps": sum(lengths), "lengths": lengths}), flush=True)


if __name__ == "__main__":
    main()
