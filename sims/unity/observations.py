"""AgentInfoProtos -> DecisionSteps / TerminalSteps, for either visual layout.

mlagents-envs 0.28.0 decodes a PNG observation as height x width x channels and
compares it with the shape the build declared. Builds with com.unity.ml-agents
3.x declare cameras channels-first (`ObservationSpec.Visual(channels, height,
width)`), so 0.28.0 fails on every PNG camera of a 3.x build. Here the layout
of each rank-3 observation is read from its dimension properties (3.x: NONE,
TRANSLATIONAL_EQUIVARIANCE, TRANSLATIONAL_EQUIVARIANCE; 2.x: the channel last),
or from the package version when a build sends none, and the decoded image is
put into the declared layout. Float (uncompressed) observations are the
declared shape already.

Observations are delivered in the layout the build declares: CHW from a 3.x
build, HWC from an older one.

PNG payloads may hold several images back to back (more than 3 channels):
they are split by walking the PNG chunk structure, not by searching for the
signature (which may occur inside compressed data).
"""
import io
import itertools
import struct
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from mlagents_envs.base_env import BehaviorSpec, DecisionSteps, DimensionProperty, TerminalSteps
from mlagents_envs.communicator_objects.observation_pb2 import NONE as COMPRESSION_NONE
from mlagents_envs.exception import UnityObservationException

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHW, HWC = "CHW", "HWC"

_TE = DimensionProperty.TRANSLATIONAL_EQUIVARIANCE


def package_major(version: Optional[str]) -> Optional[int]:
    """3 for "3.0.0" or "3.0.0-exp.1"; None when unknown."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def visual_layout(dimension_property: Sequence[int], package_version: Optional[str]) -> str:
    """CHW or HWC for a rank-3 observation."""
    props = tuple(int(p) for p in dimension_property)
    if len(props) == 3:
        if props[1] & _TE and props[2] & _TE and not props[0] & _TE:
            return CHW
        if props[0] & _TE and props[1] & _TE and not props[2] & _TE:
            return HWC
    major = package_major(package_version)
    # Release 21 (3.0.0-exp.1) made cameras channels-first; builds that old declare no properties.
    return CHW if major is not None and major >= 3 else HWC


def split_pngs(data: bytes) -> List[bytes]:
    """The PNG files concatenated in `data` (Unity sends one per 3 channels)."""
    out, pos, n = [], 0, len(data)
    while pos < n:
        if data[pos:pos + 8] != PNG_SIGNATURE:
            raise UnityObservationException(f"compressed observation: no PNG signature at byte {pos}")
        end = pos + 8
        while True:
            if end + 8 > n:
                raise UnityObservationException("compressed observation: a PNG ends before its IEND chunk")
            length, kind = struct.unpack_from(">I4s", data, end)
            end += 12 + length  # length, type, data, crc
            if kind == b"IEND":
                break
        out.append(data[pos:end])
        pos = end
    return out


def _png_channels(png: bytes) -> np.ndarray:
    """One PNG -> uint8 (H, W, c)."""
    img = Image.open(io.BytesIO(png))
    if img.mode not in ("L", "LA", "RGB", "RGBA"):
        img = img.convert("RGB")
    arr = np.asarray(img, dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


def decode_png(data: bytes, shape: Tuple[int, int, int], layout: str, mapping: Sequence[int]) -> np.ndarray:
    """Concatenated PNGs -> float32 in [0, 1], shaped `shape` (which is in `layout`)."""
    channels = shape[0] if layout == CHW else shape[2]
    images = [_png_channels(p) for p in split_pngs(bytes(data))]
    if len({im.shape[:2] for im in images}) != 1:
        raise UnityObservationException("compressed observation: its PNGs differ in size")
    stacked = np.concatenate(images, axis=2).astype(np.float32) / 255.0  # (H, W, all channels)
    if len(mapping):
        if len(mapping) != stacked.shape[2]:
            raise UnityObservationException(
                f"compressed observation: channel mapping of {len(mapping)} entries for "
                f"{stacked.shape[2]} decoded channels")
        # Channels mapped to the same index are averaged (stacked grayscale); -1 drops padding.
        maps = np.asarray(mapping)
        hwc = np.stack([stacked[:, :, maps == j].mean(axis=2) for j in range(channels)], axis=2)
    elif channels == 1 and images[0].shape[2] >= 3:
        hwc = stacked[:, :, :3].mean(axis=2, keepdims=True)  # a grayscale camera arrives as RGB
    else:
        hwc = stacked[:, :, :channels]
    out = hwc.transpose(2, 0, 1) if layout == CHW else hwc
    if out.shape != tuple(shape):
        raise UnityObservationException(
            f"compressed observation decoded to {out.shape} ({layout}) but the build declared {tuple(shape)}")
    return out


class ObservationDecoder:
    """Decodes one behavior's observations; layouts are fixed per observation index."""

    def __init__(self, behavior_name: str, spec: BehaviorSpec, package_version: Optional[str]):
        self.name = behavior_name
        self.spec = spec
        self.shapes = [tuple(o.shape) for o in spec.observation_specs]
        self.layouts = [visual_layout(o.dimension_property, package_version) if len(o.shape) == 3 else None
                        for o in spec.observation_specs]
        self.branches = tuple(spec.action_spec.discrete_branches)

    def observations(self, infos: Sequence, k: int) -> np.ndarray:
        """Observation k of every agent in `infos`, float32 (n, *shape)."""
        shape = self.shapes[k]
        n = len(infos)
        if n == 0:
            return np.zeros((0,) + shape, np.float32)
        protos = [info.observations[k] for info in infos]
        for p in protos:
            if tuple(p.shape) != shape:
                raise UnityObservationException(
                    f"behavior {self.name!r}: observation {k} has shape {tuple(p.shape)}, its spec says {shape}")
        if all(p.compression_type == COMPRESSION_NONE for p in protos):
            size = int(np.prod(shape))
            flat = np.fromiter(itertools.chain.from_iterable(p.float_data.data for p in protos),
                               np.float32, n * size)
            out = flat.reshape((n,) + shape)
        else:
            out = np.stack([self._one(p, shape, k) for p in protos])
        if not np.isfinite(out).all():
            bad = int(np.flatnonzero(~np.isfinite(out.reshape(n, -1)).all(axis=1))[0])
            raise UnityObservationException(
                f"behavior {self.name!r}: agent {infos[bad].id} sent a NaN or infinite value in observation {k}")
        return out

    def _one(self, proto, shape, k) -> np.ndarray:
        if proto.compression_type == COMPRESSION_NONE:
            return np.asarray(proto.float_data.data, np.float32).reshape(shape)
        if len(shape) != 3:
            raise UnityObservationException(f"behavior {self.name!r}: compressed observation {k} is not rank 3")
        return decode_png(proto.compressed_data, shape, self.layouts[k], proto.compressed_channel_mapping)

    def action_masks(self, infos: Sequence) -> Optional[np.ndarray]:
        """bool (n, sum(branches)), True = masked (as on the wire); None when no agent sent a mask."""
        total = int(sum(self.branches))
        if not total or not any(len(i.action_mask) for i in infos):
            return None
        masked = np.zeros((len(infos), total), bool)
        for row, info in enumerate(infos):
            if len(info.action_mask) == total:
                masked[row] = np.fromiter(info.action_mask, bool, total)
        return masked

    def steps(self, infos: Iterable) -> Tuple[DecisionSteps, TerminalSteps]:
        infos = list(infos)
        deciding = [i for i in infos if not i.done]
        ending = [i for i in infos if i.done]
        n_obs = len(self.shapes)

        def scalars(group, field, dtype):
            return np.fromiter((getattr(i, field) for i in group), dtype, len(group))

        masked = self.action_masks(deciding)
        split = None
        if masked is not None:
            split = np.split(masked, np.cumsum(self.branches)[:-1], axis=1)
        decision = DecisionSteps([self.observations(deciding, k) for k in range(n_obs)],
                                 self._rewards(deciding, "reward"), scalars(deciding, "id", np.int32), split,
                                 scalars(deciding, "group_id", np.int32), self._rewards(deciding, "group_reward"))
        terminal = TerminalSteps([self.observations(ending, k) for k in range(n_obs)],
                                 self._rewards(ending, "reward"), scalars(ending, "max_step_reached", bool),
                                 scalars(ending, "id", np.int32), scalars(ending, "group_id", np.int32),
                                 self._rewards(ending, "group_reward"))
        return decision, terminal

    def _rewards(self, group, field) -> np.ndarray:
        r = np.fromiter((getattr(i, field) for i in group), np.float32, len(group))
        if not np.isfinite(r).all():
            bad = group[int(np.flatnonzero(~np.isfinite(r))[0])]
            raise UnityObservationException(f"behavior {self.name!r}: agent {bad.id} sent a {field} of "
                                            f"{getattr(bad, field)}")
        return r
