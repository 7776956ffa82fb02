#!/usr/bin/env python
"""Throughput and latency of the bridge against a real server in another process.

Every case starts `python -m simbridge.server.cli` as a subprocess on a free
127.0.0.1 port, waits for it with the standard gRPC health check, and drives it
from client processes of their own (multiprocessing, spawn), so client and
server never share a GIL. Each measured window follows a 1 s warm-up.

Cases (--cases):
  floor      bare grpcio echo between two processes (unary, and a bidi stream
             ping-pong for reference): what this machine allows per round trip.
  unary      one CartPole-v1 simulator, transport="unary": per step get_action
             + log_returns, end_episode/start_episode at episode ends.
  stream     the same with transport="stream" (log_returns etc. pipelined).
  four_sims  four such stream simulators at once (aggregate steps/s).
  batched64  one batched simulator with 64 slots on Step (SlotClient, the
             numpy CartPoles of sims/vector_cartpole.py): one message each way
             per step for all 64, per-slot auto-reset.
  rows64     the same 64 CartPoles as 64 episodes on the row calls: get_actions
             for 64 ids, log_returns_batch, end_episodes/start_episodes for the
             finished ones (the form a multi-agent simulator uses). Stepped by
             the bench's own numpy CartPole (BenchVectorCartPole below):
             gymnasium's SyncVectorEnv costs ~2 ms per step of 64 copies, more
             than the bridge, so it would measure gymnasium. Its cost is
             reported as rows64_env_step_us, and SyncVectorEnv's as a reference.

  step_lockstep  one gymnasium CartPole-v1 as a 1-slot simulator on Step
             (SlotClient): reward, episode end and next observation in one message.
  batched256 the same with 256 slots: batched256_agent_steps_per_s.
  local      one CartPole-v1 simulator with local inference (LocalPolicyClient):
             local_steps_per_s against the random policy, local_dqn_* against a
             frozen DQN served by the trainer daemon.
  tcp_paths  step_lockstep and batched256 with every process on gRPC's iomgr TCP
             path (what simbridge's programs choose, simbridge/wire/grpc_tuning.py)
             and on its default EventEngine path, alternating, 3 short runs
             each: medians and iomgr_vs_eventengine_* ratios.
  bare       the least a Python simulator can do per Step against the real server (RawStepSim:
             a bare grpcio stream, a prebuilt StepRequest whose seq alone changes, answers not
             decoded), 1, 64 and 256 slots: bare_step{1,64,256}_*. step_lockstep_vs_bare,
             batched64_vs_bare, batched256_vs_bare: SlotClient against it (and *_without_env:
             with the simulator's own step time left out, the bare client steps none).
  iter_stream, iter_step_lockstep, iter_batched64, iter_batched256
             the TCP cases with the simulators on grpcio's public stream API (a queue-fed request
             iterator drained by gRPC's thread: SIMBRIDGE_GRPC_STREAM=iterator), the client as it
             was before simbridge/client/direct_stream.py: direct_vs_iterator_* ratios.
  uds_floor, uds_bare, uds_stream, uds_step_lockstep, uds_batched64, uds_batched256
             the same cases with the server on a Unix socket (unix:PATH in a private temporary
             directory): every figure named uds_<the TCP name>; uds_vs_tcp_* ratios.
  shm_floor  the bare shared-memory echo of a Step's sizes (simbridge/wire/shm_ring.py alone, no
             bridge): shm_echo_step{1,64,256}_roundtrips_per_s, the shm_*_vs_echo floor.
  shm_bare, shm_stream, shm_step_lockstep, shm_batched64, shm_batched256
             the same cases with the steps through the shared-memory channel (shm+unix:PATH:
             the session on the Unix socket, every later message in the rings): shm_<the TCP
             name>; shm_vs_tcp_*, shm_vs_uds_* ratios, and shm_*_vs_bare (SlotClient against the
             bare replay of its Steps, on shm too). With shm_floor and the TCP case in the same
             run, shm_vs_tcp_*_free_bridge_ceiling: the most shm could give over TCP with this
             simulator were the bridge's Step free (its CPU per Step plus the ring's round trip;
             free_bridge_ceilings below). spin_shm_step_lockstep, spin_shm_batched64:
             the same with both ends spinning up to 50 us before they block (spin_shm_*);
             cspin_shm_step_lockstep, cspin_shm_batched64: the simulator alone spinning up to
             300 us for its answer, the bridge blocking (cspin_shm_*). spin_cpp_shm_lockstep,
             spin_cpp_shm_batched64, cspin_cpp_shm_lockstep, cspin_cpp_shm_batched64: the same
             for the C++ cases (the C++ SDK reads SIMBRIDGE_SHM_SPIN_US too).
             floor (either transport) also echoes messages of a CartPole Step's sizes (1, 64,
             256 slots: echo_step{n}_*), and *_vs_echo ratios put each Step case against the
             echo of its sizes on the same transport: what the transport alone allows.
  cpp_lockstep, cpp_batched64, cpp_batched256  the C++ SDK's CartPole examples (sims/cpp, built
             into build/cpp when missing or stale) against a fresh server, measured the same way
             inside the C++ process: lockstep on PolicyClient's stream, and SlotClient with 64/256
             slots on Step. Reported as ratios to the Python client's figures of the same run:
             cpp_lockstep_vs_python_stream_lockstep (the same API, PolicyClient on the stream),
             cpp_lockstep_vs_python_step_lockstep (Python's one-message-each-way lockstep, a
             1-slot SlotClient), cpp_batchedN_vs_python_batchedN. The C++ simulators step plain
             C++ CartPoles, the Python ones gymnasium's or numpy's (their *_env_step_us), so a
             ratio is simulator process against simulator process. Skipped, with the reason, when
             the build tools are absent (bench/cpp_cases.py).
  cpp_uds_lockstep, cpp_uds_batched64, cpp_uds_batched256, cpp_shm_lockstep, cpp_shm_batched64,
  cpp_shm_batched256  the same C++ cases with the server on a Unix socket (unix:PATH) and with the
             steps through the shared-memory channel (shm+unix:PATH): cpp_<net>_vs_tcp_* ratios to
             the C++ TCP figure of the same run, and cpp_<net>_*_vs_python_<net>_* to the Python
             client's on the same transport.

Latency is the wall time of the get_action / get_actions / step call seen by the
simulator. One JSON object goes to stdout; logs go to stderr.

    .venv/bin/python bench/throughput.py --seconds 3
    .venv/bin/python bench/throughput.py --cases stream,batched64,rows64 --out runs/bench.json
    .venv/bin/python bench/throughput.py --cases stream,step_lockstep,cpp_lockstep,batched64,cpp_batched64
    .venv/bin/python bench/throughput.py --cases floor,bare,stream,step_lockstep,batched64,batched256,uds_floor,uds_bare,uds_stream,uds_step_lockstep,uds_batched64,uds_batched256
    .venv/bin/python bench/throughput.py --cases floor,bare,stream,step_lockstep,batched64,batched256,uds_floor,uds_bare,uds_step_lockstep,uds_batched64,uds_batched256,shm_floor,shm_bare,shm_stream,shm_step_lockstep,shm_batched64,shm_batched256,spin_shm_step_lockstep,spin_shm_batched64
    .venv/bin/python bench/throughput.py --seconds 3 --cases cpp_lockstep,cpp_uds_lockstep,cpp_shm_lockstep,cpp_batched64,cpp_uds_batched64,cpp_shm_batched64,cpp_batched256,cpp_shm_batched256
"""
from simbridge.wire.grpc_tuning import RECONNECT_OPTIONS, prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import functools
import json
import logging
import multiprocessing as mp
import os
import platform
import queue
import signal
import socket
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO, REPO / "bench"):  # spawned workers re-import this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import cpp_cases  # noqa: E402  (bench/cpp_cases.py, found through the path above)

HOST = "127.0.0.1"          # everything here talks to loopback only
WARMUP_S = 1.0
CASES = ("floor", "unary", "stream", "step_lockstep", "cpp_lockstep", "four_sims", "batched64", "cpp_batched64",
         "rows64", "batched256", "cpp_batched256", "local", "tcp_paths",
         "bare", "uds_floor", "uds_bare", "uds_stream", "uds_step_lockstep", "uds_batched64", "uds_batched256",
         "iter_stream", "iter_step_lockstep", "iter_batched64", "iter_batched256",
         "shm_floor", "shm_bare", "shm_stream", "shm_step_lockstep", "shm_batched64", "shm_batched256",
         "spin_shm_step_lockstep", "spin_shm_batched64", "cspin_shm_step_lockstep", "cspin_shm_batched64",
         "cpp_uds_lockstep", "cpp_uds_batched64", "cpp_uds_batched256",
         "cpp_shm_lockstep", "cpp_shm_batched64", "cpp_shm_batched256")
# --cases also takes the lockstep cases by the prefix of their figures
CASE_ALIASES = {"stream_lockstep": "stream", "unary_lockstep": "unary"}
BATCH = 64

log = logging.getLogger("bench")

# gRPC honours http(s)_proxy; never route loopback traffic through one.
_CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), *RECONNECT_OPTIONS]
for _var in ("no_grpc_proxy", "no_proxy"):
    os.environ[_var] = ",".join(filter(None, [os.environ.get(_var, ""), "127.0.0.1", "localhost"]))


# ---------------------------------------------------------------- process helpers

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu_s(pid):
    """user+system CPU seconds of a process (Linux /proc), None elsewhere."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


try:  # children get SIGTERM if this process dies without cleaning up (Linux)
    import ctypes

    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError, ImportError):
    _prctl = None


def _die_with_parent():
    if _prctl is not None:
        _prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Children:
    """Every child process of the run; stop_all() ends them whatever happened."""

    def __init__(self):
        self.procs = []

    def add(self, p):
        self.procs.append(p)
        return p

    def stop(self, p, grace=5.0):
        if isinstance(p, subprocess.Popen):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # server_cli stops cleanly on SIGTERM
                try:
                    p.wait(grace)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        else:  # multiprocessing.Process
            if p.is_alive():
                p.join(0.2)
            if p.is_alive():
                p.terminate()
                p.join(grace)
            if p.is_alive():
                p.kill()
                p.join(5)
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        for p in list(self.procs):
            try:
                self.stop(p, grace=3.0)
            except Exception:
                log.exception("could not stop child %r", p)


# ---------------------------------------------------------------- servers

_SOCKDIR = []   # one private directory for every Unix socket of the run, removed at exit


def listen_address(net):
    """A fresh address to serve on: a free loopback port ("tcp"), a socket path ("uds"), or a
    socket path whose steps go through shared memory ("shm": shm+unix:PATH)."""
    if net == "tcp":
        return f"{HOST}:{_free_port()}"
    if not _SOCKDIR:
        import atexit
        import shutil
        import tempfile

        _SOCKDIR.append(tempfile.mkdtemp(prefix="sb-bench-"))
        atexit.register(shutil.rmtree, _SOCKDIR[0], True)
    scheme = "shm+unix" if net == "shm" else "unix"
    return f"{scheme}:{_SOCKDIR[0]}/{uuid.uuid4().hex[:8]}.sock"


def _key(net, name):
    """A figure's name: today's TCP names as they were, the Unix socket's with a uds_ prefix, the
    shared-memory channel's with shm_."""
    return name if net == "tcp" else f"{net}_{name}"


def start_bridge_server(children, timeout_s=60.0, net="tcp"):
    """`python -m simbridge.server.cli` on a free loopback port or a Unix socket; returns
    (Popen, address)."""
    for _ in range(3):
        address = listen_address(net)
        cmd = [sys.executable, "-m", "simbridge.server.cli", "--address", address,
               "--print-every", "0", "--log-level", "WARNING"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        proc = children.add(subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                             stdout=sys.stderr.fileno(), preexec_fn=_die_with_parent))
        if wait_healthy(address, proc, timeout_s):
            return proc, address
        children.stop(proc)
        if proc.returncode != 2:  # 2: the port was taken meanwhile: try another
            raise RuntimeError(f"simbridge server at {address} did not become healthy "
                               f"(exit code {proc.returncode})")
    raise RuntimeError("could not start a simbridge server on a free port")


def wait_healthy(address, proc, timeout_s):
    """Poll grpc.health.v1 until SERVING; False if the process exited first."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from simbridge.wire.addresses import grpc_address

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(grpc_address(address), options=_CHANNEL_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if proc.poll() is not None:
                return False
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"simbridge server at {address} not SERVING after {timeout_s:.0f}s")
            time.sleep(0.05)


def _sized_answer(req, _answers={}):
    """The echo's answer: as many bytes as the request's first 4 bytes say (little-endian), or the
    request itself, so one echo stands for a Step whose answer is smaller than its request."""
    if len(req) < 8 or req[:4] == b"\0\0\0\0":
        return req
    size = int.from_bytes(req[:4], "little")
    answer = _answers.get(size)
    if answer is None:
        answer = _answers[size] = bytes(size)
    return answer


def _floor_server_main(address, port_q, stop_evt):
    """Child process: a trivial echo service, bytes in and out, no proto."""
    os.dup2(2, 1)
    from concurrent import futures

    import grpc

    handlers = {
        "Ping": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req),
        "PingStream": grpc.stream_stream_rpc_method_handler(lambda it, ctx: (_sized_answer(m) for m in it)),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", handlers),))
    port = server.add_insecure_port(address)
    server.start()
    port_q.put(address if address.startswith("unix:") else f"{HOST}:{port}")
    stop_evt.wait()
    server.stop(0)


# ---------------------------------------------------------------- simulators (client processes)

class BenchVectorCartPole:
    """BENCH-ONLY: N CartPole-v1 copies stepped at once with numpy.

    Written for this benchmark (not gymnasium's code): the classic cart-pole
    equations with CartPole-v1's constants, termination (|x| > 2.4,
    |theta| > 12 deg), 500-step truncation and reward 1 per step. Autoreset
    happens in the same step: step() returns the reset observation for the
    finished slots and their last observation in `final_obs`.
    """

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    x_threshold, theta_threshold = 2.4, 12 * 2 * np.pi / 360
    max_steps = 500

    def __init__(self, n, seed=0):
        self.n = n
        self.rng = np.random.default_rng(seed)
        total_mass = self.masscart + self.masspole
        self._pml = self.masspole * self.length / total_mass       # polemass_length / total_mass
        self._force = self.force_mag / total_mass
        self._mp_tm = self.masspole / total_mass
        self.state = np.zeros((4, n))  # rows: x, x_dot, theta, theta_dot
        self.steps = np.zeros(n, np.int64)
        self.reward = np.ones(n, np.float32)

    def _obs(self):
        return np.ascontiguousarray(self.state.T, dtype=np.float32)

    def reset(self):
        self.state = self.rng.uniform(-0.05, 0.05, (4, self.n))
        self.steps[:] = 0
        return self._obs()

    def step(self, actions):
        x, x_dot, theta, theta_dot = self.state
        cos, sin = np.cos(theta), np.sin(theta)
        # (force + polemass_length * theta_dot^2 * sin) / total_mass, force = +-force_mag
        temp = (2.0 * np.asarray(actions) - 1.0) * self._force + self._pml * theta_dot * theta_dot * sin
        theta_acc = (self.gravity * sin - cos * temp) / (self.length * (4.0 / 3.0 - self._mp_tm * cos * cos))
        x_acc = temp - self._pml * theta_acc * cos
        x += self.tau * x_dot          # euler, in place: these are rows of self.state
        x_dot += self.tau * x_acc
        theta += self.tau * theta_dot
        theta_dot += self.tau * theta_acc
        self.steps += 1
        terminated = (np.abs(x) > self.x_threshold) | (np.abs(theta) > self.theta_threshold)
        truncated = (self.steps >= self.max_steps) & ~terminated
        obs = self._obs()
        final_obs = None
        done = terminated | truncated
        if done.any():
            final_obs = obs.copy()
            self.state[:, done] = self.rng.uniform(-0.05, 0.05, (4, int(done.sum())))
            self.steps[done] = 0
            obs[done] = self.state[:, done].T
        return obs, self.reward, terminated, truncated, final_obs


class LockstepSim:
    """One gymnasium CartPole-v1, one episode at a time, in lockstep with the policy."""

    def __init__(self, address, transport, seed):
        import gymnasium as gym

        self.env = gym.make("CartPole-v1")
        self.client = self._client(address, transport, seed)
        self.obs, _ = self.env.reset(seed=seed)
        # Ids made here: with transport="stream" start_episode is then pipelined too.
        self.eid = self.client.start_episode(uuid.uuid4().hex)
        self.lat_ms, self.env_s, self.episodes = [], 0.0, 0

    def _client(self, address, transport, seed):
        from simbridge.client.policy_client import PolicyClient

        return PolicyClient(address, self.env.observation_space, self.env.action_space,
                            transport=transport, client_name=f"bench-{transport}-{seed}")

    def step(self, record):
        c, env = self.client, self.env
        t0 = time.perf_counter()
        action = c.get_action(self.eid, self.obs)
        t1 = time.perf_counter()
        obs, reward, terminated, truncated, _ = env.step(action)
        env_s = time.perf_counter() - t1
        c.log_returns(self.eid, reward)
        if terminated or truncated:
            c.end_episode(self.eid, obs, truncated=bool(truncated and not terminated))
            t2 = time.perf_counter()
            obs, _ = env.reset()
            env_s += time.perf_counter() - t2
            self.eid = c.start_episode(uuid.uuid4().hex)
            self.episodes += record
        self.obs = obs
        if record:
            self.lat_ms.append((t1 - t0) * 1e3)
            self.env_s += env_s
        return 1

    def close(self):
        self.client.close()


class Batched64Sim:
    """64 episodes stepped together: one get_actions call per step for all of them."""

    def __init__(self, address, transport, seed):
        import gymnasium as gym

        from simbridge.client.policy_client import PolicyClient

        self.env = BenchVectorCartPole(BATCH, seed)
        spec_env = gym.make("CartPole-v1")  # only for its spaces
        self.client = PolicyClient(address, spec_env.observation_space, spec_env.action_space,
                                   transport=transport, client_name=f"bench-batched{BATCH}")
        spec_env.close()
        self.ids = self.client.start_episodes(count=BATCH)
        self.obs = self.env.reset()
        self.lat_ms, self.env_s, self.episodes = [], 0.0, 0

    def step(self, record):
        c = self.client
        t0 = time.perf_counter()
        actions = c.get_actions(self.ids, self.obs)
        t1 = time.perf_counter()
        obs, rewards, terminated, truncated, final_obs = self.env.step(actions)
        env_s = time.perf_counter() - t1
        c.log_returns_batch(self.ids, rewards)
        if final_obs is not None:
            done = np.flatnonzero(terminated | truncated)
            ids = self.ids
            new = [uuid.uuid4().hex for _ in done]
            # End and restart the finished slots in one message (per-slot auto-reset).
            c.end_episodes([ids[i] for i in done], final_obs[done], truncated[done], start_episode_ids=new)
            for i, eid in zip(done, new):
                ids[i] = eid
            self.episodes += len(done) * record
        self.obs = obs
        if record:
            self.lat_ms.append((t1 - t0) * 1e3)
            self.env_s += env_s
        return BATCH

    def close(self):
        self.client.close()


class FloorClient:
    """Bare grpcio round trips to the echo server: unary calls or a bidi stream ping-pong."""

    def __init__(self, address, transport, seed):
        import grpc

        self.channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.payload = bytes(48)  # about a CartPole get_action request
        self.transport = transport
        if transport.startswith("stream:"):   # "stream:REQUEST_BYTES:ANSWER_BYTES", a Step's sizes
            from simbridge.client.direct_stream import open_stream

            _, req, answer = transport.split(":")
            self.payload = int(answer).to_bytes(4, "little") + bytes(int(req) - 4)
            self.stream = open_stream(self.channel, "/bench.Echo/PingStream")   # as the clients stream
            self.transport = "sized"
        elif transport == "unary":
            self.call = self.channel.unary_unary("/bench.Echo/Ping")
        else:
            self.q = queue.SimpleQueue()
            self.responses = self.channel.stream_stream("/bench.Echo/PingStream")(iter(self.q.get, None))
        self.lat_ms, self.env_s, self.episodes = [], 0.0, 0

    def step(self, record):
        t0 = time.perf_counter()
        if self.transport == "unary":
            self.call(self.payload)
        elif self.transport == "sized":
            self.stream.send(self.payload)
            self.stream.recv()
        else:
            self.q.put(self.payload)
            next(self.responses)
        if record:
            self.lat_ms.append((time.perf_counter() - t0) * 1e3)
        return 1

    def close(self):
        if self.transport == "sized":
            self.stream.close()
        elif self.transport != "unary":
            self.q.put(None)
        self.channel.close()


class RawStepSim:
    """The least a Python simulator can do per Step against the real server: the same Steps as
    the SlotClient case's (recorded beforehand from the same env, random actions, episodes
    ending and restarting as they do), replayed as bytes on the clients' stream
    (simbridge/client/direct_stream.py, as the echo_step* figures) with only their seq changed,
    answers not decoded. What the server allows one lockstep client sending that traffic;
    SlotClient's *_vs_bare ratios are measured against it."""

    RECORDED = 2000

    def __init__(self, address, transport, seed, n):
        import grpc

        from simbridge.client.direct_stream import open_stream
        from simbridge.wire import leaf_codec, tensors
        from simbridge.wire import spaces as sb_spaces
        from simbridge.wire.v1 import simbridge_pb2 as pb

        self.n = n
        env = StepLockstepSim._env(None, n, seed) if n == 1 else SlotSim._env(None, n, seed)
        encode = leaf_codec.batch_encoder(env.observation_space)
        rng = np.random.default_rng(seed)
        self.steps = []
        obs, outcome = env.reset(), None
        for _ in range(self.RECORDED):
            req = pb.StreamRequest()
            encode(req.step.observations, obs, "observations")
            if outcome is not None:
                rewards, terminated, truncated, final_obs = outcome
                tensors.fill_tensor(req.step.rewards, np.asarray(rewards, np.float32))
                tensors.fill_tensor(req.step.terminated, np.asarray(terminated, bool))
                tensors.fill_tensor(req.step.truncated, np.asarray(truncated, bool))
                if final_obs is not None:
                    encode(req.step.final_observations, final_obs, "final_observations")
            self.steps.append(req)
            obs, *outcome = env.step(rng.integers(0, 2, n))
        from simbridge.client.shm_channel import open_shm, split_address

        address, shm_path = split_address(address)
        self.channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self.stream = open_stream(self.channel, "/simbridge.v1.ExternalEnv/Stream")
        create = pb.StreamRequest(create_session=pb.CreateSessionRequest(
            client_name=f"bench-bare{n}", num_slots=n,
            observation_space=sb_spaces.space_to_proto(env.observation_space),
            action_space=sb_spaces.space_to_proto(env.action_space)))
        self.stream.send(create.SerializeToString())
        first = pb.StreamResponse.FromString(self.stream.recv())
        assert not first.HasField("error"), first.error
        if shm_path is not None:   # shm+unix: the Steps through shared memory, as SlotClient's
            self.stream = open_shm(shm_path, self.stream, first.create_session)
        self.seq = 0
        self._send(check=True)     # the first Step: observations only
        self.lat_ms, self.env_s, self.episodes = [], 0.0, 0

    def _send(self, check=False):
        from simbridge.wire.v1 import simbridge_pb2 as pb

        self.seq += 1
        # after the recording's end, round again from its second Step (the first has no outcome)
        req = self.steps[(self.seq - 1) % self.RECORDED or 1] if self.seq > self.RECORDED else self.steps[self.seq - 1]
        req.step.header.seq = self.seq
        self.stream.send(req.SerializeToString())
        answer = self.stream.recv()
        if check:
            resp = pb.StreamResponse.FromString(answer)
            assert not resp.HasField("error"), resp.error

    def step(self, record):
        t0 = time.perf_counter()
        self._send()
        if record:
            self.lat_ms.append((time.perf_counter() - t0) * 1e3)
        return self.n

    def close(self):
        self._send(check=True)   # still in order: every answer was a Step's
        self.stream.close()
        self.channel.close()


class SlotSim:
    """A batched simulator of n slots on the Step call: one message each way per step for all
    slots, per-slot auto-reset (sims/vector_cartpole.py: numpy CartPole-v1 x n)."""

    def __init__(self, address, transport, seed, n):
        from simbridge.client.slot_client import SlotClient

        self.n = n
        self.env = self._env(n, seed)
        self.client = SlotClient(address, self.env.observation_space, self.env.action_space, n,
                                 transport=transport, client_name=f"bench-slots{n}")
        self.actions = self.client.step(self.env.reset())
        self.lat_ms, self.env_s, self.episodes = [], 0.0, 0

    def _env(self, n, seed):
        from simbridge.sims.vector_cartpole import VectorCartPole

        return VectorCartPole(n, seed=seed)

    def step(self, record):
        t0 = time.perf_counter()
        obs, rewards, terminated, truncated, final_obs = self.env.step(self.actions)
        t1 = time.perf_counter()
        self.actions = self.client.step(obs, rewards, terminated, truncated, final_obs)
        if record:
            self.lat_ms.append((time.perf_counter() - t1) * 1e3)
            self.env_s += t1 - t0
            self.episodes += 0 if final_obs is None else len(final_obs)
        return self.n

    def close(self):
        self.client.close()


class StepLockstepSim(SlotSim):
    """One gymnasium CartPole-v1 as a 1-slot batched simulator: a lockstep simulator on Step,
    where reward, episode end and the next episode's first observation ride on one message."""

    def __init__(self, address, transport, seed):
        super().__init__(address, transport, seed, n=1)

    def _env(self, n, seed):
        import gymnasium as gym

        from simbridge.sims.gym_sim import GymSlots

        return GymSlots([gym.make("CartPole-v1")], seed)


SIMS = {"lockstep": LockstepSim, "step_lockstep": StepLockstepSim, "rows64": Batched64Sim, "floor": FloorClient,
        "slots64": functools.partial(SlotSim, n=64), "slots256": functools.partial(SlotSim, n=256),
        **{f"bare{n}": functools.partial(RawStepSim, n=n) for n in (1, 64, 256)}}


def _client_main(idx, sim_kind, address, transport, seconds, barrier, results, server_pid):
    """Child process: set up one simulator, wait for the others, warm up, measure."""
    os.dup2(2, 1)  # stdout belongs to the parent's JSON
    try:
        sim = SIMS[sim_kind](address, transport, seed=idx)
        barrier.wait(timeout=120)  # all simulators of a case start together
        t_warm = time.perf_counter() + WARMUP_S
        while time.perf_counter() < t_warm:
            sim.step(False)
        cpu0, srv0 = time.process_time(), _proc_cpu_s(server_pid)
        t0 = time.perf_counter()
        t_end = t0 + seconds
        steps = agent_steps = 0
        while True:
            agent_steps += sim.step(True)
            steps += 1
            if time.perf_counter() >= t_end:
                break
        elapsed = time.perf_counter() - t0
        cpu1, srv1 = time.process_time(), _proc_cpu_s(server_pid)
        sim.close()
        results.put((idx, "ok", {
            "steps": steps, "agent_steps": agent_steps, "elapsed_s": elapsed,
            "lat_ms": np.asarray(sim.lat_ms), "env_s": sim.env_s, "episodes": sim.episodes,
            "client_cpu_s": cpu1 - cpu0,
            "server_cpu_s": None if srv0 is None or srv1 is None else srv1 - srv0,
        }))
    except BaseException:
        results.put((idx, "error", traceback.format_exc()))


def run_clients(children, n, sim_kind, address, transport, seconds, server_pid):
    """n client processes; returns their result dicts (raises if one fails)."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [children.add(ctx.Process(target=_client_main, name=f"bench-{sim_kind}-{i}", daemon=True,
                                      args=(i, sim_kind, address, transport, seconds, barrier, results,
                                            server_pid if i == 0 else None)))
             for i in range(n)]
    for p in procs:
        p.start()
    out = {}
    deadline = time.monotonic() + 120 + WARMUP_S + seconds
    try:
        while len(out) < n:
            try:
                idx, status, payload = results.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise RuntimeError(f"client process {dead[0].name} died (exit code {dead[0].exitcode})")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{sim_kind} clients did not finish in time")
                continue
            if status != "ok":
                raise RuntimeError(f"client {idx} ({sim_kind}, {transport}) failed:\n{payload}")
            out[idx] = payload
    finally:
        for p in procs:
            children.stop(p)
    return [out[i] for i in range(n)]


# ---------------------------------------------------------------- cases

def _summary(prefix, res, per_agent=False):
    """Flat metrics of one case from the result dicts of its client processes."""
    lat = np.concatenate([r["lat_ms"] for r in res])
    steps = sum(r["agent_steps" if per_agent else "steps"] / r["elapsed_s"] for r in res)
    p50, p99 = np.percentile(lat, [50, 99])
    out = {
        f"{prefix}_steps_per_s": round(float(steps), 1),
        f"{prefix}_p50_ms": round(float(p50), 4),
        f"{prefix}_p99_ms": round(float(p99), 4),
        f"{prefix}_mean_ms": round(float(lat.mean()), 4),
        f"{prefix}_calls": int(lat.size),
    }
    if per_agent:
        out[f"{prefix}_agent_steps_per_s"] = out.pop(f"{prefix}_steps_per_s")
        out[f"{prefix}_calls_per_s"] = round(float(sum(r["steps"] / r["elapsed_s"] for r in res)), 1)
    total_calls = sum(r["steps"] for r in res)
    if any(r["env_s"] for r in res):
        out[f"{prefix}_env_step_us"] = round(1e6 * sum(r["env_s"] for r in res) / total_calls, 2)
    if any(r["episodes"] for r in res):
        out[f"{prefix}_episodes"] = int(sum(r["episodes"] for r in res))
    window = res[0]["elapsed_s"]
    out[f"{prefix}_client_cpu_cores"] = round(sum(r["client_cpu_s"] / r["elapsed_s"] for r in res), 3)
    # CPU per call: what a client costs, steadier than rates when other work shares the machine
    out[f"{prefix}_client_cpu_us_per_call"] = round(1e6 * sum(r["client_cpu_s"] for r in res) / max(1, total_calls), 1)
    if res[0]["server_cpu_s"] is not None:
        out[f"{prefix}_server_cpu_cores"] = round(res[0]["server_cpu_s"] / window, 3)
        out[f"{prefix}_server_cpu_us_per_call"] = round(
            1e6 * res[0]["server_cpu_s"] / max(1, sum(r["steps"] for r in res)), 1)
    return out


def step_message_sizes(n):
    """Bytes on the wire of a CartPole Step of n slots and of its answer, as SlotClient and the
    server make them (the bare echo of these sizes is what a Step could cost at best)."""
    import gymnasium as gym

    from simbridge.wire import leaf_codec, tensors
    from simbridge.wire.v1 import simbridge_pb2 as pb

    obs_space = gym.make("CartPole-v1").observation_space
    req = pb.StreamRequest()
    step = req.step
    step.header.seq = 123456   # the stream sends no session id: the stream is bound to it
    leaf_codec.batch_encoder(obs_space)(step.observations, np.zeros((n, 4), np.float32), "observations")
    tensors.fill_tensor(step.rewards, np.ones(n, np.float32))
    tensors.fill_tensor(step.terminated, np.zeros(n, bool))
    tensors.fill_tensor(step.truncated, np.zeros(n, bool))
    resp = pb.StreamResponse()
    tensors.fill_tensor(resp.step.actions.tensor, np.zeros(n, np.int64))
    tensors.fill_tensor(resp.step.policy_versions, np.zeros(n, np.int64))
    resp.step.policy_id = "default_policy"
    return req.ByteSize(), resp.ByteSize()


ECHO_SLOTS = (1, 64, 256)   # the echo of a Step of this many slots: floor's step*_ figures


def case_floor(children, seconds, net="tcp"):
    """Bare echoes: unary, a stream ping-pong of 48 bytes, and stream echoes of the sizes of a
    CartPole Step of 1, 64 and 256 slots (request and answer), on `net`."""
    ctx = mp.get_context("spawn")
    port_q, stop_evt = ctx.Queue(), ctx.Event()
    bind = listen_address(net) if net != "tcp" else f"{HOST}:0"
    server = children.add(ctx.Process(target=_floor_server_main, args=(bind, port_q, stop_evt),
                                      name="bench-floor-server", daemon=True))
    server.start()
    sized = {}
    try:
        address = port_q.get(timeout=60)
        unary = run_clients(children, 1, "floor", address, "unary", seconds, server.pid)
        stream = run_clients(children, 1, "floor", address, "stream", seconds, server.pid)
        for n in ECHO_SLOTS:
            req, answer = step_message_sizes(n)
            sized[n] = (req, answer, run_clients(children, 1, "floor", address, f"stream:{req}:{answer}",
                                                 max(1.0, seconds / 2), server.pid))
    finally:
        stop_evt.set()
        children.stop(server)
    u, s = _summary("floor_unary", unary), _summary("floor_stream", stream)
    k = functools.partial(_key, net)
    out = {
        k("grpc_floor_roundtrips_per_s"): u["floor_unary_steps_per_s"],
        k("grpc_floor_p50_ms"): u["floor_unary_p50_ms"],
        k("grpc_floor_p99_ms"): u["floor_unary_p99_ms"],
        k("grpc_floor_stream_roundtrips_per_s"): s["floor_stream_steps_per_s"],
        k("grpc_floor_stream_p50_ms"): s["floor_stream_p50_ms"],
        k("grpc_floor_stream_p99_ms"): s["floor_stream_p99_ms"],
        k("grpc_floor_server_cpu_us_per_call"): u.get("floor_unary_server_cpu_us_per_call"),
        k("grpc_floor_stream_server_cpu_us_per_call"): s.get("floor_stream_server_cpu_us_per_call"),
        k("grpc_floor_stream_client_cpu_cores"): s.get("floor_stream_client_cpu_cores"),
    }
    for n, (req, answer, res) in sized.items():
        e = _summary("e", res)
        out[k(f"echo_step{n}_roundtrips_per_s")] = e["e_steps_per_s"]
        out[k(f"echo_step{n}_bytes")] = [req, answer]
        out[k(f"echo_step{n}_client_cpu_cores")] = e["e_client_cpu_cores"]
    return out


def _shm_echo_main(path, sizes, stop_evt):
    """Child process: the bare shared-memory echo (simbridge/wire/shm_ring.py, no bridge, no
    proto): a request of sizes[0] bytes is answered with sizes[1] bytes."""
    from simbridge.wire import shm_ring

    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    conn, _ = listener.accept()
    cap = 1 << 20
    fds = [shm_ring.make_region(cap), os.eventfd(0, os.EFD_NONBLOCK), os.eventfd(0, os.EFD_NONBLOCK)]
    region = shm_ring.Region(fds[0], cap, fds[1], fds[2], conn, server=True,
                             spin_s=shm_ring.spin_seconds(shm_ring.SERVER_SPIN_ENV), fresh=True)
    socket.send_fds(conn, [shm_ring.answer(0, 0, cap)], fds)
    answer = b"a" * sizes[1]
    try:
        while not stop_evt.is_set():
            if region.incoming.get(timeout_s=0.5) is not None:
                region.outgoing.put(answer)
    except shm_ring.PeerGone:
        pass


def case_shm_floor(children, seconds):
    """The bare shared-memory echo of a CartPole Step's sizes (1, 64, 256 slots), one simulator:
    shm_echo_step{n}_roundtrips_per_s, the floor of the shm_* Step cases (their *_vs_echo)."""
    from simbridge.wire import shm_ring

    ctx = mp.get_context("spawn")
    out = {}
    listen_address("uds")   # makes the run's private socket directory
    for n in ECHO_SLOTS:
        req, answer = step_message_sizes(n)
        path = f"{_SOCKDIR[0]}/echo-{uuid.uuid4().hex[:8]}"
        stop_evt = ctx.Event()
        proc = children.add(ctx.Process(target=_shm_echo_main, args=(path, (req, answer), stop_evt),
                                        name="bench-shm-echo", daemon=True))
        proc.start()
        try:
            sock = socket.socket(socket.AF_UNIX)
            deadline = time.monotonic() + 30
            while True:
                try:
                    sock.connect(path)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            data, fds, _, _ = socket.recv_fds(sock, 4096, 3)
            cap = shm_ring.parse_answer(data)[2]
            region = shm_ring.Region(fds[0], cap, fds[1], fds[2], sock, server=False,
                                     spin_s=shm_ring.spin_seconds())
            message = b"r" * req
            count, t0, cpu0 = 0, None, None
            start = time.monotonic()
            while True:
                now = time.monotonic()
                if t0 is None and now - start >= WARMUP_S:
                    t0, cpu0, count = time.perf_counter(), time.process_time(), 0
                if t0 is not None and now - start >= WARMUP_S + max(1.0, seconds / 2):
                    break
                region.outgoing.put(message)
                region.incoming.get()
                count += 1
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            out[f"shm_echo_step{n}_roundtrips_per_s"] = round(count / wall, 1)
            out[f"shm_echo_step{n}_bytes"] = [req, answer]
            out[f"shm_echo_step{n}_client_cpu_us_per_call"] = round(cpu / count * 1e6, 1)
            region.close()
            sock.close()
            for fd in fds:
                os.close(fd)
        finally:
            stop_evt.set()
            children.stop(proc)
    return out


def _bridge_case(children, seconds, prefix, n, sim_kind, transport, per_agent=False, net="tcp"):
    proc, address = start_bridge_server(children, net=net)
    try:
        res = run_clients(children, n, sim_kind, address, transport, seconds, proc.pid)
    finally:
        children.stop(proc)
    return _summary(_key(net, prefix), res, per_agent)


def case_unary(children, seconds):
    return _bridge_case(children, seconds, "unary_lockstep", 1, "lockstep", "unary")


def case_stream(children, seconds, net="tcp"):
    return _bridge_case(children, seconds, "stream_lockstep", 1, "lockstep", "stream", net=net)


def case_four_sims(children, seconds):
    return _bridge_case(children, seconds, "four_sims", 4, "lockstep", "stream")


def case_batched64(children, seconds, net="tcp"):
    """One simulator, 64 slots, remote inference, on the Step call."""
    return _bridge_case(children, seconds, "batched64", 1, "slots64", "stream", per_agent=True, net=net)


def case_rows64(children, seconds):
    out = _bridge_case(children, seconds, f"rows{BATCH}", 1, "rows64", "stream", per_agent=True)
    out[f"syncvector{BATCH}_env_step_us"] = syncvector_env_step_us()
    return out


def case_step_lockstep(children, seconds, net="tcp"):
    return _bridge_case(children, seconds, "step_lockstep", 1, "step_lockstep", "stream", net=net)


def case_batched256(children, seconds, net="tcp"):
    """One simulator, 256 slots, remote inference, on the Step call."""
    return _bridge_case(children, seconds, "batched256", 1, "slots256", "stream", per_agent=True, net=net)


def case_bare(children, seconds, net="tcp"):
    """RawStepSim with 1, 64 and 256 slots, each against a fresh server: bare_step{n}_* figures."""
    out = {}
    for n in (1, 64, 256):
        out.update(_bridge_case(children, max(1.0, seconds / 2), f"bare_step{n}", 1, f"bare{n}", "stream",
                                per_agent=n > 1, net=net))
    return out


_TCP_ENV = ("GRPC_EXPERIMENTS", "GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "SIMBRIDGE_GRPC_EVENT_ENGINE")
_TCP_ROUNDS = 3


def _on_tcp_path(path, fn):
    """Run fn() with every process it starts on gRPC's `path`: "iomgr" (what simbridge's programs
    choose, grpc_tuning.py) or "eventengine" (gRPC's own default)."""
    saved = {k: os.environ.get(k) for k in _TCP_ENV}
    for k in _TCP_ENV:
        os.environ.pop(k, None)
    if path == "eventengine":
        os.environ["SIMBRIDGE_GRPC_EVENT_ENGINE"] = "1"
    else:
        from simbridge.wire.grpc_tuning import prefer_iomgr_tcp
        prefer_iomgr_tcp()
    try:
        return fn()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def case_tcp_paths(children, seconds):
    """step_lockstep and batched256 on both of gRPC's TCP paths, alternating, _TCP_ROUNDS times each
    (this machine's speed drifts over tens of seconds: only runs next to each other compare).
    Reports each path's median and iomgr_vs_eventengine_* = ratio of the medians."""
    window = max(1.0, seconds / 2)
    out = {}
    for name, case, key in (("step_lockstep", case_step_lockstep, "step_lockstep_steps_per_s"),
                            ("batched256", case_batched256, "batched256_agent_steps_per_s")):
        got = {"iomgr": [], "eventengine": []}
        for _ in range(_TCP_ROUNDS):
            for path in got:
                res = _on_tcp_path(path, lambda: case(children, window))
                got[path].append(res[key])
        med = {path: float(np.median(v)) for path, v in got.items()}
        for path, v in got.items():
            out[f"tcp_{path}_{key}"] = round(med[path], 1)
            out[f"tcp_{path}_{key}_runs"] = v
        out[f"iomgr_vs_eventengine_{key}"] = round(med["iomgr"] / med["eventengine"], 3)
    return out


def syncvector_env_step_us(duration_s=0.3):
    """Reference: gymnasium SyncVectorEnv of 64 CartPole-v1 (same-step autoreset), per step."""
    try:
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        env = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(BATCH)],
                            autoreset_mode=AutoresetMode.SAME_STEP)
        env.reset(seed=0)
        actions = np.zeros(BATCH, np.int64)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < duration_s:
            env.step(actions)
            n += 1
        us = 1e6 * (time.perf_counter() - t0) / n
        env.close()
        return round(us, 1)
    except Exception as e:  # only a reference figure
        log.warning("SyncVectorEnv reference failed: %r", e)
        return None


def case_cpp(children, seconds, case):
    """A C++ example (bench/cpp_cases.py) against a fresh server, or `<case>_skipped` and why."""
    build, why = cpp_cases.ensure_built()
    if build is None:
        log.warning("%s skipped: %s", case, why)
        return {f"{case}_skipped": why}
    proc, address = start_bridge_server(children, net=cpp_cases.net_of(case))
    try:
        summary = cpp_cases.run_example(children, case, address, seconds, WARMUP_S,
                                        functools.partial(_proc_cpu_s, proc.pid), _die_with_parent)
    finally:
        children.stop(proc)
    return cpp_cases.summarize(case, summary)


CASE_FUNCS = {"floor": case_floor, "unary": case_unary, "stream": case_stream,
              "four_sims": case_four_sims, "batched64": case_batched64, "step_lockstep": case_step_lockstep,
              "rows64": case_rows64, "tcp_paths": case_tcp_paths,
              "batched256": case_batched256, "bare": case_bare,
              **{case: functools.partial(case_cpp, case=case) for case in cpp_cases.CPP_CASES}}
# The same cases on a Unix socket (docs/transports.md): figures named uds_<the TCP name>.
UDS_CASES = {"uds_floor": case_floor, "uds_bare": case_bare, "uds_stream": case_stream, "uds_step_lockstep": case_step_lockstep,
             "uds_batched64": case_batched64, "uds_batched256": case_batched256}
CASE_FUNCS.update({name: functools.partial(fn, net="uds") for name, fn in UDS_CASES.items()})
# ... and with the steps through shared memory (shm+unix:PATH): figures named shm_<the TCP name>.
SHM_CASES = {"shm_bare": case_bare, "shm_stream": case_stream, "shm_step_lockstep": case_step_lockstep,
             "shm_batched64": case_batched64, "shm_batched256": case_batched256}
CASE_FUNCS.update({name: functools.partial(fn, net="shm") for name, fn in SHM_CASES.items()})
CASE_FUNCS["shm_floor"] = case_shm_floor


_SPINS = {"spin": (50, 50),     # both ends spin up to 50 us before they block
          "cspin": (300, 0)}    # the simulator spins up to 300 us for its answer; the bridge blocks


def _spin_case(children, seconds, case, kind):
    """A shared-memory case whose ends spin on the ring before they block (SIMBRIDGE_SHM_SPIN_US
    for the simulators, SIMBRIDGE_SHM_SERVER_SPIN_US for the server; inherited): figures named
    <kind>_<the case's names>, to weigh spinning against blocking in one run."""
    names = ("SIMBRIDGE_SHM_SPIN_US", "SIMBRIDGE_SHM_SERVER_SPIN_US")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(us) for name, us in zip(names, _SPINS[kind])})
    try:
        out = CASE_FUNCS[case](children, seconds)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
    return {f"{kind}_{k}": v for k, v in out.items()}


CASE_FUNCS.update({f"{kind}_{case}": functools.partial(_spin_case, case=case, kind=kind)
                   for kind in _SPINS
                   for case in ("shm_step_lockstep", "shm_batched64", "cpp_shm_lockstep", "cpp_shm_batched64")})


def _iterator_case(children, seconds, case):
    """A TCP case with the simulators on grpcio's public stream API (a queue-fed request iterator,
    simbridge/client/direct_stream.py's fallback): the client as it was before DirectStream.
    Figures named iter_<the case's names>."""
    saved = os.environ.get("SIMBRIDGE_GRPC_STREAM")
    os.environ["SIMBRIDGE_GRPC_STREAM"] = "iterator"   # spawned simulators inherit it
    try:
        out = CASE_FUNCS[case](children, seconds)
    finally:
        if saved is None:
            os.environ.pop("SIMBRIDGE_GRPC_STREAM")
        else:
            os.environ["SIMBRIDGE_GRPC_STREAM"] = saved
    return {f"iter_{k}": v for k, v in out.items()}


ITERATOR_CASES = ("stream", "step_lockstep", "batched64", "batched256")
CASE_FUNCS.update({f"iter_{case}": functools.partial(_iterator_case, case=case) for case in ITERATOR_CASES})


# ---------------------------------------------------------------- local inference
# local: one gymnasium CartPole-v1 simulator acting itself (LocalPolicyClient: numpy forward
# passes in the simulator's process, experience uploaded in chunks by a background thread),
# against server_cli's random policy (local_*) and against a frozen DQN policy of the CartPole
# preset's size served by the trainer daemon (local_dqn_*: 4-128-128-2, epsilon 0.02).

LOCAL_NOTES = ("local*: LocalPolicyClient library defaults; latency = get_action, computed in the "
               "simulator's process; local_dqn*: trainer daemon serving a frozen DQN [128, 128]")


class LocalSim(LockstepSim):
    """One gymnasium CartPole-v1, one episode at a time, acting locally."""

    def _client(self, address, transport, seed):
        from simbridge.client.local_client import LocalPolicyClient

        return LocalPolicyClient(address, self.env.observation_space, self.env.action_space,
                                 client_name=f"bench-local-{seed}", seed=seed)

    def close(self):
        stats = self.client.stats()
        self.client.close()
        log.info("local client: %s", {k: stats[k] for k in ("uploaded_steps", "refusals", "blocked_s",
                                                             "lost_steps", "policy_version")})


SIMS["local"] = LocalSim


def start_dqn_trainer(children, logdir, timeout_s=120.0):
    """`python -m simbridge.trainer.cli run` with one frozen DQN policy on a free loopback port."""
    address = f"{HOST}:{_free_port()}"
    cfg = Path(logdir) / "bench_dqn.toml"
    cfg.write_text(f"""policies_to_train = []
[server]
address = "{address}"
experience_queue_size = 64
[run]
logdir = "{Path(logdir) / 'run'}"
print_every_s = 600.0
checkpoint_every_env_steps = 0
torch_threads = 1
[policies.default_policy]
algorithm = "dqn"
config = {{ hidden = [128, 128], epsilon_initial = 0.02, epsilon_final = 0.02, seed = 0 }}
""")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = children.add(subprocess.Popen([sys.executable, "-m", "simbridge.trainer.cli", "run", "--config", str(cfg),
                                          "--log-level", "WARNING"], cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
                                         preexec_fn=_die_with_parent))
    if not wait_healthy(address, proc, timeout_s):
        raise RuntimeError(f"trainer daemon at {address} exited (code {proc.returncode})")
    return proc, address


def case_local(children, seconds):
    import tempfile

    out = _bridge_case(children, seconds, "local", 1, "local", "unary")
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        proc, address = start_dqn_trainer(children, tmp)
        try:
            res = run_clients(children, 1, "local", address, "unary", seconds, proc.pid)
        finally:
            children.stop(proc, grace=30.0)
    out.update(_summary("local_dqn", res))
    return out


CASE_FUNCS["local"] = case_local


# ---------------------------------------------------------------- main

def echo_ratios(result):
    """Each Step case against the bare stream echo of its message sizes on the same transport
    (*_vs_echo: calls per second over echo round trips per second), and UDS against TCP."""
    out = {}
    for net in ("tcp", "uds", "shm"):
        k = functools.partial(_key, net)
        for case, n, rate in (("step_lockstep", 1, "steps_per_s"), ("batched64", 64, "calls_per_s"),
                              ("batched256", 256, "calls_per_s")):
            echo, got = result.get(k(f"echo_step{n}_roundtrips_per_s")), result.get(k(f"{case}_{rate}"))
            if echo and got:
                out[k(f"{case}_vs_echo")] = round(got / echo, 3)
            bare = result.get(k(f"bare_step{n}_{rate}"))
            if bare and got:
                out[k(f"{case}_vs_bare")] = round(got / bare, 3)
                # the bare client steps no simulator: the same ratio with the env's step time left out
                env_us = result.get(k(f"{case}_env_step_us"))
                if env_us:
                    out[k(f"{case}_vs_bare_without_env")] = round(1 / (1 / got - env_us * 1e-6) / bare, 3)
        echo, got = result.get(k("grpc_floor_stream_roundtrips_per_s")), result.get(k("stream_lockstep_steps_per_s"))
        if echo and got:
            out[k("stream_lockstep_vs_echo")] = round(got / echo, 3)
    for name in ("stream_lockstep_steps_per_s", "step_lockstep_steps_per_s", "batched64_agent_steps_per_s",
                 "batched256_agent_steps_per_s"):
        if result.get(name) and result.get(f"iter_{name}"):
            out[f"direct_vs_iterator_{name}"] = round(result[name] / result[f"iter_{name}"], 3)
    for name in ("grpc_floor_stream_roundtrips_per_s", "echo_step1_roundtrips_per_s", "stream_lockstep_steps_per_s",
                 "step_lockstep_steps_per_s", "batched64_agent_steps_per_s", "batched256_agent_steps_per_s"):
        for net in ("uds", "shm", "spin_shm", "cspin_shm"):
            if result.get(name) and result.get(f"{net}_{name}"):
                out[f"{net}_vs_tcp_{name}"] = round(result[f"{net}_{name}"] / result[name], 3)
        if result.get(f"uds_{name}") and result.get(f"shm_{name}"):
            out[f"shm_vs_uds_{name}"] = round(result[f"shm_{name}"] / result[f"uds_{name}"], 3)
    out.update(free_bridge_ceilings(result))
    return out


def free_bridge_ceilings(result):
    """shm_vs_tcp_<figure>_free_bridge_ceiling: the most a shared-memory case could make of this
    simulator over TCP's figure of the same run, were the bridge's Step free. A lockstep Step is
    serial, so none is shorter than the simulator's own CPU per Step (its env and client, measured
    in the case) plus what the bare ring echo of the same sizes spends beyond its client (the
    wake-ups and the peer's copy). Over 1 means no server work could close the gap."""
    out = {}
    for case, n, figure in (("step_lockstep", 1, "step_lockstep_steps_per_s"),
                            ("batched64", 64, "batched64_agent_steps_per_s"),
                            ("batched256", 256, "batched256_agent_steps_per_s")):
        client_us = result.get(f"shm_{case}_client_cpu_us_per_call")
        echo = result.get(f"shm_echo_step{n}_roundtrips_per_s")
        echo_client_us = result.get(f"shm_echo_step{n}_client_cpu_us_per_call")
        tcp = result.get(figure)
        if client_us and echo and echo_client_us is not None and tcp:
            floor_us = client_us + max(0.0, 1e6 / echo - echo_client_us)
            out[f"shm_vs_tcp_{figure}_free_bridge_ceiling"] = round(1e6 / floor_us * n / tcp, 3)
    return out


def _loadavg():
    """1-minute load average: other work on the machine skews every figure here."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def machine_info():
    import google.protobuf
    import grpc
    import gymnasium

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "nproc": os.cpu_count(), "usable_cpus": affinity,
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "grpcio": grpc.__version__, "protobuf": google.protobuf.__version__,
        "numpy": np.__version__, "gymnasium": gymnasium.__version__,
        "platform": platform.platform(), "processor": platform.machine(),
        # simbridge's programs pick gRPC's iomgr TCP path unless told otherwise (grpc_tuning.py)
        "grpc_experiments": os.environ.get("GRPC_EXPERIMENTS"),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per case (default 5)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    p.add_argument("--out", help="also write the JSON to this file")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cases = [CASE_ALIASES.get(c.strip(), c.strip()) for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASE_FUNCS]
    if unknown:
        p.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    if args.seconds <= 0:
        p.error("--seconds must be positive")

    # SIGTERM -> SystemExit, so the finally below still stops every child.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    children = Children()
    result = {}
    load_start = _loadavg()
    t_start = time.monotonic()
    if any(case in cpp_cases.CPP_CASES for case in cases):
        cpp_cases.ensure_built()  # before anything is timed
    try:
        for case in cases:
            log.info("case %s: %.1f s warm-up + %.1f s measured", case, WARMUP_S, args.seconds)
            t0 = time.monotonic()
            result.update(CASE_FUNCS[case](children, args.seconds))
            log.info("case %s done in %.1f s", case, time.monotonic() - t0)
    finally:
        children.stop_all()

    floor = result.get("grpc_floor_roundtrips_per_s")
    if floor:
        for prefix in ("stream", "unary"):
            rate = result.get(f"{prefix}_lockstep_steps_per_s")
            if rate is not None:
                result[f"{prefix}_vs_floor"] = round(rate / floor, 3)
        sfloor = result.get("grpc_floor_stream_roundtrips_per_s")
        if sfloor and "stream_lockstep_steps_per_s" in result:
            result["stream_vs_stream_floor"] = round(result["stream_lockstep_steps_per_s"] / sfloor, 3)
    result.update(echo_ratios(result))
    result.update(cpp_cases.ratios(result))
    result["machine"] = dict(machine_info(), loadavg_1m_start=load_start, loadavg_1m_end=_loadavg())
    if cpp_cases.toolchain():
        result["machine"]["cpp"] = cpp_cases.toolchain()
    result["config"] = {
        "seconds_per_case": args.seconds, "warmup_s": WARMUP_S, "cases": cases,
        "total_runtime_s": round(time.monotonic() - t_start, 1),
        "server": "python -m simbridge.server.cli (random policy, default BridgeConfig), fresh per case",
        "clients": "one process per simulator (multiprocessing spawn)",
        "lockstep_env": "gymnasium CartPole-v1",
        "batched_env": "batched64/batched256: sims/vector_cartpole.py on Step (SlotClient); rows64: "
                       f"BenchVectorCartPole, the bench's own numpy CartPole-v1 x{BATCH}, same-step autoreset",
        "episode_ids": "made by the simulator (start_episode(id), pipelined on stream), "
                       "except rows64's initial start_episodes(count=64)",
        "latency": "wall time of get_action / get_actions / step",
        "client_options": "PolicyClient library defaults apart from transport (whatever they are in "
                          "this checkout, e.g. reward coalescing into the next get_action)",
        "notes": "a lockstep step is get_action + log_returns (+ end/start at episode ends) through the "
                 "public API; how many RPCs that makes depends on the client (unary: 1 or 2, the floor: "
                 "1 per round trip); *_vs_floor = steps_per_s / grpc_floor_roundtrips_per_s; "
                 "*_cpu_cores = CPU seconds per wall second (server from /proc, all its threads); "
                 "*_server_cpu_us_per_call = server CPU per get_action(s) call",
        "local": LOCAL_NOTES,
        "cpp": cpp_cases.NOTES,
    }
    text = json.dumps(result, indent=2)
    print(text, flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; child processes stopped", file=sys.stderr)
        sys.exit(130)
