"""The fuzzer's rig: what the fuzz runs against and beside (bench/fuzzjudge.py sends the inputs
and judges the answers).

* `ServerProcess`: `python -m simbridge.server.cli --address 127.0.0.1:0` with its
  stderr in a file (tracebacks are counted), RSS read from /proc, stopped by PID.
* `Witness`: a PolicyClient in a thread running CartPole episodes throughout;
  it must keep getting actions (steps, episodes, the longest gap between steps).
* `Pool`: real sessions made with CreateSession (rows, slots, multi-agent), so
  near-valid requests carry ids that reach deep code.
* `IdleStreams`: streams that bind a session and then stay silent (a careless or
  hostile client), held open beside the fuzz.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import grpc
import gymnasium as gym

from bench.fuzzcases import ACT_SPACE, OBS_SPACE
from bench.fuzzing import N_SLOTS, SERVICES, UNARY, Ctx
from simbridge.wire.v1 import simbridge_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.max_send_message_length", 256 << 20),
                   ("grpc.max_receive_message_length", 256 << 20)]


def rss_mb(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class ServerProcess:
    """`simbridge-server` on a free loopback port (it drains experience itself)."""

    def __init__(self, extra_args=(), timeout_s: float = 60.0):
        self.log = tempfile.NamedTemporaryFile("w+b", prefix="simbridge-fuzz-server-", suffix=".log")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                   no_proxy="127.0.0.1,localhost", no_grpc_proxy="127.0.0.1,localhost")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simbridge.server.cli", "--address", "127.0.0.1:0", "--print-every", "0",
             "--log-level", "WARNING", *extra_args],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.address = None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:   # the first line names the bound port
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on (\S+)", line)
            if m:
                self.address = m.group(1)
                break
        if self.address is None:
            self.stop()
            raise RuntimeError(f"simbridge-server did not start: {self.log_text()[-2000:]}")
        self.final = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_mb(self) -> Optional[float]:
        return rss_mb(self.proc.pid)

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_bytes().decode("utf-8", "replace")

    def log_stats(self) -> dict:
        text = self.log_text()
        return {"log_bytes": len(text.encode()), "tracebacks": text.count("Traceback (most recent call last)"),
                "error_lines": sum(1 for line in text.splitlines() if " ERROR " in line)}

    def stop(self, grace_s: float = 10.0) -> Optional[dict]:
        """SIGTERM, then SIGKILL; returns the server's final snapshot when it printed one."""
        import json
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                out, _ = self.proc.communicate(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, _ = self.proc.communicate(timeout=10)
            for line in (out or "").splitlines():
                if line.startswith('{"final"'):
                    self.final = json.loads(line)["final"]
        return self.final


def run_cartpole(client, stop: threading.Event, counters: dict, seed: int, max_len: int = 200) -> None:
    """CartPole episodes with the server's actions until `stop`; steps are counted once answered."""
    env = gym.make("CartPole-v1", max_episode_steps=max_len)
    obs, _ = env.reset(seed=seed)
    while not stop.is_set():
        eid = client.start_episode()
        done = False
        while not done and not stop.is_set():
            action = client.get_action(eid, obs)
            counters["steps"] += 1
            counters["last_step_t"] = time.monotonic()
            obs, reward, terminated, truncated, _ = env.step(int(action))
            client.log_returns(eid, float(reward))
            done = terminated or truncated
            if done:
                client.end_episode(eid, obs, truncated=truncated and not terminated)
                counters["episodes"] += 1
                obs, _ = env.reset()
    env.close()


class Witness(threading.Thread):
    """A well-behaved simulator beside the fuzz: it must keep being served."""

    def __init__(self, address: str, seed: int = 0):
        super().__init__(name="fuzz-witness", daemon=True)
        self.address, self.seed = address, seed
        self.stop_evt = threading.Event()
        self.counters = {"steps": 0, "episodes": 0, "last_step_t": time.monotonic()}
        self.max_gap_s = 0.0
        self.errors: List[str] = []
        self._started = threading.Event()

    def run(self) -> None:
        from simbridge.client.policy_client import PolicyClient
        try:
            with PolicyClient(self.address, OBS_SPACE, ACT_SPACE, client_name="fuzz-witness") as client:
                self._started.set()
                run_cartpole(client, self.stop_evt, self.counters, self.seed)
        except Exception as e:   # the fuzz's verdict reads this
            self.errors.append(repr(e)[:500])
        finally:
            self._started.set()

    def start(self) -> "Witness":
        super().start()
        self._started.wait(30)
        return self

    def gap_s(self) -> float:
        """Seconds since the witness's last answered step (also tracked as max_gap_s)."""
        gap = time.monotonic() - self.counters["last_step_t"]
        self.max_gap_s = max(self.max_gap_s, gap)
        return gap

    def finish(self, timeout_s: float = 20.0) -> dict:
        self.gap_s()
        self.stop_evt.set()
        self.join(timeout_s)
        return {"steps": self.counters["steps"], "episodes": self.counters["episodes"],
                "max_gap_s": round(self.max_gap_s, 3), "errors": self.errors, "stuck": self.is_alive()}


class Pool:
    """Real sessions for near-valid requests: single-agent rows, single-agent slots, multi-agent."""

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.ctxs: Dict[str, Ctx] = {}
        self.refresh()

    def _call(self, svc: str, method: str, req, timeout: float = 10.0):
        fn = self.channel.unary_unary(f"/{SERVICES[svc]}/{method}", request_serializer=None,
                                      response_deserializer=UNARY[method][1].FromString)
        return fn(req.SerializeToString(), timeout=timeout)

    def _close(self, c) -> None:
        try:
            self._call("multi" if c.multi else "single", "CloseSession",
                       pb.CloseSessionRequest(header=pb.RequestHeader(session_id=c.sid)))
        except grpc.RpcError:
            pass   # the fuzz may have closed it already

    def refresh(self) -> None:
        from bench.fuzzcases import create_session
        from bench.fuzzing import Gen
        made = {}
        for name, multi, slots in (("rows", False, 0), ("slots", False, N_SLOTS), ("multi", True, 0)):
            req = create_session(Gen(_NoDraw(), Ctx("", multi)))
            req.num_slots = slots
            try:
                sid = self._call("multi" if multi else "single", "CreateSession", req).session_id
            except grpc.RpcError as e:
                # The fuzz's own CreateSessions filled this host's max_sessions_per_client (the
                # limit at work): keep the current sessions until the server expires some.
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and self.ctxs:
                    for c in made.values():
                        self._close(c)
                    return
                raise
            if not slots:
                self._call("multi" if multi else "single", "StartEpisode", pb.StartEpisodeRequest(
                    header=pb.RequestHeader(session_id=sid), episode_ids=["e0", "e1", "e2"]))
            made[name] = Ctx(sid, multi, slots, ("e0", "e1", "e2") if not slots else ())
        for c in self.ctxs.values():   # close the old ones: sessions per client stay few
            self._close(c)
        ids = [c.sid for c in made.values()]
        for c in made.values():
            c.others = [s for s in ids if s != c.sid]
        self.ctxs = made

    def ctx_for(self, svc: str, method: str, pick: int) -> Ctx:
        if svc == "multi":
            return self.ctxs["multi"]
        if method == "Step":
            return self.ctxs["slots"] if pick % 4 else self.ctxs["rows"]
        return self.ctxs["rows"] if pick % 4 else self.ctxs["slots"]


class _NoDraw:
    """A Draw that always takes the plain path (the pool's own sessions are never fuzzed)."""

    def boolean(self, p=0.5):
        return False

    def integer(self, lo, hi):
        return lo

    def choice(self, seq):
        return seq[0]


class IdleStreams:
    """`count` Streams that bind a session and then send nothing, held open (a careless or hostile
    client); each on its own channel, as separate simulators would be. close() cancels them."""

    def __init__(self, address: str, count: int, multi: bool = False):
        import queue
        from bench.fuzzcases import create_session
        from bench.fuzzing import Gen
        self.channels, self.calls, self._queues = [], [], []
        first = pb.StreamRequest(create_session=create_session(Gen(_NoDraw(), Ctx("", multi)))).SerializeToString()
        for _ in range(count):
            ch = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            q = queue.SimpleQueue()
            q.put(first)
            fn = ch.stream_stream(f"/{SERVICES['multi' if multi else 'single']}/Stream", request_serializer=None,
                                  response_deserializer=None)
            self.channels.append(ch)
            self._queues.append(q)
            self.calls.append(fn(iter(q.get, None)))

    def close(self) -> None:
        for q in self._queues:
            q.put(None)
        for c in self.calls:
            c.cancel()
        for ch in self.channels:
            ch.close()
