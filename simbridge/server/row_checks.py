"""Validation of the row calls (StartEpisode, GetAction, LogAction, LogReturns, EndEpisode).

Everything here reads the session and raises BridgeError before anything
changes; what it resolves (episodes, agents, policies, reward plans) is handed
to transitions.py to apply. Policies an agent maps to are created on first use
without the runtime's lock (PolicyRegistry.ensure): resolution then starts over.
"""
from typing import Dict, List, Optional, Tuple

from simbridge.wire import checks
from simbridge.wire.checks import flags
from simbridge.server.episodes import AgentState, Episode
from simbridge.wire.columns import ALL_AGENTS, SINGLE_AGENT_ID
from simbridge.server.sessions import Session, SpaceSpec, check_state
from simbridge.wire.errors import (Reason, already_exists, failed_precondition, invalid_argument,
                                   not_found, resource_exhausted)


class Rows:
    """One AgentRows (or RewardRows) resolved against a session."""
    __slots__ = ("eids", "aids", "spec", "n", "obs", "actions", "episodes", "states", "policy_ids",
                 "unique_episodes", "idx")

    def __init__(self, eids, aids, spec, n):
        self.eids, self.aids, self.spec, self.n = eids, aids, spec, n
        self.obs = self.actions = None
        self.episodes: List[Episode] = []
        self.states: List[Optional[AgentState]] = []   # None: the agent's first appearance
        self.policy_ids: List[str] = []
        self.unique_episodes = False   # known: no episode appears twice in these rows
        self.idx = None   # a part of stacked rows (frame_stack.stack_rows): its positions in the whole


class _NewPolicy(Exception):
    """Resolution met a policy that does not exist yet: create it outside the lock, retry."""

    def __init__(self, policy_id: str, spec: SpaceSpec, agent_id: str):
        self.policy_id, self.spec, self.agent_id = policy_id, spec, agent_id


class RowChecks:
    def __init__(self, ctx):
        self.ctx = ctx

    def open_episode(self, s: Session, eid: str) -> Episode:
        ep = s.episodes.get(eid)
        if ep is None:
            checks.ids((eid,), self.ctx.config.max_id_bytes, "episode id")   # overlong: that, not "unknown"
            reason = s.finished.get(eid)
            if reason is not None:
                raise failed_precondition(f"episode {eid!r} already ended ({reason})", Reason.EPISODE_ENDED)
            raise not_found(f"unknown episode {eid!r} in session {s.session_id!r}: call StartEpisode first", Reason.EPISODE_UNKNOWN)
        return ep

    def resolve_ids(self, s: Session, episode_ids, agent_ids, what: str) -> Tuple[List[str], List[str], int]:
        if s.multi_agent:
            n = len(agent_ids)
            if n == 0:
                raise invalid_argument(f"{what}: no agent ids (ExternalMultiAgentEnv rows need one per row)")
            aids = list(agent_ids)
            if ALL_AGENTS in aids and what.startswith(("observations", "actions", "final")):
                raise invalid_argument(f"{what}: {ALL_AGENTS!r} is not an agent")
        else:
            if agent_ids:
                raise invalid_argument(f"{what}: ExternalEnv rows carry no agent ids; "
                                       f"use ExternalMultiAgentEnv for several agents per episode")
            n = len(episode_ids)
            aids = [SINGLE_AGENT_ID] * n
        if len(episode_ids) == n:
            eids = list(episode_ids)
        elif len(episode_ids) == 1:
            eids = [episode_ids[0]] * n
        else:
            raise invalid_argument(f"{what}: {len(episode_ids)} episode ids for {n} rows; "
                                   f"give one per row or one for all rows")
        limit = self.ctx.config.max_rows_per_request
        if n > limit:
            raise invalid_argument(f"{what}: {n} rows exceed the server limit of {limit} per request",
                                   Reason.MESSAGE_TOO_LARGE)
        return eids, aids, n

    @staticmethod
    def rows_spec(s: Session, aids: List[str], what: str) -> SpaceSpec:
        spec = s.spec_for(aids[0]) if aids else s.default
        if s.agent_specs:
            for a in aids:
                if s.spec_for(a) is not spec:
                    raise invalid_argument(f"{what}: agents {aids[0]!r} and {a!r} have different spaces; "
                                           f"send them in separate rows messages")
        return spec

    # ---- agent rows (observations)
    def resolve_agent_rows(self, s: Session, rows_msgs, what: str) -> List[Rows]:
        out = []
        for i, m in enumerate(rows_msgs):
            w = f"{what} {i}"
            eids, aids, n = self.resolve_ids(s, m.episode_ids, m.agent_ids, f"observations of rows {i}")
            r = Rows(eids, aids, self.rows_spec(s, aids, w), n)
            if not m.HasField("observations"):
                raise invalid_argument(f"{w}: no observations")
            r.obs = r.spec.decode_obs(m.observations, n, f"observations of rows {i}")
            out.append(r)
        mapped: Dict[Tuple[str, str], str] = {}   # the mapping's answers, kept across retries
        while True:
            try:
                with self.ctx.lock:
                    self._resolve(s, out, mapped)
                return out
            except _NewPolicy as new:   # lock released: the factory may take its time
                self.ctx.policies.ensure(new.policy_id, new.spec, new.agent_id)

    def _resolve(self, s: Session, out: List[Rows], mapped: dict) -> None:
        """Lock held."""
        if len(out) == 1 and not s.multi_agent:
            self._resolve_single_agent(s, out[0], mapped)  # the hot path, with comprehensions
            return
        seen = set()
        new_agents = 0
        for r in out:
            r.episodes, r.states, r.policy_ids = [], [], []
            for eid, aid in zip(r.eids, r.aids):
                if (eid, aid) in seen:
                    raise invalid_argument(f"agent {aid!r} of episode {eid!r} appears twice in one request")
                seen.add((eid, aid))
                ep = self.open_episode(s, eid)
                st = ep.agents.get(aid)
                if st is None:   # the agent's first appearance: it will be kept
                    new_agents = self.check_new_agent(s, aid, r.spec, new_agents)
                elif st.done:
                    raise failed_precondition(f"agent {aid!r} is already done in episode {eid!r}", Reason.EPISODE_ENDED)
                r.episodes.append(ep)
                r.states.append(st)
                r.policy_ids.append(self._policy_of(st, aid, ep, r.spec, mapped))

    def _policy_of(self, st: Optional[AgentState], aid: str, ep: Episode, spec: SpaceSpec,
                   mapped: dict) -> str:
        """Lock held. The agent's policy; on its first appearance, the mapping's choice."""
        if st is not None and st.policy_id is not None:
            return st.policy_id
        key = (ep.episode_id, aid)
        pid = mapped.get(key)
        if pid is None:
            pid = mapped[key] = self.ctx.policy_mapping_fn(aid, ep)
        if pid not in self.ctx.policies:
            raise _NewPolicy(pid, spec, aid)
        self.ctx.policies.ensure(pid, spec, aid)   # exists: only compares the spaces
        return pid

    def _resolve_single_agent(self, s: Session, r: Rows, mapped: dict) -> None:
        """Lock held. Same checks as the general path, one comprehension per step."""
        episodes = s.episodes
        eps = [episodes.get(e) for e in r.eids]
        if None in eps:
            self.open_episode(s, r.eids[eps.index(None)])  # raises the precise error
        if len(set(r.eids)) != r.n:
            dup = next(e for i, e in enumerate(r.eids) if e in r.eids[:i])
            raise invalid_argument(f"agent {SINGLE_AGENT_ID!r} of episode {dup!r} appears twice in one request")
        sts = [ep.agents.get(SINGLE_AGENT_ID) for ep in eps]
        pids = [st.policy_id if st is not None else None for st in sts]
        if None in pids:
            pids = [self._policy_of(st, SINGLE_AGENT_ID, ep, r.spec, mapped) for st, ep in zip(sts, eps)]
        r.episodes, r.states, r.policy_ids = eps, sts, pids
        r.unique_episodes = True

    def check_new_agent(self, s: Session, aid: str, spec: SpaceSpec, earlier: int) -> int:
        """Lock held. A multi-agent episode's agent, on its first appearance: its id is kept and it
        takes a slot of its spaces (an episode's first agent rides on what the episode was charged;
        counted here anyway, with the request's `earlier` new agents: a conservative check).
        Returns the bytes of the request's new agents so far."""
        c = self.ctx.config
        checks.ids((aid,), c.max_id_bytes, "agent id")
        earlier += spec.row_bytes
        check_state(s.client, earlier, c.max_client_state_bytes, f"agent {aid!r}")
        return earlier

    # ---- new episodes
    def check_new_ids(self, s: Session, ids: List[str], ending: int = 0) -> None:
        """Lock held. New episode ids must be unused; `ending` episodes close first."""
        checks.ids(ids, self.ctx.config.max_id_bytes, "episode id")
        if len(set(ids)) != len(ids):
            raise invalid_argument("episode ids to start repeat within the request")
        for eid in ids:
            if not eid:
                raise invalid_argument("StartEpisode: empty episode id")
            if eid in s.episodes:
                raise already_exists(f"episode {eid!r} is already running")
            if eid in s.finished:
                raise already_exists(f"episode id {eid!r} was already used by an episode that ended")
        cap = self.ctx.config.max_open_episodes_per_session
        if len(s.episodes) - ending + len(ids) > cap:
            raise resource_exhausted(f"session would have more than {cap} open episodes: "
                                     f"end some first", Reason.TOO_MANY_EPISODES)
        check_state(s.client, (len(ids) - ending) * s.default.row_bytes, self.ctx.config.max_client_state_bytes,
                    f"{len(ids)} more open episodes")

    # ---- reward rows
    def check_returns(self, s: Session, rows_msgs) -> list:
        """Lock held. Validates RewardRows; returns plans for Transitions.apply_returns."""
        plans = []
        seen: Dict[Tuple[str, str], int] = {}
        new_agents = 0
        for i, m in enumerate(rows_msgs):
            what = f"rewards of rows {i}"
            eids, aids, n = self.resolve_ids(s, m.episode_ids, m.agent_ids, what)
            if not m.HasField("rewards"):
                raise invalid_argument(f"{what}: no rewards tensor")
            rew = checks.rewards(m.rewards, n, what, "one per row", what + ": reward of row {}")
            term = flags(m.terminated, n, f"{what}: terminated")
            trunc = flags(m.truncated, n, f"{what}: truncated")
            any_done = any(m.terminated) or any(m.truncated)  # the wire lists: empty when no flags
            if not s.multi_agent and any_done:
                raise invalid_argument(f"{what}: ExternalEnv ends episodes with EndEpisode, "
                                       f"not with done flags")
            if m.infos:
                if len(m.infos) != n:
                    raise invalid_argument(f"{what}: {len(m.infos)} infos for {n} rows")
                for j, info in enumerate(m.infos):
                    checks.finite_struct(info, f"{what}: info of row {j}")
            final = None
            if m.HasField("final_observations"):
                spec = self.rows_spec(s, [a for a in aids if a != ALL_AGENTS], what)
                final = spec.decode_obs(m.final_observations, n, f"final observations of rows {i}")
            if not s.multi_agent:  # one agent per episode; it is done only when the episode is
                episodes = s.episodes
                eps = [episodes.get(e) for e in eids]
                if None in eps:
                    self.open_episode(s, eids[eps.index(None)])  # raises the precise error
                plans.append((m, aids, eps, rew, term, trunc, final))
                continue
            eps = []
            for eid, aid in zip(eids, aids):
                ep = self.open_episode(s, eid)
                st = ep.agents.get(aid)
                if st is None:   # the agent's first appearance: it will be kept
                    new_agents = self.check_new_agent(s, aid, s.spec_for(aid), new_agents)
                elif st.done:
                    raise failed_precondition(f"agent {aid!r} is already done in episode {eid!r}", Reason.EPISODE_ENDED)
                seen[(eid, aid)] = seen.get((eid, aid), 0) + 1
                eps.append(ep)
            plans.append((m, aids, eps, rew, term, trunc, final))
        # An agent marked done may not appear again anywhere in the request: a
        # reward after its end would count in totals but never reach a transition.
        ended = done_in(plans)
        for pair in ended:
            if seen[pair] > 1:
                raise invalid_argument(f"agent {pair[1]!r} of episode {pair[0]!r} is marked done and "
                                       f"appears more than once in one request: add its other rewards "
                                       f"into the row that marks it done")
        if ended:
            _check_truncated_finals(plans, ended)
        return plans

    @staticmethod
    def check_end_finals(s: Session, eps: List[Episode], truncated: List[bool], finals: dict,
                         plans) -> None:
        """Lock held. An episode ending truncated needs the final observation of every agent whose
        action is pending: learners bootstrap from it, and the last observation would be stale."""
        ended = done_in(plans) if plans else ()
        for ep, tr in zip(eps, truncated):
            if not tr:
                continue
            eid, given = ep.episode_id, finals[ep.episode_id]
            waiting = [aid for aid, st in ep.agents.items()
                       if st.pending and not st.done and aid not in given and (eid, aid) not in ended]
            if not waiting:
                continue
            if not s.multi_agent:
                raise invalid_argument(f"EndEpisode: episode {eid!r} ends truncated without its final "
                                       f"observation: add a final_observations row for it (learners "
                                       f"bootstrap from it)")
            raise invalid_argument(f"EndEpisode: episode {eid!r} ends truncated without the final "
                                   f"observation of agents {waiting}, whose actions are pending: add a "
                                   f"final_observations row for each (learners bootstrap from it)")

    def check_acting_not_done(self, rows: List[Rows], plans) -> None:
        """An agent the attached rewards end may not also ask for an action."""
        done = done_in(plans)
        if done:
            acting = {(r.eids[i], r.aids[i]) for r in rows for i in range(r.n)}
            acting_eps = {e for e, _ in acting}
            for eid, aid in done:
                if (eid, aid) in acting or (aid == ALL_AGENTS and eid in acting_eps):
                    raise invalid_argument(f"agent {aid!r} of episode {eid!r} is marked done by the "
                                           f"attached rewards and also asks for an action")

    @staticmethod
    def check_still_open(s: Session, rows: List[Rows], plans: list = (), ended_before: int = -1) -> None:
        """After the forward pass: every episode the request touches must still be open."""
        if s.episodes_ended == ended_before:
            return  # none of this session's episodes ended meanwhile
        eps = [ep for r in rows for ep in r.episodes] + [ep for plan in plans for ep in plan[2]]
        for ep in eps:
            if s.episodes.get(ep.episode_id) is not ep:
                raise failed_precondition(f"episode {ep.episode_id!r} ended while this request's action "
                                          f"was being computed; nothing of the request was applied", Reason.EPISODE_ENDED)


def done_in(plans) -> set:
    """(episode_id, agent_id) pairs that the planned returns finish ("__all__" included)."""
    out = set()
    for m, aids, eps, rew, term, trunc, final in plans:
        if not (m.terminated or m.truncated):
            continue
        for j, (ep, aid) in enumerate(zip(eps, aids)):
            if term[j] or trunc[j]:
                out.add((ep.episode_id, aid))
    return out


def _check_truncated_finals(plans, ended: set) -> None:
    """Lock held. A reward row that truncates an agent whose action is pending must carry its final
    observation; "__all__" truncated may not cut pending agents short (EndEpisode carries theirs)."""
    for m, aids, eps, rew, term, trunc, final in plans:
        if not m.truncated:
            continue
        for j, (ep, aid) in enumerate(zip(eps, aids)):
            if not trunc[j] or term[j]:
                continue
            eid = ep.episode_id
            if aid == ALL_AGENTS:
                waiting = [a for a, st in ep.agents.items()
                           if st.pending and not st.done and (eid, a) not in ended]
                if waiting:
                    raise invalid_argument(
                        f"'__all__' of episode {eid!r} is marked truncated while agents {waiting} have "
                        f"pending actions and no final observation: end the episode with EndEpisode "
                        f"(truncated) and their final_observations, or mark them truncated with "
                        f"final_observations in this request")
            elif final is None:
                st = ep.agents.get(aid)
                if st is not None and st.pending:
                    raise invalid_argument(
                        f"agent {aid!r} of episode {eid!r} is marked truncated without its final "
                        f"observation: set final_observations in its rewards row (learners bootstrap "
                        f"from it)")
