"""The fuzzer's rig: a `simbridge-server` subprocess, a well-behaved witness, and the judge.

* `ServerProcess`: `python -m simbridge.server.cli --address 127.0.0.1:0` with its
  stderr in a file (tracebacks are counted), RSS read from /proc, stopped by PID.
* `Witness`: a PolicyClient in a thread running CartPole episodes throughout;
  it must keep getting actions (steps, episodes, the longest gap between steps).
* `Pool`: real sessions made with CreateSession (rows, slots, multi-agent), so
  near-valid requests carry ids that reach deep code.
* `Judge`: sends raw bytes (identity serializers: the bytes go as they are) on
  unary calls and streams, with a deadline, and tallies what came back: the
  status-code histogram, `internal` (INTERNAL or UNKNOWN status, or a
  StreamResponse.error with INTERNAL), `hangs` (our deadline passed), `bad_answers`
  (an OK answer that is not the call's response: undecodable, or a stream answer
  of another kind or count), `crashes` (the server process died).
"""
from __future__ import annotations

import collections
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
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from bench.fuzzcases import ACT_SPACE, OBS_SPACE
from bench.fuzzing import N_SLOTS, SERVICES, UNARY, Ctx
from simbridge.wire.v1 import simbridge_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
INTERNAL_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.max_send_message_length", 256 << 20),
                   ("grpc.max_receive_message_length", 256 << 20)]
EXAMPLES_PER_CAUSE = 3


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


def describe(msg_or_bytes, limit: int = 600) -> str:
    """A short, readable account of an input: text format for a message (runs of equal shape entries
    collapsed, long strings and tensor data cut), length and hex for bytes."""
    if isinstance(msg_or_bytes, (bytes, bytearray)):
        return f"{len(msg_or_bytes)} bytes: {bytes(msg_or_bytes[:24]).hex()}{'...' if len(msg_or_bytes) > 24 else ''}"
    text = text_format.MessageToString(msg_or_bytes, as_one_line=True, print_unknown_fields=True)
    text = re.sub(r'"((?:[^"\\]|\\.){0,24})((?:[^"\\]|\\.)*)"',
                  lambda m: f'"{m.group(1)}{"..." if m.group(2) else ""}"', text)
    text = re.sub(r"(shape: (-?\d+) )(?:shape: \2 ){2,}",
                  lambda m: f"shape: {m.group(2)} x{m.group(0).count('shape:')} ", text)
    return text if len(text) <= limit else text[:limit] + "..."


def cause_of(message: str) -> str:
    """The server's message with numbers and quoted values blanked, to group examples by cause."""
    m = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message or "")
    return re.sub(r"\d+", "#", m)[:160]


class Judge:
    """Sends fuzzed inputs and tallies every answer against the invariants."""

    def __init__(self, server: Optional[ServerProcess], address: str, unary_deadline_s: float = 10.0,
                 stream_deadline_s: float = 20.0):
        self.server, self.address = server, address
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.unary_deadline_s, self.stream_deadline_s = unary_deadline_s, stream_deadline_s
        self.calls = collections.Counter()     # per RPC ("single.GetAction", "multi.Stream", ...)
        self.sent = collections.Counter()      # messages per RPC (a stream's requests each count)
        self.codes = collections.Counter()     # status names, stream answers' errors included
        self.internal = 0
        self.hangs = 0
        self.bad_answers = 0
        self.crashed = False
        # what -> cause (the message, numbers and quoted values blanked) -> count, RPCs, a few inputs
        self.examples: Dict[str, Dict[str, dict]] = {"internal": {}, "hangs": {}, "bad_answers": {}}
        self.violations: List[str] = []        # one line each, for a test's assertion message

    def close(self) -> None:
        self.channel.close()

    def _note(self, what: str, rpc: str, desc: str, message: str) -> None:
        setattr(self, what, getattr(self, what) + 1)
        group = self.examples[what].setdefault(cause_of(message), {"count": 0, "rpcs": {}, "examples": []})
        group["count"] += 1
        group["rpcs"][rpc] = group["rpcs"].get(rpc, 0) + 1
        if len(group["examples"]) < EXAMPLES_PER_CAUSE:
            group["examples"].append({"rpc": rpc, "input": desc, "message": (message or "")[:400]})
        self.violations.append(f"{what}: {rpc} <- {desc[:200]} -> {(message or '')[:200]}")

    def _status(self, rpc: str, desc: str, code: grpc.StatusCode, message: str) -> None:
        self.codes[code.name] += 1
        if code in INTERNAL_CODES:
            self._note("internal", rpc, desc, f"{code.name}: {message}")
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            self._note("hangs", rpc, desc, message)
        elif code == grpc.StatusCode.UNAVAILABLE and self.server is not None and not self.server.alive():
            self.crashed = True
            self.violations.append(f"crash: the server exited ({self.server.proc.returncode}) after {rpc} <- {desc}")

    def unary(self, svc: str, method: str, data: bytes, desc: str) -> Optional[bytes]:
        rpc = f"{svc}.{method}"
        self.calls[rpc] += 1
        self.sent[rpc] += 1
        fn = self.channel.unary_unary(f"/{SERVICES[svc]}/{method}", request_serializer=None,
                                      response_deserializer=None)
        try:
            answer = fn(data, timeout=self.unary_deadline_s)
        except grpc.RpcError as e:
            self._status(rpc, desc, e.code(), e.details() or "")
            return None
        self.codes["OK"] += 1
        try:
            UNARY[method][1].FromString(answer)
        except DecodeError as e:
            self._note("bad_answers", rpc, desc, f"OK carrying {len(answer)} bytes that are no "
                                                 f"{UNARY[method][1].__name__}: {e}")
        return answer

    def stream(self, svc: str, kinds: List[Optional[str]], payloads: List[bytes], desc: str) -> int:
        """One stream carrying `payloads`; checks one answer per request, in order, of the request's
        kind or an error. Returns the number of answers."""
        rpc = f"{svc}.Stream"
        self.calls[rpc] += 1
        self.sent[rpc] += len(payloads)
        fn = self.channel.stream_stream(f"/{SERVICES[svc]}/Stream", request_serializer=None,
                                        response_deserializer=None)
        answers = 0
        try:
            for raw in fn(iter(payloads), timeout=self.stream_deadline_s):
                kind = kinds[answers] if answers < len(kinds) else "?"
                answers += 1
                try:
                    resp = pb.StreamResponse.FromString(raw)
                except DecodeError as e:
                    self._note("bad_answers", rpc, desc, f"answer {answers} is no StreamResponse: {e}")
                    continue
                if resp.HasField("error"):
                    code = _CODES.get(resp.error.code, grpc.StatusCode.UNKNOWN)
                    self._status(rpc, f"[{answers}: {kind}] {desc}", code, resp.error.message)
                    continue
                self.codes["OK"] += 1
                if kind != "?" and resp.WhichOneof("payload") != kind:   # "?": raw bytes, kind unknown
                    self._note("bad_answers", rpc, desc, f"answer {answers} to a {kind} request carries "
                                                         f"{resp.WhichOneof('payload')}")
        except grpc.RpcError as e:
            self._status(rpc, desc, e.code(), e.details() or "")
            return answers
        closed = [i for i, k in enumerate(kinds[:answers]) if k == "close_session"]
        if answers > len(kinds) or (answers < len(kinds) and not closed):
            self._note("bad_answers", rpc, desc, f"{answers} answers to {len(kinds)} requests")
        return answers

    def summary(self) -> dict:
        return {"messages": sum(self.sent.values()), "messages_per_rpc": dict(sorted(self.sent.items())),
                "calls_per_rpc": dict(sorted(self.calls.items())),
                "crashes": int(self.crashed), "hangs": self.hangs, "internal": self.internal,
                "bad_answers": self.bad_answers, "status_codes": dict(self.codes.most_common()),
                "examples": {k: v for k, v in self.examples.items() if v}}


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def fuzz_one(judge: Judge, pool: Pool, draw, svc: str, method: str, raw: bool) -> None:
    """One fuzzed call of `svc`.`method` (a whole stream for "Stream"): raw bytes or typed messages."""
    from bench.fuzzcases import raw_bytes, stream_ctx, stream_requests, typed_request
    from bench.fuzzing import Gen
    if method == "Stream":
        ctx = pool.ctx_for(svc, method, draw.integer(0, 3))
        g = Gen(draw, stream_ctx(svc == "multi", others=[ctx.sid, *ctx.others]))
        if raw:
            payloads = [raw_bytes(g, "Stream") for _ in range(draw.integer(1, 4))]
            kinds = ["?"] * len(payloads)
            judge.stream(svc, kinds, payloads, " | ".join(describe(p, 80) for p in payloads))
        else:
            kinds, reqs = stream_requests(g)
            judge.stream(svc, kinds, [r.SerializeToString() for r in reqs],
                         " | ".join(describe(r, 120) for r in reqs))
        return
    g = Gen(draw, pool.ctx_for(svc, method, draw.integer(0, 3)))
    if raw:
        data = raw_bytes(g, method)
        judge.unary(svc, method, data, describe(data))
    else:
        msg = typed_request(g, method)
        judge.unary(svc, method, msg.SerializeToString(), describe(msg))


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
