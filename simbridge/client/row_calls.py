"""What the two policy clients (simbridge.client.policy_client) share, as the C++ SDK's
row_calls.hpp: their connection, the queue of rewards that rides along with the next call, and
the bookkeeping of the episodes they opened; policy_client encodes each call's rows.

Rewards are coalesced: log_returns queues its rows and the next get_action, log_action or
end_episode carries them (`rewards` of those requests, applied first, all or nothing with the
call), so a lockstep step is one message on either transport. Rewards with done flags, all rows
with coalesce_rewards=False, and rewards queued before any other call, go out as their own
(pipelined) LogReturns. If a request carrying rewards fails, the rewards are resent alone (the
connection's `on_failed`), so a bad observation never costs a reward.

Episodes: the ids started and not ended are kept, so that when the session is lost (the server
restarted, or the client moved to another host) a later call naming one of them is refused here,
saying the episode ended with it.
"""
from typing import Dict, List, Optional, Sequence

import grpc
import gymnasium as gym
from google.protobuf import struct_pb2

from simbridge.client.connection import Addresses, Connection
from simbridge.client.security import ClientSecurity
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.errors import BridgeError, Reason
from simbridge.wire.v1 import simbridge_pb2 as pb


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


class RowCalls:
    """The base of PolicyClient and MultiAgentPolicyClient (see the module doc); `_service` names
    the bridge service their session is on."""
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
