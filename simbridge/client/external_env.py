"""ExternalEnv / ExternalMultiAgentEnv: the simulator's side, as in RLlib.

Subclass, write `run()` with your simulator's own loop, and call
`self.start_episode()`, `self.get_action()`, `self.log_returns()`, ... from it.
`run()` executes on its own thread (start() / join()), or call it directly.
Unlike RLlib's, these live in the simulator's process and talk to a simbridge
server over gRPC, so the trainer never imports your simulator.
"""
import threading
from typing import Optional

import gymnasium as gym

from simbridge.client.policy_client import MultiAgentPolicyClient, PolicyClient


class ExternalEnv(threading.Thread):
    def __init__(self, action_space: gym.Space, observation_space: gym.Space,
                 address: str = "127.0.0.1:50051", **client_kwargs):
        super().__init__(daemon=True, name=type(self).__name__)
        self.action_space = action_space
        self.observation_space = observation_space
        self.address = address
        self._client_kwargs = client_kwargs
        self._client: Optional[PolicyClient] = None

    def _make_client(self):
        return PolicyClient(self.address, self.observation_space, self.action_space, **self._client_kwargs)

    @property
    def client(self):
        # Connect lazily, from the thread that runs the loop.
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def run(self) -> None:
        """Your simulator loop. Override."""
        raise NotImplementedError

    def start_episode(self, episode_id: Optional[str] = None, training_enabled: bool = True,
                      evaluation: bool = False) -> str:
        return self.client.start_episode(episode_id, training_enabled, evaluation)

    def get_action(self, episode_id: str, observation):
        return self.client.get_action(episode_id, observation)

    def log_action(self, episode_id: str, observation, action) -> None:
        self.client.log_action(episode_id, observation, action)

    def log_returns(self, episode_id: str, reward, info=None) -> None:
        self.client.log_returns(episode_id, reward, info)

    def end_episode(self, episode_id: str, observation, truncated: bool = False, stopping: bool = False) -> None:
        self.client.end_episode(episode_id, observation, truncated, stopping=stopping)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class ExternalMultiAgentEnv(ExternalEnv):
    """Same calls with {agent_id: value} dicts. `agents` maps agent ids to
    (observation_space, action_space) where they differ from the defaults."""

    def __init__(self, action_space: gym.Space, observation_space: gym.Space,
                 address: str = "127.0.0.1:50051", agents: Optional[dict] = None, **client_kwargs):
        super().__init__(action_space, observation_space, address, **client_kwargs)
        self.agents = agents

    def _make_client(self):
        return MultiAgentPolicyClient(self.address, self.observation_space, self.action_space,
                                      agents=self.agents, **self._client_kwargs)

    def log_returns(self, episode_id: str, reward_dict, info_dict=None, multiagent_done_dict=None,
                    truncated_dict=None, final_observation_dict=None) -> None:
        self.client.log_returns(episode_id, reward_dict, info_dict, multiagent_done_dict, truncated_dict,
                                final_observation_dict)

    def end_episode(self, episode_id: str, observation_dict=None, truncated: bool = False,
                    stopping: bool = False) -> None:
        self.client.end_episode(episode_id, observation_dict, truncated, stopping=stopping)
