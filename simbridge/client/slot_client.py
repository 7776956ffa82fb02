"""SlotClient: the client of a batched simulator (N slots, one Step per step).

In the manner of envrax's BatchedEnv, seen from the simulator's side:

    client = SlotClient(address, obs_space, act_space, num_slots=256)
    actions = client.step(obs)                                # first step: no outcome yet
    while running:
        obs, rewards, terminated, truncated, finals = sim.step(actions)   # auto-reset inside
        actions = client.step(obs, rewards, terminated, truncated, finals)
    rewards, terminated, truncated, last_obs = ...            # the last actions applied: each slot's
    client.close(rewards, terminated, truncated, last_obs)    # outcome and observation (not reset), then bye

`finals` holds the last observation of each slot that ended (rows in slot
order, one per terminated-or-truncated slot) while `obs` already holds the
first observation of its next episode. One message each way per step for all
slots; the server keeps one episode per slot.

`address` may name several bridge hosts (a list, or "h1:p1,h2:p2"): when the one the client is
on goes away, it moves to another and `step` raises SessionLost; the next `step` (observations
only, no outcome: the slots' episodes ended with the old server) starts every slot's new
episode there.
"""
from typing import Any, Optional

import gymnasium as gym
import numpy as np

from simbridge.wire import leaf_codec, tensors
from simbridge.wire import spaces as sb_spaces
from simbridge.client.connection import Addresses, Connection
from simbridge.client.security import ClientSecurity
from simbridge.wire.v1 import simbridge_pb2 as pb


_F32, _BOOL = np.dtype(np.float32), np.dtype(bool)
_CODES = {_F32: tensors.pb_dtype(_F32), _BOOL: tensors.pb_dtype(_BOOL)}


def _fill_vector(t: pb.Tensor, values: Any, dtype: np.dtype, n: int) -> None:
    """fill_tensor(t, np.asarray(values, dtype)), with fewer steps for what a simulator usually
    passes (an (n,) array of exactly that dtype) into a fresh message (a Step's every field is)."""
    if type(values) is np.ndarray and values.dtype == dtype and values.shape == (n,):
        t.dtype = _CODES[dtype]
        t.shape.append(n)
        t.data = values.tobytes()
    else:
        tensors.fill_tensor(t, np.asarray(values, dtype))


class SlotClient:
    def __init__(self, address: Addresses, observation_space: gym.Space, action_space: gym.Space, num_slots: int,
                 training_enabled: bool = True, transport: str = "stream", client_name: str = "slot-client",
                 connect_timeout_s: float = 30.0, reconnect_timeout_s: float = 60.0,
                 security: Optional[ClientSecurity] = None, evaluation: bool = False):
        """evaluation: the slots run evaluation episodes (greedy actions, never trained, returns
        reported apart)."""
        self.observation_space = observation_space
        self.action_space = action_space
        self.num_slots = num_slots
        self._encode_obs = leaf_codec.batch_encoder(observation_space)
        self._decode_actions = leaf_codec.batch_decoder(action_space)
        create = pb.CreateSessionRequest(client_name=client_name, num_slots=num_slots,
                                         observation_space=sb_spaces.space_to_proto(observation_space),
                                         action_space=sb_spaces.space_to_proto(action_space))
        if not training_enabled:
            create.slots_training_enabled = False
        if evaluation:
            create.slots_evaluation = True
        self._conn = Connection(address, "single", create, transport, connect_timeout_s,
                                reconnect_timeout_s, pipeline=False, security=security,
                                on_session_lost=lambda: num_slots)
        self._versions: Any = None   # the last answer's policy_versions tensor, decoded when asked for
        self.policy_id = ""

    @property
    def session_id(self) -> str:
        return self._conn.session_id

    def step(self, observations: Any, rewards=None, terminated=None, truncated=None,
             final_observations: Any = None) -> Any:
        """Actions for all slots, leaves shaped (num_slots, *action_shape).

        rewards/terminated/truncated/final_observations: the outcome of the
        previous step's actions (leave them out on the first step)."""
        # Built inside its stream envelope: the stream sends it without a copy (Connection.call).
        envelope = pb.StreamRequest()
        req = envelope.step
        self._encode_obs(req.observations, observations, "observations")
        self._fill_outcome(req, rewards, terminated, truncated, final_observations)
        resp = self._conn.call("step", req, envelope=envelope)
        self._versions = resp.policy_versions
        self.policy_id = resp.policy_id
        return self._decode_actions(resp.actions, self.num_slots, "actions from the server")

    @property
    def policy_versions(self) -> Optional[np.ndarray]:
        """The version of the policy that chose each slot's last action (None before the first step)."""
        return None if self._versions is None else tensors.from_tensor(self._versions)

    def _fill_outcome(self, req, rewards, terminated, truncated, final_observations) -> None:
        if rewards is not None:
            _fill_vector(req.rewards, rewards, _F32, self.num_slots)
        if terminated is not None:
            _fill_vector(req.terminated, terminated, _BOOL, self.num_slots)
        if truncated is not None:
            _fill_vector(req.truncated, truncated, _BOOL, self.num_slots)
        if final_observations is not None:
            self._encode_obs(req.final_observations, final_observations, "final_observations")

    def close(self, rewards=None, terminated=None, truncated=None, last_observations: Any = None) -> None:
        """Report the outcome of the last actions (if given) and close the session.

        `last_observations`: every slot's last observation (num_slots rows);
        slots not terminated end truncated there. Without an outcome the last
        actions' transitions are dropped (their outcome was never observed)."""
        try:
            if rewards is not None:
                req = pb.StepRequest(final=True)
                self._fill_outcome(req, rewards, terminated, truncated, last_observations)
                self._conn.call("step", req)
        finally:
            self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._conn.close()
