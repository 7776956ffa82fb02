"""A run that reaches total_env_steps ends for its simulators too: each hears TRAINING_OVER and stops
as at its own end (exit 0), and none steps on through the server's grace. Before, they kept stepping
for its half second (a 2,000-step run checkpointed at 3,400) and then tried to reconnect for a
minute. Real processes: the trainer CLI and simbridge-sim."""
import json
import os
import subprocess

import pytest

from simbridge.trainer.run.checkpoint import load_checkpoint
from simbridge.trainer.run.launch import ROOT, Proc, child_env, free_port, python_module, wait_for_health

TOTAL = 2000


def _trainer(tmp_path, total: int):
    cfg, logdir, address = tmp_path / "random.toml", tmp_path / "run", f"127.0.0.1:{free_port()}"
    cfg.write_text('[policies.default_policy]\nalgorithm = "random"\n')
    trainer = Proc("trainer", python_module("simbridge.trainer.cli", "run", "--config", cfg, "--logdir", logdir,
                                            "--address", address, "--total-env-steps", str(total)))
    return trainer, logdir, address


def test_the_simulators_hear_training_over_and_every_step_is_counted_on_both_sides(tmp_path):
    trainer, logdir, address = _trainer(tmp_path, TOTAL)
    try:
        wait_for_health(address, timeout=240, proc=trainer)
        # well within the minute a simulator would spend reconnecting to a trainer that went away
        sim = subprocess.run(python_module("simbridge.sims.gym_sim", "--address", address, "--slots", "4", "--quiet"),
                             capture_output=True, text=True, timeout=45, env=child_env(), cwd=str(ROOT))
        assert trainer.popen.wait(timeout=60) == 0
    finally:
        trainer.stop(timeout=30)
    summary = json.loads(sim.stdout.strip().splitlines()[-1])
    assert sim.returncode == 0 and summary["ended"] == "training_over", sim.stdout + sim.stderr
    steps = load_checkpoint(logdir / "checkpoint.pt")["counters"]["env_steps"]
    assert steps >= TOTAL and summary["steps"] == steps, (summary, steps)


@pytest.mark.parametrize("program", ["cartpole", "cartpole_slots"])
def test_the_cpp_examples_end_at_training_over_as_at_their_own_end(cpp_build, tmp_path, program):
    trainer, _, address = _trainer(tmp_path, 300)
    try:
        wait_for_health(address, timeout=240, proc=trainer)
        many = ["--episodes", "100000"] if program == "cartpole" else ["--steps", "100000"]
        out = subprocess.run([os.path.join(cpp_build, program), "--address", address, *many], capture_output=True,
                             text=True, timeout=45)
        assert trainer.popen.wait(timeout=60) == 0
    finally:
        trainer.stop(timeout=30)
    assert out.returncode == 0 and "training is over (total_env_steps 300 reached)" in out.stderr, out.stderr
