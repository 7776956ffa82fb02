"""Exactly-once that cannot be confused, against a real server: a resend is the same seq with the
same request; another request under an applied seq is SEQ_REUSED, a seq that skips ahead is
SEQ_OUT_OF_ORDER, and a refused request spends its seq unless the refusal asks for the same
request again (QUEUE_FULL and the like).

Reproductions (issue 13): a GetAction reusing a StartEpisode's seq got an OK carrying the cached
StartEpisode reply (the client failed to decode it; on the stream, INTERNAL); a seq that jumps
ahead silently raised the last-applied number, after which correct lower seqs were refused.
"""
import queue
import hashlib
import time

import grpc
import gymnasium as gym
import numpy as np

from simbridge.server.experience import ExperienceQueue
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.errors import BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc

from support.raw import Raw, create_request, header, rows

SC = grpc.StatusCode


class Stream:
    """One Stream: requests in, one response each; errors come back in the response."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.q: "queue.Queue" = queue.Queue()
        self.responses = pb_grpc.ExternalEnvStub(self.channel).Stream(iter(self.q.get, None), timeout=60)

    def __call__(self, kind: str, msg):
        req = pb.StreamRequest()
        getattr(req, kind).CopyFrom(msg)
        self.q.put(req)
        resp = next(self.responses)
        if resp.HasField("error"):
            return BridgeError.from_status(resp.error)
        return getattr(resp, resp.WhichOneof("payload"))

    def close(self):
        self.q.put(None)
        self.channel.close()


def obs_rows(eid: str, x: float) -> pb.AgentRows:
    return rows([eid], [[x, x, x, x]])


def test_a_reused_seq_with_another_request_is_refused_on_both_transports(server):
    raw = Raw(server.address)
    sid = raw.create()
    started = raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid, 1), episode_ids=["e"]))
    assert list(started.episode_ids) == ["e"]
    # The reproduction: GetAction under StartEpisode's seq used to get StartEpisode's answer.
    err = raw.refused("GetAction", pb.GetActionRequest(header=header(sid, 1), rows=[obs_rows("e", 0)]))
    assert err.code == SC.INVALID_ARGUMENT and err.reason == Reason.SEQ_REUSED, err
    assert "next seq (2)" in err.message
    # An exact resend still gets the kept answer and changes nothing.
    again = raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid, 1), episode_ids=["e"]))
    assert again == started and server.runtime.snapshot()["open_episodes"] == 1
    # The same request over a stream bound to the session (no session_id in its header) is a resend too.
    st = Stream(server.address)
    assert st("create_session", create_request(resume_session_id=sid)).resumed
    assert st("start_episode", pb.StartEpisodeRequest(header=pb.RequestHeader(seq=1), episode_ids=["e"])) == started
    err = st("get_action", pb.GetActionRequest(header=pb.RequestHeader(seq=1), rows=[obs_rows("e", 0)]))
    assert isinstance(err, BridgeError) and err.reason == Reason.SEQ_REUSED, err
    # ... and the stream goes on.
    got = st("get_action", pb.GetActionRequest(header=pb.RequestHeader(seq=2), rows=[obs_rows("e", 0)]))
    assert not isinstance(got, BridgeError) and len(got.actions) == 1
    assert server.runtime.snapshot()["errors"].get("INTERNAL", 0) == 0
    assert server.runtime.snapshot()["refused"]["SEQ_REUSED"] == 2
    st.close()
    raw.close()


def test_a_seq_that_skips_ahead_is_refused_and_the_right_one_still_applies(server):
    raw = Raw(server.address)
    sid = raw.create()
    raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid, 1), episode_ids=["e"]))
    err = raw.refused("GetAction", pb.GetActionRequest(header=header(sid, 5), rows=[obs_rows("e", 0)]))
    assert err.code == SC.INVALID_ARGUMENT and err.reason == Reason.SEQ_OUT_OF_ORDER and "next seq is 2" in err.message
    assert server.runtime.snapshot()["agent_steps"] == 0
    # The reproduction: after the jump, seq 2 used to be refused as "already applied".
    got = raw("GetAction", pb.GetActionRequest(header=header(sid, 2), rows=[obs_rows("e", 0)]))
    assert len(got.actions) == 1
    assert raw("GetAction", pb.GetActionRequest(header=header(sid, 3), rows=[obs_rows("e", 1)]))
    assert server.runtime.session(sid).last_seq == 3
    raw.close()


def test_a_refused_request_spends_its_seq_and_a_resend_hears_the_same_error(server):
    raw = Raw(server.address)
    sid = raw.create()
    raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid, 1), episode_ids=["e"]))
    bad = pb.GetActionRequest(header=header(sid, 2), rows=[rows(["e"], [[0.0, 0.0]])])   # wrong shape
    first = raw.refused("GetAction", bad)
    assert first.reason == Reason.INVALID_VALUE
    resent = raw.refused("GetAction", bad)
    assert (resent.code, resent.reason, resent.message) == (first.code, first.reason, first.message)
    # Its seq is spent: a corrected request under it is another request, not a resend.
    fixed = raw.refused("GetAction", pb.GetActionRequest(header=header(sid, 2), rows=[obs_rows("e", 0)]))
    assert fixed.reason == Reason.SEQ_REUSED
    assert server.runtime.snapshot()["agent_steps"] == 0
    # The client's next request takes the next seq: no gap.
    assert raw("GetAction", pb.GetActionRequest(header=header(sid, 3), rows=[obs_rows("e", 0)]))
    # Seq 0 is applied as received and spends nothing.
    assert raw("LogReturns", pb.LogReturnsRequest(header=header(sid, 0), rows=[pb.RewardRows(
        episode_ids=["e"], rewards=tensors.to_tensor(np.float32([1.0])))]))
    assert raw("GetAction", pb.GetActionRequest(header=header(sid, 4), rows=[obs_rows("e", 1)]))
    raw.close()


def test_a_full_queue_does_not_spend_the_seq(make_server):
    # A queue of one batch, never drained: the second upload finds it full.
    rt = BridgeRuntime(BridgeConfig(upload_queue_wait_s=0.05), experience=ExperienceQueue(1))
    srv = make_server(rt)
    raw = Raw(srv.address)
    sid = raw.create()

    def chunk(seq: int, eid: str) -> pb.UploadExperienceRequest:
        req = pb.UploadExperienceRequest(header=header(sid, seq), episode_ids=[eid])
        n = 2
        sb_spaces.fill_value(req.observations, sb_spaces.space_from_proto(sb_spaces.space_to_proto(
            gym.spaces.Box(-10.0, 10.0, (4,), np.float32))), np.zeros((n, 4), np.float32))
        sb_spaces.fill_value(req.next_observations, gym.spaces.Box(-10.0, 10.0, (4,), np.float32),
                             np.zeros((n, 4), np.float32))
        sb_spaces.fill_value(req.actions, gym.spaces.Discrete(2), np.zeros(n, np.int64))
        req.rewards.CopyFrom(tensors.to_tensor(np.ones(n, np.float32)))
        req.episode_index.CopyFrom(tensors.to_tensor(np.zeros(n, np.int64)))
        req.t.CopyFrom(tensors.to_tensor(np.arange(n, dtype=np.int64)))
        req.policy_versions.CopyFrom(tensors.to_tensor(np.zeros(n, np.int64)))
        return req

    assert raw("UploadExperience", chunk(1, "a")).accepted_steps == 2
    err = raw.refused("UploadExperience", chunk(2, "b"))
    assert err.code == SC.RESOURCE_EXHAUSTED and err.reason == Reason.QUEUE_FULL
    rt.experience.get(timeout=5)   # the learner makes room
    assert raw("UploadExperience", chunk(2, "b")).accepted_steps == 2   # the same seq applies now
    assert rt.session(sid).last_seq == 2
    raw.close()


def test_digest_ignores_the_header_and_costs_little_on_a_256_slot_step():
    from simbridge.server.sessions import request_digest
    obs = np.random.default_rng(0).standard_normal((256, 4)).astype(np.float32)
    a = pb.StepRequest(header=pb.RequestHeader(session_id="s", seq=7))
    a.observations.tensor.CopyFrom(tensors.to_tensor(obs))
    a.rewards.CopyFrom(tensors.to_tensor(np.ones(256, np.float32)))
    b = pb.StepRequest()
    b.CopyFrom(a)
    b.header.Clear()
    assert request_digest("step", a) == request_digest("step", b)
    assert a.header.session_id == "s" and a.header.seq == 7   # restored
    assert request_digest("step", a) != request_digest("get_action", a)
    b.rewards.data = np.zeros(256, np.float32).tobytes()
    assert request_digest("step", a) != request_digest("step", b)
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        request_digest("step", a)
    per_call_us = (time.perf_counter() - t0) / n * 1e6
    print(f"request_digest on a 256-slot Step ({a.ByteSize()} bytes): {per_call_us:.1f} us")
    assert per_call_us < 200   # generous for a loaded 2-core machine; measured ~6 us


def test_a_cameras_digest_sees_one_changed_pixel_and_does_not_hash_the_whole_frame():
    """Bodies over 16 KiB are hashed by their ends and a CRC of the whole (SHA-256 of a 320x240
    frame was a third of the bridge's work per step): a pixel changed anywhere, a reward, an
    episode id still make another digest."""
    from simbridge.server.sessions import request_digest
    frame = np.random.default_rng(1).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    a = pb.GetActionRequest(header=pb.RequestHeader(session_id="s", seq=3))
    row = a.rows.add(episode_ids=["ep"])
    row.observations.dict.items["camera"].tensor.CopyFrom(tensors.to_tensor(frame))
    row.observations.dict.items["joints"].tensor.CopyFrom(tensors.to_tensor(np.zeros(7, np.float32)))
    same = pb.GetActionRequest.FromString(a.SerializeToString())
    same.header.seq = 9
    assert request_digest("get_action", a) == request_digest("get_action", same)
    for at in (0, frame.size // 2, frame.size - 1):   # the ends and the middle
        b = pb.GetActionRequest()
        b.CopyFrom(a)
        changed = frame.copy().reshape(-1)
        changed[at] ^= 1
        b.rows[0].observations.dict.items["camera"].tensor.data = changed.tobytes()
        assert request_digest("get_action", a) != request_digest("get_action", b), at
    b = pb.GetActionRequest()
    b.CopyFrom(a)
    b.rows[0].episode_ids[0] = "eq"
    assert request_digest("get_action", a) != request_digest("get_action", b)
    from simbridge.server import sessions
    fed, real = [], hashlib.sha256

    class Counted:   # hashlib.sha256 that counts what it is fed
        def __init__(self, data=b""):
            self.h = real(data)
            fed.append(len(data))

        def update(self, data):
            fed.append(len(data))
            self.h.update(data)

        def digest(self):
            return self.h.digest()
    sessions.hashlib.sha256 = Counted
    try:
        request_digest("get_action", a)
    finally:
        sessions.hashlib.sha256 = real
    assert sum(fed) < 16 << 10, fed   # the ends, not the 230,400-byte frame
    n = 200
    t0 = time.thread_time()
    for _ in range(n):
        request_digest("get_action", a)
    digest_s = time.thread_time() - t0
    t0 = time.thread_time()
    for _ in range(n):
        hashlib.sha256(a.SerializeToString(deterministic=True)).digest()   # the digest before
    print(f"request_digest of a 320x240 frame: {digest_s / n * 1e6:.0f} us; serialised and "
          f"SHA-256 whole: {(time.thread_time() - t0) / n * 1e6:.0f} us")
