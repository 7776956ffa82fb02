"""What the fuzzer sends: near-valid requests, stream sequences and raw bytes (see fuzzing.py).

Near-valid: the request a correct CartPole client would send in the given
session context (Ctx), then `Gen.mutate` replaces one to three fields; one in
ten goes out unmutated so sessions move on (episodes start, act, end).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from bench.fuzzing import AGENTS, N_SLOTS, OBS_SHAPE, STREAM_KINDS, UNARY, Ctx, Gen
from simbridge.wire import spaces as sb_spaces
from simbridge.wire.v1 import simbridge_pb2 as pb

F32, I32, I64, BOOL = 1, 6, 7, 12
OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, OBS_SHAPE, np.float32)   # the witness's spaces too
ACT_SPACE = gym.spaces.Discrete(2)


def _t(arr, dtype: int) -> pb.Tensor:
    arr = np.ascontiguousarray(arr)
    return pb.Tensor(dtype=dtype, shape=arr.shape, data=arr.astype(arr.dtype.newbyteorder("<")).tobytes())


def _obs(g: Gen, n: int) -> pb.Value:
    rng = np.random.default_rng(g.d.integer(0, 2**32 - 1))
    return pb.Value(tensor=_t(rng.uniform(-0.2, 0.2, (n, *OBS_SHAPE)).astype(np.float32), F32))


def _acts(g: Gen, n: int) -> pb.Value:
    return pb.Value(tensor=_t(np.array([g.d.integer(0, 1) for _ in range(n)], np.int64), I64))


def _rewards(n: int) -> pb.Tensor:
    return _t(np.ones(n, np.float32), F32)


def _rows(g: Gen):
    """(episode_ids, agent_ids, n) of one valid row group in the context."""
    c = g.ctx
    eids = c.episodes or ["e0"]
    if c.multi:
        aids = list(AGENTS[:g.d.integer(1, len(AGENTS))])
        return [g.d.choice(eids)], aids, len(aids)
    n = g.d.integer(1, min(2, len(eids)))
    return eids[:n], [], n


def create_session(g: Gen) -> pb.CreateSessionRequest:
    c = g.ctx
    req = pb.CreateSessionRequest(client_name="fuzz", observation_space=sb_spaces.space_to_proto(OBS_SPACE),
                                  action_space=sb_spaces.space_to_proto(ACT_SPACE))
    if c.sid and g.d.boolean(0.3):
        req.resume_session_id = g.d.choice([c.sid, *c.others]) if c.others else c.sid
    if not c.multi and g.d.boolean(0.3):
        req.num_slots = N_SLOTS
    return req


def _header(g: Gen, stream: bool) -> pb.RequestHeader:
    return pb.RequestHeader(session_id="" if stream else g.ctx.sid, seq=0)


def valid_request(g: Gen, method: str, stream: bool = False):
    """The request of `method` a correct client would send now (before mutation)."""
    d = g.d
    h = _header(g, stream)
    if method == "CreateSession":
        return create_session(g)
    if method == "StartEpisode":
        if d.boolean(0.3):
            return pb.StartEpisodeRequest(header=h, count=d.integer(1, 3))
        return pb.StartEpisodeRequest(header=h, episode_ids=["n%d" % d.integer(0, 2**30)])
    if method in ("GetAction", "LogAction"):
        eids, aids, n = _rows(g)
        req = UNARY[method][0](header=h)
        req.rows.add(episode_ids=eids, agent_ids=aids, observations=_obs(g, n))
        if method == "LogAction":
            req.actions.add().CopyFrom(_acts(g, n))
        if d.boolean(0.3):
            req.rewards.add(episode_ids=eids, agent_ids=aids, rewards=_rewards(n))
        return req
    if method == "LogReturns":
        eids, aids, n = _rows(g)
        req = pb.LogReturnsRequest(header=h)
        req.rows.add(episode_ids=eids, agent_ids=aids, rewards=_rewards(n))
        if d.boolean(0.2):
            req.custom_metrics.add(episode_id=eids[0]).values["m"] = 1.0
        return req
    if method == "EndEpisode":
        eids, aids, n = _rows(g)
        eid = eids[0]
        truncated = d.boolean(0.3)
        req = pb.EndEpisodeRequest(header=h, episode_ids=[eid], truncated=[truncated])
        if truncated or d.boolean(0.3):
            req.final_observations.add(episode_ids=[eid], agent_ids=aids[:1], observations=_obs(g, 1))
        if d.boolean(0.3):
            req.start_episode_ids.append("r%d" % d.integer(0, 2**30))
        return req
    if method == "CloseSession":
        return pb.CloseSessionRequest(header=h)
    if method == "Step":
        n = N_SLOTS
        req = pb.StepRequest(header=h, observations=_obs(g, n))
        if d.boolean(0.7):
            req.rewards.CopyFrom(_rewards(n))
            done = np.array([d.boolean(0.2) for _ in range(n)])
            req.terminated.CopyFrom(_t(done.astype(np.uint8), BOOL))
            if done.any():
                req.final_observations.CopyFrom(_obs(g, int(done.sum())))
        if d.boolean(0.05):
            req.final = True
            req.ClearField("observations")
        return req
    if method == "GetPolicy":
        return pb.GetPolicyRequest(header=h, known_version=d.choice((-1, 0, 5)), include_onnx=d.boolean(0.2))
    if method == "UploadExperience":
        k = d.integer(1, 3)
        req = pb.UploadExperienceRequest(header=h, episode_ids=["u%d" % d.integer(0, 2**30)])
        req.episode_index.CopyFrom(_t(np.zeros(k, np.int32), I32))
        req.t.CopyFrom(_t(np.arange(k, dtype=np.int32), I32))
        req.observations.CopyFrom(_obs(g, k))
        req.actions.CopyFrom(_acts(g, k))
        req.rewards.CopyFrom(_rewards(k))
        req.next_observations.CopyFrom(_obs(g, k))
        req.terminated.CopyFrom(_t(np.eye(1, k, k - 1, dtype=np.uint8)[0], BOOL))
        req.truncated.CopyFrom(_t(np.zeros(k, np.uint8), BOOL))
        req.policy_versions.CopyFrom(_t(np.full(k, -1, np.int64), I64))
        req.finished_episodes.add(episode_id=req.episode_ids[0], total_reward=float(k), length=k)
        return req
    raise ValueError(method)


def typed_request(g: Gen, method: str, stream: bool = False):
    """A typed request of `method`: generic (every field hostile) or near-valid (a few fields)."""
    cls = UNARY[method][0]
    k = g.d.integer(0, 9)
    if k < 3:
        return g.message(cls)
    msg = valid_request(g, method, stream)
    if k < 9:
        g.mutate(msg, g.d.integer(1, 3))
    return msg


_KIND_METHOD = {v[2]: k for k, v in UNARY.items()}


def stream_requests(g: Gen, max_len: int = 8):
    """(kinds, StreamRequests) of one fuzzed stream: usually create_session first, usually a valid
    start_episode of the ctx's episodes next, then random requests of every stream kind."""
    d = g.d
    out = []

    def add(kind, msg):
        sr = pb.StreamRequest()
        if kind is not None:
            getattr(sr, kind).CopyFrom(msg)
        out.append((kind, sr))

    if d.boolean(0.9):
        add("create_session", typed_request(g, "CreateSession", stream=True) if d.boolean(0.3)
            else create_session(g))
    if d.boolean(0.7):
        add("start_episode", pb.StartEpisodeRequest(episode_ids=g.ctx.episodes))
    for _ in range(d.integer(1, max_len)):
        if d.boolean(0.05):
            add(None, None)   # a StreamRequest with no payload
            continue
        kind = d.choice(STREAM_KINDS)
        add(kind, typed_request(g, _KIND_METHOD[kind], stream=True))
    return [k for k, _ in out], [sr for _, sr in out]


def raw_bytes(g: Gen, method: str) -> bytes:
    """Bytes for `method` that are not (quite) its message: random, or a valid one damaged."""
    d = g.d
    k = d.integer(0, 4)
    if k == 0:
        return d.raw(1 << 18) if d.boolean(0.05) else d.raw(64)
    if k == 1:
        return d.raw(4096)
    base = bytearray(valid_request(g, method).SerializeToString()) if method != "Stream" else \
        bytearray(pb.StreamRequest(create_session=create_session(g)).SerializeToString())
    if k == 2 and base:   # truncated
        return bytes(base[:d.integer(0, len(base) - 1)])
    if k == 3 and base:   # bytes flipped
        for _ in range(d.integer(1, 4)):
            i = d.integer(0, len(base) - 1)
            base[i] ^= 1 << d.integer(0, 7)
        return bytes(base)
    return bytes(base) + d.raw(16)   # trailing garbage


def stream_ctx(multi: bool, others=()) -> Ctx:
    return Ctx("", multi, N_SLOTS, episodes=("s0", "s1"), others=others)

