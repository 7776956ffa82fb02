"""PPO through the Unity connector: the trainer daemon, simbridge-unity and the test peer as its Unity
build (three processes, loopback gRPC), with the shipped trainer/configs/unity_peer_ppo.toml.

  "Hybrid" (tests/sims/unity_peer/scenes.py): 1 continuous action and discrete branches (3, 2), a
  Dict action space for the trainer; -|c - 0.5| + 1 (branch 0 = 1) + 0.5 (branch 1 = 0) per step,
  branch 0 = 2 ends the episode, 5 steps at most. Random: about -0.1; best: 7.5.
  "Masked": branches (4, 3) whose masks change every step, sent as the observation key
  "action_mask"; a masked action costs -1, any other pays 0.1, 6 steps: 0.6 unless a masked action
  is ever taken (random: about -3).

Measured on the 2-core VM (8 agents per behavior): hybrid's mean of the last 10 went from 0.1 to 6.1
at 6.1k env steps (both behaviors), 11 s of training; masked held 0.6 throughout.
"""
import pytest

from unity_peer.harness import ROOT, train_through_connector

CONFIG = ROOT / "trainer" / "configs" / "unity_peer_ppo.toml"
BUDGET = 20_000
HYBRID_TARGET = 6.0


def r10(rec, pid):
    return (rec.get("return_mean_10") or {}).get(pid)


@pytest.mark.timeout(360)   # the harness waits up to 120 s for the trainer, then trains
def test_ppo_learns_hybrid_actions_and_never_takes_a_masked_action_through_the_unity_connector(tmp_path):
    def done(rec):
        return (r10(rec, "hybrid") or -1e9) >= HYBRID_TARGET and rec["versions"]["masked"] > 0
    recs, connector_err = train_through_connector(tmp_path, CONFIG, "hybrid,masked", BUDGET, 150, done)
    assert recs, "no metrics were written"
    hybrid = [r for r in recs if r10(r, "hybrid") is not None]
    masked = [r for r in recs if r10(r, "masked") is not None]
    assert hybrid and masked, f"episodes missing; connector: {connector_err}"
    first, last = hybrid[0], recs[-1]
    print(f"hybrid: {r10(first, 'hybrid'):.2f} at {first['env_steps']} env steps -> {r10(last, 'hybrid'):.2f} at "
          f"{last['env_steps']}, {last['wall_s']:.1f}s of training; masked: "
          f"{sorted({round(r10(r, 'masked'), 3) for r in masked})}")
    assert r10(first, "hybrid") < 3.0                                   # starts near random
    assert r10(last, "hybrid") >= HYBRID_TARGET and last["env_steps"] <= BUDGET
    assert all(abs(r10(r, "masked") - 0.6) < 1e-4 for r in masked)    # not one masked action, trained or not
    assert last["versions"]["hybrid"] > 0 and last["versions"]["masked"] > 0
