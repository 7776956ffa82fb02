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

Rows keep the observation's bytes: when every part of the space is a uint8 Box (a camera, a
Dict of cameras), rows are uint8, in the batches and in the replay buffer, and become floats
only inside the network (as Stable-Baselines3's CnnPolicy). A space that mixes uint8 images
with other parts gives float32 rows (four bytes per pixel: `row_bytes` says what a row costs).

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
    """Whether rows keep the observation as uint8: every part a uint8 Box, one of them an image."""
    if isinstance(space, gym.spaces.Box):   # the common case, on every acting call: no lists
        return len(space.shape) == 3 and space.dtype == np.uint8
    parts = leaves(space)
    return (any(is_image(s) for s in parts)
            and all(isinstance(s, gym.spaces.Box) and s.dtype == np.uint8 for s in parts))


def row_bytes(space: gym.Space) -> int:
    """Bytes one observation row takes (in a batch, in the replay buffer)."""
    return flat_dim(space) * (1 if byte_rows(space) else 4)


def obs_rows(space: gym.Space, value: Any) -> np.ndarray:
    """Batched observations -> rows (N, flat_dim): uint8 where byte_rows(space), float32 otherwise."""
    return _byte_rows(space, value) if byte_rows(space) else flatten(space, value)


def _byte_rows(space: gym.Space, value: Any) -> np.ndarray:
    if isinstance(space, gym.spaces.Box):
        v = np.asarray(value)
        return v.reshape(len(v), -1).astype(np.uint8, copy=False)
    if isinstance(space, gym.spaces.Dict):
        return np.concatenate([_byte_rows(s, value[k]) for k, s in space.spaces.items()], axis=1)
    return np.concatenate([_byte_rows(s, v) for s, v in zip(space.spaces, value)], axis=1)


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


class ImagePart(nn.Module):
    """Columns [start, stop) of a row, as an image, through its encoder."""

    def __init__(self, space: gym.spaces.Box, start: int, kind: str, size: int):
        super().__init__()
        self.start, self.stop = start, start + flat_dim(space)
        self.shape = tuple(int(s) for s in space.shape)
        self.hwc = image_layout(space.shape) == "hwc"
        self.scale = 1.0 / 255.0 if space.dtype == np.uint8 else 1.0
        self.kind = kind
        self.encoder = image_encoder(kind, *chw(space.shape), size)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        x = rows[:, self.start:self.stop].reshape(-1, *self.shape)
        if self.hwc:
            x = x.permute(0, 3, 1, 2)
        return self.encoder(x * self.scale)


class ObsEncoder(nn.Module):
    """Observation rows (N, flat_dim), uint8 or float -> features (N, out_dim) float32: each image
    through its encoder, the other columns as they are, in the space's order."""

    def __init__(self, space: gym.Space, vis_encode_type: str, size: int):
        super().__init__()
        self.images = nn.ModuleList()
        self.vectors: List[Tuple[int, int]] = []   # column ranges beside the images
        start, self.out_dim = 0, 0
        for i, leaf in enumerate(leaves(space)):
            n = flat_dim(leaf)
            if is_image(leaf):
                kind = choose(vis_encode_type, leaf.shape, f"observation part {i}" if len(leaves(space)) > 1
                              else "the observation")
                self.images.append(ImagePart(leaf, start, kind, size))
                self.out_dim += size
            elif self.vectors and self.vectors[-1][1] == start:
                self.vectors[-1] = (self.vectors[-1][0], start + n)
                self.out_dim += n
            else:
                self.vectors.append((start, start + n))
                self.out_dim += n
            start += n

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.float()
        parts = [part(rows) for part in self.images] + [rows[:, a:b] for a, b in self.vectors]
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


def say_cost(learner: type, space: gym.Space, action_space: gym.Space, config: dict) -> None:
    """Logs, for a space with images, the encoders chosen and the memory the learner's rows take."""
    enc = _meta_encoder(space, config)
    if enc is None:
        return
    est = learner.memory_estimate(space, action_space, config)
    log.info("%s: %s; one observation is %s bytes (%s rows), %s per transition: replay %.1f MiB, "
             "networks %.1f MiB", learner.__name__, enc.describe(), f"{row_bytes(space):,}",
             "uint8" if byte_rows(space) else "float32", f"{est['transition']:,} bytes",
             est["replay"] / 2**20, est["networks"] / 2**20)
