"""`frame_stack` in a policy's table of the trainer config: parsed and checked, written back, and
handed to the bridge, whose policy then sees the stacked space (server/frame_stack.py)."""
import logging

import gymnasium as gym
import numpy as np
import pytest

from simbridge.server.frame_stack import Stacker
from simbridge.trainer.config.trainer_config import ConfigError, parse_config
from simbridge.trainer.daemon import TrainerDaemon
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.v1 import simbridge_pb2 as pb

CAMERA = '{ type = "Box", low = 0, high = 255, shape = [1, 12, 12], dtype = "uint8" }'


def test_frame_stack_is_parsed_overridden_and_written_back():
    text = '[policies.cam]\nalgorithm = "random"\nframe_stack = 4\n[policies.plain]\nalgorithm = "random"\n'
    cfg = parse_config(text)
    assert cfg.policies["cam"].frame_stack == 4 and cfg.policies["plain"].frame_stack == 1
    assert parse_config(text, overrides=[("policies.plain.frame_stack", 2)]).policies["plain"].frame_stack == 2
    again = parse_config(cfg.text)
    assert {p: s.frame_stack for p, s in again.policies.items()} == {"cam": 4, "plain": 1}


@pytest.mark.parametrize("value", ["0", "65", '"4"', "true", "2.5"])
def test_a_bad_frame_stack_is_refused_naming_the_fix(value):
    with pytest.raises(ConfigError) as e:
        parse_config(f'[policies.cam]\nalgorithm = "dqn"\nframe_stack = {value}\n', "t.toml")
    assert "[policies.cam] frame_stack" in str(e.value) and "from 1 (no stacking) to 64" in str(e.value)


def test_frame_stack_inside_a_learners_config_is_refused_naming_the_table():
    with pytest.raises(ConfigError) as e:
        parse_config('[policies.cam]\nalgorithm = "dqn"\nconfig = { frame_stack = 4 }\n', "t.toml")
    assert "frame_stack belongs to [policies.cam] itself" in str(e.value)


def test_a_declared_space_that_cannot_be_stacked_is_refused_at_parse():
    with pytest.raises(ConfigError) as e:
        parse_config('[policies.p]\nalgorithm = "random"\nframe_stack = 2\n'
                     'observation_space = { type = "Discrete", n = 3 }\naction_space = { type = "Discrete", n = 2 }\n')
    assert "frame_stack = 2" in str(e.value) and "set frame_stack = 1" in str(e.value)


def test_the_daemon_builds_declared_policies_stacked_and_serves_single_frames(tmp_path, caplog):
    cfg = parse_config(f"""
        [run]
        logdir = "{tmp_path}"
        device = "cpu"
        [policies.cam]
        algorithm = "dqn"
        frame_stack = 3
        config = {{ buffer_size = 1000, replay_store = "frames" }}
        observation_space = {CAMERA}
        action_space = {{ type = "Discrete", n = 2 }}
    """)
    with caplog.at_level(logging.INFO, logger="simbridge.trainer"):
        d = TrainerDaemon(cfg)
    rt = d.runtime
    frame = gym.spaces.Box(0, 255, (1, 12, 12), np.uint8)
    assert rt.policies["cam"].observation_space == Stacker(frame, 3).space
    # the replay's cost at start-up counts the stacked observation: 3 x 144 bytes, its frames once
    # (frames this small are kept as rows unless asked: replay_store = "frames")
    assert "one observation is 432 bytes (uint8 rows)" in caplog.text and "each frame kept once" in caplog.text
    learner = rt.policies["cam"]   # told how many frames a stack holds: its replay keeps each once
    assert learner.config["frame_stack"] == 3 and learner.replay.layout.stack == 3
    assert learner.memory_estimate(learner.observation_space, learner.action_space, learner.config)["transition"] < 432
    # a simulator declaring its single frames is served by the stacked policy
    s = rt.session(rt.create_session(pb.CreateSessionRequest(
        client_name="t", observation_space=sb_spaces.space_to_proto(frame),
        action_space=sb_spaces.space_to_proto(gym.spaces.Discrete(2))), False).session_id, False)
    rt.handle("start_episode", pb.StartEpisodeRequest(episode_ids=["e"]), False, bound=s)
    resp = rt.handle("get_action", pb.GetActionRequest(rows=[pb.AgentRows(
        episode_ids=["e"], observations=pb.Value(tensor=tensors.to_tensor(np.zeros((1, 1, 12, 12), np.uint8))))]),
        False, bound=s)
    assert list(resp.actions[0].policy_ids) == ["cam"]


def test_declared_spaces_the_algorithm_refuses_stop_the_start_naming_the_table(tmp_path):
    """A policy built from the config's own spaces before any simulator: dqn refuses Box actions,
    as the config's error (the CLI prints it and exits 2), not a traceback."""
    cfg = parse_config(f"""
        [run]
        logdir = "{tmp_path}"
        device = "cpu"
        [policies.arm]
        algorithm = "dqn"
        observation_space = {{ type = "Box", low = -1.0, high = 1.0, shape = [3] }}
        action_space = {{ type = "Box", low = -1.0, high = 1.0, shape = [2] }}
    """)
    with pytest.raises(ConfigError) as e:
        TrainerDaemon(cfg)
    msg = str(e.value)
    assert msg.startswith("[policies.arm]: cannot create policy 'arm' for observation Box(") and "action Box(" in msg
