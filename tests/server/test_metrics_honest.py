"""Honest metrics, against a real server: episodes without a step count apart (empty_episodes),
not toward `episodes`, the returns or the episode-end hooks; the snapshot carries errors by code
and refusals by reason.

Reproduction (issue 13): 1,000 empty episodes moved `episodes` from 20 to 1,020,
episode_return_mean to 0.0, and emptied the per-policy returns.
"""
import grpc
import gymnasium as gym
import numpy as np

from simbridge.client.policy_client import PolicyClient
from simbridge.wire.errors import BridgeError
from simbridge.wire.v1 import simbridge_pb2 as pb

from support.raw import Raw, header

OBS = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


def test_empty_episodes_do_not_count_toward_episodes_or_returns(server):
    rt = server.runtime
    hooked = []
    rt.episode_end_callbacks.append(hooked.append)
    c = PolicyClient(server.address, OBS, ACT, client_name="honest")
    for _ in range(20):
        eid = c.start_episode()
        c.get_action(eid, np.zeros(4, np.float32))
        c.log_returns(eid, 2.0)
        c.end_episode(eid, np.zeros(4, np.float32))
    c.close()
    before = rt.snapshot()
    assert before["episodes"] == 20 and before["episode_return_mean"] == 2.0
    assert before["policy_return_mean"] == {"default_policy": 2.0}

    raw = Raw(server.address)
    sid = raw.create()
    for k in range(10):   # 1,000 episodes started and ended without a step
        ids = [f"empty-{k}-{i}" for i in range(100)]
        raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid), episode_ids=ids))
        raw("EndEpisode", pb.EndEpisodeRequest(header=header(sid), episode_ids=ids))
    raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid), count=5))   # ended by the close
    raw("CloseSession", pb.CloseSessionRequest(header=header(sid)))
    after = rt.snapshot()
    assert after["episodes"] == 20 and after["empty_episodes"] == 1005
    assert after["episode_return_mean"] == 2.0
    assert after["policy_return_mean"] == {"default_policy": 2.0}
    assert after["policy_return_mean_10"] == {"default_policy": 2.0}
    assert len(hooked) == 20 and all(s["length"] > 0 for s in hooked)
    raw.close()


def test_snapshot_counts_errors_by_code_and_refusals_by_reason(server):
    raw = Raw(server.address)
    sid = raw.create()
    for _ in range(3):
        try:
            raw("EndEpisode", pb.EndEpisodeRequest(header=header(sid), episode_ids=["nope"]))
        except BridgeError as e:
            assert e.code == grpc.StatusCode.NOT_FOUND
    snap = server.runtime.snapshot()
    assert snap["errors"]["NOT_FOUND"] == 3 and snap["refused"]["EPISODE_UNKNOWN"] == 3
    for k in ("experience_blocked_s", "sessions_timed_out", "upload_refused_chunks", "upload_refused_steps"):
        assert snap[k] == 0
    raw.close()


def test_episodes_cut_short_by_a_stopping_simulator_count_apart_not_in_the_returns(server):
    """Issue 27 #5: a policy that scored 500 in every finished episode read `return(10) 214.40`
    after its simulator stopped: the episodes it cut short at exit counted as returns. They end
    truncated still (learners bootstrap), but count apart (episodes_cut), out of the returns:
    EndEpisode.stopping, a CloseSession with episodes open, and a final Step's unfinished slots.
    An episode its environment truncated (a time limit), even in a final Step, is a return."""
    from simbridge.client.slot_client import SlotClient
    from simbridge.wire import tensors
    from support.raw import rows

    rt = server.runtime
    c = PolicyClient(server.address, OBS, ACT, client_name="finished")
    for _ in range(3):   # finished by their environment: returns of 10
        eid = c.start_episode()
        c.get_action(eid, np.zeros(4, np.float32))
        c.log_returns(eid, 10.0)
        c.end_episode(eid, np.zeros(4, np.float32), truncated=True)
    cut = c.start_episode()   # open when the simulator closes: the server ends it
    c.get_action(cut, np.zeros(4, np.float32))
    c.log_returns(cut, 1.0)
    c.close()

    raw = Raw(server.address)
    sid = raw.create()
    raw("StartEpisode", pb.StartEpisodeRequest(header=header(sid), episode_ids=["stopped"]))
    raw("GetAction", pb.GetActionRequest(header=header(sid), rows=[rows(["stopped"], [[0, 0, 0, 0]])]))
    raw("EndEpisode", pb.EndEpisodeRequest(
        header=header(sid), episode_ids=["stopped"], truncated=[True], stopping=True,
        rewards=[pb.RewardRows(episode_ids=["stopped"], rewards=tensors.to_tensor(np.array([2.0], np.float32)))],
        final_observations=[rows(["stopped"], [[0, 0, 0, 0]])]))
    raw.close()

    slots = SlotClient(server.address, OBS, ACT, num_slots=2, client_name="slots")
    slots.step(np.zeros((2, 4), np.float32))
    # Slot 0's time limit comes with the last step (a return of 10); slot 1 is cut by the close (3).
    slots.close(np.array([10.0, 3.0], np.float32), np.array([False, False]), np.array([True, False]),
                np.zeros((2, 4), np.float32))

    # A resume ends the episodes open when the trainer died as trainer_lost (trainer/run/recovery.py).
    rt.metrics.file_summaries([dict(rt.metrics.recent[0], end_reason="trainer_lost", total_reward=1.0,
                                    agent_rewards={"agent0": 1.0})], [])
    snap = rt.snapshot()
    assert snap["episodes"] == 8 and snap["episodes_cut"] == 4, snap
    assert snap["policy_return_mean"] == {"default_policy": 10.0}, snap
    assert snap["policy_return_mean_10"] == {"default_policy": 10.0} and snap["episode_return_mean"] == 10.0
