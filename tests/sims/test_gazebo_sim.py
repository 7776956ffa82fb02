"""The Gazebo plugin for real: compiled against an installed gz-sim 8 (Harmonic), loaded by `gz sim -s`, and
driving worlds against a real `simbridge-trainer run` on loopback.

The prefix is $GZ_PREFIX, else ~/.cache/simbridge/gz-harmonic, else the one `gz` on PATH belongs to;
without one every test here skips with one line naming docs/gazebo.md. Each world runs as its own
process with GZ_IP=127.0.0.1 and a partition of its own (tests/sims/gazebo_harness.py).
"""
import re
import signal
import subprocess
import time

import pytest

from gazebo_harness import (NO_PREFIX, ROOT, WORLDS, Trainer, World, camera_world, configure_and_build, find_prefix,
                            free_port, gz_env, wait_until, with_plugin_params)

pytestmark = pytest.mark.timeout(900)

CARTPOLE = WORLDS / "cartpole.sdf"
PENDULUM = WORLDS / "pendulum.sdf"
PENDULUM_SAC = WORLDS / "pendulum_sac.toml"

# Learning budgets: wall seconds from the world's start (generous, for a loaded 2-core machine) and env steps
# (the learning itself, what the machine's load does not change).
CARTPOLE_TARGET, CARTPOLE_BUDGET_S, CARTPOLE_MAX_STEPS = 150.0, 420, 40000
PENDULUM_TARGET, PENDULUM_BUDGET_S, PENDULUM_MAX_STEPS = 190.0, 420, 8000

RANDOM = """
[server]
address = "127.0.0.1:50051"
rollout_fragment_length = 16
[run]
logdir = "runs/unused"
checkpoint_every_env_steps = {checkpoint}
print_every_s = 0.25
seed = 0
[policies.default_policy]
algorithm = "random"
"""


@pytest.fixture(scope="module")
def prefix():
    found = find_prefix()
    if found is None:
        pytest.skip(NO_PREFIX)
    return found


@pytest.fixture(scope="module")
def plugin(prefix, cpp_install):
    """Built once per run into build/gazebo-gz, the plugin's and the layer's sources compiled afresh,
    linked with the installed SDK of the run's one C++ build (not a second build of it)."""
    result = configure_and_build(prefix, ROOT / "build" / "gazebo-gz", sdk=cpp_install)
    assert result["configure_rc"] == 0, result["configure"][-6000:]
    assert result["build_rc"] == 0, result["build"][-6000:]
    assert result["plugin"] is not None, result["build"][-3000:]
    return result


@pytest.fixture
def random_config(tmp_path):
    def make(checkpoint=100000):
        path = tmp_path / "random.toml"
        path.write_text(RANDOM.format(checkpoint=checkpoint))
        return path
    return make


def world(prefix, plugin, sdf, trainer, log, **kw):
    return World(prefix, plugin["plugin"].parent, sdf, trainer.address, log, **kw)


def test_the_plugin_compiles_against_gz_sim_with_no_warning(plugin, cpp_install):
    version = re.search(r"building the plugin simbridge-gz-system against gz-sim (8\.\d+\.\d+)", plugin["configure"])
    assert version, plugin["configure"][-3000:]
    # Its translation units were compiled in this run, under -Wall -Wextra -Wpedantic -Werror.
    assert "simbridge_system.cpp.o" in plugin["build"] and "episode_logic.cpp.o" in plugin["build"]
    warnings = [line for line in plugin["build"].splitlines() if "warning:" in line]
    assert not warnings, "\n".join(warnings)
    # linked with this run's SDK, not one an earlier configure of the folder found and cached
    link = (ROOT / "build" / "gazebo-gz" / "CMakeFiles" / "simbridge-gz-system.dir" / "link.txt").read_text()
    assert str(cpp_install / "lib" / "libsimbridge_client.a") in link, link


def test_a_world_runs_its_episodes_counted_exactly_on_both_sides(prefix, plugin, random_config, tmp_path):
    """A fixed number of iterations of the cart-pole under a random policy: every episode the plugin ended is
    one the trainer counted, with the same number of actions, and the open one's actions too."""
    trainer = Trainer(tmp_path / "run", config=random_config())
    gz = None
    try:
        trainer.wait_serving()
        gz = world(prefix, plugin, CARTPOLE, trainer, tmp_path / "gz.log", iterations=2000)
        assert gz.wait(300) == 0, gz.text()[-3000:]
        summary = gz.summary()
        assert summary is not None, gz.text()[-3000:]
        ended = gz.episodes()
        # 2000 iterations of 2 per action; each world reset costs a few iterations.
        assert summary["episodes"] == len(ended) >= 20 and gz.episodes(by_reset=True) == []
        assert [n for n, _ in ended] == list(range(1, len(ended) + 1))
        assert summary["actions"] == sum(a for _, a in ended)
        assert summary["sessions_lost"] == 0
        assert all(5 <= a < 500 for _, a in ended), ended   # a random cart-pole falls; none hit the limit
        actions = summary["actions"] + summary["open_actions"]
        assert 900 < actions <= 1000
        # The trainer: the ended episodes and the open one (truncated when the world's session closed), and
        # every action of them.
        episodes = summary["episodes"] + summary["open"]
        wait_until(lambda: trainer.last().get("sessions") == 0 and trainer.last().get("episodes") == episodes,
                   60, f"the trainer to count {episodes} episodes with the world gone")
        last = trainer.last()
        # An env step is an action served: the open episode's last one was served but never rewarded.
        assert last["env_steps"] == actions + summary["open"]
        # The returns are the ended episodes' (1 per action); the one the closing session cut is not among them.
        assert last["return_mean"]["default_policy"] == pytest.approx(summary["actions"] / summary["episodes"])
    finally:
        if gz is not None:
            gz.stop()
        trainer.stop()


def test_a_world_started_before_its_trainer_waits_connect_timeout_s_for_it(prefix, plugin, random_config, tmp_path):
    """gz-sim first, the trainer seconds later: the plugin waits (the world with it) and then trains; with
    no trainer at all, it gives up after connect_timeout_s, says what to start, and the world runs on."""
    address = f"127.0.0.1:{free_port()}"
    (tmp_path / "patient").mkdir()
    patient = with_plugin_params(CARTPOLE, tmp_path / "patient", connect_timeout_s=120)
    gz, trainer = None, None
    try:
        gz = World(prefix, plugin["plugin"].parent, patient, address, tmp_path / "gz.log", iterations=600)
        wait_until(lambda: "simbridge: connecting to" in gz.text(), 60, "the plugin to start connecting",
                   [("gz sim", gz.proc, gz.log)])
        time.sleep(5)   # longer than a trainer's start would be in a test: the world is still waiting
        assert "not started" not in gz.text() and gz.proc.poll() is None
        trainer = Trainer(tmp_path / "run", address=address, config=random_config())
        assert gz.wait(300) == 0, gz.text()[-3000:]
        summary = gz.summary()
        assert summary is not None and summary["episodes"] >= 5, gz.text()[-3000:]
    finally:
        if gz is not None:
            gz.stop()
        if trainer is not None:
            trainer.stop()
    (tmp_path / "hasty").mkdir()
    hasty = with_plugin_params(CARTPOLE, tmp_path / "hasty", connect_timeout_s=1.5)
    alone = World(prefix, plugin["plugin"].parent, hasty, f"127.0.0.1:{free_port()}", tmp_path / "alone.log",
                  iterations=300)
    try:
        assert alone.wait(120) == 0, alone.text()[-3000:]   # the world ran its iterations without the plugin
        said = alone.text()
        assert "not started: no simbridge trainer at" in said and "simbridge-trainer run --address" in said, said[-3000:]
    finally:
        alone.stop()


def test_a_trainer_at_its_total_env_steps_ends_the_plugin_quietly_and_the_world_runs_on(prefix, plugin,
                                                                                      random_config, tmp_path):
    """TRAINING_OVER is the trainer's normal end, not a failure: logged as a message, not an error."""
    trainer = Trainer(tmp_path / "run", config=random_config(), overrides=("run.total_env_steps=200",))
    gz = None
    try:
        trainer.wait_serving()
        gz = world(prefix, plugin, CARTPOLE, trainer, tmp_path / "gz.log", iterations=1500)
        assert gz.wait(300) == 0, gz.text()[-3000:]   # its iterations, the plugin quiet after the trainer's end
        assert trainer.proc.wait(60) == 0
    finally:
        if gz is not None:
            gz.stop()
        trainer.stop()
    said = gz.text()
    over = [line for line in said.splitlines() if "training is over (total_env_steps 200 reached)" in line]
    assert over and all(line.startswith("[Msg]") for line in over), said[-3000:]
    assert not [line for line in said.splitlines() if line.startswith("[Err]") and "simbridge" in line], said[-3000:]


def test_two_worlds_in_their_own_partitions_feed_one_trainer(prefix, plugin, random_config, tmp_path):
    """Two cart-pole worlds at once, same world name and control service, partitions apart: each resets
    only itself (a reset request crossing over would cut the other's episodes short) and the trainer
    counts both sessions' episodes exactly."""
    trainer = Trainer(tmp_path / "run", config=random_config())
    worlds = []
    try:
        trainer.wait_serving()
        worlds = [world(prefix, plugin, CARTPOLE, trainer, tmp_path / f"gz{i}.log", iterations=1200) for i in range(2)]
        assert worlds[0].partition != worlds[1].partition
        wait_until(lambda: trainer.last().get("sessions") == 2, 120, "both worlds' sessions",
                   [(f"world {i}", w.proc, w.log) for i, w in enumerate(worlds)])
        for w in worlds:
            assert w.wait(300) == 0, w.text()[-3000:]
        summaries = [w.summary() for w in worlds]
        assert all(s is not None for s in summaries), [w.text()[-2000:] for w in worlds]
        for w, s in zip(worlds, summaries):
            # Every episode ended by its own limits: none was cut short by the other world's reset request.
            assert s["episodes"] == len(w.episodes()) >= 10
            assert w.episodes(by_reset=True) == []
        episodes = sum(s["episodes"] + s["open"] for s in summaries)
        actions = sum(s["actions"] + s["open_actions"] for s in summaries)
        wait_until(lambda: trainer.last().get("sessions") == 0 and trainer.last().get("episodes") == episodes,
                   60, f"the trainer to count {episodes} episodes with both worlds gone")
        assert trainer.last()["env_steps"] == actions + sum(s["open"] for s in summaries)
    finally:
        for w in worlds:
            w.stop()
        trainer.stop()


def test_a_sigkilled_trainer_and_a_resumed_one_get_the_world_back(prefix, plugin, random_config, tmp_path):
    """The trainer dies mid-episode (SIGKILL: no goodbye, no final checkpoint); the world waits in its
    action call while the SDK reconnects, the resumed trainer knows no session, the plugin starts new
    episodes and the world goes on, its counts going on from the checkpoint."""
    config = random_config(checkpoint=500)
    logdir = tmp_path / "run"
    first = Trainer(logdir, config=config, name="trainer1")
    second = gz = None
    try:
        first.wait_serving()
        gz = world(prefix, plugin, CARTPOLE, first, tmp_path / "gz.log")
        wait_until(lambda: first.last().get("env_steps", 0) > 1200, 180, "1200 env steps (a checkpoint at 500)",
                   [("gz sim", gz.proc, gz.log), ("the trainer", first.proc, first.log)])
        before = len(gz.episodes())
        first.stop(signal.SIGKILL)
        second = Trainer(logdir, address=first.address, resume=True, name="trainer2")
        second.wait_serving()
        resumed = wait_until(lambda: [r for r in second.metrics() if r.get("event") == "resume"], 60,
                             "the resume event")[0]
        assert resumed["env_steps"] >= 500   # counts go on from the checkpoint (and journal), not from zero
        wait_until(lambda: second.last().get("env_steps", 0) > resumed["env_steps"] + 800
                   and second.last().get("sessions") == 1, 180, "the world's steps on the resumed trainer",
                   [("gz sim", gz.proc, gz.log), ("the trainer", second.proc, second.log)])
        assert gz.proc.poll() is None, "the world must outlive its trainer"
        assert "going on with new episodes" in gz.text()
        assert "the plugin is inactive" not in gz.text()
        assert len(gz.episodes()) > before
        rc = gz.stop()
        summary = gz.summary()
        assert summary is not None and summary["sessions_lost"] == 1, f"gz sim exited {rc}:\n{gz.text()[-3000:]}"
    finally:
        if gz is not None:
            gz.stop()
        first.stop()
        if second is not None:
            second.stop()


def learn(trainer, gz, target, budget_s, what):
    """Wait (bounded by budget_s of the world's time) until return(10) reaches target; the metrics row that did."""
    def reached():
        rows = [r for r in trainer.metrics() if (r.get("return_mean_10") or {}).get("default_policy", 0) >= target]
        return rows[0] if rows else None
    last = lambda: {k: trainer.last().get(k) for k in ("env_steps", "episodes", "return_mean_10", "wall_s")}  # noqa: E731
    try:
        row = wait_until(reached, budget_s, f"{what} to reach return(10) {target}",
                         [("gz sim", gz.proc, gz.log), ("the trainer", trainer.proc, trainer.log)], poll=1.0)
        print(f"{what}: return(10) {row['return_mean_10']['default_policy']:.1f} at {row['env_steps']} env steps, "
              f"{row['wall_s']:.0f} s of the trainer's wall time")   # shown by pytest -s
        return row
    except AssertionError as e:
        raise AssertionError(f"{e}; the trainer's last row: {last()}") from None


def learns(prefix, plugin, sdf, trainer, log, target, budget_s, max_steps, what):
    """The world against `trainer` until return(10) reaches target within budget_s and max_steps (both
    stopped after); the world runs on with its plugin the whole time."""
    gz = None
    try:
        trainer.wait_serving()
        gz = world(prefix, plugin, sdf, trainer, log)
        row = learn(trainer, gz, target, budget_s, what)
        assert row["env_steps"] <= max_steps, row
        assert gz.proc.poll() is None and "the plugin is inactive" not in gz.text()
    finally:
        if gz is not None:
            gz.stop()
        trainer.stop()


def test_dqn_learns_the_cart_pole_world(prefix, plugin, tmp_path):
    """The trainer's default config (DQN) against the cart-pole world, as docs/gazebo.md runs it."""
    learns(prefix, plugin, CARTPOLE, Trainer(tmp_path / "run", overrides=["run.print_every_s=1.0"]), tmp_path / "gz.log",
           CARTPOLE_TARGET, CARTPOLE_BUDGET_S, CARTPOLE_MAX_STEPS, "DQN on the cart-pole world")


def test_sac_learns_the_pendulum_world_through_box_efforts(prefix, plugin, tmp_path):
    """A Box(1) torque on the hinge, learned by SAC (sims/gazebo/worlds/pendulum_sac.toml) to hold the rod up."""
    trainer = Trainer(tmp_path / "run", config=PENDULUM_SAC, overrides=["run.print_every_s=1.0"])
    learns(prefix, plugin, PENDULUM, trainer, tmp_path / "gz.log", PENDULUM_TARGET, PENDULUM_BUDGET_S,
           PENDULUM_MAX_STEPS, "SAC on the pendulum world")


# ---- a camera: tests/fake_camera_system.cpp stands in for gz-sensors' camera (no render engine here) ----

CAMERA_W, CAMERA_H = 24, 20


def pendulum_camera(tmp_path, update_rate=0, width=CAMERA_W, **params):
    """The pendulum world with the stand-in camera, CAMERA_W x CAMERA_H (the plugin told `width`)."""
    return camera_world(tmp_path, width, CAMERA_H, update_rate, sensor_width=CAMERA_W, **params)


def run_to_its_end(prefix, plugin, sdf, trainer, log, iterations):
    """The world run for `iterations` against `trainer` (both stopped after): the world, its plugin's summary."""
    gz = None
    try:
        trainer.wait_serving()
        gz = world(prefix, plugin, sdf, trainer, log, iterations=iterations)
        assert gz.wait(300) == 0, gz.text()[-3000:]
        wait_until(lambda: trainer.last().get("sessions") == 0, 60, "the world's session to close")
        return gz, gz.summary()
    finally:
        if gz is not None:
            gz.stop()
        trainer.stop()


def recorded_episodes(logdir):
    import os
    import minari
    os.environ["MINARI_DATASETS_PATH"] = str((logdir / "datasets").resolve())
    return list(minari.load_dataset("simbridge/default_policy-v0").iterate_episodes())


def test_a_camera_frame_reaches_replay_as_bytes_showing_the_state_of_its_observation(prefix, plugin, random_config,
                                                                                       tmp_path):
    """Every observation is Dict {camera: uint8 (20, 24, 1), joints}: the camera's bytes arrive exactly (its
    padded rows packed), and with camera_max_age 0 each frame shows the very state the joints report: the
    float32 the camera wrote into its first 4 bytes is the observation's hinge angle, bit for bit."""
    import numpy as np
    trainer = Trainer(tmp_path / "run", config=random_config(), overrides=("dataset.record=true",))
    gz, summary = run_to_its_end(prefix, plugin, pendulum_camera(tmp_path, camera_max_age=0), trainer,
                                 tmp_path / "gz.log", 1500)
    assert summary is not None and summary["episodes"] >= 5, gz.text()[-3000:]
    episodes = recorded_episodes(tmp_path / "run")
    assert len(episodes) >= summary["episodes"]
    pattern = (np.arange(CAMERA_W * CAMERA_H) % 251).astype(np.uint8).reshape(CAMERA_H, CAMERA_W)
    frames = 0
    for ep in episodes:
        camera, joints = ep.observations["camera"], ep.observations["joints"]
        assert camera.dtype == np.uint8 and camera.shape[1:] == (CAMERA_H, CAMERA_W, 1)
        assert joints.dtype == np.float32 and joints.shape[1:] == (2,)
        pixels = camera[..., 0].reshape(len(camera), -1)
        np.testing.assert_array_equal(pixels[:, 4:], np.broadcast_to(pattern.reshape(-1)[4:], pixels[:, 4:].shape))
        angles = pixels[:, :4].copy().view(np.float32)[:, 0]
        np.testing.assert_array_equal(angles, joints[:, 0])
        frames += len(camera)
    assert frames > 100


def test_a_camera_at_the_action_rate_serves_every_action(prefix, plugin, random_config, tmp_path):
    """The default freshness (a frame taken after the previous observation) with a camera at 50 Hz, the
    pendulum's action rate (2 iterations of 10 ms): the world runs its episodes without a stall."""
    trainer = Trainer(tmp_path / "run", config=random_config())
    gz, summary = run_to_its_end(prefix, plugin, pendulum_camera(tmp_path, update_rate=50), trainer,
                                 tmp_path / "gz.log", 1500)
    assert summary is not None and summary["episodes"] >= 5, gz.text()[-3000:]
    assert summary["actions"] + summary["open_actions"] >= 600
    assert "the plugin is inactive" not in gz.text()


@pytest.mark.parametrize("case", ["too_slow", "wrong_size"])
def test_a_camera_unlike_its_parameters_stops_the_plugin_with_the_fix(prefix, plugin, random_config, tmp_path, case):
    """A camera slower than the actions, or sending another size than the plugin's parameters, is named
    with what to change; the plugin stops, the world runs on."""
    if case == "too_slow":
        sdf = pendulum_camera(tmp_path, update_rate=10, camera_timeout_s=1)
        said = "the camera's <update_rate> must give a frame for every action, at least 50 Hz here"
    else:
        sdf = pendulum_camera(tmp_path, width=32)
        said = ("the camera on /pendulum/camera sends 24x20 L8 images, the plugin expects 32x20 L8: make "
                "<camera_width>, <camera_height> and <camera_format> those of the sensor's <image>")
    gz, _ = run_to_its_end(prefix, plugin, sdf, Trainer(tmp_path / "run", config=random_config()), tmp_path / "gz.log",
                           600)   # the world ran its iterations without the plugin
    errors = [line for line in gz.text().splitlines() if line.startswith("[Err]") and "simbridge" in line]
    assert errors and said in errors[0] and "the plugin is inactive from now on" in errors[0], gz.text()[-3000:]


def test_sac_learns_the_pendulum_world_with_a_camera_in_its_observation(prefix, plugin, tmp_path):
    """The pendulum seen as Dict {camera, joints}: the frame through the convolutional encoder the trainer
    picks, kept as bytes in replay beside the joints' floats, and SAC still holds the rod up."""
    trainer = Trainer(tmp_path / "run", config=PENDULUM_SAC, overrides=["run.print_every_s=1.0"])
    learns(prefix, plugin, pendulum_camera(tmp_path, update_rate=50), trainer, tmp_path / "gz.log", PENDULUM_TARGET,
           PENDULUM_BUDGET_S, PENDULUM_MAX_STEPS, "SAC on the pendulum world with a camera")
    said = trainer.log.read_text()
    assert f"{CAMERA_H}x{CAMERA_W}x1 uint8 image through simple" in said, said[-3000:]
    assert f"one observation is {CAMERA_H * CAMERA_W + 4 * 2} bytes (uint8 rows)" in said, said[-3000:]


def test_the_camera_world_without_a_render_engine_says_what_it_needs(prefix, plugin, random_config, tmp_path):
    """pendulum_camera.sdf is valid SDF; in this build of gz-sim (no Sensors system, no render engine) its
    camera never sends a frame, and the plugin says so, naming the Sensors system, after camera_timeout_s."""
    sdf = WORLDS / "pendulum_camera.sdf"
    check = subprocess.run([str(prefix / "bin" / "gz"), "sdf", "-k", str(sdf)], capture_output=True, text=True,
                           timeout=120, env=gz_env(prefix, plugin["plugin"].parent, "127.0.0.1:1"))
    assert check.returncode == 0 and "Valid" in check.stdout, check.stdout + check.stderr
    trainer = Trainer(tmp_path / "run", config=random_config())
    gz = None
    try:
        trainer.wait_serving()
        quick = with_plugin_params(sdf, tmp_path, camera_timeout_s=2)
        gz = world(prefix, plugin, quick, trainer, tmp_path / "gz.log")
        said = ("no image on /pendulum/camera within 2 s: is <camera_topic> the camera sensor's <topic>, and does "
                "the world load gz-sim's Sensors system with a render engine?")
        wait_until(lambda: said in gz.text(), 120, "the plugin to give up on the camera", [("gz sim", gz.proc, gz.log)])
        assert "the plugin is inactive from now on" in gz.text() and gz.proc.poll() is None   # the world runs on
    finally:
        if gz is not None:
            gz.stop()
        trainer.stop()
