"""Learning through the bridge: the trainer daemon (real DQN) and simulators as separate processes.

Small budgets (the full runs are bench/learning.py): DQN's CartPole preset passes a mean return
of 150 over the last 10 episodes at about 6k env steps. One real DQN solve with the preset for
every way a simulator feeds the trainer, all into one learner at once: the lockstep client, the
batched Step client and the local-inference client (each simulator's own step count shows it fed
it). The multi-agent mapping's learner is support.learning's QUICK, the preset at half its CPU per
env step (with QUICK the batched + local feed reached 150 at 8k env steps once and only 137 by 21k
once: the feeds keep the preset).
"""
import json

import pytest

from support.learning import PRESET, QUICK, r10, run


@pytest.mark.timeout(300)   # a learning run: 1-2 minutes at load 5-10
def test_multiagent_trained_policy_improves_frozen_one_stays(tmp_path):
    tables = f"""[policies.p0]
algorithm = "dqn"
config = {QUICK}
[policies.p1]
algorithm = "dqn"
config = {QUICK}
[mapping]
rules = ["cart_0=p0", "cart_1=p0", "cart_2=p1"]
default = "p1\""""
    recs = run(tmp_path, 'policies_to_train = ["p0"]', tables, [["simbridge.sims.multiagent_sim", "--game", "simultaneous", "--agents", "3",
                                     "--seed", "0"]],
               budget=8_000, done=lambda rec: r10(rec, "p0") >= 100)
    assert recs, "no metrics were written"
    first = next(r for r in recs if r10(r, "p0") and r10(r, "p1"))
    last = recs[-1]
    assert r10(last, "p0") >= 100 and r10(last, "p0") > 2 * r10(first, "p0"), (first, last)
    assert last["versions"]["p0"] > 0 and last["versions"]["p1"] == 0   # frozen: never updated
    assert r10(last, "p1") < 60                                          # and still acting randomly


def sim_summary(tmp_path, i: int) -> dict:
    lines = (tmp_path / f"sim{i}.out").read_text().strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


@pytest.mark.timeout(300)   # a learning run: 1-2 minutes at load 5-10
def test_dqn_learns_cartpole_from_a_lockstep_a_batched_and_a_local_inference_simulator_at_once(tmp_path):
    """A lockstep simulator (an action per call), four slots on the Step call (the carts stepped in
    numpy, per-slot auto-reset) and a simulator acting with a local copy of the policy (shipped
    weights, uploaded experience) feed one learner, which reaches the preset's target."""
    tables = f"""[policies.default_policy]
algorithm = "dqn"
config = {PRESET}"""
    lockstep = ["simbridge.sims.gym_sim", "--env", "CartPole-v1", "--seed", "2"]
    batched = ["simbridge.sims.gym_sim", "--slots", "4", "--vector", "--seed", "0"]
    local = ["simbridge.sims.gym_sim", "--env", "CartPole-v1", "--seed", "1", "--inference", "local",
             "--update-interval", "0.2", "--chunk-steps", "32", "--max-buffered-steps", "128"]
    out = []
    recs = run(tmp_path, "", tables, [lockstep, batched, local], budget=20_000,
               done=lambda rec: r10(rec, "default_policy") >= 150, lines=out)
    assert recs, "no metrics were written"
    last = recs[-1]
    one, b, loc = sim_summary(tmp_path, 0), sim_summary(tmp_path, 1), sim_summary(tmp_path, 2)
    print(f"mean(10) {r10(last, 'default_policy'):.1f} at {last['env_steps']} env steps; lockstep {one.get('steps')} "
          f"steps, batched {b.get('steps')} steps, local {loc.get('steps')} steps at policy version "
          f"{loc.get('local', {}).get('policy_version')}")
    assert r10(last, "default_policy") >= 150, f"mean(10) {r10(last, 'default_policy')} at {last['env_steps']} steps"
    assert last["env_steps"] <= 20_000 and last["versions"]["default_policy"] > 0
    # All fed the learner: the local simulator's steps were uploaded and it acted with shipped weights.
    assert one["steps"] >= 300 and b["steps"] >= 1_000 and loc["steps"] >= 500, (one, b, loc)
    assert loc["local"]["policy_version"] > 0, loc
    # three feeds into one n-step learner: each trajectory's rows reached it in order (the hand-over
    # once let a later batch overtake an earlier one; the n-step accumulator says so if it recurs)
    assert out and not [x for x in out if "out of order" in x], [x for x in out if "out of order" in x]
