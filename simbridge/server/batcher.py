"""Dynamic batching of GetAction requests: one forward pass for many simulators.

Leader/follower, no dedicated thread: the first caller to find the policy idle
becomes the leader and runs the forward pass for everything pending; callers
arriving meanwhile queue up and are served together by the next pass. With
max_wait_ms = 0 a lone simulator pays no extra latency and batches grow by
themselves under load; max_wait_ms > 0 makes the leader wait for more rows
(up to max_batch_rows) before running.
"""
import inspect
import threading
import time
from typing import Any, List

import numpy as np

from simbridge.wire import tree
from simbridge.server.policies import ActionBatch, Policy


class _Request:
    __slots__ = ("obs", "n", "result", "error", "event", "lead")

    def __init__(self, obs, n):
        self.obs, self.n = obs, n
        self.result = self.error = None
        self.event = threading.Event()
        self.lead = False


class DynamicBatcher:
    def __init__(self, policy: Policy, max_batch_rows: int = 4096, max_wait_ms: float = 0.0,
                 explore: bool = True):
        self.policy = policy
        # False: the greedy actions of evaluation episodes, from a policy whose compute_actions
        # takes `explore` (one that does not acts as it always does).
        self.greedy = not explore and "explore" in inspect.signature(policy.compute_actions).parameters
        self.max_batch_rows = max_batch_rows
        self.max_wait_s = max_wait_ms / 1000.0
        self._cond = threading.Condition()
        self._pending: List[_Request] = []
        self._busy = False
        # Counters for metrics and tests.
        self.forward_passes = 0
        self.rows_served = 0
        self.max_rows_seen = 0

    def compute(self, obs: Any, n: int):
        """Actions for n rows of obs. Returns (actions, logp or None, version)."""
        with self._cond:
            alone = not self._busy and self.max_wait_s == 0
            if alone:
                self._busy = True
            else:
                req = _Request(obs, n)
                self._pending.append(req)
                lead = not self._busy
                if lead:
                    self._busy = True
                else:
                    self._cond.notify_all()  # a waiting leader may now have enough rows
        if alone:  # nobody else is waiting: run inline, no handoff at all
            try:
                return self._forward(obs, n)
            finally:
                self._hand_off()
        if not lead:
            req.event.wait()
            lead = req.lead
        if lead:
            self._lead(req)
        if req.error is not None:
            raise req.error
        return req.result

    def _lead(self, own: _Request) -> None:
        # Serve passes until our own request is answered, then hand leadership
        # to a waiting request (if any) so no caller serves others forever.
        while own.result is None and own.error is None:
            with self._cond:
                if self.max_wait_s > 0:
                    deadline = time.monotonic() + self.max_wait_s
                    while sum(r.n for r in self._pending) < self.max_batch_rows:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                batch, rows = [], 0
                while self._pending and (not batch or rows + self._pending[0].n <= self.max_batch_rows):
                    r = self._pending.pop(0)
                    batch.append(r)
                    rows += r.n
            self._run(batch, rows)
        self._hand_off()

    def _hand_off(self) -> None:
        with self._cond:
            if self._pending:
                nxt = self._pending[0]
                nxt.lead = True
                nxt.event.set()
            else:
                self._busy = False

    def _forward(self, obs: Any, rows: int):
        version = self.policy.version  # read before: the pass used at most these weights
        out: ActionBatch = (self.policy.compute_actions(obs, explore=False) if self.greedy
                            else self.policy.compute_actions(obs))
        self.forward_passes += 1
        self.rows_served += rows
        self.max_rows_seen = max(self.max_rows_seen, rows)
        return out.actions, (None if out.logp is None else np.asarray(out.logp)), version

    def _run(self, batch: List[_Request], rows: int) -> None:
        try:
            actions, logp, version = self._forward(tree.concat([r.obs for r in batch]), rows)
            start = 0
            for r in batch:
                sl = slice(start, start + r.n)
                r.result = (tree.take(actions, sl), None if logp is None else logp[sl], version)
                start += r.n
        except Exception as e:  # the error goes back to every caller of this pass
            for r in batch:
                r.error = e
        for r in batch:
            r.event.set()
