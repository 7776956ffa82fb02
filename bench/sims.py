"""The simulators of bench/throughput.py's cases, each run in a client process of its own.

A simulator is built as `SIMS[kind](address, transport, seed)` in bench.harness's client process and
stepped with `step(record)` (it returns the agent-steps it made; with record it keeps each call's
latency in lat_ms, its own stepping time in env_s and finished episodes in episodes), then closed.
bench/server_work.py drives the same classes in its own process.
"""
import functools
import logging
import queue
import time
import uuid

import numpy as np

from simbridge.wire.grpc_tuning import RECONNECT_OPTIONS

BATCH = 64   # rows64's episodes, and the reference SyncVectorEnv's copies
log = logging.getLogger("bench")
# gRPC honours http(s)_proxy; never route loopback traffic through one.
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), *RECONNECT_OPTIONS]


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


class CameraSim(LockstepSim):
    """A robot's camera beside its joints, one episode of 200 steps at a time, in lockstep: each
    observation a Dict {camera: HxWx3 uint8, joints: 7 floats}, each frame another (a bank of 32
    random frames, so a fragment's frames are not one frame's bytes in the cache)."""

    EPISODE = 200

    def __init__(self, address, transport, seed, shape=(240, 320, 3)):
        import gymnasium as gym

        rng = np.random.default_rng(seed)
        self.frames = rng.integers(0, 256, (32, *shape), dtype=np.uint8)
        self.space = gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, shape, np.uint8),
                                      "joints": gym.spaces.Box(-1.0, 1.0, (7,), np.float32)})
        self.actions = gym.spaces.Discrete(3)
        from simbridge.client.policy_client import PolicyClient

        self.client = PolicyClient(address, self.space, self.actions, transport=transport,
                                   client_name=f"bench-camera-{seed}")
        self.t, self.joints = 0, rng.uniform(-1, 1, (self.EPISODE + 1, 7)).astype(np.float32)
        self.eid = self.client.start_episode(uuid.uuid4().hex)
        self.lat_ms, self.env_s, self.episodes = [], 0.0, 0

    def _obs(self):
        return {"camera": self.frames[self.t % len(self.frames)], "joints": self.joints[self.t]}

    def step(self, record):
        c = self.client
        t0 = time.perf_counter()
        c.get_action(self.eid, self._obs())
        t1 = time.perf_counter()
        self.t += 1
        c.log_returns(self.eid, 1.0)
        if self.t == self.EPISODE:
            c.end_episode(self.eid, self._obs(), truncated=True)
            self.t = 0
            self.eid = c.start_episode(uuid.uuid4().hex)
            self.episodes += record
        if record:
            self.lat_ms.append((t1 - t0) * 1e3)
        return 1


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

        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
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
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
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


SIMS = {"lockstep": LockstepSim, "step_lockstep": StepLockstepSim, "rows64": Batched64Sim, "floor": FloorClient,
        "local": LocalSim, "camera": CameraSim, "camera84": functools.partial(CameraSim, shape=(84, 84, 3)),
        "slots64": functools.partial(SlotSim, n=64), "slots256": functools.partial(SlotSim, n=256),
        **{f"bare{n}": functools.partial(RawStepSim, n=n) for n in (1, 64, 256)}}
