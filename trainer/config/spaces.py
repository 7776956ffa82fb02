"""The trainer config's space tables, both ways: `{ type = "Box", low = -1.0, high = 1.0, shape = [4] }`
<-> gymnasium spaces (Discrete, Box, MultiDiscrete, MultiBinary)."""
from typing import Any, Dict

import gymnasium as gym
import numpy as np

from simbridge.trainer.config.values import ConfigError, check_keys

SPACE_KEYS = {
    "Discrete": {"n", "start"},
    "Box": {"low", "high", "shape", "dtype"},
    "MultiDiscrete": {"nvec"},
    "MultiBinary": {"n"},
}


def space_from_table(raw, what: str) -> gym.Space:
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} must be a table, got {raw!r}")
    kind = raw.get("type")
    if kind not in SPACE_KEYS:
        raise ConfigError(f"{what}: type = {kind!r}: use one of {sorted(SPACE_KEYS)}, e.g. "
                          f"{{ type = \"Discrete\", n = 2 }}")
    check_keys(raw, SPACE_KEYS[kind] | {"type"}, what)
    try:
        if kind == "Discrete":
            return gym.spaces.Discrete(int(raw["n"]), start=int(raw.get("start", 0)))
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(np.asarray(raw["nvec"], np.int64))
        if kind == "MultiBinary":
            return gym.spaces.MultiBinary(raw["n"])
        dtype = np.dtype(raw.get("dtype", "float32"))
        shape = tuple(raw["shape"]) if "shape" in raw else None
        low, high = raw["low"], raw["high"]
        conv = (lambda v: np.asarray(v, dtype)) if shape is None else (lambda v: v)
        return gym.spaces.Box(low=conv(low), high=conv(high), shape=shape, dtype=dtype)
    except KeyError as e:
        raise ConfigError(f"{what}: {kind} needs {e.args[0]!r}") from None
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"{what}: not a valid {kind}: {e}") from None


def space_table(space: gym.Space) -> Dict[str, Any]:
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": space.n if isinstance(space.n, int) else list(space.n)}
    return {"type": "Box", "low": space.low.tolist(), "high": space.high.tolist(), "dtype": str(space.dtype)}
