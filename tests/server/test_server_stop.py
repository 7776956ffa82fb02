"""A server stopped while calls are under way: the stop returns only once its handlers have
(bounded), abort() cancels every call at once, and a stream handler's last hand-over blocked on a
full queue nobody drains neither holds its thread forever (the process would hang at exit, as
`make test` once did) nor drops the batch."""
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


def _slow_calls(runtime, delay_s):
    """runtime.handle made to take `delay_s` once `slow` is set; `entered`/`returned` mark it."""
    slow, entered, returned = threading.Event(), threading.Event(), threading.Event()
    handle = runtime.handle

    def slowed(*args, **kwargs):
        if not slow.is_set():
            return handle(*args, **kwargs)
        entered.set()
        time.sleep(delay_s)
        try:
            return handle(*args, **kwargs)
        finally:
            returned.set()
    runtime.handle = slowed
    return slow, entered, returned


def test_stop_waits_for_the_handlers_still_running(make_server):
    """gRPC's stop returns while a handler still runs (it cancels the call, not the thread): a
    step committed then would miss a trainer's final checkpoint, taken right after the stop."""
    srv = make_server()
    client = PolicyClient(srv.address, OBS, ACT)
    eid = client.start_episode()
    client.get_action(eid, np.zeros(2, np.float32))
    slow, entered, returned = _slow_calls(srv.runtime, 0.6)
    slow.set()
    threading.Thread(target=lambda: _quietly(client.get_action, eid, np.zeros(2, np.float32)), daemon=True).start()
    assert entered.wait(10)
    t0 = time.monotonic()
    srv.stop(grace=0)
    assert returned.is_set(), "the server stopped with a handler still running"
    assert time.monotonic() - t0 < 3.0
    assert srv.gate.open_calls() == 0
    client._conn._channel.close()


def test_a_handler_stuck_past_the_bound_is_left_and_said(make_server, monkeypatch, caplog):
    from simbridge.server import service
    monkeypatch.setattr(service, "HANDLERS_WAIT_S", 0.3)
    srv = make_server()
    client = PolicyClient(srv.address, OBS, ACT)
    eid = client.start_episode()
    slow, entered, returned = _slow_calls(srv.runtime, 3.0)
    slow.set()
    threading.Thread(target=lambda: _quietly(client.get_action, eid, np.zeros(2, np.float32)), daemon=True).start()
    assert entered.wait(10)
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="simbridge"):
        srv.stop(grace=0)
    took = time.monotonic() - t0
    assert 0.25 <= took < 2.5 and not returned.is_set()
    assert "1 call(s) still running" in caplog.text
    assert returned.wait(5)
    client._conn._channel.close()


def _quietly(fn, *args):
    try:
        fn(*args)
    except Exception:   # the server stopped under the call: what it answers is not this test's matter
        pass


def test_abort_cancels_the_open_streams_at_once(make_server):
    """A second Ctrl-C can come before the first stop reached the server: abort() cancels every call
    now, so no handler thread stays to hold the process at exit (the trainer once ran on for good,
    its simulator's stream still served, under load)."""
    srv = make_server()
    client = PolicyClient(srv.address, OBS, ACT)
    eid = client.start_episode()
    client.get_action(eid, np.zeros(2, np.float32))
    assert srv.gate.open_calls() == 1   # the client's stream
    t0 = time.monotonic()
    srv.abort()
    assert time.monotonic() - t0 < 1.0
    deadline = time.monotonic() + 5
    while srv.gate.open_calls() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.gate.open_calls() == 0, "the stream's handler still runs after abort()"
    client._conn._channel.close()
