"""[dataset] in a data-parallel group (trainer/distributed/group.py, docs/scaling.md, docs/datasets.md): two
real trainer ranks on two "hosts" (test_distributed.py's network namespaces) record what their own
simulators send, each to its own Minari dataset in one shared logdir; the two combine with minari's
own tool; a second group warm-starts from the combined dataset, each rank taking every other
episode, and runs exactly the updates the group's clock makes due, with equal weights on both ranks.
"""
import re

import pytest

from simbridge.trainer.run.checkpoint import load_checkpoint
from simbridge.trainer.run.launch import free_port

from support.daemon import metrics
from support.datasets import tiny_dataset
from support.group import (SMALL, cleanup, digests, finish, hosts, sim, start_group,  # noqa: F401
                           stop, wait_health)
from support.waits import wait

minari = pytest.importorskip("minari", reason="the datasets extra: pip install 'simbridge[datasets]'")


def _dataset(root, rank: int):
    from minari.dataset.minari_dataset import MinariDataset
    return MinariDataset(root / f"simbridge/default_policy-rank{rank}-v0" / "data")


@pytest.mark.timeout(240)
def test_a_group_records_per_rank_then_warm_starts_from_the_combined_dataset(tmp_path, hosts, monkeypatch):
    steps = [1500, 1000]   # per simulator: rank i's dataset must hold exactly its own
    procs, logdir = start_group(tmp_path, hosts, budget=0, preset=SMALL, shared_logdir=True, name="rec",
                                extra="[dataset]\nrecord = true\n")
    sims = []
    try:
        for i in range(2):
            wait_health(hosts, procs, i)
        sims = [sim(hosts, i, "--max-steps", str(steps[i])) for i in range(2)]
        outs, codes = finish(sims, procs, timeout_s=120)
    finally:
        cleanup(sims, procs)
    text = ["\n".join(p.lines) for p in procs]
    assert codes == [0, 0], "\n".join(text)
    root = logdir / "datasets"   # both ranks' logdir: their datasets side by side, by id
    total_steps = total_episodes = 0
    for i, out in enumerate(outs):
        ds = _dataset(root, i)
        episodes = out["episodes"] + out["cut_at_exit"]
        assert (ds.total_steps, ds.total_episodes) == (out["steps"], episodes) == (steps[i], episodes), (i, out)
        assert ds.spec.dataset_id == f"simbridge/default_policy-rank{i}-v0"
        assert (f"dataset of default_policy: {episodes:,} episodes, {steps[i]:,} steps in "
                f"{root / f'simbridge/default_policy-rank{i}-v0'}") in text[i], text[i]
        total_steps, total_episodes = total_steps + ds.total_steps, total_episodes + ds.total_episodes
    assert sorted(p.name for p in (root / "simbridge").iterdir()) == ["default_policy-rank0-v0",
                                                                    "default_policy-rank1-v0"]
    # The group's counts of a run its simulators ran out (no signal) agree exactly with theirs.
    last = metrics(logdir)[-1]
    assert last["event"] == "stop" and last["env_steps"] == total_steps == sum(steps), last
    assert last["episodes"] == total_episodes, last

    # One dataset of the group's, with minari's own tool (as docs/datasets.md shows).
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    combined = minari.combine_datasets([minari.load_dataset(f"simbridge/default_policy-rank{i}-v0") for i in (0, 1)],
                                       "simbridge/default_policy-v0")
    assert (combined.total_steps, combined.total_episodes) == (total_steps, total_episodes)

    # Warm start: no simulator; each rank takes every other episode, the group's clock counts the
    # dataset's rows per rank, and both ranks run the updates due on it, the same ones.
    source = root / "simbridge/default_policy-v0"
    procs, logdir = start_group(tmp_path, hosts, budget=0, preset=SMALL, name="warm",
                                extra=f'[dataset]\nwarm_start = {{ default_policy = "{source}" }}\n')
    clock = total_steps // 2
    due = int((clock - 200) * 0.5)   # SMALL: learning_starts 200, updates_per_step 0.5
    try:
        for i in range(2):
            wait_health(hosts, procs, i)
        wait(lambda: any(r.get("updates", {}).get("default_policy", 0) >= due for r in metrics(logdir)), 60,
             f"{due} updates", procs, every=0.2)
        codes = stop(procs)
    finally:
        stop(procs)
    text = ["\n".join(p.lines) for p in procs]
    assert codes == [0, 0], "\n".join(text)
    shares = [re.search(r"warm start of default_policy: rank %d's share: ([\d,]+) transitions \((\d+) of (\d+) "
                        r"episodes\)" % i, text[i]) for i in (0, 1)]
    assert all(shares), "\n".join(text)
    rows = [int(m.group(1).replace(",", "")) for m in shares]
    assert sum(rows) == total_steps and all(rows), rows
    assert [int(m.group(2)) for m in shares] == [(total_episodes + 1) // 2, total_episodes // 2]
    d0, d1 = digests(procs[0]), digests(procs[1])
    assert d0 and d0 == d1 and d0[0].startswith(f"version {due},"), (d0, d1, due)
    recs = metrics(logdir)
    assert recs[-1]["env_steps"] == 0 and recs[-1]["versions"]["default_policy"] == due
    state = load_checkpoint(logdir / "checkpoint.pt")["policies"]["default_policy"]["state"]
    assert state["agent_steps"] == clock and state["updates"] == due, state


def test_what_a_group_cannot_do_is_refused_before_it_starts(monkeypatch, capsys, tmp_path):
    """A PPO warm start is refused in a group as in a single trainer: before serving or joining."""
    from simbridge.trainer import cli
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    cfg = tmp_path / "warm.toml"
    cfg.write_text('[policies.default_policy]\nalgorithm = "ppo"\n')
    assert cli.main(["run", "--config", str(cfg), "--logdir", str(tmp_path / "run"), "--address",
                     f"127.0.0.1:{free_port()}", "--warm-start",
                     f"default_policy={tiny_dataset(tmp_path / 'ds')}"]) == 2
    err = capsys.readouterr().err
    assert "is PPO, which learns on-policy" in err and "use dqn or sac" in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()
