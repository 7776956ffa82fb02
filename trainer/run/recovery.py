"""Reading the journal back on `--resume` (its records: trainer/run/journal.py, records.py): what it adds to
the checkpoint, and the episodes that were open at the kill."""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from simbridge.trainer.run.records import unflatten, decode_all
from simbridge.trainer.run.obs_links import LINKED, RecordLinks
from simbridge.wire.columns import AGENT_INDEX, EPS_ID, REWARDS, T


@dataclass
class Recovered:
    """What the journal adds to a checkpoint (read by recover())."""
    counters: Optional[dict] = None                           # the last after the checkpoint
    summaries: List[dict] = field(default_factory=list)       # episodes ended after it
    # policy -> (first row index, columns, rows, written after the checkpoint)
    rows: Dict[str, List[Tuple[int, dict, int, bool]]] = field(default_factory=dict)
    updates: Dict[str, int] = field(default_factory=dict)     # the last journaled update counts
    seg_ends: Dict[int, Dict[str, int]] = field(default_factory=dict)
    last_segment: int = 0
    records: int = 0
    torn: List[str] = field(default_factory=list)             # segments with a dropped tail
    max_eps_id: int = 0
    ended_ids: set = field(default_factory=set)               # eps_ids of every journaled summary

    def rows_end(self) -> Dict[str, int]:
        return {pid: chunks[-1][0] + chunks[-1][2] for pid, chunks in self.rows.items() if chunks}

    def open_episodes(self, open_from: int = 0) -> List[dict]:
        """Summaries, ended as truncated, of the episodes with journaled transitions and no
        summary: they were open at the kill (their sessions are gone). Their length and return
        come from their transitions still in the journal (an action whose outcome never came is
        dropped, as when a simulator is lost)."""
        open_ids = set()
        for chunks in self.rows.values():
            for _, cols, _, _ in chunks:
                open_ids.update(np.unique(np.asarray(cols[EPS_ID])).tolist())
        open_ids = {e for e in open_ids - self.ended_ids if e >= open_from}   # below: ended by a clean stop
        eps: Dict[int, dict] = {}
        for pid, chunks in self.rows.items():
            for _, cols, n, _ in chunks:
                ids = np.asarray(cols[EPS_ID])
                mine = np.flatnonzero(np.isin(ids, list(open_ids))) if open_ids else ()
                agents, rew, t = np.asarray(cols[AGENT_INDEX]), np.asarray(cols[REWARDS]), np.asarray(cols[T])
                for k in mine:
                    ep = eps.setdefault(int(ids[k]), {"length": 0, "agents": {}})
                    ep["length"] = max(ep["length"], int(t[k]) + 1)
                    a = ep["agents"].setdefault(f"agent{int(agents[k])}", [pid, 0.0])
                    a[1] += float(rew[k])
        out = []
        for e, ep in sorted(eps.items()):
            agent_rewards = {aid: r for aid, (_, r) in ep["agents"].items()}
            agent_policies = {aid: pid for aid, (pid, _) in ep["agents"].items()}
            policy_rewards: Dict[str, float] = {}
            for aid, pid in agent_policies.items():
                policy_rewards[pid] = policy_rewards.get(pid, 0.0) + agent_rewards[aid]
            out.append({"episode_id": f"eps-{e}", "eps_id": e, "session_id": "", "total_reward":
                        float(sum(agent_rewards.values())), "length": ep["length"],
                        "agent_rewards": agent_rewards, "agent_policies": agent_policies,
                        "policy_rewards": policy_rewards, "custom_metrics": {}, "training_enabled": True,
                        "end_reason": "trainer_lost", "duration_s": 0.0})
        return out


def recover(directory: Path, since_segment: int, needed_from: Dict[str, int]) -> Recovered:
    """Read every segment; counters, episodes and updates from `since_segment` on (the ones
    before are in the checkpoint), rows from needed_from[policy] on (earlier ones are neither
    new to the learner nor needed to refill its replay buffer)."""
    rec = Recovered()
    directory = Path(directory)
    names = sorted(directory.glob("seg-*.sbj")) if directory.is_dir() else []
    for path in names:
        try:
            n = int(path.stem.split("-")[1])
        except (IndexError, ValueError):
            continue
        data = path.read_bytes()
        records, used = decode_all(data)
        if used < len(data):
            rec.torn.append(f"{path.name}: {len(data) - used} bytes")
        rec.last_segment = max(rec.last_segment, n)
        ends = rec.seg_ends.setdefault(n, {})
        after = n >= since_segment
        links = RecordLinks()   # every linked record of the segment, in order, skipped ones too
        for header, arrays in records:
            kind = header.get("k")
            if kind == "rows" and LINKED in header["cols"]:
                arrays = links.unlink(header, arrays)
                if arrays is None:   # cannot happen to a segment written whole: read as torn
                    rec.torn.append(f"{path.name}: a record's linked observations")
                    break
            rec.records += 1
            if kind == "rows":
                pid, i, k = header["p"], int(header["i"]), int(header["n"])
                ends[pid] = i + k
                if i + k <= needed_from.get(pid, 0) and not after:
                    continue
                cols = {c: unflatten(spec, arrays) for c, spec in header["cols"].items() if c != LINKED}
                if EPS_ID in cols and len(cols[EPS_ID]):
                    rec.max_eps_id = max(rec.max_eps_id, int(np.max(cols[EPS_ID])))
                rec.rows.setdefault(pid, []).append((i, cols, k, after))
            elif kind == "episode":
                eps_id = int(header["s"].get("eps_id", 0))
                rec.ended_ids.add(eps_id)
                rec.max_eps_id = max(rec.max_eps_id, eps_id)
                if after:
                    rec.summaries.append(header["s"])
            elif not after:
                continue
            elif kind == "counters":
                rec.counters = {"env_steps": header["env"], "agent_steps": header["agent"],
                                "episodes": header["episodes"]}
            elif kind == "updates":
                rec.updates.update({p: int(u) for p, u in header["u"].items()})
    for chunks in rec.rows.values():
        chunks.sort(key=lambda c: c[0])
    return rec
