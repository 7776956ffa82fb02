"""The replay that keeps a camera's frames once (trainer/learners/frame_replay.py): every sample
equals the rows replay.py keeps, in a fraction of the memory, and the two load each other's state."""
import logging

import gymnasium as gym
import numpy as np
import pytest
import torch

from simbridge.server.frame_stack import Stacker
from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.learners import encoders, frame_replay
from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.trainer.learners.frame_replay import FrameReplay
from simbridge.trainer.learners.replay import ReplayBuffer
from simbridge.wire.columns import ACTIONS, NEW_OBS, OBS, REWARDS

HWC = gym.spaces.Box(0, 255, (16, 14, 3), np.uint8)     # an RGB frame, channels last
CHW = gym.spaces.Box(0, 255, (2, 12, 10), np.uint8)     # two channels first
ROBOT = gym.spaces.Dict({"bumper": gym.spaces.Box(0, 255, (2,), np.uint8), "cam": HWC,
                         "joints": gym.spaces.Box(-1, 1, (3,), np.float32)})


def stream(space: gym.Space, k: int, agents: int, length: int, steps: int, seed: int = 0):
    """Transitions of `agents` interleaved agents whose episodes last `length` steps, their
    observations stacked k deep as the bridge stacks them: columns of encoded rows."""
    rng = np.random.default_rng(seed)
    frame_space = space if not isinstance(space, gym.spaces.Dict) else space["cam"]
    stacker = Stacker(frame_space, k) if k > 1 else None

    def observe(frames):
        if isinstance(space, gym.spaces.Dict):
            return {"bumper": rng.integers(0, 2, (agents, 2)).astype(np.uint8), "cam": frames,
                    "joints": rng.uniform(-1, 1, (agents, 3)).astype(np.float32)}
        return frames

    def frames():
        return rng.integers(0, 256, (agents,) + frame_space.shape).astype(np.uint8)

    def stack(prev, new, fresh):
        return new if stacker is None else stacker.next(prev, new, fresh)

    t = np.zeros(agents, np.int64)
    cur = stack(None, frames(), None)
    out = []
    for step in range(steps):
        nxt = stack(cur, frames(), None)
        ob, new_ob = observe(cur), observe(nxt)
        out.append({OBS: encoders.obs_rows(space_of(space, k), ob), NEW_OBS: encoders.obs_rows(space_of(space, k), new_ob),
                    ACTIONS: rng.integers(0, 3, agents), REWARDS: rng.normal(size=agents).astype(np.float32)})
        t += 1
        ended = t % length == 0
        cur = nxt
        if ended.any():   # those agents start again: their stacks filled with a fresh first frame
            first = frames()
            cur = np.where(ended.reshape((-1,) + (1,) * (cur.ndim - 1)), stack(None, first, None), cur)
    return out


def space_of(space: gym.Space, k: int) -> gym.Space:
    if k == 1:
        return space
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({**space.spaces, "cam": Stacker(space["cam"], k).space})
    return Stacker(space, k).space


def both(space: gym.Space, k: int, capacity: int, batches):
    lay = frame_replay.layout(space_of(space, k), k)
    rows, frames = ReplayBuffer(capacity), FrameReplay(capacity, "cpu", lay)
    for cols in batches:
        rows.add(cols)
        frames.add(cols)
    return rows, frames


def assert_same(a, b, n):
    idx = torch.arange(n)
    ga, gb = a.gather(idx), b.gather(idx)
    assert set(ga) == set(gb)
    for key in ga:
        assert torch.equal(ga[key], gb[key]), key


@pytest.mark.parametrize("space,k,agents", [(HWC, 1, 3), (HWC, 4, 3), (HWC, 4, 1), (CHW, 3, 3), (ROBOT, 1, 3)])
def test_every_row_comes_back_as_its_bytes_in_less_memory(space, k, agents):
    # agents 1: each row's obs is the row before's new_obs (found without a digest)
    batches = stream(space, k, agents=agents, length=9, steps=180 // agents)   # 180 rows in a ring of 100
    rows, frames = both(space, k, 100, batches)
    assert len(frames) == len(rows) == 100
    assert_same(rows, frames, 100)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert torch.equal(rows.draw(64, g1), frames.draw(64, g2))   # the same draws, so the same learning
    # distinct frames: one a step, and each episode's first (3 agents' open stacks besides)
    assert frames.frames_held() <= 100 * 10 / 9 + agents * 2 * k
    assert frames.frames_held() < 2 * k * 100 / (1.5 if k == 1 else 5)   # rows: 2 k frames a row


@pytest.mark.parametrize("frame,stacked", [((1, 12, 10), True), ((3, 12, 10), False)])
def test_channels_first_with_no_stack_declared_the_first_rows_decide(frame, stacked, caplog):
    """Atari's (4, 84, 84), stacked by the simulator: each channel a frame, a frame a step. A colour
    camera's (3, 84, 84): the image one frame (split by channel it would need 3 a step)."""
    caplog.set_level(logging.INFO, logger="simbridge.trainer")
    space = gym.spaces.Box(0, 255, frame, np.uint8)
    k = 4 if stacked else 1
    lay = frame_replay.layout(space_of(space, k))
    assert lay.guessed and (lay.stack, lay.channels) == (1, frame[0] * k)
    rows, frames = ReplayBuffer(100), FrameReplay(100, "cpu", lay)
    for cols in stream(space, k, agents=2, length=20, steps=90):
        rows.add(cols)
        frames.add(cols)
    assert_same(rows, frames, 100)
    assert not frames.layout.guessed
    if stacked:
        assert (frames.layout.stack, frames.layout.channels) == (4, 1) and "are a stack of frames" in caplog.text
    else:
        assert (frames.layout.stack, frames.layout.channels) == (1, 3) and "stack of frames" not in caplog.text
    assert frames.frames_held() <= 100 * 21 / 20 + 2 * 2 * k   # a frame a step, not 2 k a row
    assert "grows" not in caplog.text
    again = FrameReplay(1, "cpu", lay)   # a checkpoint keeps the decision
    again.load_state_dict(frames.state_dict())
    assert again.layout == frames.layout
    assert_rows_equal(in_order(again), in_order(frames))


def test_short_episodes_grow_the_store_and_lose_no_row(caplog):
    caplog.set_level(logging.INFO, logger="simbridge.trainer")
    batches = stream(HWC, 4, agents=2, length=1, steps=100)   # every obs a new episode's: 2 frames a row
    rows, frames = both(HWC, 4, 120, batches)
    assert len(frames) == 120 and frames.frames_held() > frame_replay.initial_slots(120, frames.layout)
    assert "the store grows" in caplog.text
    assert_same(rows, frames, 120)


def in_order(replay) -> dict:
    """Every row, oldest first."""
    store = replay.rows if isinstance(replay, FrameReplay) else replay
    return replay.gather(torch.as_tensor(store.oldest(len(replay))))


def assert_rows_equal(a: dict, b: dict):
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("short", [False, True])
def test_checkpoints_load_into_either_store(short):
    batches = stream(HWC, 4, agents=2, length=1 if short else 7, steps=90)
    rows, frames = both(HWC, 4, 100, batches)
    state = frames.state_dict()
    assert len(state["frames"]) == frames.frames_held()   # each live frame once
    again = FrameReplay(1, "cpu", frames.layout)
    again.load_state_dict(state)
    assert len(again) == len(frames) and again.added == frames.added == 180
    assert_rows_equal(in_order(again), in_order(frames))
    as_rows = ReplayBuffer(1)
    as_rows.load_state_dict(frame_replay.as_rows(state))
    assert_rows_equal(in_order(as_rows), in_order(frames))
    from_rows = FrameReplay(1, "cpu", frames.layout)   # a rows checkpoint, now kept as frames
    from_rows.load_state_dict(rows.state_dict())
    assert_rows_equal(in_order(from_rows), in_order(rows))
    again.add(batches[0])   # and goes on
    assert again.added == 182


def as_batch(cols: dict, space: gym.Space) -> SampleBatch:
    """A stream's columns as the SampleBatch the bridge hands a learner."""
    n = len(cols[OBS])
    return SampleBatch(obs=cols[OBS].reshape((n,) + space.shape), new_obs=cols[NEW_OBS].reshape((n,) + space.shape),
                       actions=cols[ACTIONS], rewards=cols[REWARDS], terminateds=np.zeros(n, bool),
                       truncateds=np.zeros(n, bool), eps_id=np.zeros(n, np.int64), agent_index=np.arange(n),
                       t=np.zeros(n, np.int64))


def test_a_learner_trains_the_same_on_frames_as_on_rows():
    space = space_of(HWC, 4)
    cfg = {"hidden": [16], "seed": 3, "learning_starts": 0, "batch_size": 32, "buffer_size": 200,
           "vis_encode_type": "fully_connected", "frame_stack": 4}
    learners = [DQNLearner(space, gym.spaces.Discrete(3), {**cfg, "replay_store": store}) for store in ("rows", "frames")]
    assert isinstance(learners[0].replay, ReplayBuffer) and isinstance(learners[1].replay, FrameReplay)
    for cols in stream(HWC, 4, agents=4, length=11, steps=30):
        for learner in learners:
            learner.add(as_batch(cols, space))
            learner.train()
    assert learners[0].updates == learners[1].updates > 0
    for a, b in zip(learners[0].q.parameters(), learners[1].q.parameters()):
        assert torch.equal(a, b)
    # the frame store's size goes out with the learner's metrics (metrics.jsonl, TensorBoard)
    held = learners[1].last_metrics
    assert held["replay_frames"] == learners[1].replay.frames_held() > 0 and held["replay_store_mib"] > 0
    assert "replay_frames" not in learners[0].last_metrics


def test_a_learners_checkpoint_keeps_its_frames_once_and_loads_on_either_store():
    from simbridge.trainer.run.checkpoint import state_bytes, state_from_bytes
    space = space_of(HWC, 4)
    cfg = {"hidden": [8], "seed": 0, "learning_starts": 0, "batch_size": 8, "buffer_size": 300,
           "vis_encode_type": "fully_connected", "frame_stack": 4}
    learner = DQNLearner(space, gym.spaces.Discrete(3), cfg)
    for cols in stream(HWC, 4, agents=2, length=20, steps=60):
        learner.replay.add(cols)
    saved = state_from_bytes(state_bytes(learner.state_dict(include_replay=True)))   # no pickle
    as_rows = 2 * 4 * HWC.shape[0] * HWC.shape[1] * HWC.shape[2] * 120
    assert saved["replay"]["frames"].numel() < as_rows / 5
    for store in ("frames", "rows"):
        again = DQNLearner(space, gym.spaces.Discrete(3), {**cfg, "replay_store": store})
        again.load_state_dict(saved)
        assert_rows_equal(in_order(again.replay), in_order(learner.replay))


def test_a_checkpoint_of_another_stack_loads_as_rows_and_captured_updates_see_new_storage():
    space = space_of(HWC, 4)
    batches = stream(HWC, 4, agents=2, length=9, steps=40)
    four = FrameReplay(100, "cpu", frame_replay.layout(space, 4))
    for cols in batches:
        four.add(cols)
    one = FrameReplay(100, "cpu", frame_replay.layout(space, 1))   # frame_stack no longer said
    version = one.storage_version
    one.load_state_dict(four.state_dict())
    assert one.layout.stack == 1 and one.storage_version > version
    assert_rows_equal(in_order(one), in_order(four))


def test_on_policy_learners_estimate_rows_and_small_images_stay_rows():
    from simbridge.trainer.learners.ppo import PPOLearner
    atari = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    ppo = PPOLearner.memory_estimate(atari, gym.spaces.Discrete(6), {"frame_stack": 4})
    assert ppo["transition"] == 2 * 84 * 84 * 4 + 4 * 6 + 64   # its rollouts are rows
    tiny = gym.spaces.Box(0, 255, (8, 8, 4), np.uint8)   # frames of 64 bytes: digests would cost more
    assert not frame_replay.uses_frames("auto", tiny, 4) and frame_replay.uses_frames("frames", tiny, 4)
    assert frame_replay.uses_frames("auto", gym.spaces.Box(0, 255, (16, 16, 4), np.uint8), 4)


def test_a_batch_the_buffer_cannot_take_is_refused_before_anything_changes():
    batches = stream(HWC, 4, agents=2, length=9, steps=70)   # 140 rows into 100: the ring is full
    rows, frames = both(HWC, 4, 100, batches[:-1])
    before = in_order(frames), frames.frames_held(), frames.added
    bad = {**batches[-1]}
    del bad[REWARDS]
    short = {**batches[-1], OBS: batches[-1][OBS][:, :-1]}
    for cols in (bad, short):
        with pytest.raises(ValueError, match="replay: column"):
            frames.add(cols)
    assert_rows_equal(in_order(frames), before[0])
    assert (frames.frames_held(), frames.added) == before[1:]
    frames.add(batches[-1])
    rows.add(batches[-1])
    assert_rows_equal(in_order(frames), in_order(rows))


def test_frames_where_they_apply_and_a_named_fix_where_not():
    assert frame_replay.uses_frames("auto", HWC) and frame_replay.uses_frames("auto", ROBOT)
    assert not frame_replay.uses_frames("rows", HWC)
    vector = gym.spaces.Box(-1, 1, (4,), np.float32)
    two = gym.spaces.Dict({"a": HWC, "b": HWC})
    assert not frame_replay.uses_frames("auto", vector) and not frame_replay.uses_frames("auto", two)
    with pytest.raises(ValueError, match='set replay_store = "rows"'):
        DQNLearner(vector, gym.spaces.Discrete(2), {"replay_store": "frames"})
    with pytest.raises(ValueError, match="use one of"):
        DQNLearner(HWC, gym.spaces.Discrete(2), {"replay_store": "planes"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_frames_on_the_gpu_sample_as_rows_do_and_a_captured_update_reads_them():
    """On cuda: the store and the ids live on the device, a sample equals a rows replay's, and a
    learner on the CUDA graph path trains as eagerly on the same frames (bench/gpu_check.sh)."""
    space = space_of(HWC, 4)
    batches = stream(HWC, 4, agents=3, length=9, steps=60)
    rows, frames = ReplayBuffer(100, "cuda"), FrameReplay(100, "cuda", frame_replay.layout(space, 4))
    for cols in batches:
        rows.add(cols)
        frames.add(cols)
    idx = torch.randint(0, 100, (64,), device="cuda")
    assert_rows_equal(rows.gather(idx), frames.gather(idx))
    cfg = {"hidden": [16], "seed": 3, "learning_starts": 0, "batch_size": 32, "buffer_size": 200,
           "frame_stack": 4, "vis_encode_type": "match3", "tf32": False}
    learners = [DQNLearner(space, gym.spaces.Discrete(3), {**cfg, "update_path": path}, device="cuda")
                for path in ("eager", "graph")]
    assert all(isinstance(lrn.replay, FrameReplay) for lrn in learners)
    for cols in batches[:20]:
        for lrn in learners:
            lrn.add(as_batch(cols, space))
    for lrn in learners:
        lrn.train()
    assert learners[0].updates == learners[1].updates > 0
    for a, b in zip(learners[0].q.parameters(), learners[1].q.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
