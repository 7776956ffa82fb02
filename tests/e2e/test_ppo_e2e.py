"""PPO learning through the bridge: the trainer daemon and a simbridge-sim process over loopback gRPC.

The simulator overrides 30% of the actions with its own random choice (log_action): PPO must drop
those rows (no behaviour logp for them) and count them, and still learn from the rest. In process,
PPO's CartPole preset with 30% logged actions passes a mean of 150 over the last 10 episodes
within ~10k env steps; the test allows 30k.
"""
import time

import pytest

from support.learning import r10, run
from simbridge.trainer.config.values import toml_value
from simbridge.trainer.learners.presets import PPO_CARTPOLE

PRESET = toml_value({**PPO_CARTPOLE, "seed": 0})   # trainer/learners/presets.py


@pytest.mark.timeout(300)   # a learning run: 1-2 minutes at load 5-10
def test_ppo_learns_cartpole_through_the_bridge_and_drops_the_simulators_own_actions(tmp_path):
    tables = f"""[policies.default_policy]
algorithm = "ppo"
config = {PRESET}"""
    sim = ["simbridge.sims.gym_sim", "--env", "CartPole-v1", "--seed", "0", "--off-policy-fraction", "0.3"]
    t0 = time.monotonic()
    recs = run(tmp_path, "", tables, [sim], budget=30_000, done=lambda rec: r10(rec, "default_policy") >= 150,
               timeout=240)
    assert recs, "no metrics were written"
    last = recs[-1]
    losses = last["losses"]["default_policy"]
    print(f"mean(10) {r10(last, 'default_policy'):.1f} at {last['env_steps']} env steps, version "
          f"{last['versions']['default_policy']}, {time.monotonic() - t0:.0f}s, {losses}")
    assert r10(last, "default_policy") >= 150, f"mean(10) {r10(last, 'default_policy')} at {last['env_steps']} steps"
    assert last["env_steps"] <= 30_000 and last["versions"]["default_policy"] > 0
    dropped, trained = losses["rows_dropped_logged"], losses["rows_trained"]
    assert 0.2 < dropped / (dropped + trained) < 0.4          # the simulator's 30%, counted
    # Rows acted by weights two iterations old are dropped and counted (ppo.py; exact counts: test_ppo.py).
    # They come only while the learner process trails the simulator (the rate limiter lets it trail by up
    # to max_updates_behind updates), as on a loaded machine: 0 in most runs here, 3 of 8,473 once.
    assert losses["rows_dropped_stale"] <= 0.05 * (dropped + trained), losses
