"""Stable-Baselines3's VecEnv over a BridgeVectorEnv: SB3's algorithms learn from external simulators.

    from simbridge.trainer.adapters.vector_env import BridgeVectorEnv
    from simbridge.trainer.adapters.sb3 import SB3VecEnv
    venv = VecMonitor(SB3VecEnv(BridgeVectorEnv(8, obs_space, act_space)))
    PPO("MlpPolicy", venv).learn(100_000)

SB3's conventions, from gymnasium's SAME_STEP autoreset: `dones` is terminated | truncated;
an ended sub-environment's info holds `terminal_observation` (its last observation; the
returned one is already its next episode's first) and `TimeLimit.truncated` (truncated and not
terminated: SB3 bootstraps from the terminal observation then). Needs the `sb3` extra.
"""
from typing import Any, List, Optional, Sequence

import numpy as np

try:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv
except ModuleNotFoundError as e:   # the sb3 extra is optional
    if (e.name or "").partition(".")[0] != "stable_baselines3":
        raise
    raise ModuleNotFoundError("simbridge.trainer.adapters.sb3 needs Stable-Baselines3 (the sb3 extra): "
                              "pip install 'simbridge[sb3]'", name=e.name) from None

from simbridge.trainer.adapters.vector_env import BridgeVectorEnv
from simbridge.wire import tree


class SB3VecEnv(VecEnv):
    """A BridgeVectorEnv as SB3's VecEnv. The sub-environments live in other processes, so the
    attribute and method calls (get_attr, env_method, ...) reach the BridgeVectorEnv itself."""

    def __init__(self, venv: BridgeVectorEnv):
        self.venv = venv
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self._actions: Any = None

    def reset(self):
        """The first observations (SB3's seeds and options do not reach external simulators:
        they seed and reset themselves)."""
        obs, _ = self.venv.reset()
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self):
        obs, rewards, terminated, truncated, infos = self.venv.step(self._actions)
        self._actions = None
        dones = terminated | truncated
        out: List[dict] = [{} for _ in range(self.num_envs)]
        if dones.any():
            finals, has = infos.get("final_obs"), infos.get("_final_obs")
            for i in np.flatnonzero(dones).tolist():
                out[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
                if has is not None and has[i]:
                    out[i]["terminal_observation"] = finals[i]
                else:   # cannot happen from BridgeVectorEnv; kept for SB3's sake
                    out[i]["terminal_observation"] = tree.take(obs, i)
                end = infos.get("final_info", {}).get("simbridge_end")
                if end is not None and end[i] is not None:
                    out[i]["simbridge_end"] = end[i]
        return obs, rewards.astype(np.float32), dones, out

    def close(self) -> None:
        self.venv.close()

    # ---- the per-sub-environment calls SB3 makes: one BridgeVectorEnv answers for all

    def _n(self, indices) -> int:
        return len(self._get_indices(indices))

    def get_attr(self, attr_name: str, indices=None) -> List[Any]:
        return [getattr(self.venv, attr_name)] * self._n(indices)

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        setattr(self.venv, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> List[Any]:
        return [getattr(self.venv, method_name)(*method_args, **method_kwargs)] * self._n(indices)

    def env_is_wrapped(self, wrapper_class, indices=None) -> List[bool]:
        return [False] * self._n(indices)

    def get_images(self) -> Sequence[Optional[np.ndarray]]:
        return [None] * self.num_envs
