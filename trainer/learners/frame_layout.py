"""Where a camera's frames lie in an observation row: the Layout frame_replay.py keeps them by.

A row (encoders.py's byte rows) holds the image's bytes at [first, end), the other parts around
them. The image stacks `stack` frames of `channels` channels each: channels first, a frame's bytes
are contiguous in the row; channels last, a stacked image's frames interleave pixel by pixel and are
taken apart (split) and put back (join) by a transpose. A channels-first image with no stack
declared is `guessed` until its first rows show whether it is a stack the simulator made (`decided`).
"""
import dataclasses
import logging
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import numpy as np
import torch

from simbridge.trainer.learners import encoders
from simbridge.wire.preprocess import image_layout

log = logging.getLogger("simbridge.trainer")


@dataclass(frozen=True)
class Layout:
    """Where the image lies in an observation row, and the frames it stacks."""
    first: int     # the image's bytes in a row: [first, end)
    end: int
    width: int     # a row's bytes
    stack: int     # frames the image stacks (frame_stack; 1 unstacked)
    pixels: int    # H * W
    channels: int  # a frame's channels
    hwc: bool      # channels last: a stacked frame's bytes are strided in the row
    guessed: bool = False   # channels first, no stack declared: the first rows added decide (`decided`)

    @property
    def frame(self) -> int:
        """Bytes a frame: all its channels."""
        return self.pixels * self.channels

    def image(self, rows: np.ndarray) -> np.ndarray:
        """(n, width) rows -> their image's bytes (n, stack * frame), a view."""
        return np.asarray(rows)[:, self.first:self.end]

    def split(self, rows: np.ndarray) -> np.ndarray:
        """(n, width) rows -> their image's frames (n, stack, frame), contiguous."""
        img = self.image(rows)
        if self.hwc and self.stack > 1:   # (H * W, k, c) -> (k, H * W, c)
            img = img.reshape(len(img), self.pixels, self.stack, self.channels).transpose(0, 2, 1, 3)
        return np.ascontiguousarray(img).reshape(len(img), self.stack, self.frame)

    def rest(self, rows: np.ndarray) -> Optional[np.ndarray]:
        """The bytes of the rows' other parts, or None when the image is the whole row."""
        if self.first == 0 and self.end == self.width:
            return None
        rows = np.asarray(rows)
        return np.concatenate([rows[:, :self.first], rows[:, self.end:]], axis=1)

    def join(self, frames: torch.Tensor, rest: Optional[torch.Tensor]) -> torch.Tensor:
        """split and rest undone: (n, frames, frame) and the rest -> (n, width) rows."""
        n = frames.shape[0]
        if self.hwc and self.stack > 1 and frames.device.type == "cpu":
            # frame by frame into the interleaved layout: 3x faster on the CPU than one transposed copy
            img = frames.new_empty((n, self.pixels, self.stack, self.channels))
            for j in range(self.stack):
                img[:, :, j] = frames[:, j].view(n, self.pixels, self.channels)
            frames = img
        elif self.hwc and self.stack > 1:   # one kernel on a GPU
            frames = frames.reshape(n, self.stack, self.pixels, self.channels).transpose(1, 2)
        img = frames.reshape(n, self.stack * self.frame)
        if rest is None:
            return img
        return torch.cat([rest[:, :self.first], img, rest[:, self.first:]], dim=1)


def layout(space: gym.Space, frame_stack: int = 1) -> Optional[Layout]:
    """The Layout of rows of `space` whose image stacks `frame_stack` frames (none stacked where its
    channels are no multiple of it); None where frames do not apply (no uint8 image, or several).
    Channels first and no stack declared, the first rows added decide (`decided`)."""
    if not encoders.byte_rows(space):
        return None
    spans = encoders.byte_spans(space)
    images = [(leaf, a, b) for leaf, a, b in spans if encoders.is_image(leaf) and leaf.dtype == np.uint8]
    if len(images) != 1:
        return None
    leaf, first, end = images[0]
    c, h, w = encoders.chw(leaf.shape)
    hwc = image_layout(leaf.shape) == "hwc"
    k = frame_stack if frame_stack >= 1 and c % frame_stack == 0 else 1
    return Layout(first, end, spans[-1][2], k, h * w, c // k, hwc, guessed=k == 1 and not hwc and c > 1)


def decided(lay: Layout, obs: np.ndarray, new: np.ndarray) -> Layout:
    """A channels-first image with no stack declared, once rows show what it is: a stack the
    simulator made (Atari's (4, 84, 84): every row's new_obs is its obs shifted by a channel), each
    channel a frame; else (a colour camera's (3, 84, 84)) the image one frame."""
    if not lay.guessed:
        return lay
    c = lay.channels
    planes = (lay.image(obs).reshape(len(obs), c, -1), lay.image(new).reshape(len(new), c, -1))
    if np.array_equal(planes[1][:, :c - 1], planes[0][:, 1:]):
        log.info("replay: the %d channels of each observation are a stack of frames (each new_obs is "
                 "its obs shifted by one): each kept once", c)
        return outcomes(lay)[1]
    return outcomes(lay)[0]


def outcomes(lay: Layout) -> tuple:
    """The layouts `lay` is or may become once decided."""
    if not lay.guessed:
        return (lay,)
    return (dataclasses.replace(lay, guessed=False),
            dataclasses.replace(lay, stack=lay.channels, channels=1, guessed=False))
