"""What a camera's transitions cost in the replay: kept as rows, or each frame once (frame_replay.py).

    python bench/replay_frames.py [--capacity 5000] [--agents 8] [--episode 100] [--repeats 3]
                                  [--cases atari,atari_sim,camera,robot] [--device cpu|cuda]
                                  [--sample-batch 256] [--out FILE]

Cases (uint8 images as the trainer's rows hold them):
  atari      84x84x1 frames stacked 4 deep by the bridge (frame_stack = 4): (84, 84, 4) observations
  atari_sim  (1, 84, 84) frames stacked 4 deep by the simulator, (4, 84, 84), the trainer told nothing
  camera     84x84x3 RGB, no stack
  robot      a 64x64x3 camera beside 12 joint values and 2 bumper bytes (a Dict)
For each case, `--agents` agents step in turn through episodes of `--episode` steps (random frames,
so nothing repeats that the bridge would not repeat: a stack's shared frames, obs and new_obs),
handed over in fragments of 32 rows, 2 x capacity transitions in all (the ring wraps); each store
("rows": replay.py, "frames": frame_replay.py) takes the same batches. Per case and store: bytes
a transition takes at capacity (the storage over the rows held), the rows held, CPU microseconds
to add a transition (process CPU time; the frames store hashes each new frame) and milliseconds
to sample a batch of `--sample-batch` rows (CPU time; with --device cuda, wall time between device
synchronisations), medians over `--repeats` runs with their spread. `ratios`:
frames over rows. Runs on the CPU in well under a minute, in about 1.6 GB of memory at its defaults
(the transitions are made before anything is timed).
"""
import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.report import emit  # noqa: E402
from simbridge.server.frame_stack import Stacker  # noqa: E402
from simbridge.trainer.learners import encoders, frame_replay  # noqa: E402
from simbridge.trainer.learners.frame_replay import FrameReplay  # noqa: E402
from simbridge.trainer.learners.replay import ReplayBuffer  # noqa: E402
from simbridge.wire.columns import ACTIONS, NEW_OBS, OBS, REWARDS  # noqa: E402

FRAGMENT, SAMPLE = 32, 256
JOINTS = gym.spaces.Box(-1, 1, (12,), np.float32)
BUMPER = gym.spaces.Box(0, 255, (2,), np.uint8)
# case: (frame space, frames stacked, beside joints, the stack the trainer is told of: frame_stack)
CASES = {"atari": (gym.spaces.Box(0, 255, (84, 84, 1), np.uint8), 4, False, 4),
         "atari_sim": (gym.spaces.Box(0, 255, (1, 84, 84), np.uint8), 4, False, 1),
         "camera": (gym.spaces.Box(0, 255, (84, 84, 3), np.uint8), 1, False, 1),
         "robot": (gym.spaces.Box(0, 255, (64, 64, 3), np.uint8), 1, True, 1)}


def batches(case: str, capacity: int, agents: int, episode: int, seed: int = 0):
    """Fragments of 32 transitions from `agents` agents stepping in turn: (space, k, [columns])."""
    frame, k, robot, _ = CASES[case]
    stacker = Stacker(frame, k) if k > 1 else None
    seen = stacker.space if stacker else frame
    space = gym.spaces.Dict({"bumper": BUMPER, "cam": seen, "joints": JOINTS}) if robot else seen
    rng = np.random.default_rng(seed)
    def new_frame():
        return rng.integers(0, 256, frame.shape, dtype=np.uint8)

    def stack(prev, f):
        """The agent's next observation: the frame, or the stack with it pushed (filled at a start)."""
        if stacker is None:
            return f
        return stacker.fill(f[None])[0] if prev is None else stacker.next(prev[None], f[None], None)[0]

    def observe(img):
        if not robot:
            return img[None]
        return {"bumper": rng.integers(0, 2, (1, 2), dtype=np.uint8), "cam": img[None],
                "joints": rng.uniform(-1, 1, (1, 12)).astype(np.float32)}

    cur = [stack(None, new_frame()) for _ in range(agents)]
    t = [0] * agents
    rows = []
    for i in range(2 * capacity):
        a = i % agents
        nxt = stack(cur[a], new_frame())
        rows.append((encoders.obs_rows(space, observe(cur[a])), encoders.obs_rows(space, observe(nxt))))
        t[a] += 1
        cur[a] = stack(None, new_frame()) if t[a] % episode == 0 else nxt
    out = []
    for f in range(0, len(rows), FRAGMENT):
        part = rows[f:f + FRAGMENT]
        n = len(part)
        out.append({OBS: np.concatenate([o for o, _ in part]), NEW_OBS: np.concatenate([x for _, x in part]),
                    ACTIONS: rng.integers(0, 6, n), REWARDS: rng.normal(size=n).astype(np.float32)})
    return space, k, out


def storage_bytes(replay) -> int:
    if isinstance(replay, FrameReplay):
        return storage_bytes(replay.rows) + replay._store.numel() * replay._store.element_size()
    return sum(store.numel() * store.element_size() for store, _ in replay._stores)


def measure(replay, cols_list, batch: int) -> dict:
    """Adds every batch (process CPU time), then samples `batch` rows 20 times: CPU time on the CPU,
    wall time between device synchronisations on a GPU (where the gather runs)."""
    t0 = time.process_time()
    for cols in cols_list:
        replay.add(cols)
    add_s = time.process_time() - t0
    g = torch.Generator(device=replay.device).manual_seed(0)
    cuda = replay.device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    replay.sample(batch, g)
    if cuda:
        torch.cuda.synchronize(replay.device)
    t0 = clock()
    for _ in range(20):
        replay.sample(batch, g)
    if cuda:
        torch.cuda.synchronize(replay.device)
    sample_s = (clock() - t0) / 20
    n = sum(len(c[OBS]) for c in cols_list)
    held = len(replay)
    return {"bytes_per_transition": storage_bytes(replay) / held if isinstance(replay, FrameReplay)
            else storage_bytes(replay) / replay.capacity,
            "rows_held": held, "add_us_per_transition": add_s / n * 1e6, "sample_ms": sample_s * 1e3}


def summarise(runs: list) -> dict:
    out = {}
    for key in runs[0]:
        vals = [r[key] for r in runs]
        out[key] = round(statistics.median(vals), 3)
        if key in ("add_us_per_transition", "sample_ms"):
            out[key + "_spread"] = [round(min(vals), 3), round(max(vals), 3)]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--capacity", type=int, default=5000)
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--episode", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--device", default="cpu", help="where the stores live: cpu or cuda (sampling timed in wall time there)")
    p.add_argument("--sample-batch", type=int, default=SAMPLE, help="rows a sample draws (default 256)")
    p.add_argument("--out")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    results, ratios = [], {}
    for case in a.cases.split(","):
        if case not in CASES:
            p.error(f"--cases: {case!r} is not one of {sorted(CASES)}")
        space, k, cols = batches(case, a.capacity, a.agents, a.episode)
        lay = frame_replay.layout(space, CASES[case][3])
        got = {}
        for store in ("rows", "frames"):
            runs = [measure(ReplayBuffer(a.capacity, a.device) if store == "rows"
                            else FrameReplay(a.capacity, a.device, lay), cols, a.sample_batch)
                    for _ in range(a.repeats)]
            got[store] = summarise(runs)
            results.append({"case": case, "store": store, "observation_bytes": encoders.row_bytes(space),
                            "stacked": k, "frame_stack": CASES[case][3], **got[store]})
        ratios[case] = {"bytes_frames_vs_rows": round(got["frames"]["bytes_per_transition"]
                                                      / got["rows"]["bytes_per_transition"], 3),
                        "add_cpu_frames_vs_rows": round(got["frames"]["add_us_per_transition"]
                                                        / got["rows"]["add_us_per_transition"], 2),
                        "sample_frames_vs_rows": round(got["frames"]["sample_ms"] / got["rows"]["sample_ms"], 2)}
    return emit({"bench": "replay_frames", "machine": platform.machine(), "python": platform.python_version(),
                 "torch": torch.__version__, "device": a.device, "sample_batch": a.sample_batch, "capacity": a.capacity, "agents": a.agents, "episode": a.episode,
                 "repeats": a.repeats, "results": results, "ratios": ratios}, a.out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
