"""A data-parallel group of two trainer ranks (trainer/distributed/group.py) on two separate "hosts": two
network namespaces this test makes, joined by a veth pair, each with its own 10.x address, its own
rank and its own simulator, talking to the other only over that link. Where namespaces cannot be
made (not root, no `ip`), the same group on loopback with two ports, and the test says why.

Asserted: the ranks end with bitwise-equal weights at the same version; rank 0's records (the
group's) count exactly the env steps and episodes both simulators sent; DQN learns CartPole through
the group; a rank killed mid-run stops the other with a clear message instead of a hang.
"""
import re
import time

import pytest

from simbridge.trainer.run.launch import free_port
from simbridge.trainer.config.values import toml_value
from simbridge.trainer.learners.presets import PPO_CARTPOLE
from support.daemon import metrics
from support.learning import QUICK
from support.group import (SMALL, assert_counts, best_return, cleanup, digests, finish, hosts, sim,  # noqa: F401 (hosts: a fixture)
                           start_group, stop, wait_health)



@pytest.mark.timeout(300)
def test_two_ranks_on_two_hosts_learn_with_equal_weights_and_exact_counts(tmp_path, hosts):
    # Per simulator. support.learning's QUICK (the DQN preset at half its CPU per env step): return(10)
    # >= 150 at 11.6k env steps of the group alone (52 CPU-s); the preset came at 10.5-14k over 6 runs,
    # one CI run had only 140 by 16k, so the group gets up to 24k. The simulators stop (SIGTERM) when
    # the group's records reach it: each rank runs every update of the group, so the whole budget
    # costs twice or more. Exact counts of a group's run out without a signal:
    # test_distributed_datasets.py's recording group.
    steps = 12000
    procs, logdir = start_group(tmp_path, hosts, budget=0, preset=QUICK)
    sims = []
    try:
        for i in range(2):
            wait_health(hosts, procs, i)
        sims = [sim(hosts, i, "--max-steps", str(steps)) for i in range(2)]
        outs, codes = finish(sims, procs, logdir=logdir, until=reached(150))
    finally:
        cleanup(sims, procs)
    out = "\n".join(f"--- rank{i}\n" + "\n".join(p.lines) for i, p in enumerate(procs))
    assert codes == [0, 0], out
    d0, d1 = digests(procs[0]), digests(procs[1])
    assert d0 and d0 == d1, f"the ranks' weights differ: {d0} vs {d1}\n{out}"
    recs = metrics(logdir)
    last = recs[-1]
    assert last["event"] == "stop"
    assert_counts(last, outs)
    assert sum(o["steps"] for o in outs) <= 2 * steps, outs
    assert last["versions"]["default_policy"] == int(d0[0].split()[1].rstrip(",")) > 1000
    best, at = best_return(recs, 150)
    print(f"return(10) best {best:.1f}, >= 150 at {at} env steps of {2 * steps}; {hosts.why or 'namespaces'}")
    assert best >= 150, f"return(10) reached only {best} in {2 * steps} env steps"


def reached(target: float):
    """A metrics record in which the group's return(10) reached `target`."""
    return lambda rec: rec.get("return_mean_10", {}).get("default_policy", 0.0) >= target


# trainer/learners/presets.py's PPO_CARTPOLE: each rank's minibatch of 256 rows, averaged over the two ranks.
PPO_PRESET = toml_value({**PPO_CARTPOLE, "seed": 0})


@pytest.mark.timeout(300)
def test_ppo_ranks_iterate_together_one_sitting_out_until_its_simulator_comes(tmp_path, hosts):
    """PPO in a group: an iteration starts on both ranks at the same exchange, with the same number
    of minibatch updates. Rank 1's simulator comes only after rank 0's has trained some iterations:
    rank 1 sits those out (empty minibatches, weight 0) and its weights stay equal all the same.
    The simulators stop (SIGTERM) once the group's return(10) reaches 150: 19.8k of the 30k env
    steps in one run here; the whole budget cost 99 CPU-s in a full run of the suite."""
    steps = 15000
    procs, logdir = start_group(tmp_path, hosts, budget=0, preset=PPO_PRESET, algorithm="ppo")
    sims = []
    try:
        for i in range(2):
            wait_health(hosts, procs, i)
        sims.append(sim(hosts, 0, "--max-steps", str(steps)))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(r.get("versions", {}).get("default_policy", 0) >= 40
                                                      for r in metrics(logdir)):
            time.sleep(0.2)
        early = max((r.get("versions", {}).get("default_policy", 0) for r in metrics(logdir)), default=0)
        sims.append(sim(hosts, 1, "--max-steps", str(steps)))
        outs, codes = finish(sims, procs, logdir=logdir, until=reached(150))
    finally:
        cleanup(sims, procs)
    out = "\n".join(f"--- rank{i}\n" + "\n".join(p.lines) for i, p in enumerate(procs))
    assert early >= 40, f"no PPO iteration before rank 1's simulator came (version {early})\n{out}"
    assert codes == [0, 0], out
    d0, d1 = digests(procs[0]), digests(procs[1])
    assert d0 and d0 == d1, f"the ranks' weights differ: {d0} vs {d1}\n{out}"
    recs = metrics(logdir)
    assert_counts(recs[-1], outs, episodes=False)
    assert sum(o["steps"] for o in outs) <= 2 * steps and outs[1]["steps"] > 0, outs   # rank 1's simulator fed the group once it came
    version = int(d0[0].split()[1].rstrip(","))
    assert version > early, (version, early)   # and the ranks iterated together after it came
    best, at = best_return(recs, 150)
    print(f"PPO return(10) best {best:.1f}, >= 150 at {at} env steps of {2 * steps}; version {version} "
          f"({early} before rank 1's simulator); {hosts.why or 'namespaces'}")
    assert best >= 150, f"return(10) reached only {best} in {2 * steps} env steps"


@pytest.mark.timeout(240)
def test_a_killed_rank_stops_the_group_and_resume_restarts_it_from_rank0s_checkpoint(tmp_path, hosts):
    """Rank 0 has no simulator here: it still takes part in every update (weight 0), and builds the
    policy from rank 1's handshake. After the kill, --resume gives both ranks rank 0's checkpoint."""
    procs, logdir = start_group(tmp_path, hosts, budget=0, preset=SMALL)
    try:
        for i in range(2):
            wait_health(hosts, procs, i)
        assert sim(hosts, 1, "--max-steps", "1000").wait(60) == 0
        procs[1].popen.kill()
        deadline = time.monotonic() + 45
        while procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert procs[0].poll() == 1, "rank 0 did not stop after rank 1 was killed:\n" + "\n".join(procs[0].lines)
    finally:
        stop(procs)
    text = "\n".join(procs[0].lines)
    assert "lost the process group" in text and "--resume" in text, text
    killed_at = int(digests(procs[0])[0].split()[1].rstrip(","))
    assert killed_at > 20 and metrics(logdir)[-1]["versions"]["default_policy"] == killed_at

    procs, _ = start_group(tmp_path, hosts, budget=0, resume=True, preset=SMALL)
    try:
        for i in range(2):
            wait_health(hosts, procs, i)
        assert sim(hosts, 1, "--max-steps", "300").wait(60) == 0
        codes = stop(procs)
    finally:
        stop(procs)
    out = "\n".join(f"--- rank{i}\n" + "\n".join(p.lines) for i, p in enumerate(procs))
    assert codes == [0, 0], out
    d0, d1 = digests(procs[0]), digests(procs[1])
    assert d0 and d0 == d1 and int(d0[0].split()[1].rstrip(",")) > killed_at, out
    resumed = re.search(r"resumed at ([\d,]+) env steps", "\n".join(procs[0].lines))
    assert resumed and int(resumed.group(1).replace(",", "")) >= 800, out


@pytest.mark.parametrize("env,expect", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set: start the ranks with torchrun"),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "integers expected"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK=2 is outside WORLD_SIZE=2"),
], ids=["no-master", "not-integer", "rank-outside"])
def test_a_bad_rank_environment_is_one_line_naming_the_fix(monkeypatch, capsys, tmp_path, env, expect):
    from simbridge.trainer import cli
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main(["run", "--logdir", str(tmp_path / "run"), "--address", f"127.0.0.1:{free_port()}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simbridge-trainer: error: ") and expect in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_each_rank_of_a_host_serves_on_its_own_port():
    from simbridge.trainer.distributed.ranks import rank_address
    assert rank_address("10.0.0.1:50051", 0) == "10.0.0.1:50051"
    assert rank_address("0.0.0.0:50051", 3) == "0.0.0.0:50054"
    assert rank_address("[::1]:50051", 1) == "[::1]:50052"
    assert rank_address("127.0.0.1:0", 2) == "127.0.0.1:0"
    assert rank_address("unix:/run/sb/bridge.sock", 0) == "unix:/run/sb/bridge.sock"
    assert rank_address("unix:/run/sb/bridge.sock", 2) == "unix:/run/sb/bridge.sock.2"
    assert rank_address("shm+unix:/run/sb/bridge.sock", 0) == "shm+unix:/run/sb/bridge.sock"
    assert rank_address("shm+unix:/run/sb/bridge.sock", 2) == "shm+unix:/run/sb/bridge.sock.2"


def test_an_intake_with_more_batches_queued_than_it_takes_loses_none():
    """A rank's intake takes INTAKE_BATCHES between exchanges. Its last turn took one more off the
    queue and dropped it: a fragment the recorder and the learner never saw (rank 0's dataset of
    test_distributed_datasets was once 32 rows short: one fragment of 32). Found by a flake hunt."""
    import threading

    import numpy as np

    from simbridge.server.experience import ExperienceQueue
    from simbridge.server.sample_batch import MultiAgentBatch, SampleBatch
    from simbridge.trainer.config.sections import RunSection
    from simbridge.trainer.distributed.loop import INTAKE_BATCHES, DistributedLoop

    class Runtime:
        experience = ExperienceQueue(64)
        policies: dict = {}

    rt = Runtime()
    loop = DistributedLoop(rt, RunSection(), threading.Event(), lambda why: None, lambda: None, lambda: None)
    n = INTAKE_BATCHES + 1
    for _ in range(n):
        rt.experience.put(MultiAgentBatch({"p": SampleBatch({"rewards": np.zeros(32, np.float32)})}, 32))
    for _ in range(2):
        loop._intake()
    assert rt.experience.qsize() == 0
    assert loop.ingested["p"] == 32 * n, dict(loop.ingested)
