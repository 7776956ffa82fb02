"""The [dataset] table (recording and warm starts: trainer/data/, docs/datasets.md) and the CLI's
dataset flags as overrides. Here, beside the other sections, so that parsing a config needs
nothing of the data room."""
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from simbridge.trainer.config.values import ConfigError, check_keys

DIRNAME = "datasets"      # LOGDIR/datasets when [dataset] dir is empty
EXTRA_HINT = "install the datasets extra: pip install 'simbridge[datasets]' (minari and h5py)"


class DatasetConfigError(ConfigError):
    """A [dataset] or dataset mistake; the message says how to fix it."""


@dataclass
class DatasetSection:
    record: bool = False
    record_policies: List[str] = field(default_factory=list)   # empty: every policy
    dir: str = ""                                              # empty: LOGDIR/datasets
    warm_start: Dict[str, str] = field(default_factory=dict)   # policy id -> dataset path or id
    max_open_episodes: int = 10_000
    max_episode_steps: int = 100_000

    def records(self, policy_id: str) -> bool:
        return self.record and (not self.record_policies or policy_id in self.record_policies)

    def root(self, logdir) -> Path:
        return Path(self.dir) if self.dir else Path(logdir) / DIRNAME

    @property
    def used(self) -> bool:
        return self.record or bool(self.warm_start)


def parse_dataset_section(raw, policies, where: str) -> DatasetSection:
    """The [dataset] table; `policies`: the config's policy ids."""
    what = f"{where}: [dataset]"
    if not isinstance(raw, dict):
        raise DatasetConfigError(f"{what} must be a table, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(DatasetSection)}
    check_keys(raw, fields, what)
    out = DatasetSection()
    for key, value in raw.items():
        default = getattr(out, key)
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif isinstance(default, int):
            ok, kind = isinstance(value, int) and not isinstance(value, bool) and value >= 1, "an integer >= 1"
        elif isinstance(default, str):
            ok, kind = isinstance(value, str), "a string (a directory)"
        elif isinstance(default, list):
            ok, kind = isinstance(value, list) and all(isinstance(x, str) for x in value), \
                "a list of policy ids, e.g. [\"default_policy\"]"
        else:
            ok, kind = (isinstance(value, dict) and all(isinstance(v, str) and v for v in value.values()),
                        "a table of policy = \"dataset path or id\", e.g. { default_policy = \"runs/a/datasets/"
                        "simbridge/default_policy-v0\" }")
        if not ok:
            raise DatasetConfigError(f"{what}: {key} = {value!r} should be {kind}")
        setattr(out, key, value)
    for key in ("record_policies", "warm_start"):
        for pid in getattr(out, key):
            if pid not in policies:
                raise DatasetConfigError(f"{what}: {key} names policy {pid!r}, which is not defined: use one "
                                         f"of {sorted(policies)}")
    return out


def dataset_overrides(record: bool, warm_starts: List[str], error=DatasetConfigError) -> list:
    """`simbridge-trainer run --record-dataset --warm-start POLICY=PATH` as config overrides
    (dataset.record, dataset.warm_start.POLICY), so they are checked like the file and kept in the
    run's config.toml for --resume; a malformed flag raises `error` (the CLI's ConfigError)."""
    out = [("dataset.record", True)] if record else []
    for spec in warm_starts or ():
        pid, sep, source = spec.partition("=")
        if not sep or not pid or not source or "." in pid:
            raise error(f"--warm-start {spec!r}: use POLICY=PATH (or POLICY=DATASET_ID), e.g. "
                        f"--warm-start default_policy=runs/a/datasets/simbridge/default_policy-v0")
        out.append((f"dataset.warm_start.{pid}", source))
    return out
