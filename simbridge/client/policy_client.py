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
alone, so a bad observation never costs a reward.

`address` may name several bridge hosts (a list, or "h1:p1,h2:p2"): the client moves to another
when its host goes away, raising SessionLost as a restarted trainer does (docs/scaling.md).

Both number their requests (RequestHeader.seq). When the connection breaks the
client reconnects, resumes its session and resends what was not answered; the
server applies each seq once, so nothing is lost or doubled (the engine:
simbridge.client.connection).
"""
import collections
from typing import Any, Dict, List, Optional, Sequence

import grpc
import gymnasium as gym
import numpy as np
from google.protobuf import struct_pb2

from simbridge.client.connection import Addresses, Connection, EarlierCallFailed, SessionLost, open_channel
from simbridge.client.security import ClientSecurity
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors, tree
from simbridge.wire.errors import BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb

# The connection engine's names stay importable from here.
__all__ = ["PolicyClient", "MultiAgentPolicyClient", "SessionLost", "EarlierCallFailed", "open_channel"]
_Connection = Connection  # the engine's former name


def _struct(info: Optional[dict]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if info:
        s.update(info)
    return s


def _without_rows_of(queued: pb.RewardRows, done: pb.RewardRows) -> Optional[pb.RewardRows]:
    """`queued` less its rows for the agents `done` marks done, whose rewards (and last info)
    are added into `done`'s rows; None when no row is left. Multi-agent rows only (the
    single-agent service has no done flags); `queued` carries no flags (those are sent at once)."""
    n_done = len(done.agent_ids)
    term = list(done.terminated) or [False] * n_done
    trunc = list(done.truncated) or [False] * n_done
    done_eids = list(done.episode_ids) if len(done.episode_ids) == n_done else [done.episode_ids[0]] * n_done
    target = {(done_eids[j], done.agent_ids[j]): j for j in range(n_done) if term[j] or trunc[j]}
    n = len(queued.agent_ids)
    eids = list(queued.episode_ids) if len(queued.episode_ids) == n else [queued.episode_ids[0]] * n
    hits = [(i, target[(e, a)]) for i, (e, a) in enumerate(zip(eids, queued.agent_ids)) if (e, a) in target]
    if not hits:
        return queued
    rewards = tensors.from_tensor(queued.rewards)
    added = tensors.from_tensor(done.rewards).copy()
    for i, j in hits:
        added[j] += rewards[i]
    tensors.fill_tensor(done.rewards, added)
    if queued.infos and not done.infos:   # an info the moved row carried stays the agent's last
        done.infos.extend(struct_pb2.Struct() for _ in range(n_done))
        for i, j in hits:
            done.infos[j].CopyFrom(queued.infos[i])
    keep = sorted(set(range(n)) - {i for i, _ in hits})
    if not keep:
        return None
    rest = pb.RewardRows(agent_ids=[queued.agent_ids[i] for i in keep])
    rest.episode_ids.extend([eids[i] for i in keep])
    tensors.fill_tensor(rest.rewards, rewards[keep])
    if queued.infos:
        rest.infos.extend(queued.infos[i] for i in keep)
    # final_observations of rows without done flags are ignored by the server: not carried.
    return rest


class _ClientBase:
    _service = "single"

    def __init__(self, address: Addresses, observation_space: gym.Space, action_space: gym.Space,
                 agents: Optional[Dict[str, tuple]] = None, transport: str = "stream",
                 client_name: str = "python-client", connect_timeout_s: float = 30.0,
                 reconnect_timeout_s: float = 60.0, pipeline: bool = True, coalesce_rewards: bool = True,
                 security: Optional[ClientSecurity] = None):
        self.observation_space = observation_space
        self.action_space = action_space
        self.agent_spaces = dict(agents or {})
        create = pb.CreateSessionRequest(client_name=client_name,
                                         observation_space=sb_spaces.space_to_proto(observation_space),
                                         action_space=sb_spaces.space_to_proto(action_space))
        for aid, (obs_sp, act_sp) in self.agent_spaces.items():
            create.agents.add(agent_id=aid, observation_space=sb_spaces.space_to_proto(obs_sp),
                              action_space=sb_spaces.space_to_proto(act_sp))
        self._open: set = set()   # episode ids started and not ended
        self._cut: set = set()    # episode ids that ended with a lost session
        self._conn = Connection(address, self._service, create, transport, connect_timeout_s,
                                reconnect_timeout_s, pipeline, on_failed=self._resend_rewards, security=security,
                                on_session_lost=self._episodes_cut)
        self.coalesce_rewards = coalesce_rewards
        self._rewards: List[pb.RewardRows] = []

    def _episodes_cut(self) -> int:
        """The session was lost: its open episodes ended with it, and its queued rewards."""
        self._cut, self._open = self._open, set()
        self._rewards = []
        return len(self._cut)

    def _check_open(self, episode_ids) -> None:
        """A call naming an episode that ended with a lost session is refused here, saying so."""
        gone = [e for e in episode_ids if e in self._cut]
        if gone:
            raise BridgeError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"episode {gone[0]!r} already ended (with its session, lost: the client is on a "
                              f"new session at {self._conn.address}): start a new episode", Reason.EPISODE_ENDED)

    def _queue_rewards(self, rows: pb.RewardRows) -> None:
        if self._cut:
            self._check_open(rows.episode_ids)
        if rows.terminated or rows.truncated:
            # The contract lets an agent marked done appear in that row only: rewards queued
            # for it move into the row that ends it, then everything goes out at once.
            self._rewards = [q for q in (_without_rows_of(q, rows) for q in self._rewards) if q is not None]
            self._rewards.append(rows)
            self._send_rewards()
        elif not self.coalesce_rewards:
            self._rewards.append(rows)
            self._send_rewards()
        else:
            self._rewards.append(rows)

    def _send_rewards(self) -> None:
        """Queued rewards as their own pipelined LogReturns (before any other call)."""
        if self._rewards:
            msg = pb.LogReturnsRequest()
            msg.rows.extend(self._rewards)
            self._rewards = []
            self._conn.call("log_returns", msg, wait=False)

    def _resend_rewards(self, kind: str, sent) -> None:
        """The connection's on_failed: a failed request had no effect, so the rewards it carried
        are logged on their own and a bad observation never costs a reward (if the rewards were
        the problem, this fails too and says so)."""
        if kind not in ("log_returns", "step") and getattr(sent, "rewards", None):
            retry = pb.LogReturnsRequest()
            retry.rows.extend(sent.rewards)
            self._conn.call("log_returns", retry, wait=False)

    def _call(self, kind: str, msg, wait: bool = True):
        if self._cut and kind in ("get_action", "log_action", "end_episode"):
            self._check_open(msg.episode_ids if kind == "end_episode" else [e for r in msg.rows for e in r.episode_ids])
        if kind in ("get_action", "log_action", "end_episode") and self._rewards:
            msg.rewards.extend(self._rewards)  # applied first, all or nothing with the call
            self._rewards = []
        else:
            self._send_rewards()
        return self._conn.call(kind, msg, wait=wait)

    @property
    def session_id(self) -> str:
        return self._conn.session_id

    @property
    def limits(self) -> pb.ServerLimits:
        return self._conn.session.limits

    def start_episode(self, episode_id: Optional[str] = None, training_enabled: bool = True,
                      evaluation: bool = False) -> str:
        """evaluation: greedy actions, never trained, returns reported apart (eval_return_mean)."""
        return self.start_episodes([episode_id] if episode_id else None, 1, training_enabled, evaluation)[0]

    def start_episodes(self, episode_ids: Optional[Sequence[str]] = None, count: int = 1,
                       training_enabled: bool = True, evaluation: bool = False) -> List[str]:
        msg = pb.StartEpisodeRequest(count=count, training_enabled=training_enabled)
        if evaluation:
            msg.evaluation = True
        if episode_ids:
            msg.episode_ids.extend(episode_ids)
            self._call("start_episode", msg, wait=False)  # ids known: no need to wait
            self._open.update(episode_ids)
            return list(episode_ids)
        ids = list(self._call("start_episode", msg).episode_ids)
        self._open.update(ids)
        return ids

    def _ended(self, episode_ids, start_episode_ids=()) -> None:
        self._open.difference_update(episode_ids)
        self._open.update(start_episode_ids or ())

    def flush(self) -> None:
        """Wait until the server has applied every call so far; raise the first error."""
        self._send_rewards()
        self._conn.flush()

    def close(self) -> None:
        try:
            self._send_rewards()
        finally:
            self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PolicyClient(_ClientBase):
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

    def end_episode(self, episode_id: str, observation, truncated: bool = False) -> None:
        self.end_episodes([episode_id], sb_spaces.batch_row0(self.observation_space, observation), [truncated])

    def end_episodes(self, episode_ids: Sequence[str], observations, truncated: Sequence[bool],
                     start_episode_ids: Optional[Sequence[str]] = None, training_enabled: bool = True,
                     evaluation: bool = False) -> None:
        """End N episodes; `start_episode_ids` starts new ones in the same message
        (per-slot auto-reset for a batched simulator)."""
        msg = pb.EndEpisodeRequest(episode_ids=list(episode_ids), truncated=list(map(bool, truncated)))
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


class MultiAgentPolicyClient(_ClientBase):
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
                    truncated: bool = False) -> None:
        msg = pb.EndEpisodeRequest(episode_ids=[episode_id], truncated=[truncated])
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
                     evaluation: bool = False) -> None:
        """End N episodes in one pipelined message. final_observations (batched, one row per
        ended episode, for the agent final_agent_ids names) are what truncated episodes
        bootstrap from; start_episode_ids starts new episodes in the same message."""
        msg = pb.EndEpisodeRequest(episode_ids=list(episode_ids), truncated=list(map(bool, truncated)))
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
