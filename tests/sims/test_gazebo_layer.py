"""The Gazebo plugin's plain layer (sims/gazebo), built with CMake into build/gazebo and run with ctest.

This build looks for gz-sim where CMake does by default (Debian has no gz-sim 8 packages), so here
it builds the layer without the plugin: these tests check that configuring says so plainly, that
every decision the plugin delegates passes its C++ cases, and that the example world is a cart-pole
whose <plugin> block the layer accepts as the plugin would. The plugin itself is compiled and run
against gz-sim built from source by tests/sims/test_gazebo_sim.py.
"""
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "sims" / "gazebo"
BUILD = ROOT / "build" / "gazebo"
WORLD = SRC / "worlds" / "cartpole.sdf"

pytestmark = pytest.mark.timeout(600)   # the first test configures and compiles


def run(*cmd, timeout=300, env=None):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)


@pytest.fixture(scope="module")
def build():
    if not shutil.which("cmake") or not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("cmake and a C++ compiler are needed to build sims/gazebo")
    configure = run("cmake", "-S", SRC, "-B", BUILD, "-DSIMBRIDGE_GZ_WERROR=ON")
    assert configure.returncode == 0, configure.stdout + configure.stderr
    compile_ = run("cmake", "--build", BUILD, "-j2", timeout=540)
    assert compile_.returncode == 0, compile_.stdout + compile_.stderr
    return configure.stdout


def listed_cases():
    out = run(BUILD / "test_episode_logic", "--list")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_every_layer_case_passes_under_ctest(build):
    out = run("ctest", "--test-dir", BUILD, "--output-on-failure", "-j2")
    assert out.returncode == 0, out.stdout + out.stderr
    cases = listed_cases()
    assert len(cases) >= 14
    assert f"100% tests passed, 0 tests failed out of {len(cases)}" in out.stdout, out.stdout


def test_ctest_registers_every_case_the_binary_has(build):
    out = run("ctest", "--test-dir", BUILD, "-N")
    registered = re.findall(r"Test\s+#\d+: gazebo_layer\.(\w+)", out.stdout)
    assert sorted(registered) == sorted(listed_cases()), "sims/gazebo/CMakeLists.txt's case list is stale"


def test_a_failing_case_fails_the_run(build):
    # The binary's exit code is what ctest reads: an unknown case must not pass silently.
    out = run(BUILD / "test_episode_logic", "no_such_case")
    assert out.returncode == 2 and "no test case named" in out.stderr


def test_configuring_without_gz_sim_skips_the_plugin_and_says_why(build):
    if "building the plugin simbridge-gz-system" in build:
        pytest.skip("gz-sim 8 is installed here: the plugin is built, not skipped")
    assert "gz-sim8 (Gazebo Harmonic) not found, so the plugin simbridge-gz-system is skipped" in build
    assert not list(BUILD.glob("libsimbridge-gz-system*"))


def test_requiring_the_plugin_without_gz_sim_fails_the_configure(build, tmp_path):
    # docker/gazebo.Dockerfile configures this way: an image without the plugin must not build.
    if "building the plugin simbridge-gz-system" in build:
        pytest.skip("gz-sim 8 is installed here")
    out = run("cmake", "-S", SRC, "-B", tmp_path / "b", "-DSIMBRIDGE_GZ_REQUIRE_PLUGIN=ON")
    assert out.returncode != 0
    said = " ".join(out.stderr.split())   # CMake wraps its messages
    assert "gz-sim8 (Gazebo Harmonic) not found, and SIMBRIDGE_GZ_REQUIRE_PLUGIN is ON" in said, said
    assert "-DCMAKE_PREFIX_PATH" in said and "skipped" not in said   # the fix, not a skip


def world_model(path=WORLD):
    """The world and its model that carries the simbridge plugin."""
    world = ET.parse(path).getroot().find("world")
    assert world is not None
    model = next(m for m in world.findall("model") if m.find("plugin[@filename='simbridge-gz-system']") is not None)
    return world, model


def plugin_params(path=WORLD):
    _, model = world_model(path)
    plugin = model.find("plugin")
    return plugin, {child.tag: (child.text or "").strip() for child in plugin}


def test_the_example_world_is_a_cart_pole():
    world, model = world_model()
    joints = {j.get("name"): j for j in model.findall("joint")}
    assert joints["cart_slider"].get("type") == "prismatic"
    assert joints["pole_hinge"].get("type") == "revolute"
    assert joints["cart_slider"].findtext("child") == "cart" and joints["pole_hinge"].findtext("parent") == "cart"
    physics = world.find("physics")
    _, params = plugin_params()
    step = float(physics.findtext("max_step_size")) * int(params["steps_per_action"])
    assert step == pytest.approx(0.02)   # CartPole-v1's tau
    # The joint's own effort limit must not cut the plugin's pushes short.
    assert float(joints["cart_slider"].find("axis/limit/effort").text) >= float(params["effort_limits"])
    # Every joint the plugin names is in the model.
    for key in ("observe_joints", "actuate_joints"):
        for name in params[key].split():
            assert name in joints, f"<{key}> names {name}, not a joint of the model"


def test_the_world_names_the_plugin_the_build_makes():
    plugin, _ = plugin_params()
    source = (SRC / "simbridge_system.cpp").read_text()
    cmake = (SRC / "CMakeLists.txt").read_text()
    assert f"add_library({plugin.get('filename')} SHARED" in cmake
    assert re.search(r"GZ_ADD_PLUGIN\(\s*" + re.escape(plugin.get("name")) + ",", source)


def test_the_layer_accepts_the_worlds_plugin_block(build):
    _, params = plugin_params()
    out = run(BUILD / "simbridge_gz_check_config", *(f"{k}={v}" for k, v in params.items()))
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert lines["address"] == "127.0.0.1:50051"
    # CartPole-v1's spaces to the bit: the trainer's default config, and one policy with
    # `simbridge-sim --env CartPole-v1` (FLT_MAX velocities and a 0.419 angle were refused beside it).
    assert lines["action"] == "Discrete(2)"
    high = lines["observation"].split()
    assert high[:2] == ["Box(4)", "high"]
    assert np.array_equal(np.array(high[2:], np.float32), gym.make("CartPole-v1").observation_space.high)


def test_the_config_check_reads_the_address_as_the_plugin_does(build):
    """$SIMBRIDGE_ADDRESS wins over <address> in the plugin: the check says what the plugin will dial."""
    _, params = plugin_params()
    env = {**os.environ, "SIMBRIDGE_ADDRESS": "trainer:6000"}
    out = run(BUILD / "simbridge_gz_check_config", *(f"{k}={v}" for k, v in params.items()), env=env)
    assert out.returncode == 0, out.stderr
    assert "address: trainer:6000" in out.stdout.splitlines()


def test_the_config_check_shows_a_cameras_observation(build):
    """A camera sensor's frame beside the joints is the Dict the trainer's encoder takes: image HWC uint8."""
    _, params = plugin_params()
    camera = {"camera_topic": "/cartpole/camera", "camera_width": "64", "camera_height": "48"}
    out = run(BUILD / "simbridge_gz_check_config", *(f"{k}={v}" for k, v in {**params, **camera}.items()))
    assert out.returncode == 0, out.stderr
    observation = dict(line.split(": ", 1) for line in out.stdout.splitlines())["observation"]
    assert observation.startswith("Dict(camera: Image(48x64x3 uint8), joints: Box(4) high")
    only = {**camera, "observation": "camera", "camera_format": "L8"}
    out = run(BUILD / "simbridge_gz_check_config", *(f"{k}={v}" for k, v in {**params, **only}.items()))
    assert "observation: Image(48x64x1 uint8)" in out.stdout.splitlines()


def test_the_camera_world_names_its_sensor_as_the_plugin_reads_it(build):
    """pendulum_camera.sdf (not rendered here: no render engine in this build) asks the plugin for exactly
    the camera its sensor makes, at the action rate, and loads the Sensors system with a render engine."""
    path = SRC / "worlds" / "pendulum_camera.sdf"
    world, _ = world_model(path)
    _, params = plugin_params(path)
    sensor = world.find("model[@name='camera']/link/sensor[@type='camera']")
    image = sensor.find("camera/image")
    assert params["camera_topic"] == sensor.findtext("topic")
    assert (params["camera_width"], params["camera_height"], params["camera_format"]) == \
        (image.findtext("width"), image.findtext("height"), image.findtext("format"))
    action_s = float(world.findtext("physics/max_step_size")) * int(params["steps_per_action"])
    assert float(sensor.findtext("update_rate")) * action_s >= 1   # a frame for every action
    assert world.find("plugin[@name='gz::sim::systems::Sensors']/render_engine").text == "ogre2"
    out = run(BUILD / "simbridge_gz_check_config", *(f"{k}={v}" for k, v in params.items()))
    assert out.returncode == 0, out.stderr
    assert "observation: Dict(camera: Image(32x32x1 uint8), joints: Box(2) high" in out.stdout


def test_the_config_check_says_how_to_use_it(build):
    out = run(BUILD / "simbridge_gz_check_config", "--help")
    assert out.returncode == 0 and "key=value" in out.stdout and "camera_topic" in out.stdout, out.stdout


def test_the_layer_refuses_a_misspelt_parameter_by_name(build):
    _, params = plugin_params()
    params["max_episode_step"] = params.pop("max_episode_steps")
    out = run(BUILD / "simbridge_gz_check_config", *(f"{k}={v}" for k, v in params.items()))
    assert out.returncode == 2
    assert "<max_episode_step>: unknown parameter" in out.stderr
