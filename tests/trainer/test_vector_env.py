"""BridgeVectorEnv: external simulators' slots as one gymnasium VectorEnv, over real gRPC.

A deterministic batched simulator (the SDK's SlotClient on a thread) checks the autoreset
rules: the reward is the action the learner sent, an ended slot's last observation is in
final_obs and its next episode's first is returned. Real `simbridge-sim` processes check a
simulator joining late and one killed mid-episode (its sub-environments end truncated and the
next simulator's slots take them). Wrong spaces and an absent simulator get errors naming the fix.
"""
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from simbridge.client.policy_client import PolicyClient
from simbridge.client.slot_client import SlotClient
from simbridge.trainer.run.launch import Proc, python_module
from simbridge.trainer.adapters.vector_env import BridgeVectorEnv
from simbridge.wire.errors import BridgeError, Reason

OBS = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)   # (slot id, t)
ACT = gym.spaces.Discrete(5)
CARTPOLE = gym.make("CartPole-v1")


def counting_sim(address: str, slots: int, base: int, length: int, steps: int, errors: list) -> None:
    """Slot s's observation is (base + s, t); its reward is the action it got; every episode lasts
    `length` steps and ends terminated in even slots, truncated in odd ones."""
    try:
        client = SlotClient(address, OBS, ACT, slots, connect_timeout_s=10)
        t = np.zeros(slots, np.int64)
        ids = base + np.arange(slots)

        def obs():
            return np.stack([ids, t], 1).astype(np.float32)
        actions = client.step(obs())
        for _ in range(steps):
            t += 1
            done = t >= length
            finals = obs()[done] if done.any() else None
            term = done & (ids % 2 == 0)
            trunc = done & ~term
            t[done] = 0
            actions = client.step(obs(), np.asarray(actions, np.float32), term, trunc, finals)
        client.close()
    except Exception as e:   # reported by the test
        errors.append(e)


@pytest.fixture
def venv():
    made = []

    def make(num_envs, obs=OBS, act=ACT, **kw):
        kw.setdefault("connect_timeout_s", 20)
        kw.setdefault("step_timeout_s", 20)
        made.append(BridgeVectorEnv(num_envs, obs, act, address="127.0.0.1:0", **kw))
        return made[-1]
    yield make
    for v in made:
        v.close()


def test_same_step_autoreset_rewards_and_final_obs_from_two_simulators(venv):
    env = venv(6)
    assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    errors: list = []
    sims = [threading.Thread(target=counting_sim, args=(env.address, 3, base, 3, 7, errors), daemon=True)
            for base in (10, 20)]
    for s in sims:
        s.start()
    obs, _ = env.reset()
    assert obs.shape == (6, 2) and sorted(obs[:, 0]) == [10, 11, 12, 20, 21, 22] and not obs[:, 1].any()
    slot = obs[:, 0].astype(int)   # which simulator slot each sub-env is
    for k in range(1, 7):
        actions = np.arange(6) % 5
        obs, rew, term, trunc, infos = env.step(actions)
        np.testing.assert_array_equal(rew, actions)            # each reward is its own action's
        np.testing.assert_array_equal(obs[:, 0], slot)         # sub-envs keep their slots
        if k % 3:
            assert not (term | trunc).any() and "final_obs" not in infos
            np.testing.assert_array_equal(obs[:, 1], k % 3)
        else:   # every episode ends: next episodes' first observations, the last ones in final_obs
            np.testing.assert_array_equal(term, slot % 2 == 0)
            np.testing.assert_array_equal(trunc, slot % 2 == 1)
            np.testing.assert_array_equal(obs[:, 1], 0)
            assert infos["_final_obs"].all()
            for i in range(6):
                np.testing.assert_array_equal(infos["final_obs"][i], [slot[i], 3])
    # the last Step of each simulator (final) ends every slot; nothing can refill them
    assert not errors


def test_a_simulator_joining_late_is_waited_for(venv):
    env = venv(4, CARTPOLE.observation_space, CARTPOLE.action_space)
    sim = []
    timer = threading.Timer(1.0, lambda: sim.append(Proc("late", python_module(
        "simbridge.sims.gym_sim", "--address", env.address, "--slots", 4, "--quiet"))))
    timer.start()
    try:
        obs, _ = env.reset()   # waits for the simulator that starts a second later
        assert obs.shape == (4, 4) and np.abs(obs).max() <= 0.05   # CartPole's first observations
        for _ in range(20):
            env.step(np.zeros(4, np.int64))
    finally:
        timer.join()
        env.close()
        for p in sim:
            p.stop()


def test_a_killed_simulator_ends_its_episodes_truncated_and_the_next_one_takes_its_slots(venv):
    env = venv(4, CARTPOLE.observation_space, CARTPOLE.action_space, reconnect_grace_s=0.5)
    argv = python_module("simbridge.sims.gym_sim", "--address", env.address, "--slots", 2, "--quiet")
    sims = [Proc("a", argv), Proc("b", argv)]
    try:
        env.reset()
        for _ in range(3):
            env.step(np.zeros(4, np.int64))
        before, _, _, _, _ = env.step(np.zeros(4, np.int64))
        sims[0].popen.kill()
        sims[0].popen.wait()
        sims.append(Proc("c", argv))   # the replacement
        obs, rew, term, trunc, infos = env.step(np.zeros(4, np.int64))
        cut = np.flatnonzero(infos.get("_final_info", np.zeros(4, bool)))
        ends = infos["final_info"]["simbridge_end"]
        lost = [i for i in cut if ends[i] == "client_lost"]
        assert len(lost) == 2, infos
        assert trunc[lost].all() and not term[lost].any()
        for i in lost:   # the last observation the learner saw, as the final one
            np.testing.assert_array_equal(infos["final_obs"][i], before[i])
            assert np.abs(obs[i]).max() <= 0.05    # the new simulator's first observation
        for _ in range(5):
            env.step(np.ones(4, np.int64))
    finally:
        env.close()
        for p in sims:
            p.stop()


def test_a_simulator_declaring_other_spaces_is_refused_by_name(venv):
    env = venv(2)
    with pytest.raises(BridgeError) as e:
        SlotClient(env.address, gym.spaces.Box(-1, 1, (3,), np.float32), ACT, 2, connect_timeout_s=10).step(
            np.zeros((2, 3), np.float32))
    assert e.value.reason == Reason.SPACE_MISMATCH
    assert "Box(-1.0, 1.0, (3,), float32)" in e.value.message and "Discrete(5)" in e.value.message


def test_row_simulators_are_told_to_use_slots(venv):
    env = venv(2)
    client = PolicyClient(env.address, OBS, ACT, connect_timeout_s=10)
    with pytest.raises(BridgeError) as e:
        client.start_episode("e1")
        client.get_action("e1", np.zeros(2, np.float32))
    assert e.value.reason == Reason.WRONG_SESSION_KIND and "--slots" in e.value.message
    client.close()


def test_no_simulator_times_out_naming_the_fix(venv):
    env = venv(8, connect_timeout_s=1)
    with pytest.raises(TimeoutError) as e:
        env.reset()
    msg = str(e.value)
    assert "8 of 8 sub-environments have no simulator after 1s" in msg
    assert f"simbridge-sim --address {env.address} --slots 8" in msg
    with pytest.raises(RuntimeError, match="close this BridgeVectorEnv and make a new one"):
        env.reset()


def test_bad_actions_are_the_learners_error():
    env = BridgeVectorEnv(2, OBS, ACT, address="127.0.0.1:0", connect_timeout_s=20)
    errors: list = []
    threading.Thread(target=counting_sim, args=(env.address, 2, 0, 3, 2, errors), daemon=True).start()
    try:
        env.reset()
        with pytest.raises(ValueError, match="step\\(\\) actions"):
            env.step(np.array([0, 7]))
        with pytest.raises(ValueError, match="step\\(\\) actions"):
            env.step(np.array([0, 1, 2]))
    finally:
        env.close()


def test_sb3_vecenv_reports_terminal_observations_and_time_limits(venv):
    pytest.importorskip("stable_baselines3")
    from simbridge.trainer.adapters.sb3 import SB3VecEnv
    env = SB3VecEnv(venv(2))
    errors: list = []
    threading.Thread(target=counting_sim, args=(env.venv.address, 2, 0, 2, 3, errors), daemon=True).start()
    obs = env.reset()
    assert obs.shape == (2, 2)
    slot = obs[:, 0].astype(int)
    obs, rew, dones, infos = env.step(np.array([3, 4]))
    assert not dones.any() and infos == [{}, {}] and rew.tolist() == [3, 4]
    obs, rew, dones, infos = env.step(np.array([1, 2]))
    assert dones.all() and not obs[:, 1].any()
    for i in range(2):
        np.testing.assert_array_equal(infos[i]["terminal_observation"], [slot[i], 2])
        assert infos[i]["TimeLimit.truncated"] == bool(slot[i] % 2)   # odd slots end truncated
    assert not errors


def test_the_sb3_wrapper_without_sb3_names_the_extra():
    import subprocess
    import sys
    code = ("import sys; sys.modules['stable_baselines3'] = None\n"
            "try:\n    import simbridge.trainer.adapters.sb3\nexcept ModuleNotFoundError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "pip install 'simbridge[sb3]'" in out, out


def test_a_simulator_that_stops_ends_its_episodes_as_it_reports_and_is_replaced(venv):
    """`simbridge-sim --max-steps` stops with a final Step: its slots' episodes end there
    (truncated: cut by the budget), and a waiting simulator takes their sub-environments."""
    env = venv(2, CARTPOLE.observation_space, CARTPOLE.action_space)
    base = python_module("simbridge.sims.gym_sim", "--address", env.address, "--slots", 2, "--quiet")
    sims = [Proc("short", base + ["--max-steps", "12"])]
    try:
        env.reset()
        sims.append(Proc("next", base))   # waits for room
        ends = []
        for _ in range(10):
            obs, rew, term, trunc, infos = env.step(np.zeros(2, np.int64))
            if "final_info" in infos and "simbridge_end" in infos["final_info"]:
                ends = [infos["final_info"]["simbridge_end"][i] for i in range(2)]
                break
        assert ends == ["final_step", "final_step"], ends
        assert trunc.all() or term.any(), (term, trunc)
        assert np.abs(obs).max() <= 0.05   # the next simulator's first observations
        env.step(np.ones(2, np.int64))
        assert sims[0].popen.wait(10) == 0
    finally:
        env.close()
        for p in sims:
            p.stop()


def test_a_busy_port_names_the_constructors_argument_not_the_cli_flag():
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(RuntimeError) as e:
            BridgeVectorEnv(2, OBS, ACT, address=address)
    msg = str(e.value)
    assert f"could not bind {address}" in msg and "--address" not in msg, msg
    assert "BridgeVectorEnv(address=" in msg and "'127.0.0.1:0'" in msg, msg


def test_closing_at_the_end_of_training_ends_the_simulators_cleanly(venv):
    """close() is the learner's normal end: the simulators (the one serving and the one waiting
    for room) hear TRAINING_OVER and exit 0 with their summary, no error line."""
    env = venv(2, CARTPOLE.observation_space, CARTPOLE.action_space)
    argv = python_module("simbridge.sims.gym_sim", "--address", env.address, "--slots", 2)
    sims = [Proc("serving", argv)]
    try:
        env.reset()
        sims.append(Proc("waiting", argv))   # no room: its first Step stays parked
        deadline = time.monotonic() + 60
        while env._hub.parked < 2 and time.monotonic() < deadline:   # both Steps wait for the learner
            env.step(np.zeros(2, np.int64))
            time.sleep(0.05)
        assert env._hub.parked == 2
        env.close()
        for p in sims:
            rc = p.popen.wait(60)
            p.wait_output()
            out = "\n".join(p.lines)
            assert rc == 0 and "error" not in out, (p.name, rc, out)
            assert '"ended": "training_over"' in out and "training is over" in out, out
    finally:
        for p in sims:
            p.stop()


def test_next_step_autoreset_shows_the_final_observation_then_a_reset_step(venv):
    """NEXT_STEP: an ended sub-env returns its last observation (no final_obs); its next step()
    is the reset step (reward 0, not done), where the simulator spends that step's action on the
    new episode's first observation: the learner's next episode starts at t=1."""
    env = venv(4, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    assert BridgeVectorEnv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP   # the default's
    errors: list = []
    for base in (10, 20):
        threading.Thread(target=counting_sim, args=(env.address, 2, base, 3, 9, errors), daemon=True).start()
    obs, _ = env.reset()
    slot = obs[:, 0].astype(int)
    seen_t, seen = [], []
    for k in range(1, 9):
        actions = (np.arange(4) + k) % 5
        obs, rew, term, trunc, infos = env.step(actions)
        np.testing.assert_array_equal(obs[:, 0], slot)
        assert "final_obs" not in infos
        seen_t.append(int(obs[0, 1]))
        seen.append((rew.tolist(), actions.tolist(), (term | trunc).tolist()))
        if k in (3, 6):   # the episodes end: their last observations, t = 3
            np.testing.assert_array_equal(term, slot % 2 == 0)
            np.testing.assert_array_equal(trunc, slot % 2 == 1)
            np.testing.assert_array_equal(rew, actions)
        elif k in (4, 7):   # the reset steps
            assert not (term | trunc).any() and not rew.any()
        else:
            assert not (term | trunc).any()
            np.testing.assert_array_equal(rew, actions)
    assert seen_t == [1, 2, 3, 1, 2, 3, 1, 2], (seen_t, seen)
    assert not errors


def test_gymnasiums_observation_wrappers_work_on_next_step(venv):
    from gymnasium.wrappers import vector as wrappers
    raw = venv(4, autoreset_mode="NEXT_STEP")
    stats = wrappers.RecordEpisodeStatistics(raw)
    flat = wrappers.FlattenObservation(wrappers.TransformObservation(
        wrappers.NormalizeObservation(stats), lambda o: 2 * o))
    errors: list = []
    for base in (10, 20):
        threading.Thread(target=counting_sim, args=(raw.address, 2, base, 3, 8, errors), daemon=True).start()
    obs, _ = flat.reset()
    assert obs.shape == (4, 2)
    for k in range(1, 7):
        obs, rew, term, trunc, infos = flat.step(np.full(4, k % 5))
        assert obs.shape == (4, 2) and np.isfinite(obs).all()
    # the first episodes: steps 1-3 (actions 1, 2, 3); the next: steps 5-6 (actions 0, 1; 4 is the reset step)
    assert list(stats.return_queue) == [6.0] * 4 + [1.0] * 4, stats.return_queue
    assert list(stats.length_queue) == [3] * 4 + [2] * 4
    assert flat.env.env.obs_rms.count > 20   # NormalizeObservation learnt from every observation
    assert not errors


def test_autoreset_modes_the_simulators_cannot_have_are_refused():
    with pytest.raises(ValueError, match="SAME_STEP .* or AutoresetMode.NEXT_STEP"):
        BridgeVectorEnv(2, OBS, ACT, address="127.0.0.1:0", autoreset_mode=gym.vector.AutoresetMode.DISABLED)
