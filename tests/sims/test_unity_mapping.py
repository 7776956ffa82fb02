"""The Unity connector's mapping, end to end over real parts: the connector process runs
mlagents_envs.UnityEnvironment, which starts the test peer (tests/sims/unity_peer) as its "build";
the peer speaks Unity's side of the wire over loopback gRPC; a real BridgeServer records what
arrives. The peer's trace of every message is replayed into the transitions the bridge must
hold, and compared row by row.

One shared run hosts three behaviors (hybrid actions, action masks, group rewards) with
decision periods 1 and 2, so terminal and interrupted agents, terminal + new decision of one
agent id in one message, agents that skip steps, and the stop at --max-steps all occur.
"""
import numpy as np
import pytest

from unity_peer.harness import Bridge, check_replay, episode_number, run_connector, server_episodes, timelines

BEHAVIORS = {"Hybrid": "hybrid", "Masked": "masked", "Group": "group"}


def hybrid_actions(obs):
    i, t = obs[:, 0].astype(int), obs[:, 1].astype(int)
    cont = (((7 * i + 3 * t) % 11) / 10.0 - 0.5).astype(np.float32)[:, None]
    disc = np.stack([(i + t) % 3, t % 2], axis=1).astype(np.int64)   # branch 0 = 2 ends the episode
    return {"continuous": cont, "discrete": disc}


def highest_allowed(obs):
    mask = obs["action_mask"].astype(bool)                              # 1 = allowed
    b0 = 3 - np.argmax(mask[:, :4][:, ::-1], axis=1)
    b1 = 2 - np.argmax(mask[:, 4:][:, ::-1], axis=1)
    return np.stack([b0, b1], axis=1).astype(np.int64)


def group_actions(obs):
    return ((obs[:, 0] + obs[:, 1]).astype(int) % 2).astype(np.int64)


@pytest.fixture(scope="module", params=["tcp", "shm"])
def shared(tmp_path_factory, request):
    """One connector run per transport: on shm, the connector's steps go through shared memory."""
    tmp = tmp_path_factory.mktemp("unity_shared")
    address = "127.0.0.1:0" if request.param == "tcp" else f"shm+unix:{tmp}/bridge.sock"
    bridge = Bridge([f"{b}*={p}" for b, p in BEHAVIORS.items()],
                    {"hybrid": hybrid_actions, "masked": highest_allowed, "group": group_actions}, address=address)
    try:
        run = run_connector(bridge.address, tmp,
                            args=["--max-steps", 400, "--time-scale", 7, "--width", 64, "--height", 48,
                                  "--quality-level", 2, "--target-frame-rate", 30, "--capture-frame-rate", 25,
                                  "--env-param", "difficulty=2.5", "--env-param", "other=-1", "--seed", 11,
                                  "--num-areas", 3, "--quiet"],
                            peer_args=["--scene", "hybrid,masked,group", "--agents", 4, "--decision-period", 2,
                                       "--stats-every", 5])
    finally:
        bridge.stop()
    assert run.code == 0, run.explain()
    return bridge, run


@pytest.mark.parametrize("behavior", list(BEHAVIORS))
def test_every_transition_is_what_unity_sent_and_applied(shared, behavior):
    bridge, run = shared
    assert check_replay(bridge, run.trace, f"{behavior}?team=0", BEHAVIORS[behavior]) > 50


def test_run_covered_terminal_interrupted_skipped_steps_and_the_stop(shared):
    _, run = shared
    sent = [r for r in run.trace if r["kind"] == "sent"]
    infos = [i for r in sent for b in r["behaviors"].values() for i in b]
    assert any(i["done"] and i["max_step"] for i in infos), "no interrupted agent"
    assert any(i["done"] and not i["max_step"] for i in infos), "no terminal agent"
    # decision period 2: agent 1 of Group (id 3001) is missing from messages where agent 0 decides
    ids = [{i["id"] for i in r["behaviors"]["Group?team=0"]} for r in sent]
    assert any(3000 in x and 3001 not in x for x in ids)
    s = run.summary
    assert s["stopped_by"] == "max_steps" and s["steps"] >= 400
    assert s["cut_at_exit"] > 0 and s["terminated"] > 0 and s["truncated"] > 0
    assert run.trace[-1]["kind"] == "quit" and run.trace[-1]["reason"] == "status 400"


def test_terminal_and_new_decision_of_one_agent_in_one_message_are_two_episodes(shared):
    bridge, run = shared
    got = server_episodes(bridge, "hybrid")
    found = 0
    for agent, line in timelines(run.trace, "Hybrid?team=0").items():
        dones = [j for j, x in enumerate(line) if x["done"]]
        for k, j in enumerate(dones):
            if j + 1 >= len(line) or line[j + 1]["step"] != line[j]["step"] or k + 1 >= len(got[agent]):
                continue
            ended, started = got[agent][k], got[agent][k + 1]
            np.testing.assert_allclose(ended[-1]["new_obs"], line[j]["obs"][0], atol=1e-6)
            assert ended[-1]["terminateds"] or ended[-1]["truncateds"]
            np.testing.assert_allclose(started[0]["obs"], line[j + 1]["obs"][0], atol=1e-6)
            assert started[0]["eps_id"] != ended[-1]["eps_id"] and int(started[0]["t"]) == 0
            # the ended episode's obs never reappears in the new one (nothing mixed)
            assert not any(np.allclose(r["obs"], line[j]["obs"][0]) for r in started if int(r["t"]) > 0)
            found += 1
    assert found >= 5


def test_action_masks_reach_the_policy_and_masked_actions_never_reach_unity(shared):
    bridge, run = shared
    seen = bridge.policies["masked"].seen
    assert seen and all(set(np.unique(b["action_mask"])) <= {0, 1} for b in seen)
    assert any((b["action_mask"] == 0).any() for b in seen)
    applied = [a for r in run.trace if r["kind"] == "received" for a in r["actions"]["Masked?team=0"]]
    assert len(applied) > 50 and not any(a["masked"] for a in applied)


def test_spaces_come_from_the_behavior_specs(shared):
    bridge, _ = shared
    p = bridge.policies
    assert str(p["hybrid"].action_space) == ("Dict('continuous': Box(-1.0, 1.0, (1,), float32), "
                                             "'discrete': MultiDiscrete([3 2]))")
    assert str(p["hybrid"].observation_space) == "Box(-inf, inf, (3,), float32)"
    assert str(p["masked"].observation_space) == ("Dict('action_mask': MultiBinary(7), "
                                                  "'obs_0': Box(-inf, inf, (2,), float32))")
    assert str(p["masked"].action_space) == "MultiDiscrete([4 3])"
    assert str(p["group"].action_space) == "Discrete(2)"


def test_each_behavior_goes_to_its_policy_by_agent_id(shared):
    bridge, _ = shared
    for s in bridge.summaries:
        (aid, pid), = s["agent_policies"].items()
        behavior = aid.split("?")[0]
        assert aid.startswith(f"{behavior}?team=0/") and pid == BEHAVIORS[behavior]
        assert s["episode_id"].startswith(aid + "/")
    assert {pid for s in bridge.summaries for pid in s["agent_policies"].values()} == set(BEHAVIORS.values())


def test_group_rewards_are_added_and_reported_per_episode(shared):
    bridge, run = shared
    lines = timelines(run.trace, "Group?team=0")
    checked = 0
    for agent, line in lines.items():
        summaries = sorted((s for s in bridge.summaries if s["episode_id"].startswith(f"Group?team=0/{agent}/")),
                           key=lambda s: episode_number(s["episode_id"]))
        total = 0.0
        k = 0
        for info in line:  # an episode's group reward: from its first decision to its done info
            total += info["group_reward"]
            if info["done"]:
                assert summaries[k]["custom_metrics"]["group_reward"] == pytest.approx(total, abs=1e-5)
                total, k = 0.0, k + 1
                checked += 1
    assert checked >= 4
    assert any(i["group_reward"] == 1.0 and i["done"] for line in lines.values() for i in line)
    # rewards sent: reward + group reward (compared row by row above); the episode returns agree
    rewards = {s["episode_id"]: s["total_reward"] for s in bridge.summaries if s["episode_id"].startswith("Group")}
    assert max(rewards.values()) > 1.0


def test_engine_configuration_and_environment_parameters_reach_unity(shared):
    _, run = shared
    init = next(r for r in run.trace if r["kind"] == "init")
    assert init["communication_version"] == "1.5.0" and init["package_version"] == "0.28.0"
    assert init["seed"] == 11 and init["num_areas"] == 3
    side = [r for r in run.trace if r["kind"] == "side_channels"][0]
    assert side["engine"] == {"width": 64, "height": 48, "quality_level": 2, "time_scale": 7.0,
                              "target_frame_rate": 30, "capture_frame_rate": 25}
    assert side["env_params"] == {"difficulty": 2.5, "other": -1.0}
    first_command = next(r for r in run.trace if r["kind"] == "command")
    assert first_command["command"] == 1  # RESET answers the second handshake call


def test_unity_stats_side_channel_is_in_the_summary(shared):
    _, run = shared
    assert run.summary["unity_stats"]["Peer/steps"] > 0
