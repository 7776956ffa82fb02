"""Applying validated row calls: observations, actions and rewards into transitions.

Runtime lock held throughout. An agent's transition is complete when its next
observation arrives (its next action), when it is marked done, or when its
episode ends; the collector then gets it (see episodes.py for the per-agent
state kept in SlotTables). Its `t` is the episode's env step at which the action
was taken, as RLlib's SampleBatch has it (one call that gives an episode
observations is one step; agents acting in it share it).
"""
from typing import Dict, List, Tuple

import numpy as np
from google.protobuf import json_format

from simbridge.wire import tree
from simbridge.server.episodes import AgentState, Episode, SlotTable
from simbridge.server.frame_stack import stack_final
from simbridge.wire.columns import (ACTION_LOGP, ACTIONS, AGENT_INDEX, ALL_AGENTS, EPS_ID, NEW_OBS, OBS,
                                    POLICY_VERSION, REWARDS, T, TERMINATEDS, TRUNCATEDS)
from simbridge.server.row_checks import Rows
from simbridge.server.sessions import Session, SpaceSpec


class Transitions:
    def __init__(self, ctx):
        self.ctx = ctx
        self._tables: Dict[tuple, SlotTable] = {}

    def _table(self, spec: SpaceSpec) -> SlotTable:
        t = self._tables.get(spec.key)
        if t is None:
            t = self._tables[spec.key] = SlotTable(spec.obs_space, spec.act_space)
        return t

    def _agent(self, ep: Episode, aid: str, spec: SpaceSpec) -> AgentState:
        st = ep.agents.get(aid)
        if st is None:
            st = ep.add_agent(aid, spec, self._table(spec))
        return st

    def open_episodes(self, s: Session, ids: List[str], training: bool, evaluation: bool = False) -> None:
        charge = s.default.row_bytes
        for eid in ids:
            ep = s.episodes[eid] = Episode(eid, self.ctx.next_eps_id(), s.session_id, training, evaluation)
            ep.client, ep.charged = s.client, charge
        s.client.state_bytes += charge * len(ids)

    def add_agents(self, rows: List[Rows]) -> None:
        """The rows' agents not seen before in their episodes, in row order: rows split by their
        policies' frame stacks then act part by part, and agent_index stays the order of first
        mention (act moves each to its part's slot table)."""
        for r in rows:
            for ep, aid in zip(r.episodes, r.aids):
                if aid not in ep.agents:
                    ep.add_agent(aid, r.spec, self._table(r.spec))

    def act(self, r: Rows, actions, logp, versions, stepped: set) -> None:
        """Record observation + action per row; completes each agent's previous transition.

        Vectorised over rows through the agents' slot table: one Python loop to
        find the slots, then array operations. `stepped` holds the episodes
        already counted one env step in this call."""
        n = r.n
        table = self._table(r.spec)
        sts = r.states
        if None in sts or any(st.policy_id is None for st in sts):  # first appearances
            for i, st in enumerate(sts):
                if st is None:  # (rewards applied just before may have created it)
                    ep = r.episodes[i]
                    st = sts[i] = ep.agents.get(r.aids[i]) or ep.add_agent(r.aids[i], r.spec, table)
                if st.policy_id is None:
                    if st.table is not table:   # rewarded before it acted; its policy stacks frames
                        st.move_to(r.spec, table)
                    st.policy_id = r.policy_ids[i]
        slots = np.fromiter([st.slot for st in sts], np.int64, n)
        pend = table.pending[slots]
        if r.unique_episodes and not stepped:  # single-agent rows: one row per episode
            counted = r.episodes
            stepped.update(map(id, counted))
            for ep in counted:
                ep.length += 1
            # One agent per episode: the episode's step is one past its pending action's.
            step = np.where(pend, table.t[slots] + 1, 0)
        else:
            counted = []
            step = np.empty(n, np.int64)
            for i, ep in enumerate(r.episodes):
                if id(ep) not in stepped:
                    stepped.add(id(ep))
                    counted.append(ep)
                    ep.length += 1
                step[i] = ep.length - 1   # agents acting in one call share the env step
        new_steps = len(counted)
        collector = self.ctx.collector
        collector.count_env_steps(counted)
        if pend.any():
            idx = np.flatnonzero(pend)
            ps = slots[idx]
            k = len(idx)
            cols = {OBS: tree.take(table.obs, ps), NEW_OBS: tree.take(r.obs, idx),
                    ACTIONS: tree.take(table.act, ps), REWARDS: table.reward_acc[ps].astype(np.float32),
                    TERMINATEDS: np.zeros(k, bool), TRUNCATEDS: np.zeros(k, bool),
                    EPS_ID: table.eps_id[ps], AGENT_INDEX: table.agent_index[ps], T: table.t[ps],
                    POLICY_VERSION: table.version[ps], ACTION_LOGP: table.logp[ps]}
            self._collect_chunk(r, idx, cols)
        # Reward before an agent's first action rewards no action: dropped with the rest.
        table.reward_acc[slots] = 0.0

        def put(dst, src):
            dst[slots] = src
        tree.map_structure(put, table.obs, r.obs)
        tree.map_structure(put, table.act, actions)
        table.logp[slots] = np.nan if logp is None else logp
        table.version[slots] = versions
        table.t[slots] = step
        table.pending[slots] = True
        metrics = self.ctx.metrics
        metrics.env_steps += new_steps
        metrics.agent_steps += n

    def _collect_chunk(self, r: Rows, idx: np.ndarray, cols: dict) -> None:
        """Hand completed transitions (rows idx of r) to the collector, per policy."""
        collector = self.ctx.collector
        eps = [r.episodes[i] for i in idx]
        pids = [r.policy_ids[i] for i in idx]
        if (not collector.complete_episodes and pids.count(pids[0]) == len(pids)
                and all([ep.training_enabled for ep in eps])):
            collector.add_rows(pids[0], cols)  # the common case: one chunk
            return
        for j, ep in enumerate(eps):
            if ep.training_enabled:
                collector.add_transition(ep, pids[j], {k: tree.take(v, j) for k, v in cols.items()})

    def _emit(self, ep: Episode, st: AgentState, new_obs, terminated: bool, truncated: bool) -> None:
        """Complete one agent's pending transition (the per-row path: dones, episode ends)."""
        tb, sl = st.table, st.slot
        if ep.training_enabled:
            self.ctx.collector.add_transition(ep, st.policy_id, {
                OBS: tb.row(sl, "obs"), NEW_OBS: new_obs, ACTIONS: tb.row(sl, "act"),
                REWARDS: np.float32(tb.reward_acc[sl]), TERMINATEDS: terminated, TRUNCATEDS: truncated,
                EPS_ID: ep.index, AGENT_INDEX: st.index, T: int(tb.t[sl]),
                POLICY_VERSION: int(tb.version[sl]), ACTION_LOGP: np.float32(tb.logp[sl]),
            })
        tb.reward_acc[sl] = 0.0
        tb.pending[sl] = False

    def apply_returns(self, s: Session, plans) -> None:
        """Plans validated (RowChecks.check_returns): rewards accrue until each agent's next action."""
        ending: Dict[str, Tuple[Episode, bool]] = {}
        for m, aids, eps, rew, term, trunc, final in plans:
            sts = [ep.agents.get(aid) or self._agent(ep, aid, s.spec_for(aid)) if aid != ALL_AGENTS else None
                   for ep, aid in zip(eps, aids)]
            simple = not (m.terminated or m.truncated or m.infos) and None not in sts
            if simple and (not s.multi_agent or all([st.table is sts[0].table for st in sts])):
                tb = sts[0].table  # the common case: one vectorised update
                if len(sts) == 1:   # a lockstep simulator's reward: np.add.at costs ~3 µs a call
                    sl, r = sts[0].slot, float(rew[0])
                    tb.reward_acc[sl] += r
                    tb.reward_total[sl] += r
                    continue
                slots = np.fromiter((st.slot for st in sts), np.int64, len(sts))
                np.add.at(tb.reward_acc, slots, rew)   # an agent may appear twice: add both
                np.add.at(tb.reward_total, slots, rew)
                continue
            for j, (ep, aid, st) in enumerate(zip(eps, aids, sts)):
                if st is None:  # "__all__"
                    if term[j] or trunc[j]:
                        ending[ep.episode_id] = (ep, bool(trunc[j]) and not term[j])
                    continue
                r = float(rew[j])
                st.table.reward_acc[st.slot] += r
                st.table.reward_total[st.slot] += r
                if m.infos:
                    st.info = json_format.MessageToDict(m.infos[j])
                if term[j] or trunc[j]:
                    if st.pending:
                        new_obs = (stack_final(st, tree.take(final, j)) if final is not None
                                   else st.table.row(st.slot, "obs"))
                        self._emit(ep, st, new_obs, terminated=bool(term[j]), truncated=not term[j])
                    st.done = True
        for ep, truncated in ending.values():
            self.finish_episode(s, ep, {}, truncated=truncated, reason="truncated" if truncated else "terminated")

    def finish_episode(self, s: Session, ep: Episode, finals: dict, truncated: bool, reason: str,
                       drop_pending: bool = False) -> None:
        """Completes every pending agent transition and files the summary."""
        for aid, st in ep.agents.items():
            if st.pending and not st.done:
                if drop_pending:
                    st.table.pending[st.slot] = False  # its outcome was never observed
                else:
                    final = finals.get(aid)
                    final = st.table.row(st.slot, "obs") if final is None else stack_final(st, final)
                    self._emit(ep, st, final, terminated=not truncated, truncated=truncated)
            st.done = True
        del s.episodes[ep.episode_id]
        s.episodes_ended += 1
        s.mark_finished(ep.episode_id, reason, self.ctx.config.finished_ids_kept)
        if ep.training_enabled:
            self.ctx.collector.end_episode(ep)
        summary = ep.summary(reason)
        ep.release()
        self.ctx.file_summary(summary)
