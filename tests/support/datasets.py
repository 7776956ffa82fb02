"""Minari datasets small enough to write inside a test. Needs the datasets extra: the caller
importorskips minari first."""
from pathlib import Path

import numpy as np


def tiny_dataset(path: Path) -> Path:
    """A Minari dataset of one 2-step episode (observation Box(3,), action Discrete(2)) at path."""
    import gymnasium as gym
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    data = path / "data"
    data.mkdir(parents=True)
    store = MinariStorage.new(data, observation_space=gym.spaces.Box(-1, 1, (3,), np.float32),
                              action_space=gym.spaces.Discrete(2), jpeg_encoding=False)
    store.update_metadata({"dataset_id": "other-v0", "minari_version": minari.__version__})
    store.update_episodes([EpisodeBuffer(observations=np.zeros((3, 3), np.float32), actions=np.zeros(2, np.int64),
                                         rewards=np.ones(2, np.float32), terminations=np.array([False, True]),
                                         truncations=np.zeros(2, bool))])
    return path
