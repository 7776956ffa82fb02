"""What a resumed trainer's progress line starts from: the counts and the return windows of the
checkpoint it resumes, training's and evaluation's apart (docs/trainer.md: "counts and returns go
on"). In process: a daemon that never serves, its runtime given ended episodes, checkpointed, and
a second one resumed from it."""
from simbridge.server.episodes import episode_summary
from simbridge.trainer.config.trainer_config import parse_config
from simbridge.trainer.daemon import TrainerDaemon


def _episode(i: int, reward: float, evaluation: bool = False, end_reason: str = "terminated"):
    return episode_summary(f"e{i}", i, "s", 10, {"agent0": reward}, {"agent0": "default_policy"}, {},
                           not evaluation, end_reason, 0.1, evaluation=evaluation)


def test_a_resume_keeps_trainings_and_evaluations_last_100_returns_and_the_cut_count(tmp_path):
    """Before the fix the checkpoint kept the last 100 episodes of both kinds together: beside an
    evaluation simulator, training's window came back with fewer, newer episodes (return(100)
    jumped from 374 to 498 at a resume), and the count of episodes cut short restarted at 0."""
    cfg = parse_config(f'[run]\nlogdir = "{tmp_path}"\ndevice = "cpu"\n'
                       f'[policies.default_policy]\nalgorithm = "random"\n')
    first = TrainerDaemon(cfg)
    episodes = [_episode(i, float(i)) for i in range(150)]
    episodes += [_episode(1000 + i, 500.0, evaluation=True) for i in range(80)]   # after training's
    episodes += [_episode(2000 + i, -1.0, end_reason="client_lost") for i in range(7)]
    with first.runtime.ctx.lock:
        first.runtime.ctx.file_summaries(episodes)
        before = first.runtime.snapshot()
    first.checkpoint(clean=True)

    second = TrainerDaemon(cfg, resume=True)
    m, was = second.runtime.metrics, first.runtime.metrics
    assert [x["eps_id"] for x in m.recent] == [x["eps_id"] for x in was.recent]   # 100 training episodes
    assert [x["eps_id"] for x in m.recent_eval] == [x["eps_id"] for x in was.recent_eval]
    after = second.runtime.snapshot()
    assert after["episodes_cut"] == before["episodes_cut"] == 7
    for key in ("episode_return_mean", "policy_return_mean", "policy_eval_return_mean"):
        assert after[key] == before[key], key
    assert after["episodes"] == before["episodes"] == 237
