"""Frame stacking on the bridge (server/frame_stack.py): what the policy sees and what the batches
hold, exactly, on every intake path, over real servers on loopback."""
import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.client.local_client import LocalPolicyClient
from simbridge.client.policy_client import MultiAgentPolicyClient, PolicyClient
from simbridge.client.slot_client import SlotClient
from simbridge.server.frame_stack import Stacker, stack_problem
from simbridge.server.policies import ActionBatch, Policy
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.wire.errors import BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb
from support.experience import TRANSPORTS, collected
from support.raw import Raw, header

VEC = gym.spaces.Box(-1000.0, 1000.0, (2,), np.float32)    # frame x: [x, x + 0.5]
CHW = gym.spaces.Box(0, 255, (1, 4, 4), np.uint8)          # frame x: every pixel x
HWC = gym.spaces.Box(0, 255, (10, 10, 2), np.uint8)         # frame x: channels x and x + 100
ACT = gym.spaces.Discrete(3)


def vec(x):
    return np.array([x, x + 0.5], np.float32)


def chw(x):
    return np.full((1, 4, 4), x, np.uint8)


def hwc(x):
    f = np.empty((10, 10, 2), np.uint8)
    f[..., 0], f[..., 1] = x, x + 100
    return f


def frames_of(stack, space=VEC):
    """The frames a stacked observation holds, oldest first, each read back as its x."""
    s = np.asarray(stack)
    if space is VEC:
        return s.reshape(-1, 2)[:, 0].tolist()
    if space is CHW:
        return s[:, 0, 0].tolist()
    return s[0, 0, 0::2].tolist()   # HWC: channel pairs, frame after frame


class Recorder(Policy):
    """Answers `action` for every row and keeps every batch of observations it was asked about."""

    def __init__(self, obs_space, act_space, action=0):
        super().__init__(obs_space, act_space)
        self.action, self.seen = action, []

    def compute_actions(self, obs_batch, explore=True):
        self.seen.append(np.array(obs_batch))
        return ActionBatch(np.full(len(obs_batch), self.action, np.int64))


def runtime(stacks, mapping=None, actions=None):
    actions = actions or {}
    return BridgeRuntime(BridgeConfig(), policy_mapping_fn=mapping,
                         policy_factory=lambda pid, o, a: Recorder(o, a, actions.get(pid, 0)),
                         frame_stacks=stacks)


def by_episode(batch, space=VEC):
    """{(eps_id, agent_index): [(obs frames, new_obs frames), ...] in t order} of one policy's rows."""
    out = {}
    for i in np.lexsort((batch["t"], batch["agent_index"], batch["eps_id"])):
        key = (int(batch["eps_id"][i]), int(batch["agent_index"][i]))
        out.setdefault(key, []).append((frames_of(batch["obs"][i], space), frames_of(batch["new_obs"][i], space)))
    return out


# ---------------------------------------------------------------- spaces

def test_stacked_spaces_keep_dtype_bounds_and_the_encoders_layout():
    s = Stacker(CHW, 3).space
    assert s.shape == (3, 4, 4) and s.dtype == np.uint8 and s.high.max() == 255
    assert Stacker(HWC, 3).space.shape == (10, 10, 6)
    flat = Stacker(gym.spaces.Box(np.array([-1, 0], np.float32), np.array([1, 5], np.float32)), 3).space
    assert flat.shape == (6,)
    np.testing.assert_array_equal(flat.low, [-1, 0] * 3)
    np.testing.assert_array_equal(flat.high, [1, 5] * 3)
    for space in (gym.spaces.Discrete(4), gym.spaces.Dict({"a": VEC}), gym.spaces.Box(0, 1, (3, 3))):
        assert "frame_stack = 1" in stack_problem(space, 2)
    # 3x5x5 CHW frames twice would be 6x5x5, which the encoders read as HWC: refused, not misread
    assert "lower frame_stack" in stack_problem(gym.spaces.Box(0, 255, (3, 5, 5), np.uint8), 2)
    assert stack_problem(gym.spaces.Box(0, 255, (3, 5, 5), np.uint8), 1) is None


# ---------------------------------------------------------------- row calls

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rows_stack_per_episode_from_the_first_frame(make_server, transport):
    rt = runtime({"default_policy": 3})
    srv = make_server(rt)
    c = PolicyClient(srv.address, VEC, ACT, transport=transport)
    a, b = c.start_episode(), c.start_episode()
    c.get_action(a, vec(1))
    c.get_action(b, vec(10))
    c.get_action(a, vec(2))
    c.get_action(a, vec(3))
    c.get_action(b, vec(11))
    c.get_action(a, vec(4))
    c.end_episode(a, vec(5), truncated=True)   # the final frame onto the last stack
    c.end_episode(b, vec(0))                   # terminated: its final frame is stacked as well
    d = c.start_episode()
    c.log_action(d, vec(30), 2)                # the simulator's own action sees stacks too
    c.get_action(d, vec(31))
    c.end_episode(d, vec(32), truncated=True)
    c.flush()
    policy = rt.policy("default_policy")
    assert policy.observation_space == Stacker(VEC, 3).space
    assert [frames_of(s[0]) for s in policy.seen] == [
        [1, 1, 1], [10, 10, 10], [1, 1, 2], [1, 2, 3], [10, 10, 11], [2, 3, 4], [30, 30, 31]]
    batch = collected(srv).policy_batches["default_policy"]
    assert batch["obs"].shape[1:] == (6,)
    eps = list(by_episode(batch).values())
    assert eps == [
        [([1, 1, 1], [1, 1, 2]), ([1, 1, 2], [1, 2, 3]), ([1, 2, 3], [2, 3, 4]), ([2, 3, 4], [3, 4, 5])],
        [([10, 10, 10], [10, 10, 11]), ([10, 10, 11], [10, 11, 0])],
        [([30, 30, 30], [30, 30, 31]), ([30, 30, 31], [30, 31, 32])],
    ]
    c.close()


@pytest.mark.parametrize("space,frame", [(CHW, chw), (HWC, hwc)])
def test_images_stack_on_their_channel_axis_and_stay_bytes(make_server, space, frame):
    rt = runtime({"default_policy": 4})
    srv = make_server(rt)
    c = PolicyClient(srv.address, space, ACT)
    e = c.start_episode()
    for x in (1, 2, 3):
        c.get_action(e, frame(x))
    c.end_episode(e, frame(4), truncated=True)
    c.flush()
    seen = rt.policy("default_policy").seen
    assert seen[-1].dtype == np.uint8 and seen[-1].shape[1:] == Stacker(space, 4).space.shape
    if space is HWC:   # each frame's own channels stay together, in order
        assert seen[-1][0, 0, 0].tolist() == [1, 101, 1, 101, 2, 102, 3, 103]
    batch = collected(srv).policy_batches["default_policy"]
    assert batch["obs"].dtype == np.uint8 and batch["new_obs"].dtype == np.uint8
    assert [frames_of(o, space) for o in batch["new_obs"]] == [[1, 1, 1, 2], [1, 1, 2, 3], [1, 2, 3, 4]]
    c.close()


def test_multi_agent_stacks_per_agent_and_per_policy(make_server):
    """Agents a* map to a policy stacking 2 frames, b0 to one that stacks none: one AgentRows holds
    both (split for the passes, the actions answered in row order); a1 ends early with its final
    frame; a2 is rewarded before its first action; the episode ends with final frames."""
    rt = runtime({"stacked": 2}, mapping=lambda aid, ep: "stacked" if aid.startswith("a") else "plain",
                 actions={"stacked": 1, "plain": 2})
    srv = make_server(rt)
    c = MultiAgentPolicyClient(srv.address, VEC, ACT)
    e = c.start_episode()
    assert c.get_action(e, {"a0": vec(1), "b0": vec(100), "a1": vec(10)}) == {"a0": 1, "b0": 2, "a1": 1}
    c.log_returns(e, {"a2": 5.0})
    assert c.get_action(e, {"a0": vec(2), "b0": vec(101), "a1": vec(11), "a2": vec(50)}) == \
        {"a0": 1, "b0": 2, "a1": 1, "a2": 1}
    c.log_returns(e, {"a1": 1.0}, truncated_dict={"a1": True}, final_observation_dict={"a1": vec(12)})
    c.get_action(e, {"a0": vec(3), "b0": vec(102), "a2": vec(51)})
    c.end_episode(e, {"a0": vec(4), "b0": vec(103), "a2": vec(52)}, truncated=True)
    logged = c.start_episode()   # LogAction's rows are split the same way, each with its own action
    c.log_action(logged, {"a0": vec(7), "b0": vec(107)}, {"a0": 2, "b0": 0})
    c.end_episode(logged, {"a0": vec(8), "b0": vec(108)}, truncated=True)
    c.flush()
    b = collected(srv).policy_batches
    stacked = by_episode(b["stacked"])
    eid = next(iter(stacked))[0]
    assert stacked[(eid, 0)] == [([1, 1], [1, 2]), ([1, 2], [2, 3]), ([2, 3], [3, 4])]          # a0
    assert stacked[(eid, 2)] == [([10, 10], [10, 11]), ([10, 11], [11, 12])]                  # a1
    assert stacked[(eid, 3)] == [([50, 50], [50, 51]), ([50, 51], [51, 52])]                  # a2
    logged_id = max(k[0] for k in stacked)
    assert stacked[(logged_id, 0)] == [([7, 7], [7, 8])]
    assert b["stacked"]["actions"][b["stacked"]["eps_id"] == logged_id].tolist() == [2]
    plain = b["plain"]
    assert plain["obs"].shape[1:] == (2,) and set(plain["agent_index"]) == {1}   # order of first mention
    assert plain["obs"][:, 0].tolist() == [100, 101, 102, 107] and plain["new_obs"][:, 0].tolist() == [101, 102, 103, 108]
    assert plain["actions"].tolist() == [2, 2, 2, 0]
    summary = next(x for x in rt.metrics.recent if x["episode_id"] == e)
    assert summary["agent_rewards"]["a2"] == 5.0   # its reward before acting still counts in the totals
    c.close()


def test_a_space_that_cannot_be_stacked_is_refused_naming_the_fix(make_server):
    srv = make_server(runtime({"default_policy": 4}))
    c = PolicyClient(srv.address, gym.spaces.Dict({"pos": VEC}), ACT)
    e = c.start_episode()
    with pytest.raises(BridgeError) as info:
        c.get_action(e, {"pos": vec(1)})
    assert info.value.reason == Reason.SPACE_MISMATCH
    assert "stacks the last 4 frames" in info.value.message and "frame_stack = 1" in info.value.message
    c.close()


# ---------------------------------------------------------------- batched slots (Step)

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_slots_stack_per_slot_and_restart_at_auto_reset(make_server, transport):
    rt = runtime({"default_policy": 3})
    srv = make_server(rt)
    s = SlotClient(srv.address, CHW, ACT, 2, transport=transport)
    one = np.ones(2, np.float32)
    s.step(np.stack([chw(1), chw(11)]))
    # slot 1 terminates (no final frame); its next episode starts with 12
    s.step(np.stack([chw(2), chw(12)]), one, [False, True], [False, False])
    # slot 0 is truncated with final frame 99; its next episode starts with 3
    s.step(np.stack([chw(3), chw(13)]), one, [False, False], [True, False], np.stack([chw(99)]))
    s.close(one, [False, False], [True, True], np.stack([chw(4), chw(14)]))
    seen = rt.policy("default_policy").seen
    assert [[frames_of(o, CHW) for o in batch] for batch in seen] == [
        [[1, 1, 1], [11, 11, 11]], [[1, 1, 2], [12, 12, 12]], [[3, 3, 3], [12, 12, 13]]]
    batch = collected(srv).policy_batches["default_policy"]
    assert batch["obs"].dtype == np.uint8
    assert list(by_episode(batch, CHW).values()) == [
        [([1, 1, 1], [1, 1, 2]), ([1, 1, 2], [1, 2, 99])],
        [([11, 11, 11], [11, 11, 11])],
        [([12, 12, 12], [12, 12, 13]), ([12, 12, 13], [12, 13, 14])],
        [([3, 3, 3], [3, 3, 4])],
    ]


# ---------------------------------------------------------------- local inference

def test_local_inference_is_refused_for_a_stacking_policy(make_server):
    srv = make_server(runtime({"default_policy": 2}))
    raw = Raw(srv.address)
    sid = raw.create(VEC, ACT)
    for method, req in (("GetPolicy", pb.GetPolicyRequest(header=header(sid))),
                        ("UploadExperience", pb.UploadExperienceRequest(header=header(sid, 1), episode_ids=["u"]))):
        err = raw.refused(method, req)
        assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == Reason.POLICY_NOT_PORTABLE
        assert "frame_stack = 2" in err.message and "remote inference" in err.message
    raw.close()
    with pytest.raises(BridgeError) as info:   # the SDK's local client: at once, with the same words
        LocalPolicyClient(srv.address, VEC, ACT)
    assert info.value.reason == Reason.POLICY_NOT_PORTABLE and "remote inference" in info.value.message
