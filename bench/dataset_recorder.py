"""The dataset recorder's cost on the learning loop's thread: rows per second it takes in.

    python bench/dataset_recorder.py [--slots 64] [--fragment 200] [--rows 200000] [--episode 200]

Feeds trainer/data/datasets.py's EpisodeRecorder MultiAgentBatches shaped as the bridge delivers
them from a batched CartPole simulator (--slots episodes stepped together, fragments of
--fragment env steps, each episode --episode steps long, so episodes span fragments), writing
to a temporary directory, then loads the dataset back to check the counts. Prints one JSON
object: rows_per_s (intake, including the HDF5 writes), episodes written, write share.
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simbridge.server.sample_batch import MultiAgentBatch, SampleBatch  # noqa: E402
from simbridge.trainer.config.dataset import DatasetSection  # noqa: E402
from simbridge.trainer.data.datasets import EpisodeRecorder  # noqa: E402


def batches(slots: int, fragment: int, rows: int, episode: int):
    """Fragments of `slots` CartPole episodes of `episode` steps each, slot-major within a step."""
    t = np.zeros(slots, np.int64)
    eps = np.arange(slots, dtype=np.int64)
    next_eps = slots
    rng = np.random.default_rng(0)
    done_rows = 0
    while done_rows < rows:
        steps = fragment // 1
        n = steps * slots
        obs = rng.standard_normal((n, 4)).astype(np.float32)
        e = np.empty(n, np.int64)
        term = np.zeros(n, bool)
        for s in range(steps):
            e[s * slots:(s + 1) * slots] = eps
            t += 1
            ended = t >= episode
            term[s * slots:(s + 1) * slots] = ended
            k = int(ended.sum())
            if k:
                eps[ended] = np.arange(next_eps, next_eps + k)
                next_eps += k
                t[ended] = 0
        yield MultiAgentBatch({"p": SampleBatch(obs=obs, new_obs=obs, actions=rng.integers(0, 2, n),
                                                rewards=np.ones(n, np.float32), terminateds=term,
                                                truncateds=np.zeros(n, bool), eps_id=e,
                                                agent_index=np.zeros(n, np.int64),
                                                policy_version=np.zeros(n, np.int64),
                                                action_logp=np.zeros(n, np.float32))}, steps)
        done_rows += n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--fragment", type=int, default=200, help="env steps per fragment")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--episode", type=int, default=200)
    args = p.parse_args()
    spaces = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
    with tempfile.TemporaryDirectory() as d:
        rec = EpisodeRecorder(DatasetSection(record=True), Path(d), lambda pid: spaces)
        data = list(batches(args.slots, args.fragment // args.slots or 1, args.rows, args.episode))
        rows = sum(b.agent_steps() for b in data)
        t0 = time.perf_counter()
        for b in data:
            rec.add(b)
        summary = rec.close()
        wall = time.perf_counter() - t0
        from minari.dataset.minari_dataset import MinariDataset
        ds = MinariDataset(Path(d) / "simbridge" / "p-v0" / "data")
        assert ds.total_steps == rows == summary["p"]["steps"], (ds.total_steps, rows)
        print(json.dumps({"rows": rows, "episodes": ds.total_episodes, "wall_s": round(wall, 3),
                          "rows_per_s": round(rows / wall), "slots": args.slots, "episode_steps": args.episode,
                          "batches": len(data)}))


if __name__ == "__main__":
    main()
