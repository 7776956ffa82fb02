"""Batched simulators: N slots stepped with one Step call, envrax-style.

A session created with num_slots = N holds a SlotBank: one open episode per
slot, the actions of the previous Step waiting for their outcome, and
per-slot counters, all as arrays. A Step brings the outcome of the previous
actions for all N slots (rewards, terminated, truncated, the final
observations of the slots that ended) and the observations to act on next
(for an ended slot: the first observation of its next episode, per-slot
auto-reset). The bank turns that into N transitions with array operations
(no per-slot Python loop; only ended episodes cost a loop, for their
summaries), asks the policy for N actions in one forward pass and answers.

Validation comes first, as everywhere in the bridge: a bad Step raises
before anything changes, so the simulator may correct it and send it again.

A streamed Step is answered before its outcome is recorded: validation, the
forward pass and the reply are all the simulator waits for. The bookkeeping
(N transitions, ended episodes, hand-over to the learner) is left in
`session.pending` and settled while the reply travels and the simulator
steps (ServerContext.settle).

SlotCalls receives the ServerContext (config, lock, policies, collector,
metrics, summary filing) and nothing else of the runtime.
"""
import functools
import logging
import threading
import time
from typing import Optional

import numpy as np

from simbridge.wire import checks, leaf_codec, tree
from simbridge.wire.checks import flags
from simbridge.server.episodes import Episode, episode_summary
from simbridge.server.policies import SlotStep, StepPolicy
from simbridge.wire.errors import Reason, failed_precondition, invalid_argument
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.columns import (ACTION_LOGP, ACTIONS, AGENT_INDEX, EPS_ID, NEW_OBS, OBS, POLICY_VERSION,
                                    REWARDS, SINGLE_AGENT_ID, T, TERMINATEDS, TRUNCATEDS)

log = logging.getLogger("simbridge")

MAX_SLOTS = 65_536
_OUTCOME_FIELDS = ("rewards", "terminated", "truncated", "final_observations")


class SlotBank:
    """The N slots of one batched simulator session."""

    def __init__(self, ctx, session, n: int, training: bool, evaluation: bool = False):
        self.n = n
        self.evaluation = evaluation   # greedy actions; never trained
        self.training = training and not evaluation
        self.spec = session.default
        self.decode_obs = self.spec.decode_obs
        self.encode_actions = leaf_codec.batch_encoder(self.spec.act_space)
        self._versions = (None, None, b"")   # (version, (n,) array, its bytes): see versions()
        self.no_logp = np.full(n, np.nan, np.float32)   # for policies without logp; read-only, shared
        self.no_logp.flags.writeable = False
        # The policy is bound once, for the single agent id, as a row session binds it on
        # its agent's first appearance; all slots act with it. (No runtime lock held here:
        # the policy may be created.)
        probe = Episode(f"{session.session_id}/slots", -1, session.session_id, training)
        self.policy_id = ctx.policy_mapping_fn(SINGLE_AGENT_ID, probe)
        ctx.policies.ensure(self.policy_id, self.spec, SINGLE_AGENT_ID)
        # The policy's frame stacking (frame_stack.py; None: it stacks nothing); with it, prev_obs
        # holds the slots' stacks.
        self.frames = ctx.policies.spec_for(self.policy_id, self.spec).frames
        self.eps_index = np.array([ctx.next_eps_id() for _ in range(n)], np.int64)
        self.t = np.zeros(n, np.int64)               # actions taken in the slot's episode
        self.returns = np.zeros(n, np.float64)
        self.started = np.full(n, time.time())
        self.agent_index = np.zeros(n, np.int64)     # one agent per episode: always 0
        # The previous Step's actions, waiting for their outcome (None before the first Step).
        self.prev_obs = self.prev_act = self.prev_logp = self.prev_version = None
        self.closed = False
        self.busy = threading.Lock()
        self.fragment: list = []                      # per-Step row chunks not yet handed over
        self.held: list = []                          # complete_episodes mode: open episodes' rows
        self.session_id = session.session_id

    def versions(self, version: int):
        """(n,) int64 array of `version` and its wire bytes, made once per policy version:
        read-only, shared by every Step's rows and replies until the version changes."""
        if version != self._versions[0]:
            arr = np.full(self.n, version, np.int64)
            arr.flags.writeable = False
            self._versions = (version, arr, arr.tobytes())
        return self._versions[1], self._versions[2]


class SlotCalls:
    """Step and the slot banks' life: creation, hand-over, close."""

    def __init__(self, ctx):
        self.ctx = ctx

    def create_bank(self, session, req: pb.CreateSessionRequest) -> Optional[SlotBank]:
        """Called by CreateSession, without the runtime lock; validates num_slots."""
        n = req.num_slots
        if n == 0:
            for field in ("slots_training_enabled", "slots_evaluation"):
                if req.HasField(field):
                    raise invalid_argument(f"{field} needs num_slots > 0")
            return None
        if session.multi_agent:
            raise invalid_argument("num_slots is for ExternalEnv sessions (one agent per slot); on "
                                   "ExternalMultiAgentEnv send the agents as rows of one episode")
        if not 0 < n <= MAX_SLOTS:
            raise invalid_argument(f"num_slots must be in 1..{MAX_SLOTS}, got {n}")
        limit = self.ctx.config.max_rows_per_request
        if n > limit:
            raise invalid_argument(f"num_slots {n} exceeds the server's max_rows_per_request {limit}")
        training = req.slots_training_enabled if req.HasField("slots_training_enabled") else True
        return SlotBank(self.ctx, session, n, training, req.slots_evaluation)

    # ------------------------------------------------------------ Step

    def step(self, session, req: pb.StepRequest, defer: bool = False) -> pb.StepResponse:
        """One Step. defer=True leaves its commit pending for settle() (streams);
        otherwise it is applied before returning."""
        bank: Optional[SlotBank] = session.slots
        if bank is None:
            raise failed_precondition("this session has no slots: create it with CreateSession.num_slots = N "
                                      "to drive it with Step, or use the row calls (GetAction, ...)", Reason.WRONG_SESSION_KIND)
        if not bank.busy.acquire(blocking=False):
            raise failed_precondition("another Step of this session is still being served: a batched "
                                      "simulator sends one Step at a time", Reason.CALL_IN_PROGRESS)
        try:
            resp = self._step(session, bank, req)
            if not defer:
                self.ctx.settle(session)
            return resp
        finally:
            bank.busy.release()

    def _step(self, session, bank: SlotBank, req: pb.StepRequest) -> pb.StepResponse:
        n = bank.n
        if bank.closed:
            raise failed_precondition("this session's slots were stopped by a final Step: create a new session", Reason.WRONG_SESSION_KIND)
        first = bank.prev_obs is None

        # ---- validate everything, change nothing
        if req.final:
            if req.HasField("observations"):
                raise invalid_argument("a final Step has no observations (nothing acts after it)")
            obs = None
        else:
            if not req.HasField("observations"):
                raise invalid_argument(f"Step needs observations for all {n} slots, leaves shaped ({n}, ...)")
            obs = bank.decode_obs(req.observations, n, "Step observations")
        if first:
            given = [f for f in _OUTCOME_FIELDS if req.HasField(f)]
            if given:
                raise invalid_argument(f"the first Step of a session has no previous actions, so no outcome: "
                                       f"leave {', '.join(given)} empty")
            rewards = term = trunc = finals = stopped = None
            done_idx = np.zeros(0, np.int64)
        else:
            if not req.HasField("rewards"):
                raise invalid_argument(f"Step needs rewards: float32 ({n},), the outcome of the previous actions")
            rewards = checks.rewards(req.rewards, n, "Step rewards", "one per slot", "Step rewards: slot {}")
            term = _flags(req, "terminated", n)
            trunc = _flags(req, "truncated", n) & ~term   # terminated wins: no bootstrap past a terminal state
            done = term | trunc
            stopped = None
            if req.final:
                done_idx = np.arange(n)
                stopped = ~done   # the final Step cuts these short: their environment did not end them
                trunc = ~term
            else:
                done_idx = done.nonzero()[0]
            k = len(done_idx)
            if req.HasField("final_observations"):
                what = "Step final_observations" + (" (a final Step: one per slot)" if req.final else
                                                    f" (one per ended slot: {k})")
                finals = bank.decode_obs(req.final_observations, k, what)
            elif k and trunc[done_idx].any():
                cut = done_idx[trunc[done_idx]][:8].tolist()
                raise invalid_argument(f"slots {cut} are truncated: send their last observations in "
                                       f"final_observations (learners bootstrap from them)")
            else:
                finals = None   # all terminated: the value of their last observation never matters

        if bank.frames is not None:   # the observations as the policy sees them: stacked per slot
            obs, finals = _stacked(bank, first, obs, done_idx, finals)

        # ---- act first: one forward pass for all slots (shared with other simulators by the
        # batcher). Should the policy fail, nothing has changed and the Step can be sent again.
        actions = logp = versions = None
        policy = self.ctx.policies[bank.policy_id]
        if isinstance(policy, StepPolicy):   # it sees the whole Step, outcome included
            out = policy.compute_step(SlotStep(session.session_id, n, first, bool(req.final), obs, rewards,
                                               term, trunc, done_idx, finals))
            if not req.final:
                actions, logp, version = out.actions, out.logp, policy.version
        elif not req.final:
            actions, logp, version = self.ctx.policies.batcher(bank.policy_id, bank.evaluation).compute(obs, n)
        if not req.final:
            versions, versions_bytes = bank.versions(version)
        if session.closed:
            raise failed_precondition("the session was closed", Reason.SESSION_UNKNOWN)

        # ---- the outcome and the new pending actions are applied together, later (settle)
        with self.ctx.lock:
            session.settle()   # a row call's, if the simulator mixes them in
            session.pending = functools.partial(self._commit, session, bank, req.final, first, obs, rewards,
                                                term, trunc, done_idx, finals, actions, logp, versions, stopped)
        resp = pb.StepResponse(policy_id=bank.policy_id)
        if not req.final:
            bank.encode_actions(resp.actions, actions, "actions from the policy")
            v = resp.policy_versions
            v.dtype, v.data = pb.INT64, versions_bytes
            v.shape.append(n)
        return resp

    def _commit(self, session, bank: SlotBank, final, first, obs, rewards, term, trunc, done_idx, finals,
                actions, logp, versions, stopped=None) -> None:
        """Lock held. A validated Step's effect on the bank."""
        if not first:
            self._record_outcome(session, bank, obs, rewards, term, trunc, done_idx, finals, stopped)
        if final:
            bank.closed = True
            if bank.fragment:
                self._hand_over(bank)
        else:
            bank.prev_obs, bank.prev_act, bank.prev_version = obs, actions, versions
            n = bank.n
            bank.prev_logp = bank.no_logp if logp is None else np.asarray(logp, np.float32)
            metrics = self.ctx.metrics
            metrics.env_steps += n
            metrics.agent_steps += n

    def _record_outcome(self, session, bank: SlotBank, obs, rewards, term, trunc, done_idx, finals,
                        stopped=None) -> None:
        """Lock held. Completes the N pending transitions; ends and restarts the slots that are done."""
        if len(done_idx):
            if obs is None:   # final Step: every slot ended; the finals are their last observations
                new_obs = finals if finals is not None else bank.prev_obs
            else:
                new_obs = tree.map_structure(np.array, obs)   # writable copy: ended rows get their finals
                src = finals if finals is not None else tree.map_structure(lambda a: a[done_idx], bank.prev_obs)

                def put(dst, s):
                    dst[done_idx] = s
                tree.map_structure(put, new_obs, src)
        else:
            new_obs = obs
        bank.returns += rewards
        if bank.training:
            collector = self.ctx.collector
            cols = {OBS: bank.prev_obs, NEW_OBS: new_obs, ACTIONS: bank.prev_act,
                    REWARDS: rewards, TERMINATEDS: term, TRUNCATEDS: trunc,
                    EPS_ID: bank.eps_index.copy(), AGENT_INDEX: bank.agent_index, T: bank.t.copy(),
                    POLICY_VERSION: bank.prev_version, ACTION_LOGP: bank.prev_logp}
            if collector.complete_episodes:
                self._hold_until_complete(bank, cols, done_idx)
            else:
                # As RLlib's vector envs: a fragment is rollout_fragment_length steps of every
                # slot, so a wide simulator hands over one big batch now and then instead of
                # a small one every step.
                bank.fragment.append(cols)
                if len(bank.fragment) >= collector.rollout_fragment_length:
                    self._hand_over(bank)
        bank.t += 1
        if len(done_idx):
            self._end_slot_episodes(session, bank, done_idx, trunc, stopped=stopped)

    def hand_over(self, session) -> None:
        """Lock held. The slot rows gathered so far go to the collector now (runtime.flush)."""
        bank = session.slots
        if bank is not None and bank.fragment:
            self._hand_over(bank)

    def _hand_over(self, bank: SlotBank) -> None:
        collector = self.ctx.collector
        for cols in bank.fragment:
            collector.add_rows(bank.policy_id, cols)
        collector.add_env_steps(bank.n * len(bank.fragment))
        bank.fragment = []

    def _hold_until_complete(self, bank: SlotBank, cols: dict, done_idx) -> None:
        """complete_episodes: rows wait in the bank until their episode ends, then go whole."""
        bank.held.append(cols)
        if not len(done_idx):
            return
        held = bank.held[0] if len(bank.held) == 1 else _concat(bank.held)
        ended = np.isin(held[EPS_ID], bank.eps_index[done_idx])
        k = int(ended.sum())
        self.ctx.collector.add_rows(bank.policy_id, _select(held, ended))
        self.ctx.collector.add_env_steps(k)
        bank.held = [_select(held, ~ended)] if k < len(ended) else []

    def _end_slot_episodes(self, session, bank: SlotBank, done_idx, trunc, reason: str = "",
                           stopped=None) -> None:
        """Summaries for the ended episodes, then fresh episodes in their slots. stopped: the slots
        a final Step cut short (all slots' mask)."""
        now = time.time()
        cut_short = stopped if stopped is not None else np.zeros(bank.n, bool)
        pid, sid, training = bank.policy_id, bank.session_id, bank.training
        prefix = f"{sid[:8]}-slot"
        self.ctx.file_summaries([episode_summary(
            f"{prefix}{i}-{eidx}", eidx, sid, length, {SINGLE_AGENT_ID: ret}, {SINGLE_AGENT_ID: pid}, {},
            training, reason or ("simulator_stopped" if cut_short[i] else "truncated" if cut else "terminated"),
            now - started, bank.evaluation,
        ) for i, eidx, ret, length, started, cut in zip(
            done_idx.tolist(), bank.eps_index[done_idx].tolist(), bank.returns[done_idx].tolist(),
            bank.t[done_idx].tolist(), bank.started[done_idx].tolist(), trunc[done_idx].tolist())])
        k = len(done_idx)
        session.episodes_ended += k
        bank.eps_index[done_idx] = [self.ctx.next_eps_id() for _ in range(k)]
        bank.t[done_idx] = 0
        bank.returns[done_idx] = 0.0
        bank.started[done_idx] = now

    def close_bank(self, session, reason: str) -> int:
        """Lock held (CloseSession, reaper). The outcome of the last actions was never
        observed, so those transitions are dropped (as the row path drops an unanswered
        action); episodes that took steps get their summaries, ended as `reason`.
        Returns the number of episodes ended."""
        bank: Optional[SlotBank] = session.slots
        if bank is None or bank.closed:
            return 0
        bank.closed = True
        policy = self.ctx.policies.get(bank.policy_id)
        if isinstance(policy, StepPolicy):
            policy.slots_closed(session.session_id, reason)
        if bank.fragment:
            self._hand_over(bank)
        if bank.held:   # complete_episodes: the cut episodes go as they are
            held = _concat(bank.held)
            self.ctx.collector.add_rows(bank.policy_id, held)
            self.ctx.collector.add_env_steps(len(held[T]))
            bank.held = []
        live = np.flatnonzero(bank.t > 0)
        if len(live):
            self._end_slot_episodes(session, bank, live, np.ones(bank.n, bool), reason)
        return len(live)


def _stacked(bank: SlotBank, first: bool, obs, done_idx, finals):
    """A Step's observations and finals onto the slots' last stacks; a slot whose episode starts
    (the session's first Step, an auto-reset) starts its stack with its first frame."""
    frames, prev = bank.frames, bank.prev_obs
    if finals is not None:
        finals = frames.push(prev[done_idx], finals)
    if obs is not None:
        fresh = None
        if not first:
            fresh = np.zeros(bank.n, bool)
            fresh[done_idx] = True
        obs = frames.next(prev, obs, fresh)
    return obs, finals


def _flags(req: pb.StepRequest, name: str, n: int) -> np.ndarray:
    return flags(getattr(req, name) if req.HasField(name) else None, n, f"Step {name}", "one per slot")


def _concat(chunks: list) -> dict:
    return {key: tree.concat([c[key] for c in chunks], fresh=True) for key in chunks[0]}


def _select(cols: dict, mask: np.ndarray) -> dict:
    return {key: tree.take(v, mask) for key, v in cols.items()}
