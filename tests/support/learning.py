"""A learning run through the bridge, as the e2e tests make it: the trainer daemon and simulators as
processes, metrics polled until a test's target or the step budget."""
import subprocess
import sys
import time

from simbridge.trainer.config.values import toml_value
from simbridge.trainer.learners.presets import DQN_CARTPOLE
from simbridge.trainer.run.launch import child_env, stop_all

from support.daemon import metrics, start_trainer

# DQN's CartPole preset (trainer/learners/presets.py) at about half its CPU per env step, for the tests
# that prove a path (a group, a policy mapping) rather than the preset:
# half the updates per env step, on [64, 64] at batch 64. Its return(10) reaches 150 about as soon as
# the preset's (docs/benchmarks.md, "Cheaper configs for the tests"); the preset's own solve is
# test_learning_e2e.py's three-simulator run and bench/learning.py's.
DQN_QUICK = {**DQN_CARTPOLE, "hidden": [64, 64], "batch_size": 64, "updates_per_step": 0.5}
QUICK = toml_value({**DQN_QUICK, "seed": 0})
PRESET = toml_value({**DQN_CARTPOLE, "seed": 0})   # the preset itself, as a config table


def run(tmp_path, top: str, tables: str, sims: list, budget: int, done, timeout: float = 240.0,
        programs: list = (), fragment: int = 32, learner_process: bool = True, lines: list = None):
    """Start the daemon (config: top-level keys, then policy tables) and simulators (Python modules
    in `sims`, native programs' argv in `programs`); poll metrics until done(record) or the budget;
    return the records. Simulator i's stdout (its JSON summary at exit) is left in tmp_path/sim{i}.out.
    learner_process: [run] learner_process (the default, true: each trained policy learns in a
    process of its own; false: in the daemon's loop, a child's imports and pipe spared).
    lines: a list that receives the trainer's output lines once it stopped."""
    logdir = tmp_path / "run"
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f"""{top}
[server]
address = "127.0.0.1:0"
rollout_fragment_length = {fragment}
experience_queue_size = 4
[run]
logdir = "{logdir}"
total_env_steps = {budget}
print_every_s = 0.5
checkpoint_every_env_steps = 1000000
learner_process = {str(learner_process).lower()}
{tables}
""")
    env = child_env()
    trainer = start_trainer(cfg, timeout=120, env=env, keep=5000)
    address, procs = trainer.address, [trainer.popen]
    try:
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
            recs = metrics(logdir)
            if recs and done(recs[-1]):
                break
            time.sleep(0.5)
        return recs
    finally:
        stop_all(list(reversed(procs)))
        if lines is not None:
            trainer.wait_output()
            lines.extend(trainer.lines)


def r10(rec, pid):
    """Policy `pid`'s mean return over the last 10 episodes in a metrics record (0 before any)."""
    return (rec.get("return_mean_10") or {}).get(pid, 0.0)
