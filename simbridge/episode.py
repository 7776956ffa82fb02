"""Episodes as the bridge keeps them: per-agent state between calls.

An agent's transition (obs, action, reward, new_obs) is complete only when its
next observation arrives (its next action, its own done, or the episode's end);
until then the action is "pending" and rewards logged for the agent add up in
`reward_acc`, as in RLlib's MultiAgentEnv (turn-based games rely on this).
"""
import time
from typing import Any, Dict, Optional

import numpy as np

SINGLE_AGENT_ID = "agent0"
ALL_AGENTS = "__all__"


class AgentState:
    __slots__ = ("agent_id", "index", "policy_id", "spec", "last_obs", "last_action", "last_logp",
                 "last_version", "pending", "reward_acc", "reward_total", "t", "done", "info")

    def __init__(self, agent_id: str, index: int):
        self.agent_id = agent_id
        self.index = index            # order of first appearance in the episode
        self.policy_id: Optional[str] = None  # bound on first observation
        self.spec = None
        self.last_obs = None
        self.last_action = None
        self.last_logp = np.float32(np.nan)
        self.last_version = -1
        self.pending = False          # an action waits for its outcome
        self.reward_acc = 0.0         # reward since the last action
        self.reward_total = 0.0
        self.t = 0                    # actions taken so far
        self.done = False
        self.info: Any = None


class Episode:
    def __init__(self, episode_id: str, index: int, session_id: str, training_enabled: bool):
        self.episode_id = episode_id
        self.index = index            # unique int64 across the server: the eps_id column
        self.session_id = session_id
        self.training_enabled = training_enabled
        self.agents: Dict[str, AgentState] = {}
        self.total_reward = 0.0
        self.length = 0               # env steps: calls that gave this episode observations
        self.custom_metrics: Dict[str, float] = {}
        self.user_data: Dict[str, Any] = {}  # free for server-side hooks
        self.start_time = time.time()
        # complete_episodes mode holds transitions here until the episode ends.
        self.held_rows: list = []
        self.held_env_steps = 0

    def agent(self, agent_id: str) -> AgentState:
        st = self.agents.get(agent_id)
        if st is None:
            st = self.agents[agent_id] = AgentState(agent_id, len(self.agents))
        return st

    @property
    def agent_rewards(self) -> Dict[str, float]:
        return {a: st.reward_total for a, st in self.agents.items()}

    def summary(self, reason: str) -> dict:
        policy_rewards: Dict[str, float] = {}
        for st in self.agents.values():
            if st.policy_id is not None:
                policy_rewards[st.policy_id] = policy_rewards.get(st.policy_id, 0.0) + st.reward_total
        return {
            "episode_id": self.episode_id,
            "eps_id": self.index,
            "session_id": self.session_id,
            "total_reward": self.total_reward,
            "length": self.length,
            "agent_rewards": self.agent_rewards,
            "policy_rewards": policy_rewards,
            "custom_metrics": dict(self.custom_metrics),
            "training_enabled": self.training_enabled,
            "end_reason": reason,
            "duration_s": time.time() - self.start_time,
        }
