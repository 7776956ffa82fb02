"""A camera's uint8 frames through a recorded Minari dataset and back into a learner's replay: bytes
all the way (trainer/data/datasets.py records what the learners get; warm_start.py reads it back)."""
import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from simbridge.server.sample_batch import MultiAgentBatch, SampleBatch
from simbridge.trainer.config.dataset import DatasetSection
from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.wire.columns import OBS

CAMERA = gym.spaces.Box(0, 255, (1, 12, 12), np.uint8)


def test_camera_frames_stay_uint8_in_a_recorded_dataset_and_in_the_replay_it_warm_starts(tmp_path):
    minari = pytest.importorskip("minari")
    from simbridge.trainer.data import warm_start
    from simbridge.trainer.data.datasets import EpisodeRecorder

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (6,) + CAMERA.shape, dtype=np.uint8)
    rec = EpisodeRecorder(DatasetSection(record=True), tmp_path, lambda pid: (CAMERA, gym.spaces.Discrete(3)))
    rec.add(MultiAgentBatch({"p": SampleBatch(obs=frames[:5], new_obs=frames[1:], actions=np.zeros(5, np.int64),
                                              rewards=np.ones(5, np.float32), terminateds=np.arange(5) == 4,
                                              truncateds=np.zeros(5, bool), eps_id=np.zeros(5, np.int64),
                                              agent_index=np.zeros(5, np.int64), t=np.arange(5))}, 5))
    assert rec.close()["p"]["episodes"] == 1
    os.environ["MINARI_DATASETS_PATH"] = str(tmp_path)
    try:
        ds = minari.load_dataset("simbridge/p-v0")
        episode = next(iter(ds.iterate_episodes()))
        assert episode.observations.dtype == np.uint8 and np.array_equal(episode.observations, frames)
        batch = next(iter(warm_start.batches(ds)))
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    assert np.asarray(batch[OBS]).dtype == np.uint8
    learner = DQNLearner(CAMERA, gym.spaces.Discrete(3), {"hidden": [8], "seed": 0, "learning_starts": 0, "batch_size": 2})
    learner.add(batch)
    stored = learner.replay.gather(torch.arange(len(learner.replay)))[OBS]
    assert stored.dtype == torch.uint8
    assert torch.equal(stored[0], torch.as_tensor(frames[0].reshape(-1)))
