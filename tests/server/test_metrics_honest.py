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

from test_limits import Raw, header

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
