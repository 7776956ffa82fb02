"""ExperienceQueue's hold (hold_while): the consumer's own rule holds puts before they queue.

The trainer's rate limiter uses it (trainer/run/loop.py); its end-to-end bound is
tests/trainer/test_learner_process.py's slow-learner test. Here the rule's contract, with real
threads: a held put waits and then queues once progress() says the rule turned false; an
offer gives up at its timeout and queues nothing; close() and hold_while(None) free every
waiting put, so a stopping server never hangs on a consumer's rule.
"""
import threading
import time

import numpy as np

from simbridge.server.experience import ExperienceQueue
from simbridge.server.sample_batch import MultiAgentBatch, SampleBatch


def _batch(n: int = 3) -> MultiAgentBatch:
    return MultiAgentBatch({"p": SampleBatch({"rewards": np.ones(n, np.float32)})}, n)


def _put_in_thread(q: ExperienceQueue):
    t = threading.Thread(target=q.put, args=(_batch(),), daemon=True)
    t.start()
    return t


def test_a_held_put_waits_for_progress_then_queues():
    q = ExperienceQueue(4)
    held = [True]
    q.hold_while(lambda: held[0])
    t = _put_in_thread(q)
    time.sleep(0.3)
    assert t.is_alive() and q.qsize() == 0, "the put went through while the rule held it"
    held[0] = False
    q.progress()
    t.join(2)
    assert not t.is_alive() and q.qsize() == 1
    assert q.blocked_puts == 1 and q.blocked_s >= 0.25 and q.env_steps_in == 3


def test_a_progress_missed_between_look_and_wait_costs_at_most_a_short_wait():
    q = ExperienceQueue(4)
    held = [True]
    q.hold_while(lambda: held[0])
    t = _put_in_thread(q)
    time.sleep(0.2)
    held[0] = False        # no progress() call at all
    t.join(1)
    assert not t.is_alive() and q.qsize() == 1


def test_a_held_offer_gives_up_at_its_timeout_and_queues_nothing():
    q = ExperienceQueue(4)
    q.hold_while(lambda: True)
    t0 = time.monotonic()
    assert q.offer(_batch(), timeout=0.2) is False
    assert 0.15 <= time.monotonic() - t0 < 1.0 and q.qsize() == 0 and q.batches_in == 0
    q.hold_while(None)
    assert q.offer(_batch(), timeout=0.2) is True and q.qsize() == 1


def test_close_and_dropping_the_rule_free_every_waiting_put():
    for release in ("close", "drop"):
        q = ExperienceQueue(4)
        q.hold_while(lambda: True)
        threads = [_put_in_thread(q) for _ in range(3)]
        time.sleep(0.2)
        assert all(t.is_alive() for t in threads)
        q.close() if release == "close" else q.hold_while(None)
        for t in threads:
            t.join(2)
        assert not any(t.is_alive() for t in threads), release
        assert len(q.get_all()) == 3, release    # nothing lost


def test_rows_admitted_counts_each_policys_rows_before_they_queue_and_a_failed_offer_not_at_all():
    """A hold rule counts what is queued but not yet taken with it (trainer/run/loop.py)."""
    q = ExperienceQueue(1)
    q.put(_batch(3))
    assert q.rows_admitted["p"] == 3 and q.rows_admitted["other"] == 0
    assert q.offer(_batch(5), timeout=0.05) is False     # full
    assert q.rows_admitted["p"] == 3
    q.get()
    assert q.rows_admitted["p"] == 3, "taking is the consumer's to count"


def test_batches_queue_in_the_order_they_were_completed_whichever_thread_puts_them():
    """An episode's rows span consecutive batches: a put that waits (the queue full, or held) must
    not let a batch completed after it overtake it, or a trajectory reaches the learner's n-step
    returns and a recorded dataset out of order (a dataset's episode was once written in two
    pieces). Thread A completes batch 1 and waits inside its put; thread B completes batch 2."""
    from simbridge.server.runtime import BridgeRuntime
    ctx = BridgeRuntime().ctx
    made = iter([_batch(1), _batch(2)])
    ctx.collector.ready = lambda: next(made)
    queued, second_put, first_in_put = [], threading.Event(), threading.Event()
    put = ctx.experience.put

    def slow_first_put(batch):
        if not queued and batch.count == 1:
            first_in_put.set()
            second_put.wait(1.0)   # the old hand-over: B's put came meanwhile, and went first
        else:
            second_put.set()
        queued.append(batch.count)
        put(batch)
    ctx.experience.put = slow_first_put

    def complete_and_deliver():
        with ctx.lock:
            batch = ctx.ready()
        ctx.deliver(batch)
    a = threading.Thread(target=complete_and_deliver)
    a.start()
    assert first_in_put.wait(5)
    b = threading.Thread(target=complete_and_deliver)
    b.start()
    a.join(5)
    b.join(5)
    assert queued == [1, 2]
    assert [x.count for x in ctx.experience.get_all()] == [1, 2]


def test_after_close_puts_on_a_full_queue_keep_their_batches_aside_without_waiting():
    """At a stop the completed batches still in line are put one after another (in order): each
    waited a quarter second for room before it looked at close() (64 simulators: 16 s, past the
    stop's bound for its handlers)."""
    q = ExperienceQueue(1)
    q.put(_batch(1))
    q.close()
    t0 = time.monotonic()
    for n in range(2, 22):
        q.put(_batch(n))
    assert time.monotonic() - t0 < 2.5   # 20 x 0.25 s = 5 s before
    assert [b.count for b in q.get_all()] == list(range(1, 22))   # none lost, in order
