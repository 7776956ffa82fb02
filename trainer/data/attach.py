"""A run's [dataset] table on the trainer daemon (docs/datasets.md): the warm starts' transitions
queued for the learning loop, and the recorder on its intake."""
from typing import List

from simbridge.trainer.data import datasets


def attach_datasets(daemon) -> List[str]:
    """[dataset]: the recorder on the learning loop's intake, and the warm starts' transitions
    queued for it (policies the config gives no spaces are built with the dataset's). Lines
    for the start-up message."""
    from simbridge.trainer.data import warm_start   # imports minari's readers: only when used
    ds, notes = daemon.cfg.dataset, []
    datasets.require_minari()
    for pid, source in ds.warm_start.items():
        if daemon.resume:
            notes.append(f"warm start of {pid} skipped: a resumed run's checkpoint already counted it")
            continue
        data, what = warm_start.load(source, pid)
        policy = daemon.runtime.policies.get(pid)
        if policy is None:   # the dataset's spaces
            policy = daemon.factory.build_at_start(pid, data.observation_space, data.action_space, what)
            daemon.runtime.add_policy(pid, policy)
        warm_start.check_learner(policy, pid, what)
        warm_start.check_spaces(data, policy, pid, what)
        # In a group each rank takes every world-th episode: the shards hold the dataset once.
        episodes = warm_start.share(data, *((daemon.rank.rank, daemon.rank.world) if daemon.rank else ()))
        rows = 0
        for b in warm_start.batches(data, episodes):
            daemon.loop.warm_start.append((pid, b))
            rows += b.count
        whose, of = ("", "") if daemon.rank is None else (f"rank {daemon.rank.rank}'s share: ",
                                                        f"{len(episodes):,} of ")
        notes.append(f"warm start of {pid}: {whose}{rows:,} transitions ({of}{data.total_episodes:,} episodes) "
                     f"from {source}, learned from before any simulator's")
    if ds.record:
        def spaces(pid: str):
            p = daemon.runtime.policies[pid]
            return p.observation_space, p.action_space
        root = ds.root(daemon.logdir)
        rank = daemon.rank.rank if daemon.rank else None   # a group's ranks record apart (datasets.dataset_id)
        daemon.loop.recorder = datasets.EpisodeRecorder(ds, root, spaces, resume=daemon.resume, rank=rank)
        notes.append(f"recording {', '.join(ds.record_policies) or 'every policy'} to {root} "
                     f"(Minari; MINARI_DATASETS_PATH={root} then minari.load_dataset("
                     f"\"simbridge/<policy>{'' if rank is None else f'-rank{rank}'}-v0\"))")
    return notes
