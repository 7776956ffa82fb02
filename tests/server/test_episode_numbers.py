"""Episode numbers (the eps_id column) are unique server-wide, also while a checkpoint reads the
next one: slot banks take numbers without the runtime's lock, and a shared eps_id would join two
episodes' rows (n-step returns, advantages, a recorded dataset's trajectories)."""
import sys
import threading

from simbridge.server.runtime import BridgeRuntime


def test_numbers_stay_unique_while_a_checkpoint_reads_the_next():
    ctx = BridgeRuntime().ctx
    taken, stop = [], threading.Event()

    def take():
        while not stop.is_set() and len(taken) < 400_000:
            taken.append(ctx.next_eps_id())

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # switch threads between almost any two bytecodes
    try:
        t = threading.Thread(target=take)
        t.start()
        peeked = []
        for _ in range(20_000):
            with ctx.lock:   # as TrainerDaemon.checkpoint does
                peeked.append(ctx.next_episode_number())
        stop.set()
        t.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(taken) == len(set(taken)), "an episode number was given twice"
    assert peeked == sorted(peeked) and peeked[-1] <= taken[-1] + 1
    ctx.start_episode_numbers(taken[-1] + 10)
    assert ctx.next_eps_id() == taken[-1] + 10 and ctx.next_episode_number() == taken[-1] + 11
