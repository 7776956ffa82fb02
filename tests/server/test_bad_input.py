"""Bad input gets a clear error and loses nothing.

A wrong shape, dtype, NaN, unknown episode, oversized message or dead client
gets a precise gRPC status (INVALID_ARGUMENT, NOT_FOUND, ...), and the server,
the other simulators' episodes and the collected experience carry on untouched.

Every test runs against a real BridgeServer on 127.0.0.1 (port 0):

* malformed messages are crafted by hand with the generated stubs
  (`RawSim`), over unary RPCs and over one `Stream` (queue-fed request
  iterator; the error comes back in `StreamResponse.error` and the same
  stream must serve a valid request right after);
* a well-behaved `PolicyClient` (the `Witness`) runs one complete episode
  before the bad calls and keeps a second one open across them; at teardown
  it finishes that episode and checks that every transition it produced
  arrived in the experience intact (rows == steps - pending, same
  observations, actions and rewards).
"""
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.client.policy_client import PolicyClient
from simbridge.wire.errors import BridgeError
from simbridge.server.policies import RandomPolicy
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.service import BridgeServer
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OBS_SPACE = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)
POLICY = "default_policy"

SC = grpc.StatusCode
_CODES = {c.value[0]: c for c in grpc.StatusCode}
_UNARY = {"create_session": "CreateSession", "start_episode": "StartEpisode", "get_action": "GetAction",
          "log_action": "LogAction", "log_returns": "LogReturns", "end_episode": "EndEpisode",
          "close_session": "CloseSession"}

# ---------------------------------------------------------------- wire helpers


def obs(*values) -> np.ndarray:
    return np.asarray(values, np.float32)


def tensor(arr, dtype=None, shape=None, data=None) -> pb.Tensor:
    """A Tensor holding `arr`, with any field overridable to make it malformed."""
    t = tensors.to_tensor(np.asarray(arr))
    if dtype is not None:
        t.dtype = dtype
    if shape is not None:
        t.shape[:] = shape
    if data is not None:
        t.data = data
    return t


def value(t: pb.Tensor) -> pb.Value:
    return pb.Value(tensor=t)


def rows(eids, observations, aids=()) -> pb.AgentRows:
    """AgentRows with the observation tensor exactly as given (no client-side checks)."""
    if not isinstance(observations, pb.Tensor):
        observations = tensor(np.asarray(observations, np.float32))
    return pb.AgentRows(episode_ids=list(eids), agent_ids=list(aids), observations=value(observations))


def reward_rows(eids, rewards, aids=(), terminated=()) -> pb.RewardRows:
    if not isinstance(rewards, pb.Tensor):
        rewards = tensor(np.asarray(rewards, np.float32))
    return pb.RewardRows(episode_ids=list(eids), agent_ids=list(aids), rewards=rewards,
                         terminated=list(terminated))


def actions(a, dtype=np.int64) -> pb.Value:
    return value(tensor(np.asarray(a, dtype)))


def create_request(name: str) -> pb.CreateSessionRequest:
    return pb.CreateSessionRequest(client_name=name,
                                   observation_space=sb_spaces.space_to_proto(OBS_SPACE),
                                   action_space=sb_spaces.space_to_proto(ACT_SPACE))


def wrap(kind: str, msg) -> pb.StreamRequest:
    sr = pb.StreamRequest()
    getattr(sr, kind).CopyFrom(msg)
    return sr


class WireError(Exception):
    """An error answer: a unary call's status, a StreamResponse.error, or the stream's end."""

    def __init__(self, code: grpc.StatusCode, message: str, stream_ended: bool = False):
        super().__init__(f"{code.name}: {message}")
        self.code, self.message, self.stream_ended = code, message, stream_ended


class RawSim:
    """A simulator that speaks the wire protocol by hand, over unary RPCs or one Stream.

    It owns a training-disabled "probe" episode: `assert_serving()` asks for an
    action for it, which proves the session (and, on a stream, the stream)
    still works after a bad request.
    """

    def __init__(self, address: str, transport: str, multi: bool = False, name: str = "raw",
                 create: bool = True):
        self.transport, self.multi = transport, multi
        self.channel = grpc.insecure_channel(address)
        self.stub = (pb_grpc.ExternalMultiAgentEnvStub if multi else pb_grpc.ExternalEnvStub)(self.channel)
        self._q = None
        self._responses = None
        self.session_id = None
        if transport == "stream":
            self.open_stream()
        if not create:  # the test sends CreateSession itself
            return
        self.session_id = self.call("create_session", create_request(name)).session_id
        self.call("start_episode", pb.StartEpisodeRequest(episode_ids=["probe"], training_enabled=False))

    # -------------------------------------------------------------- transport

    def open_stream(self):
        if self._q is not None:
            self._q.put(None)
        self._q = queue.SimpleQueue()
        self._responses = self.stub.Stream(iter(self._q.get, None), timeout=60)

    def call(self, kind: str, msg):
        """The response payload, or WireError carrying the status code and message."""
        if self.transport == "unary":
            if kind != "create_session" and not msg.header.session_id:
                msg.header.session_id = self.session_id
            try:
                return getattr(self.stub, _UNARY[kind])(msg, timeout=10)
            except grpc.RpcError as e:
                raise WireError(e.code(), e.details() or "") from None
        self._q.put(wrap(kind, msg))
        try:
            resp = next(self._responses)
        except grpc.RpcError as e:  # the stream itself ended
            raise WireError(e.code(), e.details() or "", stream_ended=True) from None
        except StopIteration:
            raise WireError(SC.OK, "the server closed the stream", stream_ended=True) from None
        if resp.HasField("error"):
            assert resp.error.code != 0, resp
            assert resp.WhichOneof("payload") is None, f"an error answer carries a payload: {resp}"
            raise WireError(_CODES[resp.error.code], resp.error.message)
        assert resp.WhichOneof("payload") == kind, resp
        return getattr(resp, kind)

    def close(self):
        if self._q is not None:
            self._q.put(None)
        self.channel.close()

    # -------------------------------------------------------------- well-formed calls

    def _aids(self, n=1):
        return ["a%d" % i for i in range(n)] if self.multi else []

    def start(self, *eids, training=True):
        return self.call("start_episode", pb.StartEpisodeRequest(episode_ids=list(eids),
                                                                 training_enabled=training))

    def get_action(self, eid, o, aids=None):
        o = np.asarray(o, np.float32)
        resp = self.call("get_action", pb.GetActionRequest(
            rows=[rows([eid], o[None] if o.ndim == 1 else o, self._aids() if aids is None else aids)]))
        return tensors.from_tensor(resp.actions[0].actions.tensor)

    def log_returns(self, eid, r, aids=None):
        self.call("log_returns", pb.LogReturnsRequest(
            rows=[reward_rows([eid], np.atleast_1d(np.asarray(r, np.float32)),
                              self._aids() if aids is None else aids)]))

    def end(self, eid, final_obs=None):
        req = pb.EndEpisodeRequest(episode_ids=[eid])
        if final_obs is not None and not self.multi:
            req.final_observations.append(rows([eid], np.asarray(final_obs, np.float32)[None]))
        self.call("end_episode", req)

    def assert_serving(self):
        a = self.get_action("probe", obs(0, 0, 0, 0))
        assert a.shape == (1,) and ACT_SPACE.contains(int(a[0]))


def expect_error(sim: RawSim, kind: str, msg, code: grpc.StatusCode, *substrings: str) -> WireError:
    """Send a bad request: exact status code, meaningful message, and the session still serves."""
    with pytest.raises(WireError) as info:
        sim.call(kind, msg)
    err = info.value
    assert not err.stream_ended, f"the stream was torn down instead of answering: {err}"
    assert err.code == code, f"expected {code.name}, got {err.code.name}: {err.message}"
    for s in substrings:  # case-insensitive: "NaN" / "nan" both name the problem
        assert s.lower() in err.message.lower(), f"{s!r} not in error message {err.message!r}"
    sim.assert_serving()
    return err


# ---------------------------------------------------------------- runtime introspection


def _episode_state(ep):
    agents = tuple((aid, st.pending, st.reward_acc, st.reward_total, st.t, st.done, st.policy_id)
                   for aid, st in ep.agents.items())
    return ep.length, ep.total_reward, ep.training_enabled, agents


def session_state(rt: BridgeRuntime, sid: str):
    """Everything a request could change in a session (the probe episode aside)."""
    rt.settle_all()   # a streamed call's bookkeeping is applied just after its answer
    s = rt.session(sid)   # settled, and no other call of this session runs meanwhile
    eps = {eid: _episode_state(ep) for eid, ep in s.episodes.items() if eid != "probe"}
    return eps, dict(s.finished), s.last_seq, s.closed


def episode_summary(rt: BridgeRuntime, eid: str, sid: str = None) -> dict:
    rt.settle_all()
    found = [x for x in rt.metrics.recent
             if x["episode_id"] == eid and (sid is None or x["session_id"] == sid)]
    assert len(found) == 1, f"episode {eid!r}: {len(found)} summaries"
    return found[0]


def eps_index(rt: BridgeRuntime, eid: str, sid: str = None) -> int:
    rt.settle_all()
    for session_id in rt.session_ids() if sid is None else [sid]:
        try:
            s = rt.session(session_id)
        except BridgeError:   # closed meanwhile
            continue
        ep = s.episodes.get(eid)
        if ep is not None:
            return ep.index
    return episode_summary(rt, eid, sid)["eps_id"]


class Experience:
    """Everything the bridge delivered, kept across drains (tests and the witness share it)."""

    def __init__(self, rt: BridgeRuntime):
        self.rt = rt
        self.batches = []

    def drain(self):
        self.rt.flush()
        self.batches.extend(self.rt.experience.get_all())

    def rows(self, eps_id: int) -> dict:
        """The rows of one episode (eps_id column), sorted by t."""
        parts = []
        for mab in self.batches:
            for b in mab.policy_batches.values():
                m = np.asarray(b["eps_id"]) == eps_id
                if m.any():
                    parts.append({k: np.asarray(b[k])[m] for k in
                                  ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds",
                                   "t", "agent_index")})
        if not parts:
            return {"t": np.zeros(0, np.int64), "rewards": np.zeros(0, np.float32)}
        out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.lexsort((out["t"], out["agent_index"]))
        return {k: v[order] for k, v in out.items()}


# ---------------------------------------------------------------- the well-behaved simulator


class Witness:
    """A well-behaved PolicyClient (stream transport) next to the bad one.

    before(): one complete episode, and a second one left open with 3 steps.
    after():  checks what arrived so far (3 steps, 1 of them pending), runs 3
              more steps, ends the episode and checks every transition.
    """

    def __init__(self, bridge: "Bridge"):
        self.bridge = bridge
        self.client = PolicyClient(bridge.address, OBS_SPACE, ACT_SPACE, client_name="witness")
        self.sent = {}

    def _step(self, eid):
        steps = self.sent[eid]
        t = len(steps)
        o = (np.arange(4, dtype=np.float32) + np.float32(0.5) * t).astype(np.float32)
        a = self.client.get_action(eid, o)
        assert ACT_SPACE.contains(a)
        r = 0.25 * (t + 1) * (1 if eid.endswith("1") else -1)
        self.client.log_returns(eid, r)
        steps.append((o, a, r))

    def _end(self, eid):
        self.client.end_episode(eid, np.full(4, 9.0, np.float32))

    def before(self):
        for eid, n in (("witness-1", 4), ("witness-2", 3)):
            self.client.start_episode(eid)
            self.sent[eid] = []
            for _ in range(n):
                self._step(eid)
        self._end("witness-1")
        self.client.flush()

    def _check(self, eid, ended: bool):
        rt, exp = self.bridge.runtime, self.bridge.exp
        sent = self.sent[eid]
        got = exp.rows(eps_index(rt, eid, self.client.session_id))
        n = len(sent) if ended else len(sent) - 1  # an open episode's last action is pending
        assert len(got["t"]) == n, f"{eid}: {len(got['t'])} rows for {len(sent)} steps (ended={ended})"
        assert list(got["t"]) == list(range(n))
        np.testing.assert_array_equal(got["obs"], np.stack([o for o, _, _ in sent[:n]]))
        np.testing.assert_array_equal(got["actions"], np.asarray([a for _, a, _ in sent[:n]]))
        np.testing.assert_array_equal(got["rewards"], np.asarray([r for _, _, r in sent[:n]], np.float32))
        assert float(got["rewards"].sum()) == pytest.approx(sum(r for _, _, r in sent[:n]))
        nxt = [o for o, _, _ in sent[1:n]] + ([np.full(4, 9.0, np.float32)] if ended else [])
        if n:
            np.testing.assert_array_equal(got["new_obs"], np.stack(nxt) if ended else
                                          np.stack([o for o, _, _ in sent[1:n + 1]]))
            assert list(got["terminateds"]) == [False] * (n - 1) + [ended]
            assert not got["truncateds"].any()
        if ended:
            summary = episode_summary(rt, eid, self.client.session_id)
            assert summary["end_reason"] == "terminated"
            assert summary["length"] == len(sent)
            assert summary["total_reward"] == pytest.approx(sum(r for _, _, r in sent))

    def after(self):
        self.client.flush()  # raises if any witness call failed
        self.bridge.exp.drain()
        self._check("witness-1", ended=True)
        self._check("witness-2", ended=False)
        for _ in range(3):
            self._step("witness-2")
        self._end("witness-2")
        self.client.flush()
        self.bridge.exp.drain()
        self._check("witness-2", ended=True)
        self.client.close()


# ---------------------------------------------------------------- fixtures


class Bridge:
    def __init__(self, config: BridgeConfig, address: str = "127.0.0.1:0", **runtime_kwargs):
        self.runtime = BridgeRuntime(config, **runtime_kwargs)
        self.server = BridgeServer(self.runtime, address).start()
        self.address = self.server.address
        self.exp = Experience(self.runtime)
        self._sims = []
        self.witness = Witness(self)
        self.witness.before()

    def raw(self, transport: str, multi: bool = False, name: str = "raw", create: bool = True) -> RawSim:
        sim = RawSim(self.address, transport, multi, name, create)
        self._sims.append(sim)
        return sim

    def close(self):
        try:
            self.witness.after()
        finally:
            for sim in self._sims:
                sim.close()
            self.server.stop(0.5)


@pytest.fixture
def make_bridge(listen_address):
    made = []

    def make(policy_factory=None, **config) -> Bridge:
        b = Bridge(BridgeConfig(**config), listen_address(), policy_factory=policy_factory)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture
def bridge(make_bridge) -> Bridge:
    return make_bridge(max_message_bytes=1_000_000)


@pytest.fixture(params=["unary", "stream"])
def transport(request) -> str:
    return request.param


# ---------------------------------------------------------------- cases 1-8, 10a, 11 (single agent)
#
# Each case builds one bad request against a session holding:
#   "victim":   open, one action taken (obs V0, pending), reward 1.0 logged;
#   "finished": ended (one transition).
# The request must fail with the exact code and message, change nothing in
# the session, deliver no experience, and leave "victim" fully usable.

V0, V1, VF = obs(1, 2, 3, 4), obs(2, 3, 4, 5), obs(3, 4, 5, 6)
GOOD_ROWS = rows(["victim"], V1[None])


def _get(*r):
    return "get_action", pb.GetActionRequest(rows=list(r))


def _log_action(r, a):
    return "log_action", pb.LogActionRequest(rows=list(r), actions=list(a))


def _returns(*r):
    return "log_returns", pb.LogReturnsRequest(rows=list(r))


def _with_info(rows_msg, info: dict) -> pb.RewardRows:
    rows_msg.infos.add().update(info)
    return rows_msg


def _end(eids, finals=()):
    return "end_episode", pb.EndEpisodeRequest(episode_ids=list(eids), final_observations=list(finals))


def _start(*eids):
    return "start_episode", pb.StartEpisodeRequest(episode_ids=list(eids))


NAN_OBS = obs(1, np.nan, 3, 4)[None]

SINGLE_AGENT_CASES = {
    # 1. wrong shape
    "obs-shape-5-for-box-4": (_get(rows(["victim"], np.zeros((1, 5), np.float32))),
                              SC.INVALID_ARGUMENT, ["observations of rows 0", "shape (1, 5)", "expected (1, 4)"]),
    "obs-shape-no-row-dim": (_get(rows(["victim"], np.zeros(4, np.float32))),
                             SC.INVALID_ARGUMENT, ["shape (4,)", "expected (1, 4)"]),
    "obs-rows-vs-episode-ids": (_get(rows(["victim"], np.zeros((2, 4), np.float32))),
                                SC.INVALID_ARGUMENT, ["shape (2, 4)", "expected (1, 4)"]),
    "final-obs-shape": (_end(["victim"], [rows(["victim"], np.zeros((1, 5), np.float32))]),
                        SC.INVALID_ARGUMENT, ["final observations of rows 0", "shape (1, 5)"]),
    # 2. wrong dtype
    "obs-float64-for-float32-box": (_get(rows(["victim"], tensor(V1[None].astype(np.float64)))),
                                    SC.INVALID_ARGUMENT, ["dtype float64", "expected float32"]),
    "obs-dtype-unspecified": (_get(rows(["victim"], tensor(V1[None], dtype=pb.DTYPE_UNSPECIFIED))),
                              SC.INVALID_ARGUMENT, ["dtype DTYPE_UNSPECIFIED", "expected float32"]),
    "log-action-float-action": (_log_action([GOOD_ROWS], [actions([1.0], np.float32)]),
                                SC.INVALID_ARGUMENT, ["actions of rows 0", "dtype float32",
                                                      "expected an integer dtype"]),
    "rewards-int32": (_returns(reward_rows(["victim"], tensor(np.array([1], np.int32)))),
                      SC.INVALID_ARGUMENT, ["rewards of rows 0", "float32", "int32"]),
    # 3. NaN
    "obs-nan": (_get(rows(["victim"], NAN_OBS)), SC.INVALID_ARGUMENT, ["observations of rows 0", "NaN"]),
    "log-action-obs-nan": (_log_action([rows(["victim"], NAN_OBS)], [actions([1])]),
                           SC.INVALID_ARGUMENT, ["NaN"]),
    "final-obs-nan": (_end(["victim"], [rows(["victim"], NAN_OBS)]), SC.INVALID_ARGUMENT, ["NaN"]),
    "reward-nan": (_returns(reward_rows(["victim"], [np.nan])),
                   SC.INVALID_ARGUMENT, ["rewards of rows 0", "NaN"]),
    "reward-inf": (_returns(reward_rows(["victim"], [np.inf])),
                   SC.INVALID_ARGUMENT, ["rewards of rows 0", "inf"]),
    # 4. tensor bytes not matching shape
    "obs-bytes-short": (_get(rows(["victim"], tensor(V1[None], data=V1[:3].tobytes()))),
                        SC.INVALID_ARGUMENT, ["12 bytes", "(1, 4)", "needs 16"]),
    "obs-bytes-long": (_get(rows(["victim"], tensor(V1[None], data=V1.tobytes() + b"\0" * 4))),
                       SC.INVALID_ARGUMENT, ["20 bytes", "needs 16"]),
    "reward-bytes": (_returns(reward_rows(["victim"], tensor(np.float32([1]), data=b"\0\0"))),
                     SC.INVALID_ARGUMENT, ["2 bytes", "needs 4"]),
    "no-observations": (_get(pb.AgentRows(episode_ids=["victim"])), SC.INVALID_ARGUMENT, ["no observations"]),
    "no-rewards": (_returns(pb.RewardRows(episode_ids=["victim"])), SC.INVALID_ARGUMENT, ["no rewards"]),
    # infos are JSON: no NaN or Infinity (found by bench/fuzz.py: they failed later, as INTERNAL)
    "info-infinity": (_returns(_with_info(reward_rows(["victim"], [1.0]), {"speed": {"max": float("inf")}})),
                      SC.INVALID_ARGUMENT, ["info of row 0", "speed.max", "inf"]),
    # 5. action outside its space
    "log-action-5-for-discrete-2": (_log_action([GOOD_ROWS], [actions([5])]),
                                    SC.INVALID_ARGUMENT, ["actions of rows 0", "5 is outside Discrete(2)"]),
    "log-action-negative": (_log_action([GOOD_ROWS], [actions([-1])]),
                            SC.INVALID_ARGUMENT, ["-1 is outside Discrete(2)"]),
    "log-action-count": (_log_action([GOOD_ROWS], []), SC.INVALID_ARGUMENT, ["1 rows messages but 0 action"]),
    # 6. unknown episode
    "get-action-unknown-episode": (_get(rows(["nope"], V1[None])), SC.NOT_FOUND, ["unknown episode 'nope'"]),
    "log-returns-unknown-episode": (_returns(reward_rows(["nope"], [1.0])), SC.NOT_FOUND,
                                    ["unknown episode 'nope'"]),
    "end-unknown-episode": (_end(["nope"]), SC.NOT_FOUND, ["unknown episode 'nope'"]),
    # 7. after the end
    "action-after-end": (_get(rows(["finished"], V1[None])), SC.FAILED_PRECONDITION,
                         ["'finished'", "already ended"]),
    "log-action-after-end": (_log_action([rows(["finished"], V1[None])], [actions([0])]),
                             SC.FAILED_PRECONDITION, ["already ended"]),
    "reward-after-end": (_returns(reward_rows(["finished"], [1.0])), SC.FAILED_PRECONDITION,
                         ["already ended"]),
    "second-end-episode": (_end(["finished"]), SC.FAILED_PRECONDITION, ["'finished'", "already ended"]),
    # 8. duplicate episode ids
    "start-running-id": (_start("victim"), SC.ALREADY_EXISTS, ["'victim'", "already running"]),
    "start-ended-id": (_start("finished"), SC.ALREADY_EXISTS, ["'finished'", "already used"]),
    "start-new-and-running-id": (_start("fresh", "victim"), SC.ALREADY_EXISTS, ["already running"]),
    "start-repeated-id": (_start("fresh", "fresh"), SC.INVALID_ARGUMENT, ["repeat"]),
    # 10a. agent ids on the single-agent service
    "agent-ids-on-single-agent": (_get(rows(["victim"], V1[None], ["a0"])), SC.INVALID_ARGUMENT,
                                  ["ExternalEnv rows carry no agent ids"]),
    "done-flags-on-single-agent": (_returns(reward_rows(["victim"], [1.0], terminated=[True])),
                                   SC.INVALID_ARGUMENT, ["EndEpisode"]),
    # 11. valid first rows, invalid later rows: nothing applied
    "get-action-rows1-bad-shape": (_get(GOOD_ROWS, rows(["fresh2"], np.zeros((1, 5), np.float32))),
                                   SC.INVALID_ARGUMENT, ["observations of rows 1", "shape (1, 5)"]),
    "get-action-rows1-unknown-episode": (_get(GOOD_ROWS, rows(["nope"], V1[None])), SC.NOT_FOUND,
                                         ["unknown episode 'nope'"]),
    "get-action-same-episode-twice": (_get(GOOD_ROWS, rows(["victim"], V1[None])), SC.INVALID_ARGUMENT,
                                      ["appears twice"]),
    "log-action-rows1-out-of-space": (_log_action([GOOD_ROWS, rows(["probe"], V1[None])],
                                                  [actions([1]), actions([7])]),
                                      SC.INVALID_ARGUMENT, ["actions of rows 1", "7 is outside Discrete(2)"]),
    "log-returns-rows1-nan": (_returns(reward_rows(["victim"], [5.0]), reward_rows(["probe"], [np.nan])),
                              SC.INVALID_ARGUMENT, ["rewards of rows 1", "NaN"]),
    "log-returns-rows1-ended": (_returns(reward_rows(["victim"], [5.0]), reward_rows(["finished"], [1.0])),
                                SC.FAILED_PRECONDITION, ["already ended"]),
    "end-valid-and-unknown": (_end(["victim", "nope"]), SC.NOT_FOUND, ["unknown episode 'nope'"]),
    "end-valid-and-ended": (_end(["victim", "finished"]), SC.FAILED_PRECONDITION, ["already ended"]),
    # 11 with rewards attached to GetAction / LogAction / EndEpisode ("all or nothing")
    "get-action-attached-reward-nan": (
        ("get_action", pb.GetActionRequest(rows=[GOOD_ROWS], rewards=[reward_rows(["victim"], [np.nan])])),
        SC.INVALID_ARGUMENT, ["rewards of rows 0", "nan"]),
    "get-action-attached-reward-unknown-episode": (
        ("get_action", pb.GetActionRequest(rows=[GOOD_ROWS], rewards=[reward_rows(["victim"], [5.0]),
                                                                      reward_rows(["nope"], [1.0])])),
        SC.NOT_FOUND, ["unknown episode 'nope'"]),
    "get-action-valid-reward-bad-obs": (
        ("get_action", pb.GetActionRequest(rows=[rows(["victim"], NAN_OBS)],
                                           rewards=[reward_rows(["victim"], [5.0])])),
        SC.INVALID_ARGUMENT, ["observations of rows 0", "NaN"]),
    "log-action-attached-reward-ended": (
        ("log_action", pb.LogActionRequest(rows=[GOOD_ROWS], actions=[actions([1])],
                                           rewards=[reward_rows(["finished"], [1.0])])),
        SC.FAILED_PRECONDITION, ["'finished'", "already ended"]),
    "log-action-valid-reward-bad-action": (
        ("log_action", pb.LogActionRequest(rows=[GOOD_ROWS], actions=[actions([9])],
                                           rewards=[reward_rows(["victim"], [5.0])])),
        SC.INVALID_ARGUMENT, ["9 is outside Discrete(2)"]),
    "end-attached-reward-nan": (
        ("end_episode", pb.EndEpisodeRequest(episode_ids=["victim"], rewards=[reward_rows(["victim"], [np.nan])])),
        SC.INVALID_ARGUMENT, ["rewards of rows 0", "nan"]),
    "end-valid-reward-bad-final-obs": (
        ("end_episode", pb.EndEpisodeRequest(episode_ids=["victim"], rewards=[reward_rows(["victim"], [5.0])],
                                             final_observations=[rows(["victim"], NAN_OBS)])),
        SC.INVALID_ARGUMENT, ["final observations of rows 0", "NaN"]),
    # The contract's value rules: finite floats, FLOAT32 rewards, truncated ends with their final observation
    "obs-plus-inf": (_get(rows(["victim"], obs(1, np.inf, 3, 4)[None])), SC.INVALID_ARGUMENT,
                     ["observations of rows 0", "contains +Inf at row 0"]),
    "final-obs-minus-inf": (_end(["victim"], [rows(["victim"], obs(1, 2, -np.inf, 4)[None])]), SC.INVALID_ARGUMENT,
                            ["final observations of rows 0", "contains -Inf at row 0"]),
    "rewards-float64": (_returns(reward_rows(["victim"], tensor(np.array([1.0], np.float64)))),
                        SC.INVALID_ARGUMENT, ["rewards of rows 0", "float64", "expected float32"]),
    "end-truncated-without-final-obs": (
        ("end_episode", pb.EndEpisodeRequest(episode_ids=["victim"], truncated=[True])),
        SC.INVALID_ARGUMENT, ["episode 'victim' ends truncated without its final observation", "final_observations"]),
    "end-truncated-final-obs-of-the-other-episode-only": (
        ("end_episode", pb.EndEpisodeRequest(episode_ids=["victim", "probe"], truncated=[True],
                                             final_observations=[rows(["probe"], VF[None])])),
        SC.INVALID_ARGUMENT, ["episode 'victim' ends truncated"]),
    "end-final-obs-of-other-episode": (_end(["victim"], [rows(["victim"], VF[None]), rows(["probe"], VF[None])]),
                                       SC.INVALID_ARGUMENT, ["not among the episodes being ended"]),
}


@pytest.mark.parametrize("case", list(SINGLE_AGENT_CASES))
def test_bad_request_single_agent(bridge, transport, case):
    (kind, msg), code, substrings = SINGLE_AGENT_CASES[case]
    rt = bridge.runtime
    sim = bridge.raw(transport)
    sim.start("victim", "finished")
    a0 = sim.get_action("victim", V0)
    sim.log_returns("victim", 1.0)
    sim.get_action("finished", V1)
    sim.end("finished", VF)
    bridge.exp.drain()

    before = session_state(rt, sim.session_id)
    errors_before = rt.metrics.errors[code.name]
    req = type(msg)()
    req.CopyFrom(msg)
    expect_error(sim, kind, req, code, *substrings)

    # No effect: session, episodes and experience are exactly as before.
    assert session_state(rt, sim.session_id) == before
    assert rt.metrics.errors[code.name] == errors_before + 1
    bridge.exp.drain()
    victim = eps_index(rt, "victim", sim.session_id)
    assert len(bridge.exp.rows(victim)["t"]) == 0, "the bad request emitted the victim's pending transition"

    # ... and the victim episode carries on as if nothing happened.
    a1 = sim.get_action("victim", V1)
    sim.log_returns("victim", 2.0)
    sim.end("victim", VF)
    bridge.exp.drain()
    got = bridge.exp.rows(victim)
    assert list(got["t"]) == [0, 1]
    np.testing.assert_array_equal(got["rewards"], np.float32([1.0, 2.0]))
    np.testing.assert_array_equal(got["obs"], np.stack([V0, V1]))
    np.testing.assert_array_equal(got["new_obs"], np.stack([V1, VF]))
    np.testing.assert_array_equal(got["actions"], np.concatenate([a0, a1]))
    summary = episode_summary(rt, "victim", sim.session_id)
    assert (summary["length"], summary["total_reward"], summary["end_reason"]) == (2, 3.0, "terminated")
    assert len(bridge.exp.rows(eps_index(rt, "finished", sim.session_id))["t"]) == 1


# ---------------------------------------------------------------- case 11, multi-agent


MULTI_AGENT_CASES = {
    "get-action-rows1-bad-shape": (
        _get(rows(["m"], np.zeros((2, 4), np.float32), ["a", "b"]), rows(["m"], np.zeros((1, 5), np.float32), ["c"])),
        SC.INVALID_ARGUMENT, ["observations of rows 1", "shape (1, 5)", "expected (1, 4)"]),
    "get-action-rows1-nan": (
        _get(rows(["m"], np.zeros((2, 4), np.float32), ["a", "b"]), rows(["m"], NAN_OBS, ["c"])),
        SC.INVALID_ARGUMENT, ["observations of rows 1", "NaN"]),
    "get-action-rows1-unknown-episode": (
        _get(rows(["m"], np.zeros((2, 4), np.float32), ["a", "b"]), rows(["nope"], V1[None], ["c"])),
        SC.NOT_FOUND, ["unknown episode 'nope'"]),
    "get-action-no-agent-ids": (_get(rows(["m"], V1[None])), SC.INVALID_ARGUMENT, ["no agent ids"]),
    "get-action-all-agents-id": (_get(rows(["m"], V1[None], ["__all__"])), SC.INVALID_ARGUMENT,
                                 ["'__all__' is not an agent"]),
    "log-action-rows1-out-of-space": (
        _log_action([rows(["m"], np.zeros((2, 4), np.float32), ["a", "b"]), rows(["m"], V1[None], ["c"])],
                    [actions([0, 1]), actions([2])]),
        SC.INVALID_ARGUMENT, ["actions of rows 1", "2 is outside Discrete(2)"]),
    "log-returns-rows1-nan-after-done": (
        _returns(reward_rows(["m"], [5.0, 5.0], ["a", "__all__"], terminated=[True, True]),
                 reward_rows(["m"], [np.nan], ["b"])),
        SC.INVALID_ARGUMENT, ["rewards of rows 1", "NaN"]),
    "log-returns-flags-count": (
        _returns(reward_rows(["m"], [1.0, 1.0], ["a", "b"], terminated=[True])),
        SC.INVALID_ARGUMENT, ["1 flags for 2 rows"]),
    "get-action-attached-done-and-acting": (
        ("get_action", pb.GetActionRequest(rows=[rows(["m"], np.zeros((2, 4), np.float32), ["a", "b"])],
                                           rewards=[reward_rows(["m"], [5.0], ["a"], terminated=[True])])),
        SC.INVALID_ARGUMENT, ["'a'", "marked done by the attached rewards"]),
    "get-action-attached-all-done-and-acting": (
        ("get_action", pb.GetActionRequest(rows=[rows(["m"], np.zeros((1, 4), np.float32), ["a"])],
                                           rewards=[reward_rows(["m"], [5.0, 0.0], ["b", "__all__"],
                                                                terminated=[True, True])])),
        SC.INVALID_ARGUMENT, ["'__all__'", "marked done by the attached rewards"]),
    "end-attached-all-done": (
        ("end_episode", pb.EndEpisodeRequest(episode_ids=["m"], rewards=[
            reward_rows(["m"], [5.0, 0.0], ["a", "__all__"], terminated=[True, True])])),
        SC.INVALID_ARGUMENT, ["may not mark '__all__' done"]),
    "log-returns-truncated-without-final-obs": (
        _returns(pb.RewardRows(episode_ids=["m"], agent_ids=["a"], rewards=tensor(np.float32([1.0])), truncated=[True])),
        SC.INVALID_ARGUMENT, ["agent 'a' of episode 'm' is marked truncated without its final observation"]),
    "log-returns-all-truncated-with-pending-agents": (
        _returns(pb.RewardRows(episode_ids=["m"], agent_ids=["__all__"], rewards=tensor(np.float32([0.0])),
                               truncated=[True])),
        SC.INVALID_ARGUMENT, ["'__all__'", "['a', 'b']", "EndEpisode"]),
    "end-truncated-without-one-agents-final-obs": (
        ("end_episode", pb.EndEpisodeRequest(episode_ids=["m"], truncated=[True],
                                             final_observations=[rows(["m"], VF[None], ["a"])])),
        SC.INVALID_ARGUMENT, ["agents ['b']", "final_observations"]),
    "log-returns-rows1-unknown-episode": (
        _returns(reward_rows(["m"], [5.0], ["a"], terminated=[True]), reward_rows(["nope"], [1.0], ["b"])),
        SC.NOT_FOUND, ["unknown episode 'nope'"]),
}


@pytest.mark.parametrize("case", list(MULTI_AGENT_CASES))
def test_bad_request_multi_agent(bridge, transport, case):
    (kind, msg), code, substrings = MULTI_AGENT_CASES[case]
    rt = bridge.runtime
    sim = bridge.raw(transport, multi=True)
    sim.start("m")
    sim.get_action("m", np.stack([V0, V0]), aids=["a", "b"])
    sim.log_returns("m", [1.0, 1.0], aids=["a", "b"])
    bridge.exp.drain()

    before = session_state(rt, sim.session_id)
    req = type(msg)()
    req.CopyFrom(msg)
    expect_error(sim, kind, req, code, *substrings)
    assert session_state(rt, sim.session_id) == before, "part of the rejected request was applied"
    bridge.exp.drain()
    m = eps_index(rt, "m", sim.session_id)
    assert len(bridge.exp.rows(m)["t"]) == 0

    sim.get_action("m", np.stack([V1, V1]), aids=["a", "b"])
    sim.log_returns("m", [2.0, 3.0], aids=["a", "b"])
    sim.end("m")
    bridge.exp.drain()
    got = bridge.exp.rows(m)
    assert len(got["t"]) == 4
    np.testing.assert_array_equal(got["rewards"], np.float32([1, 2, 1, 3]))  # sorted by agent, then t
    summary = episode_summary(rt, "m", sim.session_id)
    assert (summary["length"], summary["total_reward"], summary["end_reason"]) == (2, 7.0, "terminated")


def test_reward_after_done_in_same_request(bridge, transport):
    """A reward for an agent that an earlier rows entry of the same request marks done is
    refused like the reverse order, not added to totals that never reach a transition."""
    rt = bridge.runtime
    sim = bridge.raw(transport, multi=True)
    sim.start("m")
    sim.get_action("m", np.stack([V0, V0]), aids=["a", "b"])
    before = session_state(rt, sim.session_id)
    req = pb.LogReturnsRequest(rows=[reward_rows(["m"], [1.0], ["a"], terminated=[True]),
                                     reward_rows(["m"], [5.0], ["a"])])
    with pytest.raises(WireError) as info:  # the reverse order is refused ("appears twice")
        sim.call("log_returns", req)
    assert info.value.code in (SC.INVALID_ARGUMENT, SC.FAILED_PRECONDITION), info.value
    assert "'a'" in info.value.message
    assert session_state(rt, sim.session_id) == before


# ---------------------------------------------------------------- 11: episodes ending during a forward pass


class GatedPolicy(RandomPolicy):
    """Blocks a forward pass over an observation whose first value is GATE until released."""
    GATE = 7.0

    def __init__(self, observation_space, action_space):
        super().__init__(observation_space, action_space)
        self.entered = threading.Event()
        self.release = threading.Event()

    def compute_actions(self, obs_batch):
        if np.any(np.asarray(obs_batch)[:, 0] == self.GATE):
            self.entered.set()
            assert self.release.wait(10)
        return super().compute_actions(obs_batch)


def _call_in_thread(sim, kind, msg):
    out = {}

    def run():
        try:
            out["result"] = sim.call(kind, msg)
        except WireError as e:
            out["result"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _end_during_forward_pass(make_bridge, request, end_eid):
    b = make_bridge(policy_factory=lambda pid, o, a: GatedPolicy(o, a))
    rt = b.runtime
    gate = rt.policy(POLICY)  # created for the witness
    sim = b.raw("unary")
    sim.start("x", "y")
    sim.get_action("y", V0)
    before_x = session_state(rt, sim.session_id)[0]["x"]
    t, out = _call_in_thread(sim, *request)
    try:
        assert gate.entered.wait(10)
        sim.end(end_eid, VF)  # meanwhile, on the same session
    finally:
        gate.release.set()
        t.join(10)
    return b, sim, out["result"], before_x


def test_acting_episode_ends_during_forward_pass(make_bridge):
    gated = obs(GatedPolicy.GATE, 0, 0, 0)[None]
    b, sim, res, _ = _end_during_forward_pass(
        make_bridge, ("get_action", pb.GetActionRequest(rows=[rows(["y"], gated)])), "y")
    assert isinstance(res, WireError) and res.code == SC.FAILED_PRECONDITION, res
    assert "'y'" in res.message and "ended while" in res.message and "being computed" in res.message
    b.exp.drain()
    summary = episode_summary(b.runtime, "y", sim.session_id)
    assert summary["length"] == 1
    assert len(b.exp.rows(summary["eps_id"])["t"]) == 1


def test_rewarded_episode_ends_during_forward_pass(make_bridge):
    """Rewards attached to GetAction go to an episode that ends during the forward pass:
    the call fails and applies nothing, rather than succeeding with the reward lost."""
    gated = obs(GatedPolicy.GATE, 0, 0, 0)[None]
    req = pb.GetActionRequest(rows=[rows(["x"], gated)], rewards=[reward_rows(["y"], [5.0])])
    b, sim, res, before_x = _end_during_forward_pass(make_bridge, ("get_action", req), "y")
    summary = episode_summary(b.runtime, "y", sim.session_id)
    b.exp.drain()
    y_rewards = b.exp.rows(summary["eps_id"])["rewards"]
    # Either the reward was applied before "y" ended, or the call failed and nothing was applied.
    if not isinstance(res, WireError):
        assert float(y_rewards.sum()) == 5.0 and summary["total_reward"] == 5.0, (
            f"GetAction succeeded but its attached reward 5.0 is lost: y's experience rewards "
            f"{list(y_rewards)}, summary total {summary['total_reward']}")
        return
    assert res.code == SC.FAILED_PRECONDITION and "'y'" in res.message
    assert session_state(b.runtime, sim.session_id)[0]["x"] == before_x


# ---------------------------------------------------------------- case 6: unknown session


def test_unknown_session_unary(bridge):
    sim = bridge.raw("unary")
    sim.start("e")
    req = pb.GetActionRequest(rows=[rows(["e"], V0[None])])
    req.header.session_id = "no-such-session"
    expect_error(sim, "get_action", req, SC.NOT_FOUND, "unknown session 'no-such-session'")
    # No session id at all.
    stub = pb_grpc.ExternalEnvStub(sim.channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.StartEpisode(pb.StartEpisodeRequest(), timeout=10)
    assert info.value.code() == SC.INVALID_ARGUMENT and "no session_id" in info.value.details()
    # A closed session is unknown from then on; its episode was ended as truncated.
    other = bridge.raw("unary", name="closer")
    other.start("x")
    other.get_action("x", V0)
    other.call("close_session", pb.CloseSessionRequest())
    with pytest.raises(WireError) as info:
        other.get_action("x", V1)
    assert info.value.code == SC.NOT_FOUND and "unknown session" in info.value.message
    assert episode_summary(bridge.runtime, "x", other.session_id)["end_reason"] == "session_closed"
    sim.assert_serving()
    assert sim.get_action("e", V0).shape == (1,)


def test_unknown_session_stream(bridge, net):
    """A stream is bound to its session: naming another one is an argument error, not a switch."""
    sim = bridge.raw("stream")
    sim.start("e")
    req = pb.GetActionRequest(rows=[rows(["e"], V0[None])])
    req.header.session_id = "no-such-session"
    expect_error(sim, "get_action", req, SC.INVALID_ARGUMENT, "bound to session", "'no-such-session'")
    # Even a live session of this service cannot be used through someone else's stream.
    other = bridge.raw("unary", name="other")
    other.start("theirs")
    req = pb.GetActionRequest(rows=[rows(["theirs"], V0[None])])
    req.header.session_id = other.session_id
    expect_error(sim, "get_action", req, SC.INVALID_ARGUMENT, "bound to session")
    assert session_state(bridge.runtime, other.session_id)[0]["theirs"][0] == 0
    assert sim.get_action("e", V0).shape == (1,)


def test_stream_protocol_errors_keep_the_stream_open(bridge, net):
    rt = bridge.runtime
    channel = grpc.insecure_channel(bridge.address)
    stub = pb_grpc.ExternalEnvStub(channel)
    q = queue.SimpleQueue()
    responses = stub.Stream(iter(q.get, None), timeout=30)

    def ask(req):
        q.put(req)
        return next(responses)

    try:
        r = ask(pb.StreamRequest(start_episode=pb.StartEpisodeRequest()))
        assert _CODES[r.error.code] == SC.FAILED_PRECONDITION and "create_session first" in r.error.message
        r = ask(pb.StreamRequest())
        assert _CODES[r.error.code] == SC.INVALID_ARGUMENT and "empty stream request" in r.error.message
        bad = create_request("bad")
        bad.ClearField("action_space")
        r = ask(pb.StreamRequest(create_session=bad))
        assert _CODES[r.error.code] == SC.INVALID_ARGUMENT and "action_space" in r.error.message
        bad = create_request("bad")
        bad.observation_space.box.low.dtype = 99
        r = ask(pb.StreamRequest(create_session=bad))
        assert _CODES[r.error.code] == SC.INVALID_ARGUMENT and "unknown tensor dtype 99" in r.error.message
        bad = create_request("bad")
        bad.agents.add(agent_id="x")
        r = ask(pb.StreamRequest(create_session=bad))
        assert _CODES[r.error.code] == SC.INVALID_ARGUMENT and "ExternalMultiAgentEnv" in r.error.message
        n_sessions = rt.snapshot()["sessions"]
        r = ask(pb.StreamRequest(create_session=create_request("good")))
        assert not r.HasField("error") and r.create_session.session_id
        assert rt.snapshot()["sessions"] == n_sessions + 1
        r = ask(pb.StreamRequest(create_session=create_request("again")))
        assert _CODES[r.error.code] == SC.FAILED_PRECONDITION and "already has a session" in r.error.message
        assert rt.snapshot()["sessions"] == n_sessions + 1
        r = ask(pb.StreamRequest(start_episode=pb.StartEpisodeRequest(episode_ids=["s"])))
        assert not r.HasField("error")
        r = ask(pb.StreamRequest(get_action=pb.GetActionRequest(rows=[rows(["s"], V0[None])])))
        assert not r.HasField("error") and r.get_action.actions[0].policy_ids == [POLICY]
    finally:
        q.put(None)
        channel.close()


# ---------------------------------------------------------------- case 9: oversized message


def _oversized_get_action(eid="victim") -> pb.GetActionRequest:
    return pb.GetActionRequest(rows=[rows([eid], np.zeros((1, 500_000), np.float32))])  # 2 MB


def test_oversized_message_unary(bridge):
    rt = bridge.runtime
    sim = bridge.raw("unary")
    sim.start("victim")
    sim.get_action("victim", V0)
    before = session_state(rt, sim.session_id)
    expect_error(sim, "get_action", _oversized_get_action(), SC.RESOURCE_EXHAUSTED,
                 "larger than max", "1000000")
    assert session_state(rt, sim.session_id) == before
    sim.get_action("victim", V1)
    sim.end("victim", VF)
    bridge.exp.drain()
    assert len(bridge.exp.rows(eps_index(rt, "victim", sim.session_id))["t"]) == 2


def test_oversized_message_stream(bridge, net):
    """gRPC's own limit ends the stream (it cannot answer in-band); nothing is lost:
    the session is kept for reconnect_grace_s and a new stream resumes it."""
    rt = bridge.runtime
    sim = bridge.raw("stream")
    sim.start("victim")
    a0 = sim.get_action("victim", V0)
    sim.log_returns("victim", 1.0)
    before = session_state(rt, sim.session_id)
    with pytest.raises(WireError) as info:
        sim.call("get_action", _oversized_get_action())
    assert info.value.stream_ended and info.value.code == SC.RESOURCE_EXHAUSTED
    assert "larger than max" in info.value.message
    # The server still serves other calls and other sessions.
    fresh = bridge.raw("stream", name="fresh")
    fresh.assert_serving()
    # The same session resumes on a new stream, state untouched.
    assert session_state(rt, sim.session_id) == before
    sim.open_stream()
    req = create_request("resumed")
    req.resume_session_id = sim.session_id
    resp = sim.call("create_session", req)
    assert resp.resumed and resp.session_id == sim.session_id
    assert resp.limits.max_message_bytes == 1_000_000
    sim.assert_serving()
    a1 = sim.get_action("victim", V1)
    sim.end("victim", VF)
    bridge.exp.drain()
    got = bridge.exp.rows(eps_index(rt, "victim", sim.session_id))
    np.testing.assert_array_equal(got["rewards"], np.float32([1.0, 0.0]))
    np.testing.assert_array_equal(got["actions"], np.concatenate([a0, a1]))


def _bounded_call(client: PolicyClient, fn, seconds: float = 3.0):
    """Run fn() on a thread; returns (finished, reconnects, result or exception).

    A client stuck in a reconnect-and-resend loop is stopped by closing its
    channel (its next reconnect then raises), so the test fails instead of hanging."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fn()
        except Exception as e:
            outcome["result"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    finished = not t.is_alive()
    reconnects = client._conn.reconnects
    if not finished:
        client._conn._channel.close()
        t.join(10)
    return finished, reconnects, outcome.get("result")


@pytest.mark.parametrize("client_transport", ["unary", "stream"])
@pytest.mark.nets("tcp", "uds", "shm")
def test_oversized_observation_through_policy_client(bridge, client_transport, net):
    """The PolicyClient must surface RESOURCE_EXHAUSTED, not resend the request in a loop
    (stream transport used to resume and resend it forever), and keep its episode."""
    rt = bridge.runtime
    client = PolicyClient(bridge.address, OBS_SPACE, ACT_SPACE, transport=client_transport,
                          client_name="oversized", reconnect_timeout_s=5)
    eid = client.start_episode("big")
    client.get_action(eid, V0)
    finished, reconnects, err = _bounded_call(client, lambda: client.get_action(eid, np.zeros(500_000, np.float32)))
    assert finished, f"get_action still running after 3 s ({reconnects} reconnects and resends)"
    assert isinstance(err, BridgeError), err
    assert err.code == SC.RESOURCE_EXHAUSTED and "1000000" in err.message, err
    assert reconnects == 0
    # The episode survives: the next, valid step works and is recorded.
    client.get_action(eid, V1)
    client.end_episode(eid, VF)
    client.flush()
    bridge.exp.drain()
    got = bridge.exp.rows(eps_index(rt, "big", client.session_id))
    np.testing.assert_array_equal(got["obs"], np.stack([V0, V1]))
    client.close()


@pytest.mark.parametrize("client_transport", ["unary", "stream"])
@pytest.mark.parametrize("bad_obs,substrings", [
    (np.zeros(5, np.float32), ["shape (1, 5)", "expected (1, 4)"]),
    (V1.astype(np.float64), ["dtype float64", "expected float32"]),
    (obs(1, np.nan, 3, 4), ["NaN"]),
], ids=["shape", "float64", "nan"])
@pytest.mark.nets("tcp", "uds", "shm")
def test_policy_client_bad_observation_keeps_queued_reward(bridge, client_transport, bad_obs, substrings, net):
    """Through PolicyClient: the error names the problem, and the reward queued for the
    failed request (rewards ride on the next get_action) is still logged."""
    rt = bridge.runtime
    client = PolicyClient(bridge.address, OBS_SPACE, ACT_SPACE, transport=client_transport, client_name="sloppy")
    eid = client.start_episode("sloppy")
    client.get_action(eid, V0)
    client.log_returns(eid, 1.0)
    with pytest.raises(BridgeError) as info:
        client.get_action(eid, bad_obs)
    assert info.value.code == SC.INVALID_ARGUMENT
    for sub in substrings:
        assert sub in info.value.message
    client.get_action(eid, V1)
    client.log_returns(eid, 2.0)
    client.end_episode(eid, VF)
    client.flush()
    bridge.exp.drain()
    got = bridge.exp.rows(eps_index(rt, eid, client.session_id))
    np.testing.assert_array_equal(got["rewards"], np.float32([1.0, 2.0]))
    np.testing.assert_array_equal(got["obs"], np.stack([V0, V1]))
    client.close()


@pytest.mark.parametrize("client_transport", ["unary", "stream"])
@pytest.mark.nets("tcp", "uds", "shm")
def test_coalesced_reward_survives_oversized_request(bridge, client_transport, net):
    """log_returns queues its reward for the next request; when that request is refused
    for its size, the reward must still be logged (as the client does for server errors)."""
    rt = bridge.runtime
    client = PolicyClient(bridge.address, OBS_SPACE, ACT_SPACE, transport=client_transport,
                          client_name="oversized")
    eid = client.start_episode("big")
    client.get_action(eid, V0)
    client.log_returns(eid, 1.0)
    with pytest.raises(BridgeError) as info:
        client.get_action(eid, np.zeros(500_000, np.float32))
    assert info.value.code == SC.RESOURCE_EXHAUSTED
    client.get_action(eid, V1)
    client.end_episode(eid, VF)
    client.flush()
    bridge.exp.drain()
    got = bridge.exp.rows(eps_index(rt, "big", client.session_id))
    np.testing.assert_array_equal(got["rewards"], np.float32([1.0, 0.0]))
    assert episode_summary(rt, "big", client.session_id)["total_reward"] == 1.0
    client.close()


def _request_at_the_edge(limit: int):
    """(episode id, observation) such that PolicyClient's GetActionRequest carrying one
    coalesced reward row is within `limit` bytes as the client measures it (before
    numbering it), but over it once the header (seq, session id) and, on a stream, the
    StreamRequest framing are added: the server's own gRPC limit has to answer."""
    def build(eid, k):
        return pb.GetActionRequest(rows=[rows([eid], np.zeros((1, k), np.float32))],
                                   rewards=[reward_rows([eid], [1.0])])
    for k in range((limit - 60) // 4, (limit - 60) // 4 - 40, -1):
        for n in range(1, 120):
            req = build("e" * n, k)
            if limit - 2 <= req.ByteSize() <= limit:
                req.header.seq = 3
                assert req.ByteSize() > limit and wrap("get_action", req).ByteSize() > limit
                return "e" * n, np.zeros(k, np.float32)
    raise AssertionError("no request size hits the edge")


@pytest.mark.parametrize("client_transport", ["unary", "stream"])
@pytest.mark.nets("tcp", "uds", "shm")
def test_request_just_over_the_limit_through_policy_client(bridge, client_transport, net):
    """Right at the edge the server's own gRPC limit answers (on a stream it ends the
    stream): the client still reports RESOURCE_EXHAUSTED promptly and carries on."""
    rt = bridge.runtime
    eid, big = _request_at_the_edge(1_000_000)
    client = PolicyClient(bridge.address, OBS_SPACE, ACT_SPACE, transport=client_transport,
                          client_name="edge", reconnect_timeout_s=5)
    client.start_episode(eid)
    a0 = client.get_action(eid, V0)
    client.log_returns(eid, 1.0)
    finished, reconnects, err = _bounded_call(client, lambda: client.get_action(eid, big))
    assert finished, f"get_action still running after 3 s ({reconnects} reconnects and resends)"
    assert isinstance(err, BridgeError), err
    assert err.code == SC.RESOURCE_EXHAUSTED and "1000000" in err.message, err
    # Nothing lost: the episode goes on in the same session, the reward logged before counts.
    a1 = client.get_action(eid, V1)
    client.log_returns(eid, 2.0)
    client.end_episode(eid, VF)
    client.flush()
    bridge.exp.drain()
    got = bridge.exp.rows(eps_index(rt, eid, client.session_id))
    np.testing.assert_array_equal(got["rewards"], np.float32([1.0, 2.0]))
    np.testing.assert_array_equal(got["obs"], np.stack([V0, V1]))
    assert [int(a) for a in got["actions"]] == [a0, a1]
    assert episode_summary(rt, eid, client.session_id)["end_reason"] == "terminated"
    client.close()


# ---------------------------------------------------------------- case 10b: wrong service


def test_session_on_wrong_service_unary(bridge):
    rt = bridge.runtime
    single = bridge.raw("unary", name="single")
    single.start("s")
    multi = bridge.raw("unary", multi=True, name="multi")
    multi.start("m")
    multi_stub = pb_grpc.ExternalMultiAgentEnvStub(single.channel)
    single_stub = pb_grpc.ExternalEnvStub(single.channel)
    before = session_state(rt, single.session_id), session_state(rt, multi.session_id)
    for stub, sid, eid, aids, owner in ((multi_stub, single.session_id, "s", ["a"], "ExternalEnv"),
                                        (single_stub, multi.session_id, "m", [], "ExternalMultiAgentEnv")):
        for method, req in (("GetAction", pb.GetActionRequest(rows=[rows([eid], V0[None], aids)])),
                            ("StartEpisode", pb.StartEpisodeRequest(episode_ids=["new"])),
                            ("EndEpisode", pb.EndEpisodeRequest(episode_ids=[eid])),
                            ("CloseSession", pb.CloseSessionRequest())):
            req.header.session_id = sid
            with pytest.raises(grpc.RpcError) as info:
                getattr(stub, method)(req, timeout=10)
            assert info.value.code() == SC.FAILED_PRECONDITION, (method, info.value)
            assert f"was created on {owner}" in info.value.details()
    assert (session_state(rt, single.session_id), session_state(rt, multi.session_id)) == before
    single.assert_serving()
    multi.assert_serving()


def test_session_created_on_stream_used_on_wrong_service(bridge):
    rt = bridge.runtime
    single = bridge.raw("stream", name="single")
    single.start("s")
    before = session_state(rt, single.session_id)
    req = pb.GetActionRequest(rows=[rows(["s"], V0[None], ["a"])])
    req.header.session_id = single.session_id
    with pytest.raises(grpc.RpcError) as info:
        pb_grpc.ExternalMultiAgentEnvStub(single.channel).GetAction(req, timeout=10)
    assert info.value.code() == SC.FAILED_PRECONDITION and "was created on ExternalEnv" in info.value.details()
    assert session_state(rt, single.session_id) == before
    single.assert_serving()


def test_resume_session_on_wrong_service(bridge, transport):
    """Resuming a live session through the other service is refused, not turned into a new session."""
    rt = bridge.runtime
    single = bridge.raw("stream", name="single")
    single.start("s")
    n_sessions = rt.snapshot()["sessions"]
    multi = bridge.raw(transport, multi=True, create=False)
    req = create_request("multi-resume")
    req.resume_session_id = single.session_id
    with pytest.raises(WireError) as info:
        multi.call("create_session", req)
    assert info.value.code == SC.FAILED_PRECONDITION
    assert "ExternalEnv" in info.value.message and not info.value.stream_ended
    assert rt.snapshot()["sessions"] == n_sessions
    single.assert_serving()
    # The multi-agent client can still open its own session (on the same stream).
    assert multi.call("create_session", create_request("multi")).session_id
    assert rt.snapshot()["sessions"] == n_sessions + 1


# ---------------------------------------------------------------- case 12: a client process dies


DYING_CLIENT = r"""
import os, sys, time
import numpy as np, gymnasium as gym
from simbridge.client.policy_client import PolicyClient
client = PolicyClient(sys.argv[1], gym.spaces.Box(-10.0, 10.0, (4,), np.float32), gym.spaces.Discrete(2),
                      transport="stream", client_name="doomed")
eid = client.start_episode("doomed")
for t in range(3):
    client.get_action(eid, np.full(4, t, np.float32))
    client.log_returns(eid, float(t + 1))
client.flush()  # the server has applied everything
print("ready", flush=True)
if sys.argv[2] == "exit":
    os._exit(1)
time.sleep(60)
"""


@pytest.mark.parametrize("death", ["os._exit", "SIGKILL"])
@pytest.mark.nets("tcp", "uds", "shm")
def test_client_process_dies_mid_episode(make_bridge, death, net):
    b = make_bridge(reconnect_grace_s=0.5)
    rt = b.runtime
    open_before = rt.snapshot()["open_episodes"]  # the witness's open episode
    proc = subprocess.Popen([sys.executable, "-c", DYING_CLIENT, b.address,
                             "exit" if death == "os._exit" else "sleep"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert rt.snapshot()["open_episodes"] == open_before + 1
        if death == "SIGKILL":
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    t0 = time.monotonic()
    while rt.snapshot()["open_episodes"] > open_before and time.monotonic() - t0 < 6:
        time.sleep(0.05)
    assert rt.snapshot()["open_episodes"] == open_before, "the dead client's episode was never ended"
    summary = episode_summary(rt, "doomed")
    assert summary["end_reason"] == "client_lost"
    assert (summary["length"], summary["total_reward"]) == (3, 6.0)
    # Its completed transitions are delivered; the last action, whose outcome
    # was never observed, is dropped.
    b.exp.drain()
    got = b.exp.rows(summary["eps_id"])
    assert list(got["t"]) == [0, 1]
    np.testing.assert_array_equal(got["rewards"], np.float32([1.0, 2.0]))
    np.testing.assert_array_equal(got["obs"], np.stack([np.full(4, t, np.float32) for t in (0, 1)]))
    np.testing.assert_array_equal(got["new_obs"], np.stack([np.full(4, t, np.float32) for t in (1, 2)]))
    assert not got["terminateds"].any() and not got["truncateds"].any()


# ---------------------------------------------------------------- idle unary session


def test_unary_session_idle_timeout(make_bridge):
    b = make_bridge(session_timeout_s=0.5)
    rt = b.runtime
    sim = b.raw("unary", name="idle")
    sim.start("idle-ep")
    for t, r in enumerate((1.0, 2.0)):
        sim.get_action("idle-ep", obs(t, t, t, t))
        sim.log_returns("idle-ep", r)
    t0 = time.monotonic()
    while sim.session_id in rt.session_ids() and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    with pytest.raises(WireError) as info:
        sim.get_action("idle-ep", V1)
    assert info.value.code == SC.NOT_FOUND
    assert "unknown session" in info.value.message and sim.session_id in info.value.message
    summary = episode_summary(rt, "idle-ep", sim.session_id)
    assert summary["end_reason"] == "client_lost" and summary["length"] == 2
    b.exp.drain()
    np.testing.assert_array_equal(b.exp.rows(summary["eps_id"])["rewards"], np.float32([1.0]))
    # The witness's stream session sat idle just as long and is untouched (checked at teardown);
    # a new unary session works.
    b.raw("unary", name="next").assert_serving()


# ---------------------------------------------------------------- answered, not yet recorded
# A streamed GetAction is answered before its bookkeeping is applied (runtime.settle). Whatever
# comes next must find it applied, never lost: the session's next call, a close, a snapshot.
# These drive the runtime directly with bound=session (the stream's path) to hold that window open.


def _answered_not_settled(rt: BridgeRuntime):
    s = rt.session(rt.create_session(create_request("window"), False).session_id, False)
    rt.handle("start_episode", pb.StartEpisodeRequest(episode_ids=["w"]), False, bound=s)
    rt.handle("get_action", pb.GetActionRequest(rows=[rows(["w"], V0[None])]), False, bound=s)
    rt.handle("get_action", pb.GetActionRequest(rows=[rows(["w"], V1[None])],
                                                rewards=[reward_rows(["w"], [5.0])]), False, bound=s)
    assert s.pending is not None   # the window this section is about
    return s


def test_the_next_call_finds_an_answered_get_action_applied(make_bridge):
    rt = make_bridge().runtime
    s = _answered_not_settled(rt)
    rt.handle("log_returns", pb.LogReturnsRequest(rows=[reward_rows(["w"], [2.0])]), False, bound=s)
    rt.handle("end_episode", pb.EndEpisodeRequest(episode_ids=["w"]), False, bound=s)
    summary = episode_summary(rt, "w", s.session_id)
    assert (summary["length"], summary["total_reward"]) == (2, 7.0)


def test_closing_a_session_applies_its_answered_get_action(make_bridge):
    b = make_bridge()
    rt = b.runtime
    s = _answered_not_settled(rt)
    rt.close_session(s, reason="client_lost")
    summary = episode_summary(rt, "w", s.session_id)
    # The attached reward completed the first transition; the second action's outcome never came.
    assert (summary["length"], summary["total_reward"]) == (2, 5.0)
    b.exp.drain()
    got = b.exp.rows(summary["eps_id"])
    assert got["t"].tolist() == [0] and got["rewards"].tolist() == [5.0]


def test_a_snapshot_counts_an_answered_get_action(make_bridge):
    rt = make_bridge().runtime
    before = rt.snapshot()["agent_steps"]
    _answered_not_settled(rt)
    assert rt.snapshot()["agent_steps"] == before + 2
