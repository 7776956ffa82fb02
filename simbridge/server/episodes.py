"""Episodes as the bridge keeps them: per-agent state between calls.

An agent's transition (obs, action, reward, new_obs) is complete only when its
next observation arrives (its next action, its own done, or the episode's end);
until then the action is "pending" and rewards logged for the agent add up in
`reward_acc`, as in RLlib's MultiAgentEnv (turn-based games rely on this).

The per-agent numbers and arrays live in a SlotTable (one per pair of spaces):
columns of `capacity` rows, one row ("slot") per live agent. A call with N
rows then reads and writes N slots with a few fancy-indexing operations
instead of N Python loops over per-agent objects.
"""
import time
from typing import Any, Dict, List, Mapping, TypedDict

import numpy as np

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tree


class EpisodeSummary(TypedDict):
    """An ended episode as the metrics, the episode-end hooks and the trainer's checkpoints
    (torch weights_only=True) see it: a plain dict of plain values. Every kind of episode
    (row calls, batched slots, uploads of clients acting locally) is summed up by
    episode_summary() below."""
    episode_id: str
    eps_id: int
    session_id: str
    total_reward: float
    length: int
    agent_rewards: Dict[str, float]
    agent_policies: Dict[str, str]
    policy_rewards: Dict[str, float]   # summed over each policy's agents
    custom_metrics: Dict[str, float]
    training_enabled: bool
    evaluation: bool                   # greedy actions, returns reported apart (never trained)
    end_reason: str
    duration_s: float


def episode_summary(episode_id: str, eps_id: int, session_id: str, length: int,
                    agent_rewards: Dict[str, float], agent_policies: Dict[str, str],
                    custom_metrics: Mapping[str, float], training_enabled: bool, end_reason: str,
                    duration_s: float, evaluation: bool = False) -> EpisodeSummary:
    """The summary of one ended episode; rewards are Python floats. agent_policies names the
    agents that acted (bound a policy); agent_rewards may name more (rewarded, never acted)."""
    if len(agent_rewards) == 1:   # one agent (every slot, every upload): its return, exactly
        total = float(next(iter(agent_rewards.values())))
        policy_rewards = {pid: total for pid in agent_policies.values()}
    else:
        total = float(sum(agent_rewards.values()))
        policy_rewards: Dict[str, float] = {}
        for aid, pid in agent_policies.items():
            policy_rewards[pid] = policy_rewards.get(pid, 0.0) + agent_rewards[aid]
    return {
        "episode_id": episode_id,
        "eps_id": eps_id,
        "session_id": session_id,
        "total_reward": total,
        "length": length,
        "agent_rewards": agent_rewards,
        "agent_policies": agent_policies,
        "policy_rewards": policy_rewards,
        "custom_metrics": dict(custom_metrics),
        "training_enabled": training_enabled,
        "evaluation": evaluation,
        "end_reason": end_reason,
        "duration_s": duration_s,
    }


class SlotTable:
    """Columnar state of the live agents that share one observation/action space pair."""

    def __init__(self, obs_space, act_space, capacity: int = 64):
        self.obs_space, self.act_space = obs_space, act_space
        self.capacity = 0
        self._free: List[int] = []
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        cols = {
            "obs": sb_spaces.zeros_like_space(self.obs_space, capacity),
            "act": sb_spaces.zeros_like_space(self.act_space, capacity),
            "logp": np.full(capacity, np.nan, np.float32),
            "version": np.full(capacity, -1, np.int64),
            "reward_acc": np.zeros(capacity, np.float64),   # since the last action
            "reward_total": np.zeros(capacity, np.float64),
            "pending": np.zeros(capacity, bool),            # an action waits for its outcome
            "t": np.zeros(capacity, np.int64),              # the episode's step of the pending action
            "eps_id": np.zeros(capacity, np.int64),
            "agent_index": np.zeros(capacity, np.int64),
        }
        if old:
            def keep(new, cur):
                new[:old] = cur
                return new
            cols = {k: tree.map_structure(keep, v, getattr(self, k)) for k, v in cols.items()}
        for k, v in cols.items():
            setattr(self, k, v)
        self._free.extend(range(capacity - 1, old - 1, -1))
        self.capacity = capacity

    def alloc(self, eps_id: int, agent_index: int) -> int:
        if not self._free:
            self._grow(self.capacity * 2)
        slot = self._free.pop()
        self.logp[slot] = np.nan
        self.version[slot] = -1
        self.reward_acc[slot] = self.reward_total[slot] = 0.0
        self.pending[slot] = False
        self.t[slot] = 0
        self.eps_id[slot], self.agent_index[slot] = eps_id, agent_index
        return slot

    def free(self, slot: int) -> None:
        self.pending[slot] = False
        self._free.append(slot)

    def row(self, slot: int, which: str) -> Any:
        """A copy of one slot's obs or act (the slot is overwritten later)."""
        return tree.map_structure(lambda a: a[slot].copy(), getattr(self, which))


class AgentState:
    """One agent in one episode; its numbers live in `table` at `slot`."""
    __slots__ = ("agent_id", "index", "policy_id", "spec", "table", "slot", "done", "info")

    def __init__(self, agent_id: str, index: int, spec, table: SlotTable, eps_id: int):
        self.agent_id = agent_id
        self.index = index            # order of first appearance in the episode
        self.policy_id = None         # bound on first observation
        self.spec = spec
        self.table = table
        self.slot = table.alloc(eps_id, index)
        self.done = False
        self.info: Any = None

    def move_to(self, spec, table: SlotTable) -> None:
        """Before its first action: a slot in `table` instead, its rewards so far carried (an agent
        rewarded before it acted got the simulator's spaces; its policy may see stacked ones)."""
        old, sl = self.table, self.slot
        new = table.alloc(int(old.eps_id[sl]), self.index)
        table.reward_acc[new], table.reward_total[new] = old.reward_acc[sl], old.reward_total[sl]
        old.free(sl)
        self.spec, self.table, self.slot = spec, table, new

    @property
    def pending(self) -> bool:
        return bool(self.table.pending[self.slot])

    @property
    def reward_total(self) -> float:
        return float(self.table.reward_total[self.slot])

    @property
    def reward_acc(self) -> float:
        return float(self.table.reward_acc[self.slot])

    @property
    def t(self) -> int:
        return int(self.table.t[self.slot])


class Episode:
    def __init__(self, episode_id: str, index: int, session_id: str, training_enabled: bool,
                 evaluation: bool = False):
        self.episode_id = episode_id
        self.index = index            # unique int64 across the server: the eps_id column
        self.session_id = session_id
        # An evaluation episode acts greedily and is never trained on.
        self.evaluation = evaluation
        self.training_enabled = training_enabled and not evaluation
        self.agents: Dict[str, AgentState] = {}
        self.length = 0               # env steps: calls that gave this episode observations
        self.custom_metrics: Dict[str, float] = {}
        self.user_data: Dict[str, Any] = {}  # free for server-side hooks
        self.start_time = time.time()
        # complete_episodes mode holds transitions here until the episode ends.
        self.held_rows: list = []
        self.held_env_steps = 0
        # The owner's ClientState and the bytes charged to it for this episode (sessions.py):
        # given back when the episode is released.
        self.client = None
        self.charged = 0

    def add_agent(self, agent_id: str, spec, table: SlotTable) -> AgentState:
        if self.agents and self.client is not None:   # the first agent rides on the episode's charge
            self.charged += spec.row_bytes
            self.client.state_bytes += spec.row_bytes
        st = self.agents[agent_id] = AgentState(agent_id, len(self.agents), spec, table, self.index)
        return st

    @property
    def agent_rewards(self) -> Dict[str, float]:
        return {a: st.reward_total for a, st in self.agents.items()}

    @property
    def total_reward(self) -> float:
        return float(sum(st.reward_total for st in self.agents.values()))

    def release(self) -> None:
        """Give the agents' slots back (after the summary was taken), and the client its bytes."""
        for st in self.agents.values():
            st.table.free(st.slot)
        if self.client is not None:
            self.client.state_bytes -= self.charged
            self.charged = 0

    def summary(self, reason: str) -> EpisodeSummary:
        return episode_summary(
            self.episode_id, self.index, self.session_id, self.length, self.agent_rewards,
            {a: st.policy_id for a, st in self.agents.items() if st.policy_id is not None},
            self.custom_metrics, self.training_enabled, reason, time.time() - self.start_time, self.evaluation)
