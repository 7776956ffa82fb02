"""The C++ InvertedPendulum (sims/cpp/mujoco) against gymnasium's Python InvertedPendulum-v5.

Both start from the state gymnasium's seeded reset made and take the same actions; the C++ side
is sims/cpp/mujoco's `pendulum_trace`, built here with CMake (or the one named by
$SIMBRIDGE_PENDULUM_TRACE). Observations must agree within 1e-6 at every step, and rewards,
terminations and truncations exactly.

Needs the `mujoco` Python bindings (the mujoco-core wheel ships them with libmujoco), gymnasium's
MuJoCo envs (they import glfw and imageio), cmake and a C++ compiler; skips naming what is missing.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("mujoco", reason="the mujoco Python bindings are not installed (pip install mujoco-core==4.0.1)")

SOURCE = Path(__file__).resolve().parents[2] / "sims" / "cpp" / "mujoco"
TOLERANCE = 1e-6


def balance(obs: np.ndarray) -> float:
    """A linear feedback that holds the pole up (the gains of inverted_pendulum_test.cpp)."""
    return float(0.5 * obs[0] + 5.0 * obs[1] + 0.5 * obs[2] + 1.0 * obs[3])


@pytest.fixture(scope="module")
def env():
    try:
        env = gym.make("InvertedPendulum-v5")
    except (ImportError, gym.error.DependencyNotInstalled) as e:
        pytest.skip(f"gymnasium's MuJoCo envs do not load: {e}")
    yield env
    env.close()


@pytest.fixture(scope="module")
def trace_binary(tmp_path_factory) -> str:
    given = os.environ.get("SIMBRIDGE_PENDULUM_TRACE")
    if given:
        return given
    if not shutil.which("cmake") or not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("cmake and a C++ compiler are needed to build sims/cpp/mujoco")
    build = tmp_path_factory.mktemp("mujoco_build")
    configure = subprocess.run(["cmake", "-S", str(SOURCE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                                f"-DSIMBRIDGE_MUJOCO_PYTHON={sys.executable}"],
                               capture_output=True, text=True, timeout=120)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    if "simbridge mujoco: skipped" in configure.stdout:
        pytest.skip("CMake found no MuJoCo library and headers for sims/cpp/mujoco:\n" + configure.stdout)
    built = subprocess.run(["cmake", "--build", str(build), "--target", "pendulum_trace", "-j2"],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    return str(build / "pendulum_trace")


def cpp_trace(binary: str, model_xml: str, initial: np.ndarray, actions) -> dict:
    # repr of a Python float round-trips exactly, so both sides step with the same doubles.
    text = " ".join(repr(float(x)) for x in initial) + "\n" + "\n".join(repr(float(a)) for a in actions) + "\n"
    proc = subprocess.run([binary, model_xml], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = np.array([[float(x) for x in line.split()] for line in proc.stdout.splitlines()[1:]])
    first = np.array([float(x) for x in proc.stdout.splitlines()[0].split()])
    assert rows.shape == (len(actions), 7), proc.stdout[:500]
    return {"initial": first, "obs": rows[:, :4], "rewards": rows[:, 4], "terminated": rows[:, 5].astype(bool),
            "truncated": rows[:, 6].astype(bool)}


def python_trace(env, seed: int, choose_action, steps: int) -> dict:
    """Step gymnasium's env from its seeded reset; choose_action(obs) -> float. Goes on past termination
    (gymnasium allows it) so the physics is compared for every step."""
    obs, _ = env.reset(seed=seed)
    out = {"initial": obs, "obs": [], "actions": [], "rewards": [], "terminated": [], "truncated": []}
    for _ in range(steps):
        action = choose_action(obs)
        obs, reward, terminated, truncated, _ = env.step(np.array([action]))
        for key, value in (("obs", obs), ("actions", action), ("rewards", reward), ("terminated", terminated),
                           ("truncated", truncated)):
            out[key].append(value)
    return {k: np.asarray(v) for k, v in out.items()}


def assert_same(py: dict, cpp: dict) -> None:
    np.testing.assert_array_equal(cpp["initial"], py["initial"])
    worst = np.max(np.abs(cpp["obs"] - py["obs"]), axis=1)
    bad = np.flatnonzero(worst > TOLERANCE)
    assert bad.size == 0, f"observations differ by {worst[bad[0]]:.3g} first at step {bad[0] + 1}"
    np.testing.assert_array_equal(cpp["rewards"], py["rewards"])
    np.testing.assert_array_equal(cpp["terminated"], py["terminated"])
    np.testing.assert_array_equal(cpp["truncated"], py["truncated"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_actions_give_gymnasiums_trajectory_and_termination_step(env, trace_binary, seed):
    rng = np.random.default_rng(seed)
    # Beyond the ctrlrange [-3, 3] too, so clipping is compared as well.
    py = python_trace(env, seed, lambda obs: float(rng.uniform(-4.5, 4.5)), steps=300)
    assert py["terminated"].any() and (np.abs(py["actions"]) > 3).any()
    cpp = cpp_trace(trace_binary, env.unwrapped.fullpath, py["initial"], py["actions"])
    assert_same(py, cpp)
    assert np.argmax(cpp["terminated"]) == np.argmax(py["terminated"])


@pytest.mark.parametrize("seed, noise", [(0, 0.6), (1, 1.0), (2, 0.3)])
def test_noisy_balancing_gives_the_same_episode_end(env, trace_binary, seed, noise):
    """Long episodes: the pole held up with noise falls late (seeds 0, 1) or lasts the 1000 steps (seed 2),
    where both truncate on the same step with the same return."""
    rng = np.random.default_rng(seed)
    py = python_trace(env, seed, lambda obs: balance(obs) + float(rng.normal(0.0, noise)), steps=1000)
    cpp = cpp_trace(trace_binary, env.unwrapped.fullpath, py["initial"], py["actions"])
    assert_same(py, cpp)
    ended = py["terminated"].any()
    assert ended == (seed != 2)
    if ended:
        assert 30 < np.argmax(cpp["terminated"]) + 1 < 1000
    else:
        assert cpp["truncated"][-1] and not cpp["truncated"][:-1].any() and cpp["rewards"].sum() == 1000
