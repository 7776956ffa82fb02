"""A data-parallel trainer group in tests (trainer/distributed/group.py): two ranks on two "hosts",
network namespaces joined by a veth pair, each with its own 10.x address, where they can be made
(root and `ip`), else two ports on loopback (and a warning says why); their simulators; a stop
that lets every rank write its last counts."""
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
import warnings

import pytest

from simbridge.trainer.run.launch import Proc, child_env, free_port, free_ports, python_module, wait_for_health
from support.daemon import metrics
from support.waits import wait

def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


class Hosts:
    """Two places to run a rank: `wrap(i, argv)` runs argv on host i; `addr[i]` is its address."""

    def __init__(self):
        self.namespaces = []
        self.why = ""

    def make(self) -> "Hosts":
        tag = uuid.uuid4().hex[:6]
        if os.environ.get("SIMBRIDGE_TEST_LOOPBACK"):   # to run the fallback where namespaces work
            return self._loopback("SIMBRIDGE_TEST_LOOPBACK is set")
        if os.geteuid() != 0 or shutil.which("ip") is None:
            return self._loopback("not root" if os.geteuid() != 0 else "no `ip` command")
        names = [f"sbd{tag}a", f"sbd{tag}b"]
        net = f"10.{200 + int(tag[:2], 16) % 50}.{int(tag[2:4], 16)}"
        try:
            for ns in names:
                _ip("netns", "add", ns)
                self.namespaces.append(ns)
            _ip("link", "add", f"v{tag}a", "netns", names[0], "type", "veth", "peer", "name", f"v{tag}b",
                "netns", names[1])
            for i, ns in enumerate(names):
                _ip("-n", ns, "addr", "add", f"{net}.{i + 1}/24", "dev", f"v{tag}{'ab'[i]}")
                _ip("-n", ns, "link", "set", f"v{tag}{'ab'[i]}", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except (subprocess.CalledProcessError, OSError) as e:
            self.close()
            msg = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
            return self._loopback(f"`ip netns` failed: {msg}")
        self.host = [f"{net}.1", f"{net}.2"]
        self.ifname = [f"v{tag}a", f"v{tag}b"]
        self.port = [50051, 50051]   # each host has its own ports
        return self

    def _loopback(self, why: str) -> "Hosts":
        self.why = f"network namespaces unavailable ({why}): the two ranks run on loopback with two ports"
        warnings.warn(self.why)   # shown in pytest's summary
        self.host, self.ifname, self.port = ["127.0.0.1", "127.0.0.1"], ["lo", "lo"], free_ports(2)
        return self

    def addr(self, i: int) -> str:
        return f"{self.host[i]}:{self.port[i]}"

    def wrap(self, i: int, argv):
        return ["ip", "netns", "exec", self.namespaces[i], *argv] if self.namespaces else list(argv)

    def close(self) -> None:
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self.namespaces = []


@pytest.fixture
def hosts():
    h = Hosts().make()
    try:
        yield h
    finally:
        h.close()


SMALL = ('{ batch_size = 32, learning_starts = 200, hidden = [32, 32], buffer_size = 5000, updates_per_step = 0.5, '
         'seed = 0 }')


def start_group(tmp_path, hosts: Hosts, budget: int, preset: str, resume: bool = False,
                algorithm: str = "dqn", extra: str = "", shared_logdir: bool = False, name: str = "run"):
    """Two ranks, each serving on its own host; returns (procs, logdir). extra: more config (a
    [dataset] table); shared_logdir: both ranks get rank 0's --logdir (one shared filesystem)."""
    logdir = tmp_path / name
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(f"""[server]
address = "127.0.0.1:0"
rollout_fragment_length = 32
[run]
logdir = "{logdir}"
total_env_steps = {budget}
print_every_s = 0.5
checkpoint_every_env_steps = 1000000
seed = 0
[policies.default_policy]
algorithm = "{algorithm}"
config = {preset}
{extra}""")
    master = free_port() if not hosts.namespaces else 29500 + resume + 2 * (name != "run")   # a group after another
    procs = []
    for i in range(2):
        env = child_env({"RANK": str(i), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": hosts.host[0],
                         "MASTER_PORT": str(master), "GLOO_SOCKET_IFNAME": hosts.ifname[i],
                         "SIMBRIDGE_DIST_TIMEOUT_S": "30"})
        argv = python_module("simbridge.trainer.cli", "run", "--config", cfg, "--address", hosts.addr(i),
                             "--logdir", logdir if i == 0 or shared_logdir else tmp_path / f"rank{i}", "--insecure",
                             *(["--resume"] if resume else []))
        procs.append(Proc(f"rank{i}", hosts.wrap(i, argv), env=env, keep=400))
    return procs, logdir


def wait_health(hosts: Hosts, procs, i: int) -> None:
    if hosts.namespaces:   # the health check must run inside the namespace too
        wait(lambda: any("joined the group" in line for line in procs[i].lines), 120, f"rank {i} to join the group",
             [procs[i]], every=0.2)
        return
    wait_for_health(hosts.addr(i), timeout=120, proc=procs[i])


def sim(hosts: Hosts, i: int, *args):
    return subprocess.Popen(hosts.wrap(i, python_module("simbridge.sims.gym_sim", "--address", hosts.addr(i),
                                                        "--quiet", "--seed", str(i), *args)),
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def digests(proc):
    return re.findall(r"policy default_policy at (version \d+, weights sha256 \w+)", "\n".join(proc.lines))


def finish(sims, procs, timeout_s: float = 200, logdir=None, until=None):
    """Each simulator's closing JSON line once it ends, then the ranks stopped (every rank's last
    counts reach rank 0 by the exchange at the stop): (summaries, the ranks' exit codes).
    until(record): the simulators are stopped (SIGTERM: they cut their episodes, say so and print
    their counts) as soon as one of rank 0's metrics records in `logdir` passes it; a learning test
    ends at its target instead of running its whole step budget (see unanswered())."""
    if until is not None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(s.poll() is None for s in sims):
            if any(until(r) for r in metrics(logdir)):
                for s in sims:
                    if s.poll() is None:
                        s.send_signal(signal.SIGTERM)
                break
            time.sleep(0.5)
    outs = [json.loads(s.communicate(timeout=timeout_s)[0].strip().splitlines()[-1]) for s in sims]
    return outs, stop(procs)


def unanswered(outs) -> int:
    """How many simulators gave up an answer when stopped: a SIGTERM while the trainer is slow to
    answer (a loaded machine) ends the wait after STOP_GRACE_S (simbridge/client/stopping.py). The
    server counts an env step when it serves an action, so such a simulator's last action may be
    counted on the trainer's side (served, the answer lost) or not (the request cut off): the two
    sides agree exactly only up to one env step and one episode per such simulator (gym_sim, one slot)."""
    return sum("waiting for an answer" in o.get("stopped", "") for o in outs)


def assert_counts(rec: dict, outs, episodes: bool = True) -> None:
    """The group's counts (its last metrics record) are its simulators' summaries', exactly but
    for the answers they gave up when stopped (unanswered())."""
    lost = unanswered(outs)
    steps = sum(o["steps"] for o in outs)
    assert steps <= rec["env_steps"] <= steps + lost, (rec, outs)
    if episodes:
        eps = sum(o["episodes"] + o["cut_at_exit"] for o in outs)
        assert eps <= rec["episodes"] <= eps + lost, (rec, outs)


def best_return(recs, target: float, pid: str = "default_policy"):
    """(the best return(10) of the records, the env steps where it first reached target or None)."""
    r10 = [r["return_mean_10"].get(pid, 0.0) for r in recs]
    return max(r10, default=0.0), next((r["env_steps"] for r, x in zip(recs, r10) if x >= target), None)


def cleanup(sims, procs) -> None:
    """After a test, pass or fail: no simulator or rank left running."""
    for s in sims:
        if s.poll() is None:
            s.kill()
    stop(procs)


def stop(procs):
    """One SIGTERM to each rank at once (a second would mean "now, no checkpoint"); their exit codes."""
    for p in procs:
        if p.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
    codes = []
    for p in procs:
        try:
            p.popen.wait(60)
        except subprocess.TimeoutExpired:
            p.popen.kill()
        codes.append(p.stop())
    return codes
