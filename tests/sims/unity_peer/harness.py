"""What the Unity connector tests share: a recording bridge server, the connector run as a
process with the peer as its "build", and the peer's trace turned into the transitions the
bridge must have recorded."""
import collections
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from simbridge.wire import tree
from simbridge.trainer.run.launch import child_env, free_port, stop_all, wait_for_health
from simbridge.server.mapping import parse_rules, pattern_mapping
from simbridge.server.policies import ActionBatch, Policy, RandomPolicy
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.sample_batch import SampleBatch
from simbridge.server.service import BridgeServer

ROOT = Path(__file__).resolve().parents[3]
PEER = Path(__file__).resolve().parent / "unity_peer.x86_64"


def ports_free(base: int, n: int) -> bool:
    for port in range(base, base + n):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("localhost", port))
            except OSError:
                return False
    return True


def free_base_port(n: int = 1) -> int:
    """A port p with p .. p+n-1 free a moment ago (Unity instance i listens on p + i)."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("localhost", 0))
            base = s.getsockname()[1]
        if base + n < 65536 and ports_free(base, n):
            return base
    raise RuntimeError("no run of free ports")


class ScriptedPolicy(Policy):
    """Actions from a function of the observation batch; remembers every batch it saw."""

    def __init__(self, obs_space, act_space, choose: Optional[Callable] = None):
        super().__init__(obs_space, act_space)
        self.choose = choose
        self.random = RandomPolicy(obs_space, act_space, seed=0)
        self.seen: List = []
        self._lock = threading.Lock()

    def compute_actions(self, obs_batch) -> ActionBatch:
        with self._lock:
            self.seen.append(tree.map_structure(np.array, obs_batch))
        if self.choose is None:
            return self.random.compute_actions(obs_batch)
        return ActionBatch(self.choose(obs_batch))


class Bridge:
    """A real BridgeServer on loopback: policies by glob rules, every batch and episode kept."""

    def __init__(self, rules: List[str], choosers: Optional[Dict[str, Callable]] = None, default: str = "default",
                 address: str = "127.0.0.1:0"):
        self.choosers = choosers or {}
        self.policies: Dict[str, ScriptedPolicy] = {}
        self.runtime = BridgeRuntime(BridgeConfig(rollout_fragment_length=1, experience_queue_size=1024),
                                     policy_mapping_fn=pattern_mapping(parse_rules(rules), default),
                                     policy_factory=self._factory)
        self.summaries: List[dict] = []
        self.runtime.episode_end_callbacks.append(self.summaries.append)
        self.batches: Dict[str, List[SampleBatch]] = collections.defaultdict(list)
        self.server = BridgeServer(self.runtime, address).start()
        self.address = self.server.address
        self._stop = threading.Event()
        self._drain = threading.Thread(target=self._drain_loop, daemon=True)
        self._drain.start()

    def _factory(self, pid, obs_space, act_space):
        p = self.policies[pid] = ScriptedPolicy(obs_space, act_space, self.choosers.get(pid))
        return p

    def _take(self, batch) -> None:
        for pid, b in batch.policy_batches.items():
            self.batches[pid].append(b)

    def _drain_loop(self) -> None:
        while not self._stop.is_set():
            b = self.runtime.experience.get(timeout=0.05)
            if b is not None:
                self._take(b)

    def stop(self) -> None:
        self.server.stop(grace=0)
        self._stop.set()
        self._drain.join()
        self.runtime.flush()
        for b in self.runtime.experience.get_all():
            self._take(b)

    def episodes(self, pid: str) -> Dict[str, List[dict]]:
        """"<session id>:<episode id>" -> its transitions (dicts of one row each), in order of t.
        (Instances of one build use the same Unity agent ids, so episode ids repeat across sessions.)"""
        by_index = {s["eps_id"]: f"{s['session_id']}:{s['episode_id']}" for s in self.summaries}
        out: Dict[str, List[dict]] = collections.defaultdict(list)
        for b in self.batches[pid]:
            for i in range(b.count):
                row = {k: tree.take(b[k], i) for k in b.keys()}
                out[by_index[int(row["eps_id"])]].append(row)
        for rows in out.values():
            rows.sort(key=lambda r: int(r["t"]))
        return dict(out)


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, trace_files: List[Path]):
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        self.summary = json.loads(lines[-1]) if lines else {}
        self.traces = [[json.loads(x) for x in f.read_text().splitlines()] if f.exists() else [] for f in trace_files]

    @property
    def trace(self) -> List[dict]:
        return self.traces[0]

    def explain(self) -> str:
        return f"exit {self.code}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"


def run_connector(address: str, tmp_path: Path, args=(), peer_args=(), num_envs: int = 1, timeout: float = 90,
                  base_port: Optional[int] = None, env_path: Path = PEER) -> Run:
    port = base_port or free_base_port(num_envs)
    trace = tmp_path / "trace-{port}.jsonl"
    cmd = [sys.executable, "-m", "simbridge.sims.unity.connector", "--address", address, "--env", str(env_path),
           "--base-port", str(port), "--num-envs", str(num_envs), "--timeout-wait", "30", "--connect-timeout", "10",
           "--log-folder", str(tmp_path), "--no-graphics", *map(str, args),
           "--env-args", "--trace", str(trace), *map(str, peer_args)]
    env = child_env({"SIMBRIDGE_PEER_PYTHON": sys.executable})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))
    return Run(proc, [Path(str(trace).format(port=port + i)) for i in range(num_envs)])


# ---------------------------------------------------------------- the trace as transitions

def timelines(trace: List[dict], behavior: str) -> Dict[int, List[dict]]:
    """Per Unity agent id, everything the peer sent about it in order (done infos and
    decisions); decisions carry the action the peer then applied (None: never answered)."""
    out: Dict[int, List[dict]] = collections.defaultdict(list)
    for rec in trace:
        if rec["kind"] == "sent":
            for info in rec["behaviors"].get(behavior, []):
                out[info["id"]].append({**info, "action": None, "step": rec["step"]})
        elif rec["kind"] == "received":
            for a in rec["actions"].get(behavior, []):
                last = out[a["id"]][-1]
                assert not last["done"] and last["action"] is None, "an action for an agent that did not ask"
                last["action"] = (a["c"], a["d"])
    return dict(out)


def expected_episodes(timeline: List[dict], group_weight: float = 1.0) -> List[List[dict]]:
    """The transitions one agent's timeline must produce, split into its episodes.

    A decision that was answered and is followed by another message about the agent gives
    (obs, action, new_obs, reward) with the follower's reward (+ group reward): terminated when
    the follower is a done info without max_step_reached, truncated when it has it, or when the
    follower is the last, unanswered decision (the connector stopped there). After a done info
    the next decision opens a new episode; nothing links the two."""
    episodes, cur = [], []
    for prev, nxt in zip(timeline, timeline[1:]):
        if prev["done"] or prev["action"] is None:
            continue
        cut = not nxt["done"] and nxt["action"] is None
        cur.append({"obs": prev["obs"], "mask": prev.get("mask"), "action": prev["action"], "new_obs": nxt["obs"],
                    "new_mask": None if nxt["done"] else nxt.get("mask"),
                    "reward": np.float32(nxt["reward"]) + np.float32(group_weight) * np.float32(nxt["group_reward"]),
                    "terminated": nxt["done"] and not nxt["max_step"],
                    "truncated": (nxt["done"] and nxt["max_step"]) or cut})
        if nxt["done"] or cut:
            episodes.append(cur)
            cur = []
    if cur:
        episodes.append(cur)  # ended by the session's close: its last action had no outcome
    return episodes


def episode_number(episode_id: str) -> int:
    return int(episode_id.rsplit("/", 1)[1])


def agent_of(episode_id: str) -> int:
    return int(episode_id.rsplit("/", 2)[1])


def server_episodes(bridge: Bridge, pid: str) -> Dict[int, List[List[dict]]]:
    """Unity agent id -> its episodes' transitions on the server, in episode order."""
    out: Dict[int, list] = {}
    for eid, rows in bridge.episodes(pid).items():
        out.setdefault(agent_of(eid), []).append((episode_number(eid), rows))
    return {a: [rows for _, rows in sorted(eps, key=lambda e: e[0])] for a, eps in out.items()}


def _first_sensor(value):
    """The first sensor's values as Unity sent them: a camera sent as bytes (the connector's default
    --camera-dtype uint8) back in [0, 1], as the peer's trace holds it."""
    v = np.asarray(value["obs_0"] if isinstance(value, dict) else value)
    return v.astype(np.float32) / np.float32(255.0) if v.dtype == np.uint8 else v


def check_replay(bridge: Bridge, trace: List[dict], behavior: str, pid: str, group_weight: float = 1.0) -> int:
    """Every transition the bridge recorded for `behavior` equals the one the peer's trace implies
    (observations, action applied, reward, terminated/truncated, masks), in the same episodes;
    returns how many were compared."""
    lines = timelines(trace, behavior)
    got = server_episodes(bridge, pid)
    assert sorted(got) == sorted(lines), "agents on the server differ from the agents Unity sent"
    n = 0
    for agent, line in lines.items():
        want = expected_episodes(line, group_weight)
        have = got[agent]
        assert [len(e) for e in have] == [len(e) for e in want], f"agent {agent}: episode lengths differ"
        for ep_have, ep_want in zip(have, want):
            for row, w in zip(ep_have, ep_want):
                np.testing.assert_allclose(_first_sensor(row["obs"]), w["obs"][0], atol=1e-6)
                np.testing.assert_allclose(_first_sensor(row["new_obs"]), w["new_obs"][0], atol=1e-6)
                assert abs(float(row["rewards"]) - float(w["reward"])) <= 1e-5, (row["rewards"], w["reward"])
                assert (bool(row["terminateds"]), bool(row["truncateds"])) == (w["terminated"], w["truncated"])
                act = row["actions"]
                if isinstance(act, dict):
                    np.testing.assert_allclose(act["continuous"], w["action"][0], atol=1e-6)
                    np.testing.assert_array_equal(act["discrete"], w["action"][1])
                elif w["action"][1]:
                    np.testing.assert_array_equal(np.ravel(act), w["action"][1])
                else:
                    np.testing.assert_allclose(np.ravel(act), w["action"][0], atol=1e-6)
                if w["mask"] is not None:  # the policy saw Unity's mask, flipped to 1 = allowed
                    np.testing.assert_array_equal(row["obs"]["action_mask"], ~np.asarray(w["mask"]))
                    nxt = w["new_mask"]
                    want_next = np.ones_like(w["mask"]) if nxt is None else ~np.asarray(nxt)
                    np.testing.assert_array_equal(row["new_obs"]["action_mask"], want_next)
                n += 1
    return n


def train_through_connector(tmp_path: Path, config: Path, scenes: str, budget: int, timeout: float,
                            done: Callable[[dict], bool]):
    """The trainer daemon (`config`, stopping at `budget` env steps) and the connector driving the
    peer's `scenes` with 8 agents each, until `done(last metrics record)` or `timeout` s.
    Returns (metrics records, the connector's stderr)."""
    address = f"127.0.0.1:{free_port()}"
    logdir = tmp_path / "run"
    env = child_env({"SIMBRIDGE_PEER_PYTHON": sys.executable})
    daemon = subprocess.Popen([sys.executable, "-m", "simbridge.trainer.cli", "run", "--config", str(config),
                               "--address", address, "--logdir", str(logdir), "--total-env-steps", str(budget)],
                              env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    connector = None
    recs: List[dict] = []
    try:
        wait_for_health(address, timeout=120)
        connector = subprocess.Popen([sys.executable, "-m", "simbridge.sims.unity.connector", "--address", address,
                                      "--env", str(PEER), "--base-port", str(free_base_port(1)), "--no-graphics",
                                      "--seed", "0", "--quiet", "--log-folder", str(tmp_path),
                                      "--env-args", "--scene", scenes, "--agents", "8"],
                                     env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        deadline = time.monotonic() + timeout
        from support.daemon import metrics   # tests/ on sys.path: the tests' one reader of a live run
        while time.monotonic() < deadline and daemon.poll() is None and connector.poll() is None:
            recs = metrics(logdir)
            if recs and done(recs[-1]):
                break
            time.sleep(0.5)
    finally:
        stop_all([connector, daemon])
    return recs, (connector.stderr.read() if connector else "")
