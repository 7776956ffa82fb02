"""Learning through the Unity connector: the trainer daemon (real DQN and SAC), simbridge-unity
and the test peer as its Unity build, three processes over loopback gRPC, with the shipped config
trainer/configs/unity_peer.toml. One build, two behaviors, two policies, both trained at once.

  "Ball" (DQN; tests/sims/unity_peer/scenes.py): keep a ball on a 1-D plate, +0.1 per step, at most
  100 steps. Random: 2.8 on average (90% of episodes below 4.6). Trained: 10 (held all along).
  "Reach" (SAC): move to a goal on a line, -distance per step, +1 on arrival, at most 20 steps.
  Random: -12.6 on average; its best mean of 100 consecutive episodes in 20000 was -9.7.
  Trained: ~0.

Measured on the 2-core VM (8 agents per behavior, 3 runs): ball's mean of the last 10 episodes
went from 2.6-2.7 to 9.4-10 and reach's mean of the last 100 from -11.6 to -2.4..-2.9, both by
4.7-5.1k env steps and 14-18 s of training; the test takes 21-24 s.
"""
import pytest

from unity_peer.harness import ROOT, train_through_connector

CONFIG = ROOT / "trainer" / "configs" / "unity_peer.toml"
BUDGET = 25_000     # env steps: one per agent decision, both behaviors together
# ball: mean of its last 10 episodes (early episodes are short failures: biased low, not high);
# reach: mean of its last up-to-100 (its first finished episodes are the lucky short ones, so a
# mean of 10 can start high; over 100 that bias is gone once each agent has run a dozen).
TARGETS = {"ball": ("return_mean_10", 8.0), "reach": ("return_mean", -3.0)}
MIN_ENV_STEPS = 3000


def score(rec, pid):
    return (rec.get(TARGETS[pid][0]) or {}).get(pid)


def reached(rec) -> bool:
    return rec["env_steps"] >= MIN_ENV_STEPS and all(
        (score(rec, pid) if score(rec, pid) is not None else -1e9) >= target for pid, (_, target) in TARGETS.items())


@pytest.mark.timeout(360)   # the harness waits up to 120 s for the trainer, then trains
def test_dqn_and_sac_learn_two_behaviors_of_one_build_through_the_unity_connector(tmp_path):
    recs, connector_err = train_through_connector(tmp_path, CONFIG, "ball,reach", BUDGET, 180,
                                                  reached)
    assert recs, "no metrics were written"
    last = recs[-1]
    for pid, (key, target) in TARGETS.items():
        scored = [r for r in recs if score(r, pid) is not None]
        assert scored, f"no {pid} episodes finished; connector: {connector_err}"
        first = scored[0]
        print(f"{pid} {key}: {score(first, pid):.2f} at {first['env_steps']} env steps -> {score(last, pid):.2f} "
              f"at {last['env_steps']} env steps, {last['wall_s']:.1f}s of training")
        assert score(last, pid) >= target, f"{pid}: {key} {score(last, pid)} at {last['env_steps']} env steps"
        assert last["versions"][pid] > 0
    first_ball = next(r for r in recs if score(r, "ball") is not None)
    assert score(first_ball, "ball") < 5.0        # ball starts near random (2.8)
    assert MIN_ENV_STEPS <= last["env_steps"] <= BUDGET


def test_the_shipped_unity_configs_load_and_map_behaviors_to_their_policies():
    from simbridge.server.mapping import pattern_mapping
    from simbridge.trainer.config.trainer_config import CONFIG_DIR, load_config, resolve_algorithm
    files = sorted(CONFIG_DIR.glob("unity_*.toml"))
    assert [f.name for f in files] == ["unity_3dball.toml", "unity_peer.toml", "unity_peer_ppo.toml"]
    expect = {"unity_3dball.toml": {"3DBall?team=0/17": "ball"},
              "unity_peer.toml": {"Ball?team=0/1000": "ball", "Reach?team=0/2003": "reach"},
              "unity_peer_ppo.toml": {"Hybrid?team=0/3": "hybrid", "Masked?team=0/7": "masked"}}
    for f in files:
        cfg = load_config(f)
        for spec in cfg.policies.values():
            assert resolve_algorithm(spec) is not None
        mapping = pattern_mapping(cfg.mapping.rules, cfg.mapping.default)  # as the daemon maps
        assert {aid: mapping(aid) for aid in expect[f.name]} == expect[f.name]
