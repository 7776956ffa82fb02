"""What a run leaves in its logdir ([run] logdir, --logdir):
  metrics.jsonl          one JSON object per line every print_every_s (env_steps, wall_s,
                         return_mean per policy, updates, versions, losses, ...); appended on resume
  events.out.tfevents.*  TensorBoard scalars (env/return_mean/<policy>, env/steps_per_s,
                         learner/<policy>/<metric>, ...): `tensorboard --logdir DIR`
  checkpoint.pt          written atomically every checkpoint_every_env_steps and at exit
                         (SIGTERM, Ctrl-C, total_env_steps reached)
  config.toml            the effective config the run started with (file, --set and flags applied);
                         `run --resume --logdir DIR` reuses it
  journal/seg-*.sbj      the write-ahead journal ([run] journal): experience, counters and episodes
                         as they enter the bridge; `--resume` replays it (docs/durability.md)
"""
# Names only (no torch here): the CLI reads them before anything heavy is imported.
from pathlib import Path

from simbridge.trainer.config.trainer_config import ConfigError

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
SAVED_CONFIG = "config.toml"
JOURNAL = "journal"


def refuse_used(logdir: Path, resumable: bool = True) -> None:
    """A fresh run must not write over another run's checkpoint or metrics. resumable: the command
    takes --resume (run does; serve does not)."""
    fix = "pass --resume to continue it, or choose another --logdir" if resumable else "choose another --logdir"
    for name in (CHECKPOINT, METRICS):
        f = logdir / name
        if f.exists() and f.stat().st_size > 0:
            raise ConfigError(f"{logdir} already holds a run ({name}): {fix}")
    if any((logdir / JOURNAL).glob("seg-*.sbj")):
        raise ConfigError(f"{logdir} already holds a run's journal ({JOURNAL}/): {fix}")
