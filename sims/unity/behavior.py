"""One Unity behavior's agents as simbridge episodes.

Each Unity agent-episode is one simbridge episode with one agent, on a
session (ExternalMultiAgentEnv) whose default spaces are the behavior's:

  * agent id `"<behavior name>/<Unity agent id>"`, e.g. "3DBall?team=0/7", so the
    trainer's glob rules (`"3DBall*=ball"`) pick a policy per behavior;
  * episode id `"<agent id>/<n>"`, n counting this connector's episodes of the
    behavior. Unity 3.x keeps an agent's id across its episodes, and one step
    may carry a terminal info and a new decision for the same id: the first
    ends episode n, the second opens episode n+1, so two episodes never mix.

Per Unity step, per behavior, one round trip:
  1. (pipelined) EndEpisode for the TerminalSteps agents that have an episode:
     their last rewards attached, their terminal observations as final
     observations, `interrupted` (max step reached) -> truncated, otherwise
     terminated. The same message starts the episodes of agents that request
     a decision without one (per-agent auto-reset); without ends, a pipelined
     StartEpisode does.
     Ended members of a group first send their "group_reward" metric (a
     pipelined LogReturns).
  2. GetAction with one row per DecisionSteps agent, carrying their rewards.

Rewards sent are `reward + group_reward_weight * group_reward` (default weight
1, as RLlib's Unity3DEnv adds them); each agent-episode of a Unity
multi-agent group also reports its summed group reward as the custom metric
"group_reward".

An agent that ends before its first decision never had an episode: nothing is
sent for it. Agents that skip a step (decision period > 1) keep their episode
open and their pending action; Unity sums their rewards until they decide.
"""
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from mlagents_envs.base_env import ActionTuple
from simbridge.client.policy_client import MultiAgentPolicyClient, SessionLost
from simbridge.sims.unity.spaces import BehaviorSpaces

log = logging.getLogger("simbridge.unity")


@dataclass
class AgentEpisode:
    episode_id: str
    agent_id: str
    ret: float = 0.0          # sum of the rewards sent for it
    group_ret: float = 0.0    # sum of its group rewards (unweighted)
    in_group: bool = False


class BehaviorBridge:
    def __init__(self, name: str, spaces: BehaviorSpaces, client: MultiAgentPolicyClient,
                 training: bool = True, group_reward_weight: float = 1.0, evaluation: bool = False):
        self.name = name
        self.spaces = spaces
        self.client = client
        self.training = training
        self.evaluation = evaluation   # greedy actions, returns reported apart
        self.group_reward_weight = float(group_reward_weight)
        # Episodes that ended by themselves (terminal or interrupted), (episode, truncated), for
        # the caller to take with take_finished(); step() may run on a worker thread.
        self.finished: List[Tuple[AgentEpisode, bool]] = []
        self.open: Dict[int, AgentEpisode] = {}     # Unity agent id -> its running episode
        self._agent_ids: Dict[int, str] = {}
        self._next_episode = 0
        self.decisions = 0
        self.session_losses = 0
        self._mask_warned = False

    def agent_id(self, unity_id: int) -> str:
        aid = self._agent_ids.get(unity_id)
        if aid is None:
            aid = self._agent_ids[unity_id] = f"{self.name}/{unity_id}"
        return aid

    def _new_episode(self, unity_id: int) -> AgentEpisode:
        aid = self.agent_id(unity_id)
        self._next_episode += 1
        return AgentEpisode(f"{aid}/{self._next_episode}", aid)

    def _rewards(self, steps) -> np.ndarray:
        r = steps.reward.astype(np.float32)
        if self.group_reward_weight:
            r = r + np.float32(self.group_reward_weight) * steps.group_reward
        return r

    # ------------------------------------------------------------ one Unity step

    def step(self, decision, terminal) -> Optional[ActionTuple]:
        """Report one step of this behavior; returns the ActionTuple for its DecisionSteps (None if empty)."""
        try:
            self._end_and_start(terminal, decision)
            return self._act(decision)
        except SessionLost as e:
            # The trainer restarted: every episode of this session is gone on its side.
            self.session_losses += 1
            log.warning("behavior %s: %s; its agents start new episodes", self.name, e.message)
            self.open.clear()
            self._end_and_start(None, decision)
            return self._act(decision)

    def _end_and_start(self, terminal, decision) -> None:
        ended: List[AgentEpisode] = []
        rows: List[int] = []
        if terminal is not None and len(terminal):
            rewards = self._rewards(terminal)
            for i, unity_id in enumerate(terminal.agent_id.tolist()):
                ep = self.open.pop(unity_id, None)
                if ep is None:
                    continue  # ended before its first decision: no episode to end
                ep.ret += float(rewards[i])
                ep.group_ret += float(terminal.group_reward[i])
                ep.in_group = ep.in_group or bool(terminal.group_id[i])
                ended.append(ep)
                rows.append(i)
        starting = [u for u in decision.agent_id.tolist() if u not in self.open]
        new = [self._new_episode(u) for u in starting]
        new_ids = [ep.episode_id for ep in new]
        if ended:
            idx = np.asarray(rows)
            truncated = terminal.interrupted[idx].tolist()
            ids = [ep.episode_id for ep in ended]
            aids = [ep.agent_id for ep in ended]
            self.client.log_returns_batch(ids, aids, rewards[idx])
            grouped = {ep.episode_id: {"group_reward": ep.group_ret} for ep in ended if ep.in_group}
            self.client.log_custom_metrics(grouped)
            finals = self.spaces.observations([o[idx] for o in terminal.obs], None)
            self.client.end_episodes(ids, truncated, aids, finals, start_episode_ids=new_ids,
                                     training_enabled=self.training, evaluation=self.evaluation)
            self.finished.extend((ep, bool(tr)) for ep, tr in zip(ended, truncated))
        elif new_ids:
            self.client.start_episodes(new_ids, training_enabled=self.training, evaluation=self.evaluation)
        for u, ep in zip(starting, new):
            self.open[u] = ep

    def _act(self, decision):
        n = len(decision)
        if n == 0:
            return None
        eps = [self.open[u] for u in decision.agent_id.tolist()]
        ids = [ep.episode_id for ep in eps]
        aids = [ep.agent_id for ep in eps]
        rewards = self._rewards(decision)
        self.client.log_returns_batch(ids, aids, rewards)  # rides on the GetAction below
        masked = None if decision.action_mask is None else np.concatenate(decision.action_mask, axis=1)
        if masked is not None and not self.spaces.with_mask and not self._mask_warned:
            self._mask_warned = True
            log.warning("behavior %s sends action masks, but its policy's observations have no 'action_mask' "
                        "(its first decisions had none, or --action-masks off): restart with --action-masks on "
                        "to pass them", self.name)
        obs = self.spaces.observations(decision.obs, masked)
        actions = self.client.get_actions(ids, aids, obs)
        for i, ep in enumerate(eps):
            ep.ret += float(rewards[i])
            ep.group_ret += float(decision.group_reward[i])
            ep.in_group = ep.in_group or bool(decision.group_id[i])
        self.decisions += n
        return self.spaces.action_tuple(actions, n)

    # ------------------------------------------------------------ the end

    def finish(self, decision, terminal) -> int:
        """The connector stops after this (unanswered) step: terminal agents end as usual and
        deciding agents end truncated at the observation they now hold. Returns how many
        episodes were cut short this way."""
        self._end_and_start(terminal, _NO_DECISIONS)
        cut = [(i, self.open.pop(u)) for i, u in enumerate(decision.agent_id.tolist()) if u in self.open]
        if cut:
            idx = np.asarray([i for i, _ in cut])
            eps = [ep for _, ep in cut]
            rewards = self._rewards(decision)[idx]
            ids, aids = [ep.episode_id for ep in eps], [ep.agent_id for ep in eps]
            self.client.log_returns_batch(ids, aids, rewards)
            for ep, r, g in zip(eps, rewards, decision.group_reward[idx]):
                ep.ret += float(r)
                ep.group_ret += float(g)
            self.client.log_custom_metrics({ep.episode_id: {"group_reward": ep.group_ret} for ep in eps
                                            if ep.in_group})
            masked = None if decision.action_mask is None else np.concatenate(decision.action_mask, axis=1)[idx]
            finals = self.spaces.observations([o[idx] for o in decision.obs], masked)
            self.client.end_episodes(ids, [True] * len(ids), aids, finals, stopping=True)
        return len(cut)

    def close(self) -> int:
        """Close the session: episodes still open (agents that did not decide in the last step,
        or all of them when Unity quit) end truncated on the server without the transition
        of their unanswered action. Returns how many were open."""
        left = len(self.open)
        self.open.clear()
        self.client.close()
        return left

    def take_finished(self) -> List[Tuple[AgentEpisode, bool]]:
        out, self.finished = self.finished, []
        return out


class _NoDecisions:
    agent_id = np.zeros(0, np.int32)

    def __len__(self) -> int:
        return 0


_NO_DECISIONS = _NoDecisions()
