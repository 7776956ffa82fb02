"""The simulators' side of BridgeVectorEnv: `StepHub`, the one policy every slot session maps
to. It computes nothing: each simulator's Step is parked (on the simulator's gRPC thread, in
compute_step) with its outcome until the learner's step() answers it, and once the VectorEnv
closes every Step, parked or still to come, is answered TRAINING_OVER (a simulator's normal end).

A `Member` is one simulator session as both sides see it. BridgeVectorEnv reads and writes the
members (admits them to sub-environments, hands their answers over) on its own thread, always
under the hub's `cond`.
"""
import threading
import time
from typing import Any, Dict, Optional

import numpy as np

from simbridge.server.policies import ActionBatch, SlotStep, StepPolicy
from simbridge.wire.errors import BridgeError, Reason, failed_precondition


class Member:
    """One simulator session: its slots, the sub-environments they fill, its parked Step."""
    __slots__ = ("sid", "n", "envs", "arrived", "answer", "closed", "last_obs")

    def __init__(self, sid: str, n: int):
        self.sid, self.n = sid, n
        self.envs: Optional[np.ndarray] = None   # sub-env indices, once admitted
        self.arrived: Optional[SlotStep] = None  # a Step the learner has not seen yet
        self.answer: Any = None                  # the learner's actions for the parked Step
        self.closed: Optional[str] = None        # why its slots stopped
        self.last_obs: Any = None                # the rows the learner saw last (final obs on loss)


class StepHub(StepPolicy):
    """The policy every slot session maps to: parks Steps for the VectorEnv (compute_step,
    simulator threads) and hands them over (the VectorEnv's thread, under `cond`)."""

    def __init__(self, observation_space, action_space):
        super().__init__(observation_space, action_space)
        self.cond = threading.Condition()
        self.members: Dict[str, Member] = {}
        self.shut = False
        self.parked = 0   # Steps waiting in compute_step: close() lets them hear why before the server stops

    def compute_step(self, step: SlotStep) -> Optional[ActionBatch]:
        with self.cond:
            if self.shut:
                raise _over()
            m = self.members.get(step.session_id)
            if m is None:
                m = self.members[step.session_id] = Member(step.session_id, step.n)
            m.arrived, m.answer = step, None
            self.cond.notify_all()
            if step.final:
                return None
            # The simulator waits for the learner as it would for any policy: no deadline but
            # the learner's own (it closes the VectorEnv, or this session goes).
            self.parked += 1
            try:
                while m.answer is None and m.closed is None and not self.shut:
                    self.cond.wait(1.0)
            finally:
                self.parked -= 1
                self.cond.notify_all()
            if m.answer is None:
                if self.shut:
                    raise _over()
                raise failed_precondition(f"this session was closed ({m.closed})", Reason.SESSION_UNKNOWN)
            answer, m.answer = m.answer, None
            return ActionBatch(answer)

    def slots_closed(self, session_id: str, reason: str) -> None:
        with self.cond:
            m = self.members.get(session_id)
            if m is not None and m.closed is None:
                m.closed = reason
                self.cond.notify_all()

    def close(self, wait_s: float) -> None:
        """Every Step, parked or still to come, is answered TRAINING_OVER (a simulator's normal
        end); returns once the parked ones were (or after wait_s)."""
        deadline = time.monotonic() + wait_s
        with self.cond:
            self.shut = True
            self.cond.notify_all()
            while self.parked and time.monotonic() < deadline:
                self.cond.wait(max(0.0, min(0.1, deadline - time.monotonic())))


def _over() -> BridgeError:
    return failed_precondition("the learner closed its BridgeVectorEnv: training is over",
                               Reason.TRAINING_OVER)
