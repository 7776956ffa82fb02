"""How a run reports: metrics.jsonl, TensorBoard scalars, the console's progress line, and
`plot`'s learning curves drawn from metrics.jsonl.

TensorBoard (torch.utils.tensorboard) and matplotlib are imported when used: a run without
TensorBoard still writes metrics.jsonl, and `plot` is the only user of matplotlib.
"""
import collections
import json
import logging
import math
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, TextIO

import numpy as np

from simbridge.trainer.config import ConfigError
from simbridge.trainer.rundir import METRICS

log = logging.getLogger("simbridge.trainer")


class Reporter:
    """One record of the runtime's counters and its policies' versions, updates and losses
    -> a metrics.jsonl line, TensorBoard scalars and a progress line on `out`."""

    def __init__(self, runtime, logdir: Path, out: TextIO, queue_max: int, wall_s: Callable[[], float]):
        self.runtime = runtime
        self.logdir = logdir
        self.out = out
        self.queue_max = queue_max
        self.wall_s = wall_s
        self._metrics_file = None
        self._writer = None

    def open(self, purge_step: Optional[int] = None) -> None:
        """purge_step: on resume, TensorBoard hides what an earlier process logged past the checkpoint."""
        self._metrics_file = open(self.logdir / METRICS, "a")
        self._writer = self._open_tensorboard(purge_step)
        self._last_t = time.monotonic()
        self._last_steps = self.runtime.metrics.env_steps

    def _open_tensorboard(self, purge_step: Optional[int]):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            log.warning("no TensorBoard event files (%s); metrics.jsonl is still written", e)
            return None
        return SummaryWriter(str(self.logdir), purge_step=purge_step)

    def hparams(self, flat: Dict[str, object], text: str, policy_ids: List[str]) -> None:
        """The effective config in TensorBoard: every key in the HParams tab (the stop metric,
        return_mean_10, beside them) and the TOML as text."""
        w = self._writer
        if w is None:
            return
        from torch.utils.tensorboard.summary import hparams
        values = {k: v for k, v in flat.items() if isinstance(v, (bool, int, float, str))}
        metrics = {f"env/return_mean_10/{pid}": None for pid in policy_ids}
        for summary in hparams(values, metrics):
            w.file_writer.add_summary(summary)
        w.add_text("config", "".join(f"    {line}\n" for line in text.splitlines()), 0)   # markdown code
        w.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._metrics_file.close()

    def report(self, event: Optional[str] = None, extra: Optional[dict] = None) -> dict:
        rec = self.record(event, extra)
        print(progress_line(rec, self.queue_max), file=self.out, flush=True)
        return rec

    def record(self, event: Optional[str] = None, extra: Optional[dict] = None) -> dict:
        """extra: fields of this one record (the resume's losses)."""
        snap = self.runtime.snapshot()
        now = time.monotonic()
        rate = (snap["env_steps"] - self._last_steps) / max(now - self._last_t, 1e-9)
        self._last_steps, self._last_t = snap["env_steps"], now
        rec = {"env_steps": snap["env_steps"], "agent_steps": snap["agent_steps"], "episodes": snap["episodes"],
               "wall_s": round(self.wall_s(), 3), "steps_per_s": round(rate, 1),
               "sessions": snap["sessions"], "episode_return_mean": snap["episode_return_mean"],
               "return_mean": snap["policy_return_mean"], "return_mean_10": snap["policy_return_mean_10"],
               # Evaluation episodes (greedy, never trained): their returns, apart.
               "eval_return_mean": snap["policy_eval_return_mean"],
               "updates": {}, "versions": {}, "losses": {},
               "experience_queue": snap["experience_queue"],
               "experience_blocked_puts": snap["experience_blocked_puts"],
               # What went wrong, so far: a run's health at a glance (docs/limits.md).
               "experience_blocked_s": round(snap["experience_blocked_s"], 3),
               "empty_episodes": snap["empty_episodes"], "sessions_timed_out": snap["sessions_timed_out"],
               "upload_refused_chunks": snap["upload_refused_chunks"],
               "upload_refused_steps": snap["upload_refused_steps"],
               "errors": dict(sorted(snap["errors"].items())), "refused": dict(sorted(snap["refused"].items()))}
        for pid, p in sorted(self.runtime.policies.items()):
            rec["versions"][pid] = int(p.version)
            if hasattr(p, "updates"):
                rec["updates"][pid] = int(p.updates)
            m = {k: float(v) for k, v in (getattr(p, "last_metrics", None) or {}).items()
                 if isinstance(v, (int, float, np.floating)) and math.isfinite(float(v))}
            if m:
                rec["losses"][pid] = m
        if event:
            rec["event"] = event
        rec.update(extra or {})
        self._metrics_file.write(json.dumps(rec) + "\n")
        self._metrics_file.flush()
        self._tensorboard(rec)
        return rec

    def _tensorboard(self, rec: dict) -> None:
        w = self._writer
        if w is None:
            return
        step = rec["env_steps"]
        w.add_scalar("env/steps_per_s", rec["steps_per_s"], step)
        w.add_scalar("env/episodes", rec["episodes"], step)
        if rec["episode_return_mean"] is not None:
            w.add_scalar("env/episode_return_mean", rec["episode_return_mean"], step)
        for pid, v in rec["return_mean"].items():
            w.add_scalar(f"env/return_mean/{pid}", v, step)
        for pid, v in rec.get("eval_return_mean", {}).items():
            w.add_scalar(f"eval/return_mean/{pid}", v, step)
        for k in ("experience_blocked_s", "empty_episodes", "sessions_timed_out", "upload_refused_chunks",
                  "upload_refused_steps"):
            w.add_scalar(f"health/{k}", rec[k], step)
        for code, v in rec["errors"].items():
            w.add_scalar(f"health/errors/{code}", v, step)
        for reason, v in rec["refused"].items():
            w.add_scalar(f"health/refused/{reason}", v, step)
        for pid, v in rec["updates"].items():
            w.add_scalar(f"learner/{pid}/updates", v, step)
        for pid, v in rec["versions"].items():
            w.add_scalar(f"learner/{pid}/version", v, step)
        for pid, m in rec["losses"].items():
            for k, v in m.items():
                w.add_scalar(f"learner/{pid}/{k}", v, step)
        w.flush()


def progress_line(rec: dict, queue_max: int) -> str:
    parts = [f"env steps {rec['env_steps']:,} ({rec['steps_per_s']:,.0f}/s)",
             f"episodes {rec['episodes']:,}", f"sessions {rec['sessions']}"]
    if rec["return_mean"]:
        parts.append("return(100) " + " ".join(f"{pid} {v:.2f}" for pid, v in sorted(rec["return_mean"].items())))
    if rec.get("eval_return_mean"):
        parts.append("eval(100) " + " ".join(f"{pid} {v:.2f}" for pid, v in sorted(rec["eval_return_mean"].items())))
    for pid, v in rec["versions"].items():
        s = f"{pid}: v{v}"
        if pid in rec["updates"]:
            s += f" upd {rec['updates'][pid]:,}"
        m = rec["losses"].get(pid, {})
        shown = {k: x for k, x in m.items() if "loss" in k} or dict(list(m.items())[:2])
        s += "".join(f" {k} {x:.4g}" for k, x in shown.items())
        parts.append(s)
    parts.append(f"queue {rec['experience_queue']}/{queue_max}")
    return "[trainer] " + " | ".join(parts)


# ---------------------------------------------------------------- plot

def read_metrics(path: Path) -> List[dict]:
    """metrics.jsonl records; a "resume" record drops earlier records past its env_steps
    (logged after the checkpoint by a process that did not stop cleanly)."""
    out: List[dict] = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if rec.get("event") == "resume":
                out = [r for r in out if r["env_steps"] <= rec["env_steps"]]
            out.append(rec)
    return out


def plot(run_dir: Path, out: Optional[Path] = None) -> Path:
    path = run_dir / METRICS
    if not path.exists():
        raise ConfigError(f"no {METRICS} in {run_dir}: pass a trainer run's logdir ([run] logdir)")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = read_metrics(path)
    out = out or run_dir / "learning_curves.png"
    fig, (ax_r, ax_l) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    returns: Dict[str, list] = collections.defaultdict(list)
    losses: Dict[str, list] = collections.defaultdict(list)
    for r in recs:
        for pid, v in r.get("return_mean", {}).items():
            returns[pid].append((r["env_steps"], v))
        for pid, m in r.get("losses", {}).items():
            shown = {k: v for k, v in m.items() if "loss" in k} or m  # else whatever the learner reports
            for k, v in shown.items():
                losses[f"{pid} {k}"].append((r["env_steps"], v))
    for name, pts in sorted(returns.items()):
        ax_r.plot(*zip(*pts), label=name)
    for name, pts in sorted(losses.items()):
        ax_l.plot(*zip(*pts), label=name)
    ax_r.set_ylabel("episode return, mean of last 100")
    ax_r.set_title(f"{run_dir}")
    ax_l.set_ylabel("learner loss (last update)")
    ax_l.set_xlabel("env steps")
    if losses and all(v > 0 for pts in losses.values() for _, v in pts):
        ax_l.set_yscale("log")
    for ax, series, empty in ((ax_r, returns, "no finished episodes yet"), (ax_l, losses, "no updates yet")):
        if series:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
