"""A bare server stopped while its experience queue is full and nobody drains it: the stream
handlers' last hand-over must neither hold their threads forever (the process would hang at
exit, as `make test` once did) nor drop the batch."""
import threading
import time

import gymnasium as gym
import numpy as np

from simbridge.client import PolicyClient

OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACT = gym.spaces.Discrete(2)


def test_stop_releases_a_hand_over_blocked_on_a_full_queue(make_server):
    srv = make_server(experience_queue_size=1, rollout_fragment_length=4)
    client = PolicyClient(srv.address, OBS, ACT)
    eid = client.start_episode()
    steps = 0

    def drive():
        nonlocal steps
        try:
            for _ in range(12):   # fragments of 4: the second one blocks on the full queue
                client.get_action(eid, np.zeros(2, np.float32))
                steps += 1
        except Exception:
            pass
    t = threading.Thread(target=drive, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while srv.runtime.experience.qsize() < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)   # the next hand-over is now waiting for room
    assert srv.runtime.experience.blocked_puts == 0 and steps < 12
    srv.stop(grace=0)
    deadline = time.monotonic() + 5
    while srv.runtime.experience.blocked_puts == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.runtime.experience.blocked_puts >= 1, "the blocked hand-over gave up waiting"
    batches = srv.runtime.experience.get_all()
    assert sum(b.env_steps() for b in batches) >= 8, "nothing handed over was dropped"
    client._conn._channel.close()
