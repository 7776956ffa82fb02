"""Limits no client can break, against a real BridgeServer on loopback: id lengths, space sizes,
sessions per client, session ownership, tensors and spaces of more than 64 dimensions.

Each refusal is a precise status with its ErrorReason, nothing is kept of the refused call, and
a well-behaved client on the same server carries on.
"""
import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.client.policy_client import PolicyClient
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.errors import BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb
from support.raw import ACT, OBS, Raw, create_request, header, rows

SC = grpc.StatusCode


@pytest.fixture
def witness(server):
    """A well-behaved simulator with an episode open across the bad calls: it must carry on."""
    c = PolicyClient(server.address, OBS, ACT, client_name="witness")
    eid = c.start_episode()
    c.get_action(eid, np.zeros(4, np.float32))
    yield c, eid
    c.log_returns(eid, 1.0)
    c.get_action(eid, np.ones(4, np.float32))
    c.end_episode(eid, np.ones(4, np.float32))
    c.close()
    assert server.runtime.snapshot()["episodes"] >= 1


def assert_refused(err: BridgeError, code, reason, *words):
    assert err.code == code and err.reason == reason, (err.code, err.reason_name, err.message)
    for w in words:
        assert w in err.message, err.message


# ---------------------------------------------------------------- ids


def test_overlong_ids_are_refused_everywhere_before_anything_is_kept(server, witness):
    limit = server.runtime.config.max_id_bytes
    long_id = "e" * (1 << 20)                    # the reproduction: 1 MB episode ids
    just_over = "é" * (limit // 2 + 1)           # 2 bytes each in UTF-8: over by bytes, not by characters
    assert len(just_over) <= limit
    raw = Raw(server.address)
    sid = raw.create()
    for bad in (long_id, just_over):
        err = raw.refused("StartEpisode", pb.StartEpisodeRequest(header=header(sid), episode_ids=["ok", bad]))
        assert_refused(err, SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG, f"limit of {limit} bytes", "max_id_bytes")
        assert len(err.message) < 400   # the id itself is not echoed back
    assert server.runtime.snapshot()["open_episodes"] == 1   # the witness's only: "ok" was not started
    ok = "é" * (limit // 2)
    assert list(raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid), episode_ids=[ok])).episode_ids) == [ok]

    # An unknown overlong id is refused as too long (not echoed as unknown), in every row call.
    for method, req in (
            ("GetAction", pb.GetActionRequest(header=header(sid), rows=[rows([long_id], [[0, 0, 0, 0]])])),
            ("EndEpisode", pb.EndEpisodeRequest(header=header(sid), episode_ids=[long_id])),
            ("EndEpisode", pb.EndEpisodeRequest(header=header(sid), episode_ids=[ok], start_episode_ids=[long_id])),
            ("LogReturns", pb.LogReturnsRequest(header=header(sid), rows=[pb.RewardRows(
                episode_ids=[long_id], rewards=tensors.to_tensor(np.float32([1.0])))]))):
        assert_refused(raw.refused(method, req), SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG)
    custom = pb.LogReturnsRequest(header=header(sid))
    custom.custom_metrics.add(episode_id=ok).values[long_id] = 1.0
    assert_refused(raw.refused("LogReturns", custom), SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG, "custom metric")

    # CreateSession: client_name, declared agents, resume_session_id; another session id.
    assert_refused(raw.refused("CreateSession", create_request(client_name=long_id)),
                   SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG, "client_name")
    assert_refused(raw.refused("CreateSession", create_request(resume_session_id=long_id)),
                   SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG, "resume_session_id")
    assert_refused(raw.refused("GetAction", pb.GetActionRequest(header=header(long_id))),
                   SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG, "session_id")
    ma = Raw(server.address, multi_agent=True)
    req = create_request()
    req.agents.add(agent_id=long_id)
    assert_refused(ma.refused("CreateSession", req), SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG, "agent id")
    assert len(server.runtime.session_ids()) == 2   # the witness's and sid: nothing else was created

    # Multi-agent rows: a new agent's id is kept on its first appearance, so it is checked there.
    msid = ma.create()
    ma("StartEpisode", pb.StartEpisodeRequest(header=header(msid), episode_ids=["m"]))
    err = ma.refused("GetAction", pb.GetActionRequest(header=header(msid), rows=[
        rows(["m"], [[0, 0, 0, 0], [0, 0, 0, 0]], agent_ids=["a", long_id])]))
    assert_refused(err, SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG, "agent id")
    assert not server.runtime.session(msid).episodes["m"].agents   # not even "a" was added
    err = ma.refused("LogReturns", pb.LogReturnsRequest(header=header(msid), rows=[pb.RewardRows(
        episode_ids=["m"], agent_ids=[long_id], rewards=tensors.to_tensor(np.float32([1.0])))]))
    assert_refused(err, SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG, "agent id")
    raw.close()
    ma.close()


def test_upload_ids_are_bounded(server):
    raw = Raw(server.address)
    sid = raw.create()
    long_id = "u" * 10_000
    req = pb.UploadExperienceRequest(header=header(sid, 1), episode_ids=[long_id])
    assert_refused(raw.refused("UploadExperience", req), SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG)
    req = pb.UploadExperienceRequest(header=header(sid, 2))
    req.finished_episodes.add(episode_id=long_id, length=1)
    assert_refused(raw.refused("UploadExperience", req), SC.INVALID_ARGUMENT, Reason.ID_TOO_LONG, "finished")
    assert server.runtime.snapshot()["episodes"] == 0
    raw.close()


# ---------------------------------------------------------------- spaces and sessions


def test_a_space_over_max_space_elements_is_refused_at_create_session(make_server):
    srv = make_server(max_space_elements=1000)
    raw = Raw(srv.address)
    for obs, act, what in ((gym.spaces.Box(-1, 1, (1001,), np.float32), ACT, "observation_space"),
                           (OBS, gym.spaces.MultiBinary([1 << 20, 1 << 20]), "action_space"),
                           (gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (500,), np.float32),
                                             "b": gym.spaces.MultiDiscrete([2] * 501)}), ACT, "observation_space")):
        err = raw.refused("CreateSession", create_request(obs, act))
        assert_refused(err, SC.RESOURCE_EXHAUSTED, Reason.SPACE_TOO_LARGE, what, "limit of 1000",
                       "max_space_elements")
    ma = Raw(srv.address, multi_agent=True)
    req = create_request()
    req.agents.add(agent_id="big", observation_space=sb_spaces.space_to_proto(gym.spaces.Box(-1, 1, (2000,))))
    assert_refused(ma.refused("CreateSession", req), SC.RESOURCE_EXHAUSTED, Reason.SPACE_TOO_LARGE, "'big'")
    assert srv.runtime.session_ids() == []
    assert raw.create(gym.spaces.Box(-1, 1, (1000,), np.float32))   # at the limit: served
    assert srv.runtime.snapshot()["refused"]["SPACE_TOO_LARGE"] == 4
    raw.close()
    ma.close()


def test_sessions_per_client_are_capped_and_freed_by_close(make_server):
    srv = make_server(max_sessions_per_client=3)
    rt = srv.runtime
    sids = [rt.create_session(create_request(), False, client="a").session_id for _ in range(3)]
    with pytest.raises(BridgeError) as info:
        rt.create_session(create_request(), False, client="a")
    assert_refused(info.value, SC.RESOURCE_EXHAUSTED, Reason.TOO_MANY_SESSIONS, "3 live sessions", "CloseSession")
    assert rt.create_session(create_request(), False, client="b").session_id   # others are not affected
    rt.handle("close_session", pb.CloseSessionRequest(header=header(sids[0])), False, client="a")
    assert rt.create_session(create_request(num_slots=2), False, client="a").session_id
    # Over the wire too: one loopback host is one client.
    raw = Raw(srv.address)
    for _ in range(3):
        raw.create()
    assert_refused(raw.refused("CreateSession", create_request()), SC.RESOURCE_EXHAUSTED, Reason.TOO_MANY_SESSIONS)
    raw.close()


def test_a_session_belongs_to_its_creator():
    rt = BridgeRuntime(BridgeConfig())
    sid = rt.create_session(create_request(), False, client="alice").session_id
    rt.handle("start_episode", pb.StartEpisodeRequest(header=header(sid, 1), episode_ids=["e"]), False,
              client="alice")
    for call in (lambda: rt.create_session(create_request(resume_session_id=sid), False, client="mallory"),
                 lambda: rt.handle("end_episode", pb.EndEpisodeRequest(header=header(sid, 2), episode_ids=["e"]),
                                   False, client="mallory"),
                 lambda: rt.handle("close_session", pb.CloseSessionRequest(header=header(sid)), False,
                                   client="mallory")):
        with pytest.raises(BridgeError) as info:
            call()
        assert_refused(info.value, SC.PERMISSION_DENIED, Reason.NOT_SESSION_OWNER)
        assert info.value.message == "this session belongs to another credential"
    assert rt.snapshot()["open_episodes"] == 1 and rt.session(sid).last_seq == 1   # untouched, seq not spent
    assert rt.create_session(create_request(resume_session_id=sid), False, client="alice").resumed
    rt.handle("end_episode", pb.EndEpisodeRequest(header=header(sid, 2), episode_ids=["e"]), False, client="alice")


# ---------------------------------------------------------------- more than 64 dimensions


def _box_proto(shape) -> pb.Space:
    low = np.zeros(shape, np.float32)
    msg = pb.Space()
    msg.box.low.CopyFrom(tensors.to_tensor(low))
    msg.box.high.CopyFrom(tensors.to_tensor(low + 1))
    return msg


def _tensor(shape, dtype=pb.FLOAT32, itemsize=4) -> pb.Tensor:
    n = int(np.prod(shape))
    return pb.Tensor(dtype=dtype, shape=shape, data=b"\0" * (n * itemsize))


def test_more_than_64_dimensions_is_invalid_value_not_internal(make_server, server, witness):
    raw = Raw(server.address)
    ones = [1] * 65

    def space_refused(obs_msg=None, act_msg=None):
        req = pb.CreateSessionRequest(observation_space=obs_msg or sb_spaces.space_to_proto(OBS),
                                      action_space=act_msg or sb_spaces.space_to_proto(ACT))
        return raw.refused("CreateSession", req)

    # Spaces: a Box bound of 65 dims (numpy cannot hold it), and leaves of 64 (their values, with the
    # row dimension, would have 65).
    assert_refused(space_refused(_box_proto([1] * 64)), SC.INVALID_ARGUMENT, Reason.INVALID_VALUE, "at most 63")
    big_bound = pb.Space()
    big_bound.box.low.CopyFrom(_tensor(ones))
    big_bound.box.high.CopyFrom(_tensor(ones))
    assert_refused(space_refused(big_bound), SC.INVALID_ARGUMENT, Reason.INVALID_VALUE, "65 dimensions")
    md = pb.Space()
    md.multi_discrete.nvec.CopyFrom(pb.Tensor(dtype=pb.INT64, shape=ones, data=(2).to_bytes(8, "little")))
    assert_refused(space_refused(act_msg=md), SC.INVALID_ARGUMENT, Reason.INVALID_VALUE, "65 dimensions")
    mb = pb.Space()
    mb.multi_binary.shape.extend([1] * 64)
    assert_refused(space_refused(act_msg=mb), SC.INVALID_ARGUMENT, Reason.INVALID_VALUE, "MultiBinary")
    # An empty tensor whose shape numpy cannot make an array of.
    huge = pb.Space()
    huge.box.low.CopyFrom(_tensor([0, 1 << 62, 1 << 62]))
    huge.box.high.CopyFrom(_tensor([0, 1 << 62, 1 << 62]))
    assert_refused(space_refused(huge), SC.INVALID_ARGUMENT, Reason.INVALID_VALUE)
    # A 63-dim leaf is served, and a value of 65 dims for it is refused (a server of its own: the
    # witness bound default_policy to its spaces).
    assert server.runtime.snapshot()["errors"].get("INTERNAL", 0) == 0
    raw.close()
    deep_srv = make_server()
    raw = Raw(deep_srv.address)
    deep = gym.spaces.Box(0, 1, tuple([1] * 63), np.float32)
    sid = raw.create(deep)
    raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid), episode_ids=["d"]))
    ok = raw("GetAction", pb.GetActionRequest(header=header(sid), rows=[pb.AgentRows(
        episode_ids=["d"], observations=pb.Value(tensor=_tensor([1] * 64)))]))
    assert len(ok.actions) == 1
    err = raw.refused("GetAction", pb.GetActionRequest(header=header(sid), rows=[pb.AgentRows(
        episode_ids=["d"], observations=pb.Value(tensor=_tensor([1] * 65)))]))
    assert_refused(err, SC.INVALID_ARGUMENT, Reason.INVALID_VALUE)
    # Rewards, and uploads' tensors (decoded by tensors.from_tensor).
    err = raw.refused("LogReturns", pb.LogReturnsRequest(header=header(sid), rows=[pb.RewardRows(
        episode_ids=["d"], rewards=_tensor(ones))]))
    assert_refused(err, SC.INVALID_ARGUMENT, Reason.INVALID_VALUE)
    usid = raw.create()
    up = pb.UploadExperienceRequest(header=header(usid, 1), episode_ids=["u"], rewards=_tensor([1]))
    up.episode_index.CopyFrom(pb.Tensor(dtype=pb.INT64, shape=ones, data=b"\0" * 8))
    err = raw.refused("UploadExperience", up)
    assert err.code == SC.INVALID_ARGUMENT, (err.code, err.message)
    assert deep_srv.runtime.snapshot()["errors"].get("INTERNAL", 0) == 0
    raw.close()


# ---------------------------------------------------------------- what a client makes the server keep


def test_open_episodes_and_agents_are_bounded_by_the_clients_memory_budget(make_server):
    big = gym.spaces.Box(-1.0, 1.0, (10_000,), np.float32)
    srv = make_server(max_client_state_bytes=1 << 20)
    rt = srv.runtime
    raw = Raw(srv.address)
    sid = raw.create(big)
    other = raw.create(big)                    # the same client: one budget for both
    s = rt.session(sid)
    per_episode = s.default.row_bytes          # 16 bytes an element + 2 KiB
    assert 160_000 < per_episode < 170_000
    fits = ((1 << 20) - s.client.state_bytes) // per_episode
    assert fits >= 2
    raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid), count=fits))
    err = raw.refused("StartEpisode", pb.StartEpisodeRequest(header=header(sid), count=1))
    assert_refused(err, SC.RESOURCE_EXHAUSTED, Reason.TOO_MANY_EPISODES, "max_client_state_bytes", "end episodes")
    # The client's other session shares the budget; another client has its own.
    assert_refused(raw.refused("StartEpisode", pb.StartEpisodeRequest(header=header(other), count=1)),
                   SC.RESOURCE_EXHAUSTED, Reason.TOO_MANY_EPISODES)
    elsewhere = rt.create_session(create_request(big), False, client="another host").session_id
    rt.handle("start_episode", pb.StartEpisodeRequest(header=header(elsewhere), count=fits), False,
              client="another host")
    # Ending episodes gives their bytes back.
    ids = list(s.episodes)
    raw("EndEpisode", pb.EndEpisodeRequest(header=header(sid), episode_ids=ids))
    assert s.client.state_bytes == s.fixed_bytes + rt.session(other).fixed_bytes
    raw("StartEpisode", pb.StartEpisodeRequest(header=header(other), count=1))
    raw("CloseSession", pb.CloseSessionRequest(header=header(other)))
    raw("CloseSession", pb.CloseSessionRequest(header=header(sid)))
    assert "" not in rt.sessions._clients   # the client holds nothing any more
    raw.close()

    # Multi-agent: each agent after an episode's first takes its own share.
    ma = Raw(srv.address, multi_agent=True)
    msid = ma.create(big)
    ms = rt.session(msid)
    ma("StartEpisode", pb.StartEpisodeRequest(header=header(msid), episode_ids=["m"]))
    before = ms.client.state_bytes
    zeros = np.zeros((2, 10_000), np.float32)
    ma("GetAction", pb.GetActionRequest(header=header(msid), rows=[rows(["m"], zeros, agent_ids=["a", "b"])]))
    assert ms.client.state_bytes == before + per_episode
    n_more = ((1 << 20) - ms.client.state_bytes) // per_episode + 1
    err = ma.refused("GetAction", pb.GetActionRequest(header=header(msid), rows=[
        rows(["m"], np.zeros((n_more, 10_000), np.float32), agent_ids=[f"x{i}" for i in range(n_more)])]))
    assert_refused(err, SC.RESOURCE_EXHAUSTED, Reason.TOO_MANY_EPISODES)
    ma.close()


def test_kept_answers_are_bounded_in_bytes(make_server):
    srv = make_server(response_cache_bytes=3000)
    raw = Raw(srv.address)
    sid = raw.create()
    raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid, 1), episode_ids=["e"]))
    big = pb.StartEpisodeRequest(header=header(sid, 2), episode_ids=[f"{i:0>200}" for i in range(20)])
    raw("StartEpisode", big)                                   # ~4 KB answer: not kept
    s = srv.runtime.session(sid)
    assert list(s.responses) == [1] and s.responses_bytes < 3000 and s.last_seq == 2
    err = raw.refused("StartEpisode", big)
    assert err.reason == Reason.ALREADY_APPLIED
    for seq in range(3, 40):
        raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid, seq), episode_ids=[f"s{seq:0>60}"]))
    assert s.responses_bytes <= 3000 and 20 < len(s.responses) < 40


# ---------------------------------------------------------------- finished ids (bench/soak.py)


def test_finished_ids_per_session_stay_few():
    """A session keeps only its last `finished_ids_kept` (100) ended ids: with 1,000 a 64-client soak
    (~45 episodes a minute each) grew the server ~0.45 MB/min for ~22 minutes (issue 13's soak)."""
    rt = BridgeRuntime(BridgeConfig())
    assert rt.config.finished_ids_kept == 100
    sid = rt.create_session(create_request(), False, client="c").session_id
    seq = 0
    for i in range(250):
        ids = [f"{i:04d}-episode-with-an-id-as-long-as-a-uuid"]
        seq += 1
        rt.handle("start_episode", pb.StartEpisodeRequest(header=header(sid, seq), episode_ids=ids), False,
                  client="c")
        seq += 1
        rt.handle("end_episode", pb.EndEpisodeRequest(header=header(sid, seq), episode_ids=ids), False, client="c")
    finished = rt.session(sid).finished
    assert len(finished) == 100 and next(iter(finished)).startswith("0150-")   # the last 100, oldest first
