"""simbridge.sims.unity.compat (mlagents-envs 0.28.0's protobuf modules under protobuf 7) and
simbridge.sims.unity.spaces (BehaviorSpec -> gymnasium spaces, actions -> ActionTuple)."""
import pickle
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import simbridge.sims.unity  # noqa: F401  (installs the hook)
from mlagents_envs.base_env import ActionSpec, BehaviorSpec, DimensionProperty, ObservationSpec, ObservationType
from mlagents_envs.exception import UnityObservationException
from simbridge.trainer.run.launch import child_env
from simbridge.sims.unity.compat import serialized_descriptor
from simbridge.sims.unity.spaces import behavior_spaces

ROOT = Path(__file__).resolve().parents[2]


def test_without_the_hook_mlagents_envs_does_not_import_with_this_protobuf_and_with_it_it_does():
    plain = subprocess.run([sys.executable, "-c", "import mlagents_envs.environment"], capture_output=True,
                           text=True, env=child_env(), cwd=str(ROOT))
    assert plain.returncode != 0 and "Descriptors cannot be created directly" in plain.stderr
    hooked = subprocess.run([sys.executable, "-c", "import simbridge.sims.unity, mlagents_envs.environment as e; "
                             "print(e.UnityEnvironment.API_VERSION)"],
                            capture_output=True, text=True, env=child_env(), cwd=str(ROOT))
    assert hooked.returncode == 0, hooked.stderr
    assert hooked.stdout.strip() == "1.5.0"


def test_every_generated_module_is_rebuilt_from_its_own_embedded_descriptor():
    import importlib

    import mlagents_envs.communicator_objects as pkg
    files = sorted(Path(pkg.__file__).parent.glob("*_pb2.py"))
    assert len(files) >= 20
    for f in files:
        mod = importlib.import_module(f"mlagents_envs.communicator_objects.{f.stem}")
        assert mod.DESCRIPTOR.serialized_pb == serialized_descriptor(f.read_text(), str(f))
        for name in mod.DESCRIPTOR.message_types_by_name:
            cls = getattr(mod, name)
            assert cls.__module__ == mod.__name__ and cls.DESCRIPTOR.full_name == f"communicator_objects.{name}"


def test_messages_enums_and_pickling_work_as_the_old_modules_promised():
    from mlagents_envs.communicator_objects.command_pb2 import QUIT, RESET, STEP
    from mlagents_envs.communicator_objects.observation_pb2 import NONE, PNG, ObservationProto
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto
    assert (STEP, RESET, QUIT, NONE, PNG) == (0, 1, 2, 0, 1)
    msg = UnityMessageProto()
    msg.header.status = 200
    info = msg.unity_output.rl_output.agentInfos["Ball?team=0"].value.add(id=7, reward=0.5, max_step_reached=True)
    info.observations.add(shape=[2], float_data=ObservationProto.FloatData(data=[1.0, 2.0]))
    info.action_mask.extend([True, False])
    # RpcCommunicator hands messages between its threads through a multiprocessing Pipe (pickle)
    again = pickle.loads(pickle.dumps(msg))
    assert again == msg and again.unity_output.rl_output.agentInfos["Ball?team=0"].value[0].id == 7
    assert UnityMessageProto.FromString(msg.SerializeToString()) == msg


def test_serialized_descriptor_refuses_a_file_without_one():
    with pytest.raises(ImportError, match="no serialized_pb"):
        serialized_descriptor("DESCRIPTOR = None\n", "x_pb2.py")


# ---------------------------------------------------------------- spaces

def spec(obs_shapes, continuous=0, branches=()):
    props = {1: (DimensionProperty.NONE,), 3: (DimensionProperty.NONE,) + (DimensionProperty.TRANSLATIONAL_EQUIVARIANCE,) * 2}
    return BehaviorSpec([ObservationSpec(s, props[len(s)], ObservationType.DEFAULT, f"s{k}")
                         for k, s in enumerate(obs_shapes)], ActionSpec(continuous, tuple(branches)))


def test_one_vector_observation_and_continuous_actions():
    sp = behavior_spaces(spec([(8,)], continuous=2))
    assert sp.observation_space == gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)
    assert sp.action_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    obs = np.arange(16, dtype=np.float32).reshape(2, 8)
    assert sp.observations([obs], None) is obs
    act = sp.action_tuple(np.array([[0.5, -3.0], [2.0, 0.1]], np.float32), 2)
    np.testing.assert_array_equal(act.continuous, np.float32([[0.5, -1.0], [1.0, 0.1]]))  # clipped to [-1, 1]
    assert act.continuous.dtype == np.float32 and act.discrete.shape == (2, 0)


def test_discrete_branches_several_sensors_and_masks():
    one = behavior_spaces(spec([(4,)], branches=(5,)))
    assert one.action_space == gym.spaces.Discrete(5)
    np.testing.assert_array_equal(one.action_tuple(np.array([4, 0]), 2).discrete, [[4], [0]])
    sp = behavior_spaces(spec([(3, 8, 8), (6,)], branches=(3, 2)), with_mask=True)
    assert list(sp.observation_space.spaces) == ["action_mask", "obs_0", "obs_1"]
    assert sp.observation_space["action_mask"] == gym.spaces.MultiBinary(5)
    assert sp.observation_space["obs_0"].shape == (3, 8, 8)
    assert sp.action_space == gym.spaces.MultiDiscrete([3, 2])
    masked = np.array([[True, False, False, False, True]])      # Unity: True = masked
    value = sp.observations([np.zeros((1, 3, 8, 8), np.float32), np.ones((1, 6), np.float32)], masked)
    np.testing.assert_array_equal(value["action_mask"], [[0, 1, 1, 1, 0]])   # here: 1 = allowed
    assert sp.observation_space.contains({k: v[0] for k, v in value.items()})
    no_mask_yet = sp.observations([np.zeros((2, 3, 8, 8), np.float32), np.ones((2, 6), np.float32)], None)
    np.testing.assert_array_equal(no_mask_yet["action_mask"], np.ones((2, 5)))
    act = sp.action_tuple(np.array([[2, 1], [0, 0]]), 2)
    assert act.discrete.dtype == np.int32 and act.discrete.tolist() == [[2, 1], [0, 0]]


def test_a_camera_is_sent_as_its_bytes_and_one_of_floats_is_named():
    camera = spec([(3, 8, 8), (6,)], branches=(3,))
    sp = behavior_spaces(camera)
    assert sp.observation_space["obs_0"] == gym.spaces.Box(0, 255, (3, 8, 8), np.uint8)
    assert sp.observation_space["obs_1"] == gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)
    pixels = np.random.default_rng(0).integers(0, 256, (2, 3, 8, 8)).astype(np.uint8)
    value = sp.observations([pixels.astype(np.float32) / np.float32(255.0), np.ones((2, 6), np.float32)], None)
    assert value["obs_0"].dtype == np.uint8 and np.array_equal(value["obs_0"], pixels)   # exactly the bytes
    for odd in (0.3, np.nan, 1.5):
        with pytest.raises(UnityObservationException, match="not 8-bit pixels.*--camera-dtype float32"):
            sp.observations([np.full((1, 3, 8, 8), odd, np.float32), np.ones((1, 6), np.float32)], None)
    # a grayscale camera is the mean of three 8-bit channels: (10 + 20 + 31) / 3 is level 20.33
    gray = np.full((1, 3, 8, 8), np.mean([10, 20, 31]) / 255, np.float32)
    assert np.all(sp.observations([gray, np.ones((1, 6), np.float32)], None)["obs_0"] == 20)
    floats = behavior_spaces(camera, camera_dtype="float32")
    assert floats.observation_space["obs_0"] == gym.spaces.Box(-np.inf, np.inf, (3, 8, 8), np.float32)
    kept = floats.observations([np.full((1, 3, 8, 8), 0.3, np.float32), np.ones((1, 6), np.float32)], None)
    assert kept["obs_0"].dtype == np.float32 and np.all(kept["obs_0"] == np.float32(0.3))


def test_hybrid_actions_are_a_dict_of_both_parts():
    sp = behavior_spaces(spec([(2,)], continuous=1, branches=(3,)), with_mask=False)
    assert sp.action_space == gym.spaces.Dict({"continuous": gym.spaces.Box(-1.0, 1.0, (1,), np.float32),
                                               "discrete": gym.spaces.Discrete(3)})
    act = sp.action_tuple({"continuous": np.array([[0.25]], np.float32), "discrete": np.array([2])}, 1)
    assert act.continuous.tolist() == [[0.25]] and act.discrete.tolist() == [[2]]


def test_masks_are_only_for_behaviors_with_discrete_actions():
    sp = behavior_spaces(spec([(2,)], continuous=3), with_mask=True)
    assert not sp.with_mask and isinstance(sp.observation_space, gym.spaces.Box)


def test_the_faster_step_message_is_the_one_mlagents_builds():
    import types

    from mlagents_envs.base_env import ActionTuple
    from mlagents_envs.environment import UnityEnvironment
    from mlagents_envs.side_channel.side_channel_manager import SideChannelManager
    from simbridge.sims.unity.environment import BridgeUnityEnvironment
    rng = np.random.default_rng(0)
    env = types.SimpleNamespace(_env_state={"hybrid": ([0] * 5, None), "disc": ([0] * 3, None), "idle": ([], None)},
                                _side_channel_manager=SideChannelManager([]),
                                _wrap_unity_input=UnityEnvironment._wrap_unity_input)
    actions = {"hybrid": ActionTuple(rng.random((5, 2), np.float32), rng.integers(0, 3, (5, 2), np.int32)),
               "disc": ActionTuple(discrete=rng.integers(0, 3, (3, 1), np.int32)),
               "idle": ActionTuple(discrete=np.zeros((0, 1), np.int32))}
    theirs = UnityEnvironment._generate_step_input(env, actions)
    ours = BridgeUnityEnvironment._generate_step_input(env, actions)
    assert ours == theirs and len(ours.rl_input.agent_actions["hybrid"].value) == 5
