"""A Unity BehaviorSpec as gymnasium spaces, and values across the two.

Observations:
  * one observation, no action masks: Box(-inf, inf, shape, float32). Unity
    declares no bounds. Rank-3 (visual) observations keep the layout the build
    declares (CHW from package 3.x); a camera's values, k/255 in [0, 1] (8-bit
    pixels, PNG on the wire), are sent as its bytes: Box(0, 255, shape, uint8),
    a quarter of the floats' size in messages and in the trainer's replay
    (camera_dtype "float32": as floats in [0, 1]).
  * otherwise a Dict: "obs_0", "obs_1", ... in the build's sensor order, plus
    "action_mask" when the behavior uses masks.
  * "action_mask" is MultiBinary(sum(branches)), all branches side by side,
    1 = the action is ALLOWED (gymnasium's convention; Unity's wire says
    true = masked, and is flipped here).
Actions:
  * continuous only: Box(-1, 1, (c,), float32)
  * discrete only: Discrete(n) for one branch, MultiDiscrete(branches) for more
  * hybrid: Dict{"continuous": Box, "discrete": Discrete | MultiDiscrete}
Continuous actions are clipped to [-1, 1] before they go to Unity.
"""
from dataclasses import dataclass
from typing import Any, List, Optional

import gymnasium as gym
import numpy as np

from mlagents_envs.base_env import ActionTuple, BehaviorSpec
from mlagents_envs.exception import UnityObservationException

MASK_KEY = "action_mask"
CONTINUOUS_KEY = "continuous"
DISCRETE_KEY = "discrete"


def obs_key(k: int) -> str:
    return f"obs_{k}"


def _discrete_space(branches) -> gym.Space:
    if len(branches) == 1:
        return gym.spaces.Discrete(int(branches[0]))
    return gym.spaces.MultiDiscrete(np.asarray(branches, np.int64))


@dataclass
class BehaviorSpaces:
    observation_space: gym.Space
    action_space: gym.Space
    n_obs: int
    continuous_size: int
    branches: tuple
    with_mask: bool
    byte_sensors: tuple = ()   # the sensors sent as bytes (cameras, camera_dtype "uint8")

    @property
    def as_dict(self) -> bool:
        return isinstance(self.observation_space, gym.spaces.Dict)

    # ------------------------------------------------------------ observations

    def observations(self, obs_list: List[np.ndarray], masked: Optional[np.ndarray]) -> Any:
        """Batched observation value: obs_list as DecisionSteps/TerminalSteps hold it (one float32
        (n, *shape) array per sensor); masked is bool (n, sum(branches)), True = masked, or None."""
        if self.byte_sensors:
            obs_list = [camera_bytes(o, k) if k in self.byte_sensors else o for k, o in enumerate(obs_list)]
        if not self.as_dict:
            return obs_list[0]
        value = {obs_key(k): o for k, o in enumerate(obs_list)}
        if self.with_mask:
            n = len(obs_list[0]) if obs_list else 0
            if masked is None:
                value[MASK_KEY] = np.ones((n, int(sum(self.branches))), np.int8)
            else:
                value[MASK_KEY] = (~masked).astype(np.int8)
        return value

    # ------------------------------------------------------------ actions

    def action_tuple(self, actions: Any, n: int) -> ActionTuple:
        """A batch of actions of action_space -> ActionTuple for set_actions."""
        cont = disc = None
        if self.continuous_size and self.branches:
            cont, disc = actions[CONTINUOUS_KEY], actions[DISCRETE_KEY]
        elif self.continuous_size:
            cont = actions
        elif self.branches:
            disc = actions
        out = ActionTuple()
        if cont is not None:
            out.add_continuous(np.clip(np.asarray(cont, np.float32).reshape(n, self.continuous_size), -1.0, 1.0))
        if disc is not None:
            out.add_discrete(np.asarray(disc).astype(np.int32).reshape(n, len(self.branches)))
        return out


CAMERA_DTYPES = ("uint8", "float32")


def camera_bytes(values: np.ndarray, k: int) -> np.ndarray:
    """A camera's values as its uint8 pixels: k/255 in [0, 1] as Unity's PNG decodes to, or a
    grayscale camera's mean of three 8-bit channels, (r + g + b)/765 (ML-Agents' grayscale,
    compressed or not), rounded to the nearest level. A UnityObservationException for anything else
    (a sensor of floats, NaN)."""
    v = np.asarray(values, np.float32)
    thirds = v * np.float32(765.0)
    if v.size and not (np.abs(thirds - np.rint(thirds)).max() <= 1e-2 and v.min() >= 0 and v.max() <= 1):
        raise UnityObservationException(
            f"observation {k} is rank 3 but its values are not 8-bit pixels (k/255 in [0, 1], or a "
            f"grayscale mean of three): a sensor of floats; run the connector with --camera-dtype float32")
    return np.rint(v * np.float32(255.0)).astype(np.uint8)


def behavior_spaces(spec: BehaviorSpec, with_mask: bool = False, camera_dtype: str = "uint8") -> BehaviorSpaces:
    """The spaces of one behavior; with_mask adds "action_mask" (only for discrete branches);
    camera_dtype "uint8" declares rank-3 observations as their bytes."""
    branches = tuple(int(b) for b in spec.action_spec.discrete_branches)
    with_mask = bool(with_mask and branches)
    shapes = [tuple(o.shape) for o in spec.observation_specs]
    byte_sensors = tuple(k for k, shape in enumerate(shapes) if len(shape) == 3 and camera_dtype == "uint8")
    sensors = [gym.spaces.Box(0, 255, shape, np.uint8) if k in byte_sensors
               else gym.spaces.Box(-np.inf, np.inf, shape, np.float32) for k, shape in enumerate(shapes)]
    if len(sensors) == 1 and not with_mask:
        obs_space: gym.Space = sensors[0]
    else:
        parts = {obs_key(k): s for k, s in enumerate(sensors)}
        if with_mask:
            parts[MASK_KEY] = gym.spaces.MultiBinary(int(sum(branches)))
        obs_space = gym.spaces.Dict(parts)
    c = int(spec.action_spec.continuous_size)
    cont_space = gym.spaces.Box(-1.0, 1.0, (c,), np.float32)
    if c and branches:
        act_space: gym.Space = gym.spaces.Dict({CONTINUOUS_KEY: cont_space, DISCRETE_KEY: _discrete_space(branches)})
    elif branches:
        act_space = _discrete_space(branches)
    else:
        act_space = cont_space  # also a behavior without actions: Box of shape (0,)
    return BehaviorSpaces(obs_space, act_space, len(sensors), c, branches, with_mask, byte_sensors)
