"""Frame stacking on the bridge: a policy that sees the last k observations of each agent as one.

A simulator that sends one camera frame per step trains a policy that needs motion (a ball's
direction, a paddle's speed) only if something stacks frames. `frame_stack = k` in a policy's
table of the trainer config does it here, per policy, as gymnasium's FrameStackObservation or
Stable-Baselines3's VecFrameStack do inside an env:

* The policy's observation space is the stacked space (`Stacker.space`): an image Box (rank 3)
  holds k times the frame's channels on its channel axis (CHW: the first, HWC: the last; read by
  the rule the trainer's encoders read images by, `wire.preprocess.image_layout`), oldest frame
  first; a flat vector Box (rank 1) is the k frames concatenated, oldest first. The dtype and the
  bounds are the frame's (uint8 stays uint8). Any other space is refused, and so is a stack that
  would change how the encoders read the image's layout (`stack_problem` names the fix).
* Per (episode, agent) the stack is the observation the agent last acted on (the rows' slot
  table, a batched simulator's previous Step): its next frame drops the oldest and goes last, so
  frames of different agents, episodes and slots never mix and nothing else is kept.
* An episode's first frame fills the whole stack (gymnasium's default "reset" padding); so does
  a slot's first frame after its auto-reset.
* A final observation (an agent's done, an episode's end, a Step's ended slots) is stacked onto
  the agent's last stack, so `new_obs` is what the policy would have seen next.

Acting and recording both see the stacked observations: GetAction, LogAction, Step, the final
observations, and thus obs/new_obs of every SampleBatch (replay, datasets and PPO's batches hold
what the network saw). A client acting locally (GetPolicy, UploadExperience) keeps no stack on
the bridge and is refused (uploads.py): it uses remote inference for such a policy.

One `Stacker` per (frame spaces, k) does the stacking for every intake path: `stack_rows` for the
row calls' observations (rows.py), `stack_final` for their final observations (transitions.py), and
the slot bank's own Stacker for Step (slots.py). `stacker(spec, k)` makes it once and keeps it on
the simulator's SpaceSpec, with the stacked SpaceSpec the policy is created and compared with
(PolicyRegistry.spec_for).
"""
from typing import Optional

import gymnasium as gym
import numpy as np

from simbridge.server.row_checks import Rows
from simbridge.server.sessions import SpaceSpec
from simbridge.wire.errors import Reason, invalid_argument
from simbridge.wire.preprocess import image_layout

MAX_FRAME_STACK = 64


def stack_problem(space: gym.Space, k: int) -> Optional[str]:
    """Why frames of `space` cannot be stacked k deep (None: they can), naming the fix."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) not in (1, 3):
        return (f"frame_stack stacks a Box observation (an image of rank 3, CHW or HWC, or a flat "
                f"vector of rank 1), not {space}: stack the frames in the simulator and set "
                f"frame_stack = 1")
    if len(space.shape) == 3:
        layout = image_layout(space.shape)
        shape = _stacked_shape(space.shape, layout, k)
        if image_layout(shape) != layout:
            misread = "HWC" if layout == "chw" else "CHW"
            return (f"frame_stack = {k} turns {layout.upper()} frames {tuple(space.shape)} into "
                    f"{shape}, which the encoders would read as {misread} (the channels are the "
                    f"smaller of the first and last sides): lower frame_stack")
    return None


def _stacked_shape(shape, layout: str, k: int) -> tuple:
    shape = tuple(int(s) for s in shape)
    if layout == "hwc":
        return shape[:2] + (k * shape[2],)
    return (k * shape[0],) + shape[1:]


class Stacker:
    """k frames of one space stacked into one observation, batched (rows first)."""

    def __init__(self, frame_space: gym.spaces.Box, k: int):
        problem = stack_problem(frame_space, k)
        if problem is not None:
            raise ValueError(problem)
        self.k = k
        # The axis of a batch (n, ...) the frames are stacked on, and a frame's width on it.
        rank = len(frame_space.shape)
        hwc = rank == 3 and image_layout(frame_space.shape) == "hwc"
        self.axis = -1 if hwc else 1
        self.width = int(frame_space.shape[-1] if hwc else frame_space.shape[0])
        low, high = (np.broadcast_to(b, frame_space.shape)[None] for b in (frame_space.low, frame_space.high))
        self.space = gym.spaces.Box(self.fill(low)[0], self.fill(high)[0], dtype=frame_space.dtype)

    def fill(self, frames: np.ndarray) -> np.ndarray:
        """An episode's first frames (n, ...) repeated k times."""
        return np.concatenate([frames] * self.k, axis=self.axis)

    def push(self, stacks: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """The stacks (n, ...) with their oldest frame dropped and `frames` (n, ...) last."""
        older = np.take(stacks, np.arange(self.width, self.k * self.width), axis=self.axis)
        return np.concatenate([older, frames.astype(stacks.dtype, copy=False)], axis=self.axis)

    def next(self, stacks: Optional[np.ndarray], frames: np.ndarray, fresh: Optional[np.ndarray]) -> np.ndarray:
        """Each row's next stack: `frames` pushed onto `stacks`, or filling it where `fresh` (bool
        (n,): an episode's first frame) is set; stacks None: every row is fresh."""
        if stacks is None or (fresh is not None and fresh.all()):
            return self.fill(frames)
        out = self.push(stacks, frames)
        if fresh is not None and fresh.any():
            out[fresh] = self.fill(frames[fresh])
        return out


def stacker(spec: SpaceSpec, k: int, policy_id: str = "") -> SpaceSpec:
    """The SpaceSpec a policy with frame_stack = k sees for agents of `spec` (its obs stacked, its
    `frames` the Stacker), made once per spec; INVALID_ARGUMENT / SPACE_MISMATCH naming the fix for
    a space that cannot be stacked."""
    got = spec.stacked.get(k)
    if got is None:
        try:
            frames = Stacker(spec.obs_space, k)
        except ValueError as e:
            raise invalid_argument(f"policy {policy_id!r} stacks the last {k} frames: {e}",
                                   Reason.SPACE_MISMATCH) from None
        got = SpaceSpec(frames.space, spec.act_space)
        got.frames = frames
        spec.stacked[k] = got
    return got


def stack_rows(policies, r) -> list:
    """Runtime lock held (reads the agents' last stacks). The rows of one resolved AgentRows
    (row_checks.Rows) as their policies see them: [r] itself when none of them stacks frames;
    else one Rows per depth k, its observations stacked and its spec the stacked one, with `idx`
    the positions of its rows in r (None: all of them)."""
    pids = set(r.policy_ids)
    depth = {pid: policies.frame_stack(pid) for pid in pids}
    if all(k <= 1 for k in depth.values()):
        return [r]
    if len(set(depth.values())) == 1:
        return [_stacked_part(r, None, next(iter(depth.values())))]
    ks = np.fromiter((depth[pid] for pid in r.policy_ids), np.int64, r.n)
    return [_stacked_part(r, np.flatnonzero(ks == k), int(k)) for k in np.unique(ks)]


def _stacked_part(r, idx: Optional[np.ndarray], k: int):
    if idx is None:
        eids, aids, episodes, states, pids, frames = r.eids, r.aids, r.episodes, r.states, r.policy_ids, r.obs
    else:
        pick = idx.tolist()
        eids, aids = [r.eids[i] for i in pick], [r.aids[i] for i in pick]
        episodes, states = [r.episodes[i] for i in pick], [r.states[i] for i in pick]
        pids, frames = [r.policy_ids[i] for i in pick], r.obs[idx]
    part = Rows(eids, aids, r.spec if k <= 1 else stacker(r.spec, k), len(eids))
    part.episodes, part.states, part.policy_ids = episodes, states, pids
    part.unique_episodes, part.idx = r.unique_episodes, idx
    if k <= 1:
        part.obs = frames
        return part
    # An agent that has acted in this episode holds its last stack in its slot table (acting
    # with this policy put it there); any other starts its episode's stack with this frame.
    live = np.fromiter((st is not None and st.pending for st in states), bool, len(states))
    stacks = None
    if live.any():
        held = [st for st in states if st is not None and st.pending]
        stacks = np.zeros((len(states),) + part.spec.obs_space.shape, part.spec.obs_space.dtype)
        stacks[live] = held[0].table.obs[np.fromiter((st.slot for st in held), np.int64, len(held))]
    part.obs = part.spec.frames.next(stacks, frames, ~live)
    return part


def stack_final(st, frame):
    """Runtime lock held. An agent's final observation as its policy sees it: `frame` (one row)
    pushed onto the agent's last stack when it stacks frames."""
    frames = st.spec.frames
    if frames is None:
        return frame
    return frames.push(st.table.obs[st.slot][None], np.asarray(frame)[None])[0]
