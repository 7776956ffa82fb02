"""Python client: PolicyClient (one agent per episode) and MultiAgentPolicyClient.

Transports:
  * "stream" (default): one bidirectional stream; calls that return nothing
    (log_returns, log_action, end_episode, start_episode with a given id) are
    pipelined: sent without waiting, their answers checked when the next
    answer is read, so a lockstep step costs one round trip. An error from a
    pipelined call is raised by the next call that reads answers (or flush()).
  * "unary": one RPC per call; simplest, two round trips per lockstep step.

Rewards are coalesced: log_returns queues its rows and the next get_action,
log_action or end_episode carries them (`rewards` of those requests), so a
lockstep step is one message on either transport. Rewards with done flags,
and rewards queued before any other call, are sent as their own (pipelined)
LogReturns; if a request carrying rewards fails, the rewards are resent
alone, so a bad observation never costs a reward. That queue, the connection
and the episodes' bookkeeping are the two clients' shared base
(simbridge.client.row_calls); this module encodes each call's rows.

`address` may name several bridge hosts (a list, or "h1:p1,h2:p2"): the client moves to another
when its host goes away, raising SessionLost as a restarted trainer does (docs/scaling.md).

Both number their requests (RequestHeader.seq). When the connection breaks the
client reconnects, resumes its session and resends what was not answered; the
server applies each seq once, so nothing is lost or doubled (the engine:
simbridge.client.connection).
"""
import collections
from typing import Any, Dict, List, Optional, Sequence

import gymnasium as gym
import numpy as np
from google.protobuf import struct_pb2

from simbridge.client.connection import Addresses, Connection, EarlierCallFailed, SessionLost, open_channel
from simbridge.client.row_calls import RowCalls
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors, tree
from simbridge.wire.v1 import simbridge_pb2 as pb

# The connection engine's names stay importable from here.
__all__ = ["PolicyClient", "MultiAgentPolicyClient", "SessionLost", "EarlierCallFailed", "open_channel"]
_Connection = Connection  # the engine's former name


def _struct(info: Optional[dict]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if info:
        s.update(info)
    return s


class PolicyClient(RowCalls):
    """Client of the ExternalEnv service: one agent per episode.

    Single calls take one observation; the *_batch forms take N episodes at
    once with observations shaped (N, *obs_shape) and cost one round trip.
    """

    def __init__(self, address: Addresses, observation_space: gym.Space, action_space: gym.Space, **kwargs):
        super().__init__(address, observation_space, action_space, None, **kwargs)
        self.last_policy_versions: List[int] = []

    def get_action(self, episode_id: str, observation) -> Any:
        return sb_spaces.unbatch_row0(self.action_space, self.get_actions([episode_id], sb_spaces.batch_row0(self.observation_space, observation)))

    def get_actions(self, episode_ids: Sequence[str], observations) -> Any:
        msg = pb.GetActionRequest()
        rows = msg.rows.add()
        rows.episode_ids.extend(episode_ids)
        sb_spaces.fill_value(rows.observations, self.observation_space, observations)
        resp = self._call("get_action", msg)
        out = resp.actions[0]
        self.last_policy_versions = list(out.policy_versions)
        return sb_spaces.decode_value(self.action_space, out.actions, len(episode_ids), "actions from server")

    def log_action(self, episode_id: str, observation, action) -> None:
        self.log_actions([episode_id], sb_spaces.batch_row0(self.observation_space, observation),
                         sb_spaces.batch_row0(self.action_space, action))

    def log_actions(self, episode_ids: Sequence[str], observations, actions) -> None:
        msg = pb.LogActionRequest()
        rows = msg.rows.add()
        rows.episode_ids.extend(episode_ids)
        sb_spaces.fill_value(rows.observations, self.observation_space, observations)
        sb_spaces.fill_value(msg.actions.add(), self.action_space, actions)
        self._call("log_action", msg, wait=False)

    def log_returns(self, episode_id: str, reward: float, info: Optional[dict] = None) -> None:
        self.log_returns_batch([episode_id], [reward], None if info is None else [info])

    def log_returns_batch(self, episode_ids: Sequence[str], rewards, infos: Optional[List[dict]] = None) -> None:
        rows = pb.RewardRows()
        rows.episode_ids.extend(episode_ids)
        tensors.fill_tensor(rows.rewards, np.asarray(rewards, np.float32))
        if infos is not None:
            rows.infos.extend(_struct(i) for i in infos)
        self._queue_rewards(rows)

    def end_episode(self, episode_id: str, observation, truncated: bool = False, stopping: bool = False) -> None:
        self.end_episodes([episode_id], sb_spaces.batch_row0(self.observation_space, observation), [truncated],
                          stopping=stopping)

    def end_episodes(self, episode_ids: Sequence[str], observations, truncated: Sequence[bool],
                     start_episode_ids: Optional[Sequence[str]] = None, training_enabled: bool = True,
                     evaluation: bool = False, stopping: bool = False) -> None:
        """End N episodes; `start_episode_ids` starts new ones in the same message
        (per-slot auto-reset for a batched simulator). stopping: the simulator ends them because it
        stops, not its environment: truncated for the learners, not returns of the policy."""
        msg = pb.EndEpisodeRequest(episode_ids=list(episode_ids), truncated=list(map(bool, truncated)),
                                   stopping=stopping)
        if start_episode_ids:
            msg.start_episode_ids.extend(start_episode_ids)
            msg.start_training_enabled = training_enabled
            if evaluation:
                msg.start_evaluation = True
        rows = msg.final_observations.add()
        rows.episode_ids.extend(episode_ids)
        sb_spaces.fill_value(rows.observations, self.observation_space, observations)
        self._call("end_episode", msg, wait=False)
        self._ended(msg.episode_ids, msg.start_episode_ids)


class MultiAgentPolicyClient(RowCalls):
    """Client of the ExternalMultiAgentEnv service: per-agent dicts, as in RLlib.

    `agents` maps agent ids to (observation_space, action_space) for agents
    whose spaces differ from the defaults.
    """
    _service = "multi"

    def _space(self, agent_id: str, which: int):
        spec = self.agent_spaces.get(agent_id)
        if spec is None:
            return self.observation_space if which == 0 else self.action_space
        return spec[which]

    def _groups(self, agent_ids) -> Dict[Any, List[str]]:
        """Agents grouped by spaces: each group travels as one AgentRows."""
        groups: Dict[Any, List[str]] = collections.OrderedDict()
        for aid in agent_ids:
            key = aid if aid in self.agent_spaces else None
            groups.setdefault(key, []).append(aid)
        return groups

    def _fill_rows(self, rows, episode_id: str, aids: List[str], obs_dict: dict) -> None:
        rows.episode_ids.append(episode_id)
        rows.agent_ids.extend(aids)
        space = self._space(aids[0], 0)
        sb_spaces.fill_value(rows.observations, space, sb_spaces.stack_values(space, [obs_dict[a] for a in aids]))

    def get_action(self, episode_id: str, observation_dict: Dict[str, Any]) -> Dict[str, Any]:
        """Actions for exactly the agents in observation_dict."""
        msg = pb.GetActionRequest()
        groups = list(self._groups(observation_dict).values())
        for aids in groups:
            self._fill_rows(msg.rows.add(), episode_id, aids, observation_dict)
        resp = self._call("get_action", msg)
        out = {}
        for aids, act in zip(groups, resp.actions):
            space = self._space(aids[0], 1)
            batch = sb_spaces.decode_value(space, act.actions, len(aids), "actions from server")
            for i, aid in enumerate(aids):
                out[aid] = sb_spaces.unbatch_row0(space, tree.take(batch, slice(i, i + 1)))
        return out

    def log_action(self, episode_id: str, observation_dict: Dict[str, Any], action_dict: Dict[str, Any]) -> None:
        msg = pb.LogActionRequest()
        for aids in self._groups(observation_dict).values():
            self._fill_rows(msg.rows.add(), episode_id, aids, observation_dict)
            space = self._space(aids[0], 1)
            sb_spaces.fill_value(msg.actions.add(), space, sb_spaces.stack_values(space, [action_dict[a] for a in aids]))
        self._call("log_action", msg, wait=False)

    def log_returns(self, episode_id: str, reward_dict: Dict[str, float], info_dict: Optional[dict] = None,
                    multiagent_done_dict: Optional[Dict[str, bool]] = None,
                    truncated_dict: Optional[Dict[str, bool]] = None,
                    final_observation_dict: Optional[Dict[str, Any]] = None) -> None:
        """Rewards add up per agent until its next action.

        multiagent_done_dict (terminated) and truncated_dict end agents early;
        final_observation_dict gives those agents' last observations (needed
        for truncated agents, whose learners bootstrap from it; without it the
        agent's previous observation stands in). "__all__": True ends the
        episode; use end_episode instead to give final observations."""
        done = dict(multiagent_done_dict or {})
        trunc = dict(truncated_dict or {})
        finals = dict(final_observation_dict or {})
        aids = list(dict.fromkeys(list(reward_dict) + list(done) + list(trunc)))
        if not aids:
            return
        # Agents with a final observation travel in rows of one space each; the rest together.
        with_final = [a for a in aids if a in finals and a != "__all__"]
        plain = [a for a in aids if a not in finals or a == "__all__"]
        groups = [(g, True) for g in self._groups(with_final).values()] + ([(plain, False)] if plain else [])
        for group, has_final in groups:
            rows = pb.RewardRows()
            rows.episode_ids.append(episode_id)
            rows.agent_ids.extend(group)
            tensors.fill_tensor(rows.rewards, np.array([reward_dict.get(a, 0.0) for a in group], np.float32))
            if done or trunc:
                rows.terminated.extend(bool(done.get(a, False)) for a in group)
                rows.truncated.extend(bool(trunc.get(a, False)) for a in group)
            if info_dict:
                rows.infos.extend(_struct(info_dict.get(a)) for a in group)
            if has_final:
                space = self._space(group[0], 0)
                sb_spaces.fill_value(rows.final_observations, space, sb_spaces.stack_values(space, [finals[a] for a in group]))
            self._queue_rewards(rows)
        if done.get("__all__") or trunc.get("__all__"):
            self._ended([episode_id])

    def end_episode(self, episode_id: str, observation_dict: Optional[Dict[str, Any]] = None,
                    truncated: bool = False, stopping: bool = False) -> None:
        """stopping: as PolicyClient.end_episodes'."""
        msg = pb.EndEpisodeRequest(episode_ids=[episode_id], truncated=[truncated], stopping=stopping)
        if observation_dict:
            for aids in self._groups(observation_dict).values():
                self._fill_rows(msg.final_observations.add(), episode_id, aids, observation_dict)
        self._call("end_episode", msg, wait=False)
        self._ended(msg.episode_ids, msg.start_episode_ids)

    # ---------------------------------------------------------- rows of many episodes
    # Batched forms for simulators that run many episodes at once, each row one
    # (episode, agent) with the default spaces (e.g. one Unity agent-episode per
    # episode): one message per call whatever the number of rows.

    def get_actions(self, episode_ids: Sequence[str], agent_ids: Sequence[str], observations) -> Any:
        """Actions for N rows in one round trip; observations and the returned actions are
        batched values of the default spaces, shaped (N, *shape)."""
        msg = pb.GetActionRequest()
        rows = msg.rows.add()
        rows.episode_ids.extend(episode_ids)
        rows.agent_ids.extend(agent_ids)
        sb_spaces.fill_value(rows.observations, self.observation_space, observations)
        out = self._call("get_action", msg).actions[0]
        self.last_policy_versions = list(out.policy_versions)
        return sb_spaces.decode_value(self.action_space, out.actions, len(agent_ids), "actions from server")

    def log_returns_batch(self, episode_ids: Sequence[str], agent_ids: Sequence[str], rewards) -> None:
        """Rewards of N rows; queued and carried by the next call, like log_returns."""
        rows = pb.RewardRows()
        rows.episode_ids.extend(episode_ids)
        rows.agent_ids.extend(agent_ids)
        tensors.fill_tensor(rows.rewards, np.asarray(rewards, np.float32))
        self._queue_rewards(rows)

    def log_custom_metrics(self, metrics: Dict[str, Dict[str, float]]) -> None:
        """Custom metrics per episode id, reported with each episode's summary (pipelined)."""
        if not metrics:
            return
        msg = pb.LogReturnsRequest()
        msg.rows.extend(self._rewards)  # queued rewards ride along, in order
        self._rewards = []
        for eid, values in metrics.items():
            msg.custom_metrics.add(episode_id=eid, values={k: float(v) for k, v in values.items()})
        self._conn.call("log_returns", msg, wait=False)

    def end_episodes(self, episode_ids: Sequence[str], truncated: Sequence[bool],
                     final_agent_ids: Optional[Sequence[str]] = None, final_observations=None,
                     start_episode_ids: Optional[Sequence[str]] = None, training_enabled: bool = True,
                     evaluation: bool = False, stopping: bool = False) -> None:
        """End N episodes in one pipelined message. final_observations (batched, one row per
        ended episode, for the agent final_agent_ids names) are what truncated episodes
        bootstrap from; start_episode_ids starts new episodes in the same message; stopping:
        as PolicyClient.end_episodes'."""
        msg = pb.EndEpisodeRequest(episode_ids=list(episode_ids), truncated=list(map(bool, truncated)),
                                   stopping=stopping)
        if final_observations is not None:
            rows = msg.final_observations.add()
            rows.episode_ids.extend(episode_ids)
            rows.agent_ids.extend(final_agent_ids)
            sb_spaces.fill_value(rows.observations, self.observation_space, final_observations)
        if start_episode_ids:
            msg.start_episode_ids.extend(start_episode_ids)
            msg.start_training_enabled = training_enabled
            if evaluation:
                msg.start_evaluation = True
        self._call("end_episode", msg, wait=False)
        self._ended(msg.episode_ids, msg.start_episode_ids)
