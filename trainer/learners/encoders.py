"""Observation encoders: images through a convolutional network, vectors beside it.

Every learner's networks read observation *rows* (`obs_rows`): one row per agent step, the
observation flattened in its space's order (simbridge/wire/preprocess.py). What turns a row into
the features the MLP layers read is `Encoded`, built by `encoder_for`:

* No image in the space: no encoder at all. The MLP reads the flat float32 row, exactly as before
  encoders existed (same modules, same initialisation, same checkpoints).
* An image is a Box of rank 3. Its layout is read from its shape: the smaller of the first and
  the last dimension holds the channels, CHW when they are equal (1x12x12 and 4x84x84 are CHW;
  12x12x1 and 84x84x4 are HWC). A uint8 image is scaled to [0, 1] inside the network; a float
  image is used as it is (Unity's cameras already send [0, 1]).
* Each image goes through its own encoder; the other parts of the row (vectors, one-hot
  discrete parts, action masks) go beside the encoders' outputs, concatenated.

Rows keep the observation's bytes: when a part of the space is a uint8 image (a camera, a Dict
of a camera and joint states), rows are uint8, in the batches and in the replay buffer, and become
floats only inside the network (as Stable-Baselines3's CnnPolicy). In such a byte row every uint8
Box part is its bytes and every other part the bytes of its float32 values (4 a value, read back
as float32 inside the network), so a camera beside a vector costs a byte a pixel, not four
(`row_bytes` says what a row costs). Without a uint8 image, rows are float32 (the flat layout).
The encoder reads either layout by the rows' dtype: exports feed it the flat float32 rows.

The encoders are ML-Agents' (`vis_encode_type`, mlagents/trainers/torch_entities/encoders.py),
each with the smallest image side it takes (MIN_SIDE):
  "simple"          2 convolutions (8x8 stride 4, 4x4 stride 2), 20x20 and up
  "nature_cnn"      Mnih et al. 2015's 3 convolutions (the Atari DQN), 36x36 and up
  "resnet"          IMPALA's 3 stacks of conv, max-pool and 2 residual blocks, 15x15 and up
  "match3"          2 3x3 convolutions at stride 1 (board games' small grids), 5x5 and up
  "fully_connected" one dense layer on the pixels, any size
"auto" (the default) takes nature_cnn from 36x36, simple from 20x20, match3 from 5x5, else
fully_connected. Each encoder ends in a dense layer of `hidden[0]` units (ML-Agents' hidden
units), then the learner's MLP follows as for vectors.
"""
import logging
from typing import Any, Callable, List, Literal, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from simbridge.trainer.learners import splitk
from simbridge.wire.columns import NEW_OBS, OBS
from simbridge.wire.preprocess import flat_dim, flatten, image_layout

log = logging.getLogger("simbridge.trainer")

MIN_SIDE = {"simple": 20, "nature_cnn": 36, "resnet": 15, "match3": 5, "fully_connected": 1}
VIS_ENCODE_TYPES = ("auto", *MIN_SIDE)
AUTO_ORDER = ("nature_cnn", "simple", "match3", "fully_connected")   # the first whose minimum fits
VIS_ENCODE_TYPE = Literal[VIS_ENCODE_TYPES]   # the config key's type (checked when the config is read)


# ---------------------------------------------------------------- spaces

def is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3


def chw(shape) -> Tuple[int, int, int]:
    return tuple(int(s) for s in shape) if image_layout(shape) == "chw" else (int(shape[2]), int(shape[0]), int(shape[1]))


def leaves(space: gym.Space) -> List[gym.Space]:
    """The space's parts in flatten order."""
    if isinstance(space, gym.spaces.Dict):
        return [leaf for s in space.spaces.values() for leaf in leaves(s)]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for s in space.spaces for leaf in leaves(s)]
    return [space]


def has_images(space: gym.Space) -> bool:
    return any(is_image(s) for s in leaves(space))


def byte_rows(space: gym.Space) -> bool:
    """Whether rows keep the observation's bytes: one of its parts a uint8 image."""
    if isinstance(space, gym.spaces.Box):   # the common case, on every acting call: no lists
        return len(space.shape) == 3 and space.dtype == np.uint8
    return any(is_image(s) and s.dtype == np.uint8 for s in leaves(space))


def _is_bytes(leaf: gym.Space) -> bool:
    """A part kept as its bytes in a byte row; every other part is its float32 values' bytes."""
    return isinstance(leaf, gym.spaces.Box) and leaf.dtype == np.uint8


def _width(leaf: gym.Space, in_bytes: bool) -> int:
    """Bytes a value of `leaf` takes in a row: 1 for a uint8 part of a byte row, else 4 (float32)."""
    return 1 if in_bytes and _is_bytes(leaf) else 4


def row_bytes(space: gym.Space) -> int:
    """Bytes one observation row takes (in a batch, in the replay buffer)."""
    in_bytes = byte_rows(space)
    return sum(flat_dim(leaf) * _width(leaf, in_bytes) for leaf in leaves(space))


def byte_spans(space: gym.Space) -> List[Tuple[gym.Space, int, int]]:
    """Each part of a byte row's space with the bytes [first, end) it takes in a row, in order."""
    spans, first = [], 0
    for leaf in leaves(space):
        end = first + flat_dim(leaf) * _width(leaf, True)
        spans.append((leaf, first, end))
        first = end
    return spans


def obs_rows(space: gym.Space, value: Any) -> np.ndarray:
    """Batched observations -> rows (N, row width): bytes where byte_rows(space), else float32 (N, flat_dim)."""
    return _byte_rows(space, value) if byte_rows(space) else flatten(space, value)


def _byte_rows(space: gym.Space, value: Any) -> np.ndarray:
    if _is_bytes(space):
        v = np.asarray(value)
        return v.reshape(len(v), -1).astype(np.uint8, copy=False)
    if isinstance(space, gym.spaces.Dict):
        return np.concatenate([_byte_rows(s, value[k]) for k, s in space.spaces.items()], axis=1)
    if isinstance(space, gym.spaces.Tuple):
        return np.concatenate([_byte_rows(s, v) for s, v in zip(space.spaces, value)], axis=1)
    return np.ascontiguousarray(flatten(space, value), np.float32).view(np.uint8)


def replay_in_layout(space: gym.Space, state: dict) -> dict:
    """A replay buffer's saved state with its observation columns as rows of `space` are now: a
    checkpoint written before a camera beside other parts kept its bytes holds them as flat float32
    rows (exact: the pixels are whole numbers), which become byte rows here."""
    data = state["data"]
    if not byte_rows(space) or OBS not in data or data[OBS].dtype == torch.uint8:
        return state
    return {**state, "data": {**data, **{k: torch.from_numpy(_byte_rows_of_flat(space, data[k].numpy()))
                                         for k in (OBS, NEW_OBS) if k in data}}}


def _byte_rows_of_flat(space: gym.Space, rows: np.ndarray) -> np.ndarray:
    parts, start = [], 0
    for leaf in leaves(space):
        n = flat_dim(leaf)
        part = rows[:, start:start + n]
        parts.append(part.astype(np.uint8) if _is_bytes(leaf)
                     else np.ascontiguousarray(part, np.float32).view(np.uint8))
        start += n
    return np.concatenate(parts, axis=1)


def choose(vis_encode_type: str, shape, where: str = "the observation") -> str:
    """The encoder for an image of `shape`, or a ValueError naming the smallest size it takes."""
    if vis_encode_type not in VIS_ENCODE_TYPES:
        raise ValueError(f"vis_encode_type = {vis_encode_type!r}: use one of {list(VIS_ENCODE_TYPES)}")
    _, h, w = chw(shape)
    if vis_encode_type == "auto":
        return next(name for name in AUTO_ORDER if min(h, w) >= MIN_SIDE[name])
    need = MIN_SIDE[vis_encode_type]
    if min(h, w) < need:
        fits = [name for name in MIN_SIDE if min(h, w) >= MIN_SIDE[name]]
        raise ValueError(f"{where} is a {h}x{w} image ({image_layout(shape).upper()} {tuple(shape)}); "
                         f"vis_encode_type {vis_encode_type!r} needs at least {need}x{need}: send a larger "
                         f"image or set vis_encode_type to one of {fits} (or \"auto\")")
    return vis_encode_type


# ---------------------------------------------------------------- the encoders (ML-Agents')

def conv_side(side: int, kernel: int, stride: int = 1) -> int:
    return (side - kernel) // stride + 1


def dense(n_in: int, n_out: int) -> nn.Sequential:
    layer = splitk.Linear(n_in, n_out)
    nn.init.kaiming_normal_(layer.weight)   # ML-Agents: KaimingHeNormal, gain 1.41
    layer.weight.data.mul_(1.41)
    nn.init.zeros_(layer.bias)
    return nn.Sequential(nn.Flatten(), layer, nn.LeakyReLU())


def convs(c: int, h: int, w: int, spec) -> Tuple[nn.Sequential, int]:
    """Conv2d + LeakyReLU per (channels, kernel, stride) of spec; (module, flat outputs)."""
    layers: List[nn.Module] = []
    for out, k, s in spec:
        layers += [nn.Conv2d(c, out, k, s), nn.LeakyReLU()]
        c, h, w = out, conv_side(h, k, s), conv_side(w, k, s)
    return nn.Sequential(*layers), c * h * w


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class ResBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.layers = nn.Sequential(Swish(), nn.Conv2d(c, c, 3, 1, padding=1), Swish(), nn.Conv2d(c, c, 3, 1, padding=1))

    def forward(self, x):
        return x + self.layers(x)


def resnet(c: int, h: int, w: int) -> Tuple[nn.Sequential, int]:
    layers: List[nn.Module] = []
    for out in (16, 32, 32):
        layers += [nn.Conv2d(c, out, 3, 1, padding=1), nn.MaxPool2d(3, 2), ResBlock(out), ResBlock(out)]
        c, h, w = out, conv_side(h, 3, 2), conv_side(w, 3, 2)
    layers.append(Swish())
    return nn.Sequential(*layers), c * h * w


def image_encoder(kind: str, c: int, h: int, w: int, size: int) -> nn.Sequential:
    """(N, C, H, W) floats -> (N, size)."""
    if kind == "simple":
        body, flat = convs(c, h, w, [(16, 8, 4), (32, 4, 2)])
    elif kind == "nature_cnn":
        body, flat = convs(c, h, w, [(32, 8, 4), (64, 4, 2), (64, 3, 1)])
    elif kind == "match3":
        body, flat = convs(c, h, w, [(35, 3, 1), (144, 3, 1)])
    elif kind == "resnet":
        body, flat = resnet(c, h, w)
    else:
        body, flat = nn.Sequential(), c * h * w
    return nn.Sequential(body, dense(flat, size))


def _float32(rows: torch.Tensor, start: int, stop: int, width: int) -> torch.Tensor:
    """Columns [start, stop) of byte rows as floats: bytes as they are (width 1), or the float32
    values whose bytes they are (width 4)."""
    part = rows[:, start:stop]
    # clone, not contiguous(): one row's slice is "contiguous" already, and a dtype view needs its
    # storage offset and row stride in whole float32s, which only a copy of its own has
    return part.float() if width == 1 else part.clone(memory_format=torch.contiguous_format).view(torch.float32)


class ImagePart(nn.Module):
    """An image's columns of a row ([start, stop) of a flat float row, [byte_start, byte_stop) of a
    byte row) through its encoder."""

    def __init__(self, space: gym.spaces.Box, start: int, byte_start: int, width: int, kind: str, size: int):
        super().__init__()
        self.start, self.stop = start, start + flat_dim(space)
        self.byte_start, self.byte_stop, self.width = byte_start, byte_start + flat_dim(space) * width, width
        self.shape = tuple(int(s) for s in space.shape)
        self.hwc = image_layout(space.shape) == "hwc"
        self.scale = 1.0 / 255.0 if space.dtype == np.uint8 else 1.0
        self.kind = kind
        self.encoder = image_encoder(kind, *chw(space.shape), size)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.dtype == torch.uint8:
            x = _float32(rows, self.byte_start, self.byte_stop, self.width)
        else:
            x = rows[:, self.start:self.stop].float()
        x = x.reshape(-1, *self.shape)
        if self.hwc:
            x = x.permute(0, 3, 1, 2)
        return self.encoder(x * self.scale)


class ObsEncoder(nn.Module):
    """Observation rows, bytes (N, row_bytes) or flat float32 (N, flat_dim) -> features (N,
    out_dim) float32: each image through its encoder, the other columns as they are, in the
    space's order."""

    def __init__(self, space: gym.Space, vis_encode_type: str, size: int):
        super().__init__()
        self.images = nn.ModuleList()
        # column ranges beside the images: (start, stop) of a flat row, (start, stop, width) of a byte row
        self.vectors: List[Tuple[int, int]] = []
        self.byte_vectors: List[Tuple[int, int, int]] = []
        parts, in_bytes = leaves(space), byte_rows(space)
        start, byte_start, self.out_dim = 0, 0, 0
        for i, leaf in enumerate(parts):
            n = flat_dim(leaf)
            width = _width(leaf, in_bytes)
            if is_image(leaf):
                kind = choose(vis_encode_type, leaf.shape, f"observation part {i}" if len(parts) > 1
                              else "the observation")
                self.images.append(ImagePart(leaf, start, byte_start, width, kind, size))
                self.out_dim += size
            else:
                self.out_dim += n
                if self.vectors and self.vectors[-1][1] == start:
                    self.vectors[-1] = (self.vectors[-1][0], start + n)
                else:
                    self.vectors.append((start, start + n))
                last = self.byte_vectors[-1] if self.byte_vectors else None
                if last and last[1] == byte_start and last[2] == width:
                    self.byte_vectors[-1] = (last[0], byte_start + n * width, width)
                else:
                    self.byte_vectors.append((byte_start, byte_start + n * width, width))
            start, byte_start = start + n, byte_start + n * width

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.dtype == torch.uint8:
            vectors = [_float32(rows, a, b, w) for a, b, w in self.byte_vectors]
        else:
            rows = rows.float()
            vectors = [rows[:, a:b] for a, b in self.vectors]
        parts = [part(rows) for part in self.images] + vectors
        return torch.cat(parts, -1) if len(parts) > 1 else parts[0]

    def describe(self) -> str:
        return ", ".join(f"{'x'.join(map(str, p.shape))} {'uint8' if p.scale != 1.0 else 'float'} image through "
                         f"{p.kind}" for p in self.images)


class Encoded(nn.Module):
    """`mlp` reading the features of `encoder` instead of the rows. The MLP's attributes read
    through (DQN's export reads q.body, PPO's acting reads policy.log_std), and arguments after
    the rows pass on (SAC's critic takes the actions too)."""

    def __init__(self, encoder: ObsEncoder, mlp: nn.Module):
        super().__init__()
        self.encoder, self.mlp = encoder, mlp

    def forward(self, rows: torch.Tensor, *args, **kwargs):
        if kwargs.get("detach_params"):   # SAC's actor loss: no gradient for the critic's encoder
            with torch.no_grad():
                features = self.encoder(rows)
        else:
            features = self.encoder(rows)
        return self.mlp(features, *args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("mlp"), name)


def encoder_for(space: gym.Space, config: dict) -> Optional[ObsEncoder]:
    """The encoder a learner with `config` puts before its MLP for `space`; None without images."""
    if not has_images(space):
        if config.get("vis_encode_type", "auto") not in VIS_ENCODE_TYPES:
            choose(config["vis_encode_type"], (1, 1, 1))   # the error naming the choices
        return None
    return ObsEncoder(space, config.get("vis_encode_type", "auto"), int(config["hidden"][0]))


def feature_dim(space: gym.Space, encoder: Optional[ObsEncoder]) -> int:
    return flat_dim(space) if encoder is None else encoder.out_dim


def wrap(encoder: Optional[ObsEncoder], net: nn.Module) -> nn.Module:
    return net if encoder is None else Encoded(encoder, net)


def network(space: gym.Space, config: dict, make: Callable[[int], nn.Module]) -> nn.Module:
    """make(features) -> the learner's MLP, behind the encoder for `space` when it has images (its
    own encoder: each call builds one)."""
    enc = encoder_for(space, config)
    return wrap(enc, make(feature_dim(space, enc)))


def _meta_encoder(space: gym.Space, config: dict) -> Optional[ObsEncoder]:
    with torch.device("meta"):   # sizes only: no memory, no draws from torch's random generator
        return encoder_for(space, config)


def feature_count(space: gym.Space, config: dict) -> int:
    """What the MLP after the encoder reads per row (flat_dim without images)."""
    return feature_dim(space, _meta_encoder(space, config))


def encoder_params(space: gym.Space, config: dict) -> int:
    """Parameters of the encoder for `space` (0 without images), for memory estimates."""
    enc = _meta_encoder(space, config)
    return 0 if enc is None else sum(p.numel() for p in enc.parameters())


def say_cost(learner: type, space: gym.Space, action_space: gym.Space, config: dict, store: str = "") -> None:
    """Logs, for a space with images, the encoders chosen and the memory the learner's rows take
    (store: how its replay keeps them, said after the bytes per transition)."""
    enc = _meta_encoder(space, config)
    if enc is None:
        return
    est = learner.memory_estimate(space, action_space, config)
    log.info("%s: %s; one observation is %s bytes (%s rows), %s per transition%s: replay %.1f MiB, "
             "networks %.1f MiB", learner.__name__, enc.describe(), f"{row_bytes(space):,}",
             "uint8" if byte_rows(space) else "float32", f"{est['transition']:,} bytes",
             store, est["replay"] / 2**20, est["networks"] / 2**20)
