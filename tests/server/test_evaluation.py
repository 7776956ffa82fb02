"""Evaluation episodes (StartEpisode.evaluation, EndEpisode.start_evaluation,
CreateSession.slots_evaluation) on a real server: greedy actions (the policy's explore=False),
even in a batch mixed with training episodes; nothing of them reaches the experience; their
returns are kept apart from training returns.
"""
import gymnasium as gym
import numpy as np
import pytest

from simbridge.client import PolicyClient
from simbridge.client.slot_client import SlotClient
from simbridge.server.policies import ActionBatch, Policy
from simbridge.server.runtime import BridgeRuntime
from support.experience import TRANSPORTS, collected, o

OBS = gym.spaces.Box(-10, 10, (2,), np.float32)
ACT = gym.spaces.Discrete(3)
GREEDY, EXPLORING = 0, 2


class TwoModes(Policy):
    """Action 0 when asked for greedy actions, 2 otherwise (logp tells them apart too)."""

    def compute_actions(self, obs_batch, explore: bool = True):
        n = len(obs_batch)
        a = EXPLORING if explore else GREEDY
        return ActionBatch(np.full(n, a, np.int64), np.full(n, -1.0 if explore else 0.0, np.float32))


class NoGreedyMode(Policy):
    def compute_actions(self, obs_batch):
        return ActionBatch(np.ones(len(obs_batch), np.int64))


def _server(make_server, cls=TwoModes):
    return make_server(BridgeRuntime(policy_factory=lambda pid, o_, a: cls(o_, a)))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_evaluation_episodes_act_greedily_beside_training_ones_and_are_never_trained(make_server, transport):
    server = _server(make_server)
    c = PolicyClient(server.address, OBS, ACT, transport=transport)
    train, ev = c.start_episode(), c.start_episode(evaluation=True)
    for i in range(4):
        # One GetAction for both: the batcher must not serve one kind of action to the other.
        actions = c.get_actions([train, ev], np.stack([o(i), o(-i)]))
        assert list(actions) == [EXPLORING, GREEDY]
        c.log_returns_batch([train, ev], np.array([1.0, 10.0], np.float32))
    c.end_episodes([train, ev], np.stack([o(9), o(9)]), [False, False])
    c.flush()
    batch = collected(server).policy_batches["default_policy"]
    assert batch.count == 4 and set(batch["actions"].tolist()) == {EXPLORING}   # the training episode only
    m = server.runtime.metrics
    assert [s["total_reward"] for s in m.recent] == [4.0] and [s["total_reward"] for s in m.recent_eval] == [40.0]
    assert m.recent_eval[0]["evaluation"] and not m.recent_eval[0]["training_enabled"]
    snap = server.runtime.snapshot()
    assert snap["policy_return_mean"] == {"default_policy": 4.0}
    assert snap["policy_eval_return_mean"] == {"default_policy": 40.0}
    c.close()


def test_auto_started_episodes_keep_the_evaluation_flag(make_server):
    server = _server(make_server)
    c = PolicyClient(server.address, OBS, ACT)
    eid = c.start_episode(evaluation=True)
    assert c.get_action(eid, o(1)) == GREEDY
    c.end_episodes([eid], o(2)[None], [False], start_episode_ids=["next"], evaluation=True)
    assert c.get_action("next", o(3)) == GREEDY
    c.end_episodes(["next"], o(4)[None], [False], start_episode_ids=["third"])
    assert c.get_action("third", o(5)) == EXPLORING
    c.close()


def test_evaluation_slots_act_greedily_and_feed_no_batches(make_server):
    server = _server(make_server)
    c = SlotClient(server.address, OBS, ACT, num_slots=4, evaluation=True)
    actions = c.step(np.zeros((4, 2), np.float32))
    for _ in range(3):
        assert actions.tolist() == [GREEDY] * 4
        done = np.array([True, False, False, False])
        actions = c.step(np.zeros((4, 2), np.float32), np.ones(4, np.float32), done, np.zeros(4, bool),
                         np.zeros((1, 2), np.float32))
    c.close()
    assert collected(server).agent_steps() == 0
    m = server.runtime.metrics
    assert not m.recent and len(m.recent_eval) >= 3 and all(s["evaluation"] for s in m.recent_eval)


def test_a_policy_without_a_greedy_mode_acts_as_it_always_does(make_server):
    server = _server(make_server, NoGreedyMode)
    c = PolicyClient(server.address, OBS, ACT)
    assert c.get_action(c.start_episode(evaluation=True), o(1)) == 1
    c.close()
