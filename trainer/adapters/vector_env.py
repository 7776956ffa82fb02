"""simbridge as a gymnasium VectorEnv: external simulators' slots are its sub-environments.

`BridgeVectorEnv` hosts a bridge server (a `BridgeRuntime` behind a `BridgeServer`, as the
trainer daemon does) and serves its single policy with a `StepPolicy` that computes nothing
(`StepHub`, step_hub.py): each batched simulator's Step (simbridge-sim --slots K, or any
SlotClient) is parked with its outcome until the learner calls `step(actions)`, which answers
every parked Step and waits for the next ones. The learner (Stable-Baselines3, CleanRL, RLlib,
...) sees one VectorEnv:

- sub-environments are simulator slots; a simulator's slots are admitted together when as
  many sub-environments are free (in order of arrival), so the connected simulators' --slots
  must add up to num_envs;
- `reset()` waits until every sub-environment has its first observation;
- `step(actions)` returns what the simulators report next. Autoreset is gymnasium's SAME_STEP
  (the simulators reset their own slots inside the Step that ends an episode): an ended
  sub-environment's observation is its next episode's first, the last one is in
  `infos["final_obs"]`, with `infos["final_info"]`. autoreset_mode=NEXT_STEP (for gymnasium's
  observation wrappers) shows the last one instead, and a reset step next (_as_next_step);
- a simulator that goes away (killed, or its final Step) ends its sub-environments' episodes
  (truncated, unless it reported terminated; the final observation is the last one seen) and
  they take the slots of the next simulator that connects;
- spaces come from the constructor; a simulator declaring others is refused by the bridge
  (SPACE_MISMATCH, naming both).

Every wait is bounded (connect_timeout_s, step_timeout_s) and its error says what to start.
Rewards, episodes and step counts are the simulators'; the bridge's own rules (validation,
exactly-once sequence numbers, limits) stay as they are. No torch here.
"""
import re
import threading
import time
import warnings
from typing import Dict, List, Optional, Union

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from simbridge.server.cli import drain
from simbridge.server.mapping import DEFAULT_POLICY
from simbridge.server.policies import SlotStep
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.service import BridgeServer
from simbridge.trainer.adapters.step_hub import Member, StepHub
from simbridge.wire import leaf_codec, tree
from simbridge.wire import spaces as sb_spaces
from simbridge.wire.errors import BridgeError, Reason, failed_precondition
from simbridge.wire.v1 import simbridge_pb2 as pb


def _for_python(bind_error: str) -> str:
    """The bridge's bind errors name the CLIs' flag (--address HOST:PORT); a Python caller passes
    the constructor's argument instead."""
    said = re.sub(r"--address (\S+)", r"BridgeVectorEnv(address='\1')", bind_error)
    return said + (" ('127.0.0.1:0' binds any free port; the env's .address then says which)"
                   if said != bind_error else "")


def _set_row(batch, i, row) -> None:
    """batch[i] = row, leaf by leaf (i: an index, or an array of them with rows to match)."""
    def put(dst, src):
        dst[i] = src
    tree.map_structure(put, batch, row)


def _row(rows, i):
    """Row i, the learner's own copy (decoded rows are read-only views of the message)."""
    return tree.map_structure(np.array, tree.take(rows, i))


def _autoreset_mode(mode) -> AutoresetMode:
    try:   # the enum, its value ("NextStep") or its name ("NEXT_STEP")
        mode = AutoresetMode(mode) if not isinstance(mode, str) or mode not in AutoresetMode.__members__ \
            else AutoresetMode[mode]
    except ValueError:
        mode = None
    if mode not in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):
        raise ValueError("autoreset_mode must be AutoresetMode.SAME_STEP (the simulators' own, the default) or "
                         "AutoresetMode.NEXT_STEP (for gymnasium's observation wrappers); the simulators reset "
                         "their slots themselves, so DISABLED cannot be offered")
    return mode


class BridgeVectorEnv(gym.vector.VectorEnv):
    """num_envs sub-environments served by external simulators connected to `address`.

    observation_space / action_space: one sub-environment's (the simulators must declare the
    same). connect_timeout_s bounds reset() and the wait for a replacement simulator;
    step_timeout_s bounds the wait for the simulators' next Steps. reconnect_grace_s: how long
    a simulator whose connection broke may take to reconnect before its episodes end truncated.
    autoreset_mode: SAME_STEP (the default: every simulator step is the learner's) or NEXT_STEP
    (gymnasium's observation wrappers need it; each episode's first step is the simulator's alone).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, observation_space: gym.Space, action_space: gym.Space,
                 address: str = "127.0.0.1:50051", connect_timeout_s: float = 60.0,
                 step_timeout_s: float = 60.0, reconnect_grace_s: float = 5.0,
                 config: Optional[BridgeConfig] = None,
                 autoreset_mode: Union[AutoresetMode, str] = AutoresetMode.SAME_STEP):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.metadata = {**self.metadata, "autoreset_mode": _autoreset_mode(autoreset_mode)}
        self._next_step = self.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        self._reset_next = np.zeros(num_envs, bool)   # NEXT_STEP: sub-envs whose next step() is their reset step
        self._ends: Dict[int, tuple] = {}             # NEXT_STEP: this step()'s ends, (final obs, info) by sub-env
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = observation_space, action_space
        self.observation_space = batch_space(observation_space, num_envs)
        self.action_space = batch_space(action_space, num_envs)
        self.connect_timeout_s, self.step_timeout_s = connect_timeout_s, step_timeout_s
        self._hub = StepHub(observation_space, action_space)
        cfg = config or BridgeConfig(reconnect_grace_s=reconnect_grace_s, max_wait_ms=0.0)
        self.runtime = BridgeRuntime(cfg, policy_factory=self._no_other_policy)
        self.runtime.add_policy(DEFAULT_POLICY, self._hub)   # spaces checked on every session
        try:
            self._server = BridgeServer(self.runtime, address).start()
        except RuntimeError as e:
            raise RuntimeError(_for_python(str(e))) from None
        self.address = self._server.address
        self._stop = threading.Event()
        threading.Thread(target=drain, args=(self.runtime, self._stop), daemon=True,
                         name="simbridge-vecenv-drain").start()   # experience nobody trains on here
        self._envs: List[Optional[Member]] = [None] * num_envs   # who serves each sub-env
        self._standby: List[Member] = []                          # connected, waiting for room
        self._obs = sb_spaces.zeros_like_space(observation_space, num_envs)
        self._encode = leaf_codec.batch_encoder(action_space)
        self._decode = leaf_codec.batch_decoder(action_space)
        self._started = False
        self._failed = ""
        self.closed = False

    def _no_other_policy(self, policy_id, observation_space, action_space):
        raise failed_precondition(f"this server serves one policy ({DEFAULT_POLICY!r}); "
                                  f"{policy_id!r} is not served", Reason.SPACE_MISMATCH)

    # ------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        """The first observation of every sub-environment. The simulators own their episodes and
        seeds: a later reset() returns the current observations (the episodes go on)."""
        self._check_open()
        if self._started:
            warnings.warn("BridgeVectorEnv.reset() after the first: the simulators' episodes go on "
                          "(they reset themselves); returning the current observations", stacklevel=2)
            return tree.map_structure(np.copy, self._obs), {}
        hub = self._hub
        deadline = time.monotonic() + self.connect_timeout_s
        with hub.cond:
            while True:
                self._take_arrivals()
                self._admit()
                if all(m is not None for m in self._envs):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(TimeoutError(self._missing("reset()", self.connect_timeout_s)))
                hub.cond.wait(min(left, 0.5))
        self._started = True
        self._reset_next[:] = False
        return tree.map_structure(np.copy, self._obs), {}

    def step(self, actions):
        """Answer every sub-environment's pending Step with `actions`; return what comes next."""
        self._check_open()
        if not self._started:
            raise RuntimeError("call reset() before step()")
        n = self.num_envs
        what = f"step() actions (one row per sub-environment, {n} rows)"
        try:   # checked here, so a bad action is the learner's error, not the simulator's
            msg = pb.Value()
            self._encode(msg, actions, what)
            actions = self._decode(msg, n, what)   # the space's dtypes and shapes, as the wire's
            sb_spaces.check_contains(self.single_action_space, actions, n, what)
        except BridgeError as e:
            raise ValueError(e.message) from None
        hub = self._hub
        rewards = np.zeros(n, np.float64)
        term = np.zeros(n, bool)
        trunc = np.zeros(n, bool)
        infos: dict = {}
        self._ends.clear()
        with hub.cond:
            waiting = {id(m): m for m in self._envs}.values()   # each member once
            for m in waiting:
                if m.closed is None:
                    m.answer = tree.take(actions, m.envs)
            hub.cond.notify_all()
            deadline = time.monotonic() + self.step_timeout_s
            todo = list(waiting)
            while True:
                self._take_arrivals()
                for m in list(todo):
                    step = m.arrived if m.arrived is not None and not m.arrived.first else None
                    if step is not None:
                        m.arrived = None
                        self._outcome(m, step, rewards, term, trunc, infos)
                    elif m.closed is not None:   # gone without a final Step: its episodes are cut
                        self._end(m, np.arange(m.n), None, trunc, infos, m.closed)
                    else:
                        continue
                    todo.remove(m)
                if not todo:
                    self._admit()
                    if all(m is not None for m in self._envs):
                        break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(TimeoutError(self._missing("step()", self.step_timeout_s) if not todo
                                                  else self._late(todo)))
                hub.cond.wait(min(left, 0.5))
        obs = tree.map_structure(np.copy, self._obs)
        if self._next_step:
            self._as_next_step(obs, rewards, term, trunc, infos)
        return obs, rewards, term, trunc, infos

    def _as_next_step(self, obs, rewards, term, trunc, infos) -> None:
        """gymnasium's NEXT_STEP from the simulators' same-step resets: an ended sub-environment
        shows its final observation; its next step() is its reset step (reward 0, not done), where
        the simulator, which has reset the slot already and waits for its action, takes the
        step's action (the one NEXT_STEP ignores) on the new episode's first observation. The
        learner's episode starts at the observation that returns, the one the simulator waits
        on: the new episode's first step, and its reward, stay the simulator's alone."""
        resetting = self._reset_next.copy()
        rewards[resetting], term[resetting], trunc[resetting] = 0.0, False, False
        self._reset_next[:] = term | trunc
        for i, (last, info) in sorted(self._ends.items()):
            if resetting[i]:   # an episode begun and ended within the reset step: unseen, as its first step
                continue
            _set_row(obs, i, last)
            if info:
                self._add_info(infos, info, i)

    def close_extras(self, **kwargs) -> None:
        # The simulators hear TRAINING_OVER (they stop cleanly) before the server goes: one whose
        # stream were cut instead would try to reconnect, then fail.
        self._hub.close(wait_s=5.0)
        self._stop.set()
        self._server.stop(grace=1.0)

    # ------------------------------------------------------------ with hub.cond held

    def _take_arrivals(self) -> None:
        """New sessions (their first Step arrived) join the standby line; closed ones leave it."""
        hub = self._hub
        known = {id(m) for m in self._envs if m is not None} | {id(m) for m in self._standby}
        for m in list(hub.members.values()):
            if id(m) not in known and m.arrived is not None:
                self._standby.append(m)
        for m in list(self._standby):
            if m.closed is not None or (m.arrived is not None and m.arrived.final):
                self._standby.remove(m)
                hub.members.pop(m.sid, None)

    def _admit(self) -> None:
        """Standby sessions take free sub-environments, whole, first come first served."""
        for m in list(self._standby):
            free = [i for i, x in enumerate(self._envs) if x is None]
            if m.n <= len(free):
                self._standby.remove(m)
                m.envs = np.asarray(free[:m.n])
                for i in m.envs:
                    self._envs[i] = m
                self._place(m, m.arrived.obs)   # its first Step's observations
                m.arrived = None

    def _place(self, m: Member, obs) -> None:
        m.last_obs = obs
        _set_row(self._obs, m.envs, obs)

    def _outcome(self, m: Member, step: SlotStep, rewards, term, trunc, infos) -> None:
        idx = m.envs
        rewards[idx] = step.rewards
        term[idx] = step.terminated
        trunc[idx] = step.truncated
        if step.final:   # every slot ends here; its last observations are the finals
            self._end(m, step.done_idx, step.finals, trunc, infos, "final_step", step.terminated)
            return
        for j, slot in enumerate(step.done_idx.tolist()):
            last = _row(step.finals, j) if step.finals is not None else _row(m.last_obs, slot)
            self._ended(infos, int(idx[slot]), last, {})
        self._place(m, step.obs)

    def _end(self, m: Member, slots, finals, trunc, infos, reason: str, terminated=None) -> None:
        """The session's slots stop: their episodes end (truncated unless reported terminated)
        and their sub-environments wait for the next simulator."""
        for j, slot in enumerate(np.asarray(slots).tolist()):
            i = int(m.envs[slot])
            cut = terminated is None or not terminated[slot]
            trunc[i] = trunc[i] or cut
            last = _row(finals, j) if finals is not None else _row(m.last_obs, slot)
            self._ended(infos, i, last, {"simbridge_end": reason})
            self._envs[i] = None
        self._hub.members.pop(m.sid, None)

    def _ended(self, infos, i: int, last, info: dict) -> None:
        """Sub-env i's episode ended with observation `last`: SAME_STEP's infos["final_obs"] and
        infos["final_info"] (the returned observation is its next episode's first); NEXT_STEP's
        returned observation, and `info` in infos (_as_next_step)."""
        if self._next_step:
            self._ends[i] = (last, info)
        else:
            self._add_info(infos, {"final_obs": last, "final_info": info}, i)   # fills infos

    def _missing(self, call: str, waited: float) -> str:
        free = [i for i, m in enumerate(self._envs) if m is None]
        have = self.num_envs - len(free)
        waiting = [m.n for m in self._standby]
        msg = (f"{call}: {len(free)} of {self.num_envs} sub-environments have no simulator after "
               f"{waited:.0f}s ({have} served")
        if waiting:
            msg += f"; simulators waiting for room declared slots {waiting}"
        return (msg + f"): start simulators on {self.address} whose slots add up to the {len(free)} free, "
                f"e.g. `simbridge-sim --address {self.address} --slots {len(free)}`")

    def _late(self, todo: List[Member]) -> str:
        envs = sorted(int(i) for m in todo for i in m.envs)
        return (f"step(): the simulators serving sub-environments {envs} sent no Step within "
                f"{self.step_timeout_s:.0f}s (sessions {[m.sid[:8] for m in todo]}): a simulator is hung "
                f"or very slow; raise step_timeout_s, or stop it (its episodes then end truncated)")

    def _fail(self, e: Exception) -> Exception:
        self._failed = str(e)   # some Steps were answered, others not: the batch cannot go on
        return e

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this BridgeVectorEnv is closed")
        if self._failed:
            raise RuntimeError(f"an earlier call failed ({self._failed}): close this BridgeVectorEnv "
                               f"and make a new one")

    def __repr__(self) -> str:
        return f"BridgeVectorEnv(num_envs={self.num_envs}, address={self.address!r})"
