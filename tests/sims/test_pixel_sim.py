"""simbridge-pixel-sim's task (sims/pixel_sim.py): what the camera shows and what the episode pays."""
import subprocess
import sys

import numpy as np
import pytest

from simbridge.sims.pixel_sim import BALL, PADDLE, PixelCatch


@pytest.mark.parametrize("layout, shape", [("hwc", (20, 20, 1)), ("chw", (1, 20, 20))])
def test_the_image_shows_the_ball_and_the_paddle_in_their_cells(layout, shape):
    env = PixelCatch(layout=layout)
    obs, _ = env.reset(seed=0)
    assert obs.shape == shape == env.observation_space.shape and obs.dtype == np.uint8
    img = obs[:, :, 0] if layout == "hwc" else obs[0]
    assert (img[0:4, 4 * env.ball_col:4 * env.ball_col + 4] == BALL).all()          # top row, its column
    assert (img[16:20, 8:12] == PADDLE).all()                                        # the paddle starts centred
    assert (img == 0).sum() == 400 - 32


def test_following_the_ball_catches_it_and_staying_away_misses():
    for seed in range(10):
        env = PixelCatch()
        env.reset(seed=seed)
        total, done, steps = 0.0, False, 0
        while not done:
            _, r, done, trunc, _ = env.step(1 + int(np.sign(env.ball_col - env.paddle)))
            total, steps = total + r, steps + 1
        assert total == 1.0 and steps == 4 and not trunc
        env.reset(seed=seed)
        away = 0 if env.ball_col > env.cells // 2 else 2
        total = sum(env.step(away)[1] for _ in range(4))
        assert total == -1.0


def test_bad_options_are_refused_with_the_fix():
    out = subprocess.run([sys.executable, "-m", "simbridge.sims.pixel_sim", "--cells", "2"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "cells >= 3" in out.stderr


def _pixel_sim(*args):
    return subprocess.run([sys.executable, "-m", "simbridge.sims.pixel_sim", *args], capture_output=True,
                          text=True, timeout=60)


def test_its_help_and_errors_are_its_own():
    """It runs simbridge-sim's loop, but its help shows what it is and its errors carry its name; an
    --env would have replaced PixelCatch without a word."""
    out = _pixel_sim("--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: simbridge-pixel-sim [-h]"), out.stdout[:300]
    assert "Catch seen through a camera" in out.stdout and "--slots" in out.stdout
    out = _pixel_sim("--env", "CartPole-v1")
    assert out.returncode == 2 and "runs PixelCatch" in out.stderr, out.stderr
    out = _pixel_sim("--slots", "0")
    assert out.returncode == 2 and out.stderr.startswith("simbridge-pixel-sim: error: --slots"), out.stderr
