"""Learning through the bridge: the trainer daemon (real DQN) and simulators as separate processes.

Small budgets (the full runs are bench/learning.py): DQN's CartPole preset passes a mean return
of 150 over the last 10 episodes at about 6k env steps; the test allows 15k. One real DQN solve per
way a simulator feeds the trainer: the lockstep client alone, then the batched Step client and the
local-inference client together into one learner (each simulator's own step count shows it fed it).
"""
import json
import subprocess
import sys
import time

import pytest

from simbridge.trainer.run.launch import child_env, free_port, stop_all, wait_for_health
from simbridge.trainer.config.values import toml_value
from simbridge.trainer.learners.presets import DQN_CARTPOLE

PRESET = toml_value({**DQN_CARTPOLE, "seed": 0})   # trainer/learners/presets.py


def run(tmp_path, top: str, tables: str, sims: list, budget: int, done, timeout: float = 240.0,
        programs: list = (), fragment: int = 32):
    """Start the daemon (config: top-level keys, then policy tables) and simulators (Python modules
    in `sims`, native programs' argv in `programs`); poll metrics until done(record) or the budget;
    return the records. Simulator i's stdout (its JSON summary at exit) is left in tmp_path/sim{i}.out."""
    address = f"127.0.0.1:{free_port()}"
    logdir = tmp_path / "run"
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f"""{top}
[server]
address = "{address}"
rollout_fragment_length = {fragment}
experience_queue_size = 4
[run]
logdir = "{logdir}"
total_env_steps = {budget}
print_every_s = 0.5
checkpoint_every_env_steps = 1000000
{tables}
""")
    env = child_env()
    procs = [subprocess.Popen([sys.executable, "-m", "simbridge.trainer.cli", "run", "--config", str(cfg)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_for_health(address, timeout=120)
        for i, cmd in enumerate(sims):
            with open(tmp_path / f"sim{i}.out", "wb") as out:
                procs.append(subprocess.Popen([sys.executable, "-m", *cmd, "--address", address, "--quiet"], env=env,
                                              stdout=out, stderr=subprocess.DEVNULL))
        for argv in programs:
            procs.append(subprocess.Popen([*argv, "--address", address], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + timeout
        recs = []
        while time.monotonic() < deadline and procs[0].poll() is None:
            path = logdir / "metrics.jsonl"
            if path.exists():
                recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
                if recs and done(recs[-1]):
                    break
            time.sleep(0.5)
        return recs
    finally:
        stop_all(list(reversed(procs)))


def r10(rec, pid):
    return (rec.get("return_mean_10") or {}).get(pid, 0.0)


@pytest.mark.timeout(300)   # a learning run: 1-2 minutes at load 5-10
def test_dqn_learns_cartpole_through_the_bridge(tmp_path):
    tables = f"""[policies.default_policy]
algorithm = "dqn"
config = {PRESET}"""
    recs = run(tmp_path, "", tables, [["simbridge.sims.gym_sim", "--env", "CartPole-v1", "--seed", "0"]], budget=15_000,
               done=lambda rec: r10(rec, "default_policy") >= 150)
    assert recs, "no metrics were written"
    last = recs[-1]
    assert r10(last, "default_policy") >= 150, f"mean(10) {r10(last, 'default_policy')} at {last['env_steps']} steps"
    assert last["env_steps"] <= 15_000
    assert last["versions"]["default_policy"] > 0


@pytest.mark.timeout(300)   # a learning run: 1-2 minutes at load 5-10
def test_multiagent_trained_policy_improves_frozen_one_stays(tmp_path):
    tables = f"""[policies.p0]
algorithm = "dqn"
config = {PRESET}
[policies.p1]
algorithm = "dqn"
config = {PRESET}
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
def test_dqn_learns_cartpole_from_a_batched_simulator_and_a_local_inference_one_at_once(tmp_path):
    """Four slots on the Step call (the carts stepped in numpy, per-slot auto-reset) and a simulator
    acting with a local copy of the policy (shipped weights, uploaded experience) feed one learner."""
    tables = f"""[policies.default_policy]
algorithm = "dqn"
config = {PRESET}"""
    batched = ["simbridge.sims.gym_sim", "--slots", "4", "--vector", "--seed", "0"]
    local = ["simbridge.sims.gym_sim", "--env", "CartPole-v1", "--seed", "1", "--inference", "local",
             "--update-interval", "0.2", "--chunk-steps", "32", "--max-buffered-steps", "128"]
    recs = run(tmp_path, "", tables, [batched, local], budget=20_000,
               done=lambda rec: r10(rec, "default_policy") >= 150)
    assert recs, "no metrics were written"
    last = recs[-1]
    b, loc = sim_summary(tmp_path, 0), sim_summary(tmp_path, 1)
    print(f"mean(10) {r10(last, 'default_policy'):.1f} at {last['env_steps']} env steps; batched {b.get('steps')} "
          f"steps, local {loc.get('steps')} steps at policy version {loc.get('local', {}).get('policy_version')}")
    assert r10(last, "default_policy") >= 150, f"mean(10) {r10(last, 'default_policy')} at {last['env_steps']} steps"
    assert last["env_steps"] <= 20_000 and last["versions"]["default_policy"] > 0
    # Both fed the learner: the local simulator's steps were uploaded and it acted with shipped weights.
    assert b["steps"] >= 1_000 and loc["steps"] >= 500, (b, loc)
    assert loc["local"]["policy_version"] > 0, loc
