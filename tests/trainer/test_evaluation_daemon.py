"""Evaluation episodes against the trainer daemon and a DQN learner: greedy actions are
deterministic while training episodes explore, and `simbridge-sim --eval` returns show up as
eval_return_mean (metrics.jsonl, the progress line), apart from the training returns."""
import gymnasium as gym
import numpy as np

from simbridge.client import PolicyClient
from support.daemon import kill, metrics, start_sim, start_trainer
from support.waits import wait

CARTPOLE = gym.make("CartPole-v1")


def test_evaluation_episodes_are_greedy_and_reported_apart(tmp_path):
    logdir = tmp_path / "run"
    cfg = tmp_path / "c.toml"
    # Exploration at epsilon 1: a training episode's actions are coin flips. Nothing learns (the
    # learner inline: no learner process to start for it).
    cfg.write_text(f'[server]\naddress = "127.0.0.1:0"\nrollout_fragment_length = 16\n[run]\nlogdir = "{logdir}"\n'
                   f'print_every_s = 0.2\nseed = 0\nlearner_process = false\n[policies.default_policy]\nalgorithm = "dqn"\n'
                   f'config = {{ hidden = [16], learning_starts = 100000, epsilon_initial = 1.0, '
                   f'epsilon_final = 1.0 }}\n')
    daemon = start_trainer(cfg, keep=2000)
    address = daemon.address
    sims = []
    try:
        c = PolicyClient(address, CARTPOLE.observation_space, CARTPOLE.action_space)
        obs = np.array([0.01, -0.02, 0.03, 0.04], np.float32)
        ev, train = c.start_episode(evaluation=True), c.start_episode()
        greedy = [c.get_action(ev, obs) for _ in range(20)]
        explored = [c.get_action(train, obs) for _ in range(20)]
        assert len(set(greedy)) == 1 and len(set(explored)) == 2, (greedy, explored)
        c.end_episodes([ev, train], np.stack([obs, obs]), [True, True])
        c.close()
        sims = [start_sim("eval", "simbridge.sims.gym_sim", address, "--eval", "--slots", "2", "--max-steps", "400"),
                start_sim("train", "simbridge.sims.gym_sim", address, "--max-steps", "400")]
        wait(lambda: all(s.poll() is not None for s in sims), 60, "the simulators' steps", [daemon])
        wait(lambda: (metrics(logdir) or [{}])[-1].get("eval_return_mean"), 10, "evaluation returns")
        assert daemon.stop(timeout=30) == 0
    finally:
        kill(*sims, daemon)
    last = metrics(logdir)[-1]
    assert set(last["eval_return_mean"]) == {"default_policy"} and set(last["return_mean"]) == {"default_policy"}
    out = "\n".join(daemon.lines)
    assert "eval(100) default_policy" in out, out

    # Issue 27 #13: `plot` drew the training returns only; the evaluation returns are a curve of their own.
    from simbridge.trainer.run.reporting import figure
    fig = figure(logdir)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert any(label.startswith("eval(100)") for label in labels), labels
    assert "last eval(100)" in fig.axes[0].get_title()
