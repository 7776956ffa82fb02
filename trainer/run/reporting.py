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

from simbridge.trainer.config.trainer_config import ConfigError
from simbridge.trainer.run.rundir import METRICS

log = logging.getLogger("simbridge.trainer")

WAITING_EVERY_S = 30.0   # an idle trainer repeats "waiting for simulators" this often, not every line
# Refusals only the user can fix, which otherwise show only in metrics.jsonl: said on the console
# at once, then at most this often per kind (a simulator that retries must not flood it).
SAID_REFUSALS = ("SPACE_MISMATCH", "SPACE_TOO_LARGE")
REFUSAL_EVERY_S = 30.0


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
        self.address = "?"   # the server's, once bound (the "waiting for simulators" line)
        self.sim_flags = ""  # what a simulator needs beside --address there (TLS, a token)
        self._waiting_said: Optional[float] = None
        self._refusals_said: Dict[str, tuple] = {}   # reason -> (its count when said, when)

    def open(self, purge_step: Optional[int] = None) -> None:
        """purge_step: on resume, TensorBoard hides what an earlier process logged past the checkpoint."""
        self._metrics_file = open(self.logdir / METRICS, "a")
        self._writer = self._open_tensorboard(purge_step)
        self._last_t = time.monotonic()
        self._last_steps = self.runtime.metrics.env_steps
        refused = self.runtime.metrics.refused   # a resume's restored counts were said by the run before
        self._refusals_said = {r: (refused.get(r, 0), -math.inf) for r in SAID_REFUSALS}

    def _open_tensorboard(self, purge_step: Optional[int]):
        try:
            from torch.utils.tensorboard import SummaryWriter
            from tensorboard.compat.proto.summary_pb2 import Summary
            self._summary_cls = Summary
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
        """Records; the console gets the progress line, or while no simulator is connected and
        nothing moves, "waiting for simulators" once and then every WAITING_EVERY_S."""
        rec = self.record(event, extra)
        getattr(self.out, "check_reader", lambda: None)()   # `run | head` left while nothing is printed
        now = time.monotonic()
        self._say_refusals(now)
        if rec["sessions"] == 0 and rec["steps_per_s"] == 0 and event != "stop":
            if self._waiting_said is None or now - self._waiting_said >= WAITING_EVERY_S:
                self._waiting_said = now
                print(f"[trainer] waiting for simulators on {self.address} ({rec['env_steps']:,} env steps so far; "
                      f"start one, e.g. `simbridge-sim --address {self.address}{self.sim_flags}`)", file=self.out,
                      flush=True)
            return rec
        self._waiting_said = None
        print(progress_line(rec, self.queue_max), file=self.out, flush=True)
        return rec

    def _say_refusals(self, now: float) -> None:
        m = self.runtime.metrics
        for reason in SAID_REFUSALS:
            n = m.refused.get(reason, 0)
            said_n, said_t = self._refusals_said.get(reason, (0, -math.inf))
            if n > said_n and now - said_t >= REFUSAL_EVERY_S:
                self._refusals_said[reason] = (n, now)
                times = f", {n - said_n} times since it was last said" if n - said_n > 1 else ""
                print(f"[trainer] refused a simulator ({reason}{times}): {m.refusal_said.get(reason, '?')}",
                      file=self.out, flush=True)

    def record(self, event: Optional[str] = None, extra: Optional[dict] = None) -> dict:
        """extra: fields of this one record (the resume's losses)."""
        snap = self.runtime.snapshot()
        now = time.monotonic()
        rate = (snap["env_steps"] - self._last_steps) / max(now - self._last_t, 1e-9)
        self._last_steps, self._last_t = snap["env_steps"], now
        rec = {"env_steps": snap["env_steps"], "agent_steps": snap["agent_steps"], "episodes": snap["episodes"],
               # Of those, cut short because their simulator stopped or went away: not in the returns.
               "episodes_cut": snap["episodes_cut"],
               "wall_s": round(self.wall_s(), 3), "steps_per_s": round(rate, 1),
               "sessions": snap["sessions"], "episode_return_mean": snap["episode_return_mean"],
               "return_mean": snap["policy_return_mean"], "return_mean_10": snap["policy_return_mean_10"],
               "episode_length_mean_10": snap["policy_length_mean_10"], "lr": {},
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
            cfg = getattr(p, "config", None) or {}
            if isinstance(cfg.get("lr"), (int, float)):   # decayed when the learner has lr_final (DQN, PPO)
                decays = "lr_final" in cfg and "lr_timesteps" in cfg and hasattr(p, "learning_rate")
                rec["lr"][pid] = float(p.learning_rate() if decays else cfg["lr"])
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
        """The record's scalars as one event (one Summary of many values, as TensorFlow's merged
        summaries): add_scalar makes an event and wakes the writer thread per scalar, 20-40 of them a
        record (on the 2-core VM a DQN record cost 2.5 ms that way, 0.47 ms as one event, flush included)."""
        w = self._writer
        if w is None:
            return
        scalars = {"env/steps_per_s": rec["steps_per_s"], "env/episodes": rec["episodes"],
                   "env/episodes_cut": rec["episodes_cut"]}
        if rec["episode_return_mean"] is not None:
            scalars["env/episode_return_mean"] = rec["episode_return_mean"]
        for key, tag in _KEYED_SCALARS:
            for k, v in rec.get(key, {}).items():
                scalars[tag.format(k=k)] = v
        for k in ("experience_blocked_s", "empty_episodes", "sessions_timed_out", "upload_refused_chunks",
                  "upload_refused_steps"):
            scalars[f"health/{k}"] = rec[k]
        for pid, m in rec["losses"].items():
            for k, v in m.items():
                scalars[f"learner/{pid}/{k}"] = v
        summary = self._summary_cls(value=[self._summary_cls.Value(tag=tag, simple_value=float(v))
                                           for tag, v in scalars.items()])
        w.file_writer.add_summary(summary, rec["env_steps"])
        w.flush()


# The record's per-policy (or per-code) tables and their TensorBoard tags: one scalar per entry.
_KEYED_SCALARS = (("return_mean", "env/return_mean/{k}"), ("return_mean_10", "env/return_mean_10/{k}"),
                  ("episode_length_mean_10", "env/episode_length_mean_10/{k}"), ("lr", "learner/{k}/lr"),
                  ("eval_return_mean", "eval/return_mean/{k}"), ("errors", "health/errors/{k}"),
                  ("refused", "health/refused/{k}"), ("updates", "learner/{k}/updates"),
                  ("versions", "learner/{k}/version"))


def progress_line(rec: dict, queue_max: int) -> str:
    parts = [f"env steps {rec['env_steps']:,} ({rec['steps_per_s']:,.0f}/s)",
             f"episodes {rec['episodes']:,}" + (f" ({rec['episodes_cut']:,} cut short, not in the returns)"
                                                 if rec.get("episodes_cut") else ""),
             f"sessions {rec['sessions']}"]
    r10, r100 = rec.get("return_mean_10", {}), rec["return_mean"]
    if r100:   # return(10): what `make demo` stops on (the mean of the last 10 episodes)
        parts.append("return(10) " + " ".join(f"{pid} {r10.get(pid, v):.2f} (100: {v:.2f})"
                                               for pid, v in sorted(r100.items())))
    if rec.get("episode_length_mean_10"):
        parts.append("length(10) " + " ".join(f"{pid} {v:.0f}" for pid, v in sorted(rec["episode_length_mean_10"].items())))
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


def plot(run_dir: Path, out: Optional[Path] = None, target: Optional[float] = None) -> Path:
    """Learning curves to PNG (figure's); returns the PNG's path."""
    fig = figure(run_dir, target)
    out = out or run_dir / "learning_curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return out


def figure(run_dir: Path, target: Optional[float] = None):
    """The learning curves: per policy, the mean return of the last 10 episodes (what `make demo`
    stops on) and of the last 100, the evaluation episodes' mean return (greedy, never trained),
    with `target` as a dashed line and where it was first reached, and the mean episode length;
    below, the learners' losses and learning rates. The record a stop writes is left out of the
    curves: it counts the episodes the stop cut short."""
    path = run_dir / METRICS
    if not path.exists():
        raise ConfigError(f"no {METRICS} in {run_dir}: pass a trainer run's logdir ([run] logdir)")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = read_metrics(path)
    curves = [r for r in recs if r.get("event") != "stop"]
    series: Dict[str, Dict[str, list]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in curves:
        for key in ("return_mean_10", "return_mean", "eval_return_mean", "episode_length_mean_10"):
            for pid, v in r.get(key, {}).items():
                series[pid][key].append((r["env_steps"], v))
    losses: Dict[str, list] = collections.defaultdict(list)
    lrs: Dict[str, list] = collections.defaultdict(list)
    for r in recs:
        for pid, m in r.get("losses", {}).items():
            shown = {k: v for k, v in m.items() if "loss" in k} or m  # else whatever the learner reports
            for k, v in shown.items():
                losses[f"{pid} {k}"].append((r["env_steps"], v))
        for pid, v in r.get("lr", {}).items():
            lrs[pid].append((r["env_steps"], v))

    pids = sorted(series) or ["(none)"]
    fig, axes = plt.subplots(len(pids) + 1, 2, figsize=(12, 3.2 * (len(pids) + 1)), squeeze=False)
    last = curves[-1] if curves else {}
    title = f"{run_dir.resolve().name}: {last.get('env_steps', 0):,} env steps, {last.get('episodes', 0):,} episodes"
    fig.suptitle(title, fontsize="large")
    for (ax_r, ax_len), pid in zip(axes, pids):
        s = series.get(pid, {})
        if s.get("return_mean_10"):
            ax_r.plot(*zip(*s["return_mean_10"]), label="return(10): mean of the last 10 episodes", lw=1.8)
        if s.get("return_mean"):
            ax_r.plot(*zip(*s["return_mean"]), label="return(100)", lw=1.0, alpha=0.7)
        if s.get("eval_return_mean"):
            ax_r.plot(*zip(*s["eval_return_mean"]), label="eval(100): evaluation episodes, greedy", lw=1.4,
                      color="tab:purple", marker=".", ms=3)
        head, hit = f"{pid}: episode return", None
        if target is not None:
            ax_r.axhline(target, ls="--", color="tab:red", lw=1, label=f"target {target:g}")
            hit = next(((x, v) for x, v in s.get("return_mean_10", []) if v >= target), None)
            if hit:
                ax_r.plot([hit[0]], [hit[1]], "o", color="tab:red")
        notes = []
        if target is not None and hit:
            notes.append(f"return(10) reached {target:g} at {hit[0]:,} env steps")
        if s.get("return_mean_10"):
            notes.append(f"last return(10) {s['return_mean_10'][-1][1]:.1f}")
        if s.get("eval_return_mean"):
            notes.append(f"last eval(100) {s['eval_return_mean'][-1][1]:.1f}")
        if notes:
            head += "\n" + "; ".join(notes)
        ax_r.set_title(head, fontsize="medium")
        if s.get("episode_length_mean_10"):
            ax_len.plot(*zip(*s["episode_length_mean_10"]), color="tab:green", label="length(10)")
        ax_len.set_title(f"{pid}: episode length, mean of the last 10 (env steps)", fontsize="medium")
        _finish(ax_r, bool(s), "no finished episodes yet")
        _finish(ax_len, bool(s.get("episode_length_mean_10")), "no finished episodes yet")
    ax_l, ax_lr = axes[-1]
    for name, pts in sorted(losses.items()):
        ax_l.plot(*zip(*pts), label=name)
    if losses and all(v > 0 for pts in losses.values() for _, v in pts):
        ax_l.set_yscale("log")
    ax_l.set_title("learner loss (last update)", fontsize="medium")
    for pid, pts in sorted(lrs.items()):
        ax_lr.plot(*zip(*pts), label=pid)
    ax_lr.set_title("learning rate", fontsize="medium")
    _finish(ax_l, bool(losses), "no updates yet")
    _finish(ax_lr, bool(lrs), "no learning rate reported")
    for ax in axes[-1]:
        ax.set_xlabel("env steps")
    fig.tight_layout()
    return fig


def _finish(ax, has_data: bool, empty: str) -> None:
    if has_data:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
