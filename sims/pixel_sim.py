"""`simbridge-pixel-sim`: a visual reference task, Catch seen through a camera, as a simulator process.

A ball falls from the top row of a grid of cells, one row a step, in a column drawn at reset;
the paddle on the bottom row moves left, stays or moves right (actions 0, 1, 2). When the ball
reaches the bottom row the episode ends: +1 if the paddle is under it, -1 if not (bsuite's
Catch, Osband et al. 2019). The agent sees only a uint8 image: `--cells` x `--cells` cells of
`--cell-px` pixels, one channel, ball 255, paddle 128; HWC (20, 20, 1) by default, or
CHW with `--layout chw`. Every episode is `--cells` - 1 steps, and every ball can be caught.

The learner sees pixels only, so it needs a convolutional encoder (trainer/learners/encoders.py):
at 20x20 "auto" takes ML-Agents' "simple" CNN. A random policy scores about -0.5; one that
always catches scores 1.

    simbridge-pixel-sim --address 127.0.0.1:50051          # simbridge-sim's options, this env
    python -m simbridge.sims.pixel_sim --slots 4 --seed 0

The loop is simbridge-sim's (sims/gym_sim.py): this module registers the env and runs it.
"""
import argparse
import sys
from typing import Optional

import gymnasium as gym
import numpy as np

ENV_ID = "simbridge/PixelCatch-v0"
PROG = "simbridge-pixel-sim"
BALL, PADDLE = 255, 128


class PixelCatch(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, cells: int = 5, cell_px: int = 4, layout: str = "hwc"):
        if cells < 3 or cell_px < 1 or layout not in ("hwc", "chw"):
            raise ValueError("PixelCatch needs cells >= 3, cell_px >= 1 and layout 'hwc' or 'chw'")
        self.cells, self.px, self.layout = cells, cell_px, layout
        side = cells * cell_px
        shape = (side, side, 1) if layout == "hwc" else (1, side, side)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.ball_row = self.ball_col = self.paddle = 0

    def _image(self) -> np.ndarray:
        img = np.zeros((self.cells, self.cells), np.uint8)
        img[self.cells - 1, self.paddle] = PADDLE
        img[self.ball_row, self.ball_col] = BALL
        img = np.kron(img, np.ones((self.px, self.px), np.uint8))
        return img[:, :, None] if self.layout == "hwc" else img[None]

    def reset(self, *, seed: Optional[int] = None, options=None):
        super().reset(seed=seed)
        self.ball_row = 0
        self.ball_col = int(self.np_random.integers(self.cells))
        self.paddle = self.cells // 2
        return self._image(), {}

    def step(self, action):
        self.paddle = int(np.clip(self.paddle + int(action) - 1, 0, self.cells - 1))
        self.ball_row += 1
        done = self.ball_row == self.cells - 1
        reward = (1.0 if self.paddle == self.ball_col else -1.0) if done else 0.0
        return self._image(), reward, done, False, {}


def register(**kwargs) -> None:
    """(Re-)registers ENV_ID with these PixelCatch arguments."""
    gym.registry.pop(ENV_ID, None)
    gym.register(ENV_ID, entry_point=PixelCatch, kwargs=kwargs)


register()


def main(argv=None) -> int:
    from simbridge.sims import gym_sim
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, add_help=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-h", "--help", action="store_true", help="this help, then simbridge-sim's options")
    p.add_argument("--cells", type=int, default=5, help="grid side in cells (default: %(default)s)")
    p.add_argument("--cell-px", type=int, default=4, help="pixels per cell side (default: %(default)s)")
    p.add_argument("--layout", choices=("hwc", "chw"), default="hwc", help="image layout (default: %(default)s)")
    args, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.help:
        p.print_help()
        print("\nand simbridge-sim's options, but --env (this one runs PixelCatch):\n")
        return gym_sim.main(["--help"], prog=PROG)
    if any(a == "--env" or a.startswith("--env=") for a in rest):
        print(f"{PROG}: error: --env: this simulator runs PixelCatch ({ENV_ID}); for another env, run "
              f"simbridge-sim --env ENV", file=sys.stderr)
        return 2
    try:
        register(cells=args.cells, cell_px=args.cell_px, layout=args.layout)
        PixelCatch(args.cells, args.cell_px, args.layout)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return gym_sim.main(["--env", ENV_ID, *rest], prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
