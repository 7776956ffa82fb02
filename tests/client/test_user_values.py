"""Values as users write them: the space, not the Python type, says what nests.

A Tuple space's value may come as a list, a Box value as a plain list of numbers; every
client call (single-agent, multi-agent, local inference) sends the same rows either way.
"""
import gymnasium as gym
import numpy as np

from simbridge.client import LocalPolicyClient, MultiAgentPolicyClient, PolicyClient
from simbridge.wire import spaces as sb_spaces

OBS = gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(3)))
ACT = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-1, 1, (1,), np.float32)))


def _rows(rt):
    rt.flush()
    out = []
    for batch in rt.experience.get_all():
        out.extend(batch.policy_batches.values())
    return out


def test_batch_row0_and_stack_values_follow_the_space():
    as_list = [[0.5, -0.5], 2]
    one = sb_spaces.batch_row0(OBS, as_list)
    assert isinstance(one, tuple) and one[0].shape == (1, 2) and one[1].tolist() == [2]
    assert sb_spaces.unbatch_row0(OBS, one)[1] == 2
    stacked = sb_spaces.stack_values(OBS, [as_list, ([0.1, 0.2], 1), (np.zeros(2, np.float32), 0)])
    assert stacked[0].shape == (3, 2) and stacked[1].tolist() == [2, 1, 0]
    box = gym.spaces.Box(-1, 1, (4,), np.float32)
    assert sb_spaces.batch_row0(box, [0.1, 0.2, 0.3, 0.4]).dtype == np.float32   # a list takes the box's dtype
    assert sb_spaces.batch_row0(box, np.zeros(4)).dtype == np.float64           # an array keeps its own
    wrong = [[0.5, -0.5]]                        # one item for a Tuple of two: left for the codec to name
    assert sb_spaces.batch_row0(OBS, wrong) is wrong


def test_list_values_for_tuple_spaces_on_every_client_call(make_server):
    srv = make_server()
    with_lists = PolicyClient(srv.address, OBS, ACT)
    eid = with_lists.start_episode()
    action = with_lists.get_action(eid, [[0.5, -0.5], 2])
    assert isinstance(action, tuple) and ACT.contains((int(action[0]), np.asarray(action[1], np.float32)))
    with_lists.log_returns(eid, 1.0)
    with_lists.log_action(eid, [[0.1, 0.1], 0], [1, [0.25]])
    with_lists.end_episode(eid, [[0.0, 0.0], 1])
    with_lists.close()
    rows = _rows(srv.runtime)
    assert sum(len(b) for b in rows) == 2
    batch = rows[0]
    assert np.allclose(batch["obs"][0][0], [0.5, -0.5]) and batch["obs"][1][0] == 2
    assert batch["actions"][0][1] == 1 and np.allclose(batch["actions"][1][1], [0.25])


def test_list_values_for_multi_agent_rows(make_server):
    srv = make_server()
    client = MultiAgentPolicyClient(srv.address, OBS, ACT)
    eid = client.start_episode()
    acts = client.get_action(eid, {"a": [[0.5, -0.5], 2], "b": ([0.1, 0.1], 0)})
    assert set(acts) == {"a", "b"}
    client.log_returns(eid, {"a": 1.0, "b": 2.0})
    client.log_action(eid, {"a": [[0.0, 0.0], 1]}, {"a": [0, [0.5]]})
    client.end_episode(eid, {"a": [[0.2, 0.2], 1], "b": [[0.3, 0.3], 2]})
    client.close()
    assert sum(len(b) for b in _rows(srv.runtime)) == 3


def test_list_values_with_local_inference(make_server):
    srv = make_server()   # local inference acts on a Tuple observation; its heads take flat actions
    client = LocalPolicyClient(srv.address, OBS, gym.spaces.Discrete(2), chunk_steps=4)
    eid = client.start_episode()
    for _ in range(3):
        client.get_action(eid, [[0.5, -0.5], 2])
        client.log_returns(eid, 1.0)
    client.end_episode(eid, [[0.0, 0.0], 1])
    client.close()
    assert srv.runtime.snapshot()["uploaded_steps"] == 3
