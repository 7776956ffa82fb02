"""How well a fixed controller does on CartPole-v1 when a share of its actions is uniformly random.

    python bench/logged_ceiling.py [--episodes 300] [--fractions 0.3,0.314] [--search]

The ceiling beside `bench/learning.py dqn-cartpole-logged` (30% of the actions chosen by the
simulator): a hand-tuned linear controller, a = [0.05, 0.2, 1.5, 0.7] . obs > 0, acts for the rest.
Prints one JSON object per fraction: mean episode length, worst, the share of episodes that reach
500, and the share of blocks of 10 consecutive episodes whose mean is >= 475 (the benchmark's
threshold). Episodes are seeded 0..N-1, the random actions from one generator seeded 0.
With --search, first a cross-entropy search for better weights at the first fraction (6 rounds of
16 candidates, 20 episodes each, the 4 best kept), then the same figures for the weights it found.
"""
import argparse
import json

import gymnasium as gym
import numpy as np

WEIGHTS = np.array([0.05, 0.2, 1.5, 0.7])


def episode_lengths(fraction: float, episodes: int, weights: np.ndarray = WEIGHTS, seed: int = 0) -> np.ndarray:
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    lengths = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed * 100_000 + k)
        done, n = False, 0
        while not done:   # bounded: the env truncates at 500 steps
            action = int(rng.integers(2)) if rng.random() < fraction else int(weights @ obs > 0)
            obs, _, terminated, truncated, _ = env.step(action)
            n, done = n + 1, terminated or truncated
        lengths.append(n)
    env.close()
    return np.array(lengths)


def search(fraction: float) -> np.ndarray:
    """Cross-entropy method over the linear weights, from WEIGHTS; each round on fresh episodes."""
    rng = np.random.default_rng(1)
    mean, std = WEIGHTS.copy(), np.array([0.3, 0.3, 1.0, 0.5])
    for round_ in range(6):
        candidates = mean + std * rng.standard_normal((16, 4))
        scores = [episode_lengths(fraction, 20, c, seed=round_ + 1).mean() for c in candidates]
        elite = candidates[np.argsort(scores)[-4:]]
        mean, std = elite.mean(0), elite.std(0) + 0.02
    return mean


def report(fraction: float, episodes: int, weights: np.ndarray) -> dict:
    lengths = episode_lengths(fraction, episodes, weights)
    blocks = lengths.reshape(-1, 10).mean(1)
    return {"random_fraction": fraction, "weights": [round(float(w), 3) for w in weights], "episodes": episodes,
            "mean_length": round(float(lengths.mean()), 1), "worst": int(lengths.min()),
            "share_500": round(float((lengths == 500).mean()), 3),
            "share_mean10_ge_475": round(float((blocks >= 475).mean()), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=300, help="a multiple of 10")
    ap.add_argument("--fractions", default="0.3,0.314", help="shares of random actions, comma-separated")
    ap.add_argument("--search", action="store_true", help="also search linear weights (a few minutes)")
    args = ap.parse_args()
    if args.episodes < 10 or args.episodes % 10:
        ap.error("--episodes must be a positive multiple of 10")
    fractions = [float(f) for f in args.fractions.split(",")]
    for fraction in fractions:
        print(json.dumps(report(fraction, args.episodes, WEIGHTS)), flush=True)
    if args.search:
        print(json.dumps({"searched": True, **report(fractions[0], args.episodes, search(fractions[0]))}))

if __name__ == "__main__":
    main()
