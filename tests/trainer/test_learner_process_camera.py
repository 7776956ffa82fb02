"""A camera policy in a learner process: megabytes of weights going up the pipe while megabytes of
camera rows come down must not block both sides (trainer/run/learner_process.py, _Outbox)."""
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.trainer.run.learner_process import LearnerProcess

ATARI = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


def _camera_rows(n, rng):
    frames = rng.integers(0, 256, (2, n) + ATARI.shape, dtype=np.uint8)
    return SampleBatch(obs=frames[0], new_obs=frames[1], actions=rng.integers(0, 6, n),
                       rewards=rng.normal(size=n).astype(np.float32), terminateds=np.zeros(n, bool),
                       truncateds=np.zeros(n, bool), eps_id=np.zeros(n, np.int64), agent_index=np.zeros(n, np.int64),
                       t=np.arange(n), policy_version=np.zeros(n, np.int64), action_logp=np.full(n, -1.8, np.float32))


@pytest.mark.timeout(300)   # a deadlock shows as a failed join after 90 s
def test_a_camera_policys_learner_process_takes_rows_while_its_weights_wait_to_be_read():
    # nature_cnn and a 512-unit layer: ~7 MB of acting weights per report; 32 camera rows: 1.8 MB per send
    learner = DQNLearner(ATARI, gym.spaces.Discrete(6), {"hidden": [512], "batch_size": 8, "learning_starts": 0,
                                                         "buffer_size": 1_000, "updates_per_step": 0.01, "seed": 0},
                         device="cpu")
    proc = LearnerProcess("camera", learner)
    rng = np.random.default_rng(0)
    batches = [_camera_rows(32, rng) for _ in range(16)]
    failed = []

    def send_all():   # the daemon's loop sends every fragment before it reads the child's reports
        try:
            for b in batches:
                proc.add(b)
        except Exception as e:   # noqa: BLE001 - reported below
            failed.append(e)

    sender = threading.Thread(target=send_all, daemon=True)
    try:
        sender.start()
        sender.join(90)
        assert not sender.is_alive(), "the parent's sends blocked: the child stopped reading rows"
        assert not failed, failed
        deadline = time.monotonic() + 90
        while proc.learner.version < 1 and time.monotonic() < deadline:
            proc.poll(1.0)
        assert proc.learner.version >= 1, "no weights came back from the child"
    finally:
        if sender.is_alive():   # deadlocked: end the child, which unblocks the sender with an error
            proc.proc.kill()
            sender.join(30)
        proc.close()
