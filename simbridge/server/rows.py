"""The row calls: StartEpisode, GetAction, LogAction, LogReturns, EndEpisode.

Each call validates everything first (row_checks.py) and raises BridgeError
before changing any state, so a bad request has no effect on the session, on
other simulators' episodes or on collected experience; then it applies
(transitions.py) and returns the batch it completed for the runtime to deliver.
A streamed GetAction (defer=True) is answered before its bookkeeping is
applied: that is left in session.pending for ServerContext.settle.
"""
import collections
import functools
import uuid
from typing import Dict, List

import numpy as np

from simbridge.wire import checks
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tree
from simbridge.wire.columns import ALL_AGENTS
from simbridge.server.frame_stack import stack_rows
from simbridge.server.row_checks import RowChecks, Rows, done_in
from simbridge.server.sessions import Session
from simbridge.server.transitions import Transitions
from simbridge.wire.errors import invalid_argument
from simbridge.wire.v1 import simbridge_pb2 as pb


class RowCalls:
    def __init__(self, ctx):
        self.ctx = ctx
        self.checks = RowChecks(ctx)
        self.transitions = Transitions(ctx)

    def start_episode(self, s: Session, req: pb.StartEpisodeRequest, defer: bool = False):
        training = req.training_enabled if req.HasField("training_enabled") else True
        if req.episode_ids:
            ids = list(req.episode_ids)
        else:
            if req.count < 0 or req.count > self.ctx.config.max_rows_per_request:
                raise invalid_argument(f"StartEpisode: count {req.count} out of range")
            ids = [uuid.uuid4().hex for _ in range(max(1, req.count))]
        with self.ctx.lock:
            self.checks.check_new_ids(s, ids)
            self.transitions.open_episodes(s, ids, training, req.evaluation)
        return pb.StartEpisodeResponse(episode_ids=ids)

    # ---- GetAction
    def get_action(self, s: Session, req: pb.GetActionRequest, defer: bool = False) -> pb.GetActionResponse:
        ctx = self.ctx
        rows, plans = self._resolve_with_returns(s, req, "GetAction rows")
        ended_before = s.episodes_ended
        acting = parts = rows
        if ctx.policies.frame_stacks:   # the observations as the policies see them (frame_stack.py)
            with ctx.lock:
                parts = [stack_rows(ctx.policies, r) for r in rows]
            acting = [p for ps in parts for p in ps]
        # Forward passes, outside the lock, batched across simulators per policy.
        results = []
        for p in acting:
            results.append(self._compute(p))
        with ctx.lock:
            self.checks.check_still_open(s, rows, plans, ended_before)
            s.settle()   # another thread's call on this session (unary), if any
            s.pending = functools.partial(self._commit_actions, s, rows, acting, plans, results)
        if not defer:
            ctx.settle(s)
        resp = pb.GetActionResponse()
        if len(acting) > len(rows):   # some AgentRows were split by their policies' frame stacks
            results = _merged(rows, parts, results)
        for r, (actions, _, versions) in zip(rows, results):
            out = resp.actions.add()
            sb_spaces.fill_value(out.actions, r.spec.act_space, actions)
            out.policy_versions.extend(versions)
            out.policy_ids.extend(r.policy_ids)
        return resp

    def _commit_actions(self, s: Session, rows, acting, plans, results) -> None:
        """Lock held. A validated GetAction's effect: its rewards, then the actions it answered
        (acting: the rows as their policies saw them, frame_stack.stack_rows)."""
        self.transitions.apply_returns(s, plans)
        if len(acting) > len(rows):
            self.transitions.add_agents(rows)
        stepped = set()
        for r, (actions, logp, versions) in zip(acting, results):
            self.transitions.act(r, actions, logp, versions, stepped)

    def _resolve_with_returns(self, s: Session, req, what: str):
        rows = self.checks.resolve_agent_rows(s, req.rows, what)
        if not req.rewards:
            return rows, []
        with self.ctx.lock:
            plans = self.checks.check_returns(s, req.rewards)
            self.checks.check_acting_not_done(rows, plans)
        return rows, plans

    def _compute(self, r: Rows):
        policies = self.ctx.policies
        # One batcher per policy and mode: evaluation episodes get greedy actions.
        keys = [(p, ep.evaluation) for p, ep in zip(r.policy_ids, r.episodes)]
        if keys.count(keys[0]) == len(keys):  # common case: one policy and mode for all rows
            actions, logp, version = policies.batcher(*keys[0]).compute(r.obs, r.n)
            return actions, logp, [version] * r.n
        # Rows of several policies or modes: one pass each, then reassembled in row order.
        idx_by_pid: Dict[tuple, List[int]] = collections.defaultdict(list)
        for i, k in enumerate(keys):
            idx_by_pid[k].append(i)
        actions = sb_spaces.zeros_like_space(r.spec.act_space, r.n)
        logp = np.full(r.n, np.nan, np.float32)
        versions = [0] * r.n
        for p, idx in idx_by_pid.items():
            ix = np.asarray(idx)
            a, lp, v = policies.batcher(*p).compute(tree.take(r.obs, ix), len(idx))

            def put(dst, src, ix=ix):
                dst[ix] = src
            tree.map_structure(put, actions, a)
            if lp is not None:
                logp[ix] = lp
            for i in idx:
                versions[i] = v
        return actions, logp, versions

    # ---- LogAction, LogReturns
    def log_action(self, s: Session, req: pb.LogActionRequest, defer: bool = False) -> pb.LogActionResponse:
        if len(req.actions) != len(req.rows):
            raise invalid_argument(f"LogAction: {len(req.rows)} rows messages but {len(req.actions)} "
                                   f"action values; give one per rows message")
        rows, plans = self._resolve_with_returns(s, req, "LogAction rows")
        for i, (r, a) in enumerate(zip(rows, req.actions)):
            what = f"actions of rows {i}"
            r.actions = sb_spaces.decode_value(r.spec.act_space, a, r.n, what)
            sb_spaces.check_contains(r.spec.act_space, r.actions, r.n, what)
        with self.ctx.lock:
            self.checks.check_still_open(s, rows, plans)
            parts = rows
            if self.ctx.policies.frame_stacks:   # as in get_action
                parts = [p for r in rows for p in _with_actions(r, stack_rows(self.ctx.policies, r))]
            self.transitions.apply_returns(s, plans)
            if len(parts) > len(rows):
                self.transitions.add_agents(rows)
            stepped = set()
            for p in parts:
                self.transitions.act(p, p.actions, None, [-1] * p.n, stepped)  # version -1: the simulator's own choice
            batch = self.ctx.ready()
        self.ctx.deliver(batch)
        return pb.LogActionResponse()

    def log_returns(self, s: Session, req: pb.LogReturnsRequest, defer: bool = False) -> pb.LogReturnsResponse:
        with self.ctx.lock:
            plans = self.checks.check_returns(s, req.rows)
            for em in req.custom_metrics:
                self.checks.open_episode(s, em.episode_id)
                checks.ids(list(em.values), self.ctx.config.max_id_bytes, "custom metric name")
            self.transitions.apply_returns(s, plans)
            for em in req.custom_metrics:
                s.episodes[em.episode_id].custom_metrics.update(em.values)
            batch = self.ctx.ready()
        self.ctx.deliver(batch)
        return pb.LogReturnsResponse()

    # ---- EndEpisode
    def end_episode(self, s: Session, req: pb.EndEpisodeRequest, defer: bool = False) -> pb.EndEpisodeResponse:
        eids = list(req.episode_ids)
        if not eids:
            raise invalid_argument("EndEpisode: no episode ids")
        if len(set(eids)) != len(eids):
            raise invalid_argument("EndEpisode: episode ids repeat within the request")
        if len(req.truncated) not in (0, 1, len(eids)):
            raise invalid_argument(f"EndEpisode: {len(req.truncated)} truncated flags for {len(eids)} "
                                   f"episodes; give one per episode or one for all")
        checks = self.checks
        finals: Dict[str, Dict[str, object]] = {eid: {} for eid in eids}
        for i, m in enumerate(req.final_observations):
            what = f"final observations of rows {i}"
            f_eids, f_aids, n = checks.resolve_ids(s, m.episode_ids, m.agent_ids, what)
            spec = checks.rows_spec(s, f_aids, what)
            obs = spec.decode_obs(m.observations, n, what)
            for j, (eid, aid) in enumerate(zip(f_eids, f_aids)):
                if eid not in finals:
                    raise invalid_argument(f"{what}: episode {eid!r} is not among the episodes being ended")
                finals[eid][aid] = tree.take(obs, j)
        with self.ctx.lock:
            eps = [checks.open_episode(s, eid) for eid in eids]
            starts = list(req.start_episode_ids)
            if starts:
                checks.check_new_ids(s, starts, ending=len(eids))
            plans = checks.check_returns(s, req.rewards)
            if any(aid == ALL_AGENTS for _, aid in done_in(plans)):
                raise invalid_argument("EndEpisode: attached rewards may not mark '__all__' done: "
                                       "EndEpisode ends the episode itself")
            flags = req.truncated
            truncated = [bool(flags[0 if len(flags) == 1 else k]) if flags else False for k in range(len(eps))]
            checks.check_end_finals(s, eps, truncated, finals, plans)
            self.transitions.apply_returns(s, plans)
            for ep, tr in zip(eps, truncated):
                reason = ("simulator_stopped" if req.stopping else "truncated") if tr else "terminated"
                self.transitions.finish_episode(s, ep, finals[ep.episode_id], truncated=tr, reason=reason)
            if starts:
                training = req.start_training_enabled if req.HasField("start_training_enabled") else True
                self.transitions.open_episodes(s, starts, training, req.start_evaluation)
            batch = self.ctx.ready()
        self.ctx.deliver(batch)
        return pb.EndEpisodeResponse()

    def end_all(self, s: Session, reason: str) -> List[str]:
        """Lock held (CloseSession, reaper). Every open episode ends truncated; actions whose
        outcome never came are dropped. Returns their ids."""
        ended = list(s.episodes)
        for ep in list(s.episodes.values()):
            self.transitions.finish_episode(s, ep, {}, truncated=True, reason=reason, drop_pending=True)
        return ended


def _with_actions(r: Rows, parts: List[Rows]) -> List[Rows]:
    """LogAction: each part of r (frame_stack.stack_rows) with its rows' logged actions."""
    for p in parts:
        p.actions = r.actions if p.idx is None else tree.take(r.actions, p.idx)
    return parts


def _merged(rows: List[Rows], parts: List[List[Rows]], results: list) -> list:
    """The results of the parts, back in their AgentRows' row order: (actions, None, versions) per rows."""
    out, it = [], iter(results)
    for r, ps in zip(rows, parts):
        got = [next(it) for _ in ps]
        if len(ps) == 1 and ps[0].idx is None:
            out.append(got[0])
            continue
        actions = sb_spaces.zeros_like_space(r.spec.act_space, r.n)
        versions = [0] * r.n
        for p, (a, _, v) in zip(ps, got):
            def put(dst, src, ix=p.idx):
                dst[ix] = src
            tree.map_structure(put, actions, a)
            for i, j in enumerate(p.idx.tolist()):
                versions[j] = v[i]
        out.append((actions, None, versions))
    return out
