"""A replay buffer that keeps each camera frame once: replay.py's rows, the image as shared frames.

Stored as rows, a transition holds its observation twice (obs and new_obs), and with
`frame_stack = k` each of them holds k frames: Atari's 84x84x4 takes 56 KB a transition, 53 GiB
for CleanRL's million. Yet the next transition's obs is this one's new_obs, and a stack shares
k - 1 frames with the next: an episode of L steps shows L + 1 distinct frames. Dopamine's circular
replay keeps one frame a step and Stable-Baselines3's `optimize_memory_usage` one observation a
step, both read from the order of one environment's steps. Experience here comes from many
simulators, agents and n-step windows interleaved, so what is shared is found by content instead:

* The image's frames (a stack's k frames, each with all its channels; an unstacked image is one
  frame) go into one store of frames, and a frame whose bytes are stored already (its SHA-256) is
  not stored again. A row keeps the ids of its obs's and new_obs's frames beside its other columns
  (and the bytes of the observation's other parts, joint values beside a camera) in a ReplayBuffer.
* What a frame is (frame_layout.py): the learner config's `frame_stack` (the trainer sets it from
  the policy's) says how many a stack holds; with none declared, the first rows of a channels-first
  image show whether its channels are a stack the simulator made (each then a frame) or a colour
  camera's (the image one frame); a channels-last image is one frame.
* A frame lives while a row refers to it (counted). The store is made for 1.25 frames a row and
  grows by half where rows share fewer (episodes of a few steps), up to what rows would take: it
  never drops a row.
* A sample gathers its rows' frame ids, then their frames, and lays them back into rows on the
  device (inside a captured update's graph too): a sample equals the rows replay.py would give.

The learner config's `replay_store` picks it: "frames" for an observation with one uint8 image (a
Box, or a Dict / Tuple with one beside other parts), "rows", or "auto" (the default: frames where
they apply and are 256 bytes or more). Checkpoints hold each live frame once; either store loads
the other's.
"""
import dataclasses
import hashlib
import logging
from typing import Dict, Optional

import gymnasium as gym
import numpy as np
import torch

from simbridge.trainer.learners import encoders
from simbridge.trainer.learners.frame_layout import Layout, decided, layout, outcomes
from simbridge.trainer.learners.replay import ReplayBuffer, take
from simbridge.wire.columns import NEW_OBS, OBS

log = logging.getLogger("simbridge.trainer")

IDS, OBS_REST, NEW_REST = "frame_ids", "obs_rest", "new_obs_rest"   # the row buffer's own columns
FRAMES_PER_ROW = 1.25   # episodes of about 5 steps and more fit the store as first made
STORES = ("auto", "rows", "frames")
AUTO_MIN_BYTES = 256    # "auto" keeps images of smaller frames as rows (a frame costs ~280 host bytes in all)


def check(store: str) -> None:
    if store not in STORES:
        raise ValueError(f"replay_store = {store!r}: use one of {list(STORES)}")


def uses_frames(store: str, space: gym.Space, frame_stack: int = 1) -> bool:
    """Whether `replay_store` puts rows of `space` in a FrameReplay; a ValueError naming the fix
    for "frames" where they do not apply."""
    check(store)
    if store == "rows":
        return False
    lay = layout(space, frame_stack)
    if store == "frames" and lay is None:
        raise ValueError(f"replay_store = \"frames\" keeps the frames of one uint8 image, and the "
                         f"observation {space} holds {'several' if encoders.byte_rows(space) else 'none'}: "
                         f"set replay_store = \"rows\" (or \"auto\")")
    # "auto": frames of under 256 bytes save less than their digests and ids cost on the host
    return lay is not None and (store == "frames" or lay.frame >= AUTO_MIN_BYTES)


def initial_slots(capacity: int, lay: Layout) -> int:
    """Frames the store holds at first: 1.25 a row (never more than rows would take)."""
    return min(max_slots(capacity, lay), int(capacity * FRAMES_PER_ROW) + 4 * lay.stack)


def max_slots(capacity: int, lay: Layout) -> int:
    """Frames `capacity` rows can refer to: what rows would take (every frame of every row distinct)."""
    return 2 * lay.stack * capacity


def row_bytes(capacity: int, lay: Layout) -> float:
    """Bytes a row takes at capacity: its share of the frames, its frame ids, its other parts (an
    undecided layout counted as one frame an image: a stack the simulator made takes less)."""
    frames = initial_slots(capacity, lay) / max(1, capacity)
    return frames * lay.frame + 2 * lay.stack * 8 + 2 * (lay.width - (lay.end - lay.first))


def make(space: gym.Space, config: dict, device):
    """The replay buffer a learner's config asks for rows of `space` (replay_store, buffer_size, frame_stack)."""
    if uses_frames(config["replay_store"], space, config["frame_stack"]):
        return FrameReplay(config["buffer_size"], device, layout(space, config["frame_stack"]))
    return ReplayBuffer(config["buffer_size"], device)


def obs_bytes(space: gym.Space, config: dict) -> int:
    """Bytes a transition's obs and new_obs take in the replay `make` builds, at capacity."""
    if not uses_frames(config["replay_store"], space, config["frame_stack"]):
        return 2 * encoders.row_bytes(space)
    return int(row_bytes(int(config["buffer_size"]), layout(space, config["frame_stack"])))


def for_store(replay, state: dict) -> dict:
    """A saved replay state as `replay` loads it: a FrameReplay's laid out as rows for a ReplayBuffer
    (the other way, FrameReplay.load_state_dict adds the rows)."""
    return as_rows(state) if "frames" in state and not isinstance(replay, FrameReplay) else state


def metrics(replay) -> dict:
    """What a frame store holds, for the learner's metrics (TensorBoard's learner/<policy>/...):
    its frames, and the MiB they take on the device (the store grows where rows share fewer)."""
    if not isinstance(replay, FrameReplay):
        return {}
    return {"replay_frames": replay.frames_held(), "replay_store_mib": replay.slots * replay.layout.frame / 2**20}


def says(replay) -> str:
    """What the start-up memory line says of a replay's store."""
    return " (each frame kept once: replay_store)" if isinstance(replay, FrameReplay) else ""


class FrameReplay:
    """ReplayBuffer's interface (add, draw, gather, sample, state) over rows whose image frames
    are kept once each."""

    def __init__(self, capacity: int, device, lay: Layout):
        self.rows = ReplayBuffer(capacity, device)
        self.device = self.rows.device
        self.slots = 0                               # the store's frames, made on the first add
        self._lay_out(lay)
        self._refs = np.zeros(0, np.int64)
        self._free = np.zeros(0, np.int64)           # a stack of free slots: pops from its end
        self._n_free = 0
        self._key: list = []                         # a slot's digest
        self._by_key: Dict[bytes, int] = {}
        self._version = 0
        self.added = 0

    def _lay_out(self, lay: Layout) -> None:
        """Rows laid out as `lay`: an empty store of its frames, and room for its rows' frame ids."""
        self.layout = lay
        self._store = torch.zeros((0, lay.frame), dtype=torch.uint8, device=self.device)
        self._ids = np.zeros((self.capacity, 2 * lay.stack), np.int64)   # the rows' frame ids, host side

    @property
    def capacity(self) -> int:
        return self.rows.capacity

    @property
    def storage_version(self) -> int:
        return self.rows.storage_version + self._version

    def __len__(self) -> int:
        return len(self.rows)

    def frames_held(self) -> int:
        return self.slots - self._n_free

    # ------------------------------------------------------------ writing

    def add(self, columns: Dict[str, np.ndarray]) -> None:
        if not columns or len(columns[OBS]) == 0:
            return
        n = len(columns[OBS])
        self._check(columns, n)   # before anything changes: a refused batch leaves the buffer as it was
        if n > self.capacity:   # keep the newest
            columns = {k: np.asarray(v)[-self.capacity:] for k, v in columns.items()}
            n = self.capacity
        self.added += n
        if self.slots == 0:
            self._lay_out(decided(self.layout, np.asarray(columns[OBS]), np.asarray(columns[NEW_OBS])))
            self._grow(initial_slots(self.capacity, self.layout))
        self._release(len(self.rows) + n - self.capacity)   # the rows the ring writes over
        lay = self.layout
        ids, fresh = self._refer(np.asarray(columns[OBS]), np.asarray(columns[NEW_OBS]))
        if fresh:
            where, src = np.fromiter(fresh, np.int64, len(fresh)), np.stack(list(fresh.values()))
            if self.device.type == "cpu":   # numpy's row copies: torch's index_put copies byte by byte
                self._store.numpy()[where] = src
            else:
                self._store[torch.as_tensor(where, device=self.device)] = torch.as_tensor(src, device=self.device)
        cols = {k: v for k, v in columns.items() if k not in (OBS, NEW_OBS)}
        cols[IDS] = ids
        for name, key in ((OBS_REST, OBS), (NEW_REST, NEW_OBS)):
            rest = lay.rest(columns[key])
            if rest is not None:
                cols[name] = rest
        self._ids[self.rows.next_positions(n)] = ids
        self.rows.add(cols)

    def _check(self, columns: Dict[str, np.ndarray], n: int) -> None:
        """A ValueError for columns this buffer cannot take: other names than its rows', other
        lengths, or observation rows of another width."""
        names = {k for k in columns if k not in (OBS, NEW_OBS)}
        held = {k for k in self.rows._data if k not in (IDS, OBS_REST, NEW_REST)}
        if held and names != held:
            raise ValueError(f"replay: columns {sorted(names)}, where its rows hold {sorted(held)}")
        for k, v in columns.items():
            if len(v) != n or (k in (OBS, NEW_OBS) and np.shape(v)[1:] != (self.layout.width,)):
                raise ValueError(f"replay: column {k!r} of shape {np.shape(v)}: {n} rows of "
                                 f"{self.layout.width} bytes expected for obs and new_obs")

    def _refer(self, obs: np.ndarray, new: np.ndarray):
        """Each frame's id, stored frames found by their digest: (ids (n, 2 * stack): obs's frames,
        then new_obs's; {new id: its frame's bytes})."""
        lay, n, k = self.layout, len(obs), self.layout.stack
        # Equal bytes need no digest. A row's obs is mostly the new_obs of an earlier row of the
        # batch, the agent's step before (`source`: found by a few sampled bytes, compared whole);
        # a new_obs stack's older frames are its obs's newer ones (`shifted`).
        new_f, source = lay.split(new), self._sources(lay.image(obs), lay.image(new))
        obs_f = np.empty_like(new_f)
        found = source >= 0
        obs_f[found] = new_f[source[found]]
        obs_f[~found] = lay.split(obs[~found])
        shifted = np.all(new_f[:, :k - 1] == obs_f[:, 1:], axis=2)   # (n, k - 1)
        # Digests for the frames nothing else gives: obs without a source, new_obs frames not shifted.
        digest = np.concatenate([np.repeat(~found[:, None], k, axis=1), ~shifted, np.ones((n, 1), bool)], axis=1)
        ids = np.empty((n, 2 * k), np.int64)
        fresh: Dict[int, np.ndarray] = {}
        by_key = self._by_key
        for i, j in zip(*np.nonzero(digest)):   # row by row, in order: ids as the rows meet them
            frame = obs_f[i, j] if j < k else new_f[i, j - k]
            key = hashlib.sha256(frame).digest()
            pid = by_key.get(key)
            if pid is None:
                if self._n_free == 0:
                    self._grow(self.slots + self.slots // 2 + 2 * k)
                self._n_free -= 1
                pid = int(self._free[self._n_free])
                by_key[key], self._key[pid], fresh[pid] = pid, key, frame
            ids[i, j] = pid
        for i in np.flatnonzero(found | shifted.any(axis=1)).tolist():   # the others, from earlier rows
            if found[i]:
                ids[i, :k] = ids[source[i], k:]
            ids[i, k:2 * k - 1] = np.where(shifted[i], ids[i, 1:k], ids[i, k:2 * k - 1])
        np.add.at(self._refs, ids.ravel(), 1)
        return ids, fresh

    @staticmethod
    def _sources(obs: np.ndarray, new: np.ndarray) -> np.ndarray:
        """For each row, the last earlier row whose new_obs image equals its obs image (-1: none)."""
        at = np.linspace(0, obs.shape[1] - 1, 16).astype(np.int64)
        obs_keys, new_keys = obs[:, at], new[:, at]
        source = np.full(len(obs), -1, np.int64)
        earlier: Dict[bytes, int] = {}   # sampled bytes of a row's new_obs -> the last such row
        for i in range(len(obs)):
            source[i] = earlier.get(obs_keys[i].tobytes(), -1)
            earlier[new_keys[i].tobytes()] = i
        found = np.flatnonzero(source >= 0)
        whole = np.all(obs[found] == new[source[found]], axis=1)
        source[found[~whole]] = -1
        return source

    def _grow(self, slots: int) -> None:
        """A store of `slots` frames (at most what rows would take), the frames held kept: rows whose
        frames are fewer in common than 1.25 a row (short episodes) take more, never a row less."""
        slots = min(max(slots, self.slots + 1), max_slots(self.capacity, self.layout) + 2 * self.layout.stack)
        if slots <= self.slots:   # rows never refer to more: a bug, not a state to carry on from
            raise RuntimeError(f"replay: {self.frames_held()} frames held for {len(self.rows)} rows")
        if self.slots:
            log.info("replay: %d frames held for %d rows, the store grows to %d (short episodes share "
                     "fewer frames)", self.frames_held(), len(self.rows), slots)
        store = torch.zeros((slots, self.layout.frame), dtype=torch.uint8, device=self.device)
        store[:self.slots] = self._store
        added = np.arange(slots - 1, self.slots - 1, -1, dtype=np.int64)   # popped lowest first
        free = np.empty(slots, np.int64)
        free[:len(added)] = added
        free[len(added):len(added) + self._n_free] = self._free[:self._n_free]
        self._free, self._n_free = free, len(added) + self._n_free
        self._refs = np.concatenate([self._refs, np.zeros(slots - self.slots, np.int64)])
        self._key += [None] * (slots - self.slots)
        self._store, self.slots = store, slots
        self._version += 1

    def _release(self, m: int) -> None:
        """Frees the frames of the m oldest rows, which the next rows added replace, that no other
        row refers to."""
        if m > 0:
            self._unref(self._ids[self.rows.oldest(m)])

    def _unref(self, ids: np.ndarray) -> None:
        flat = ids.ravel()
        np.subtract.at(self._refs, flat, 1)
        dead = np.unique(flat[self._refs[flat] == 0])
        for pid in dead.tolist():
            del self._by_key[self._key[pid]]
            self._key[pid] = None
        self._free[self._n_free:self._n_free + len(dead)] = dead
        self._n_free += len(dead)

    # ------------------------------------------------------------ reading

    def draw(self, batch_size: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        return self.rows.draw(batch_size, generator)

    def sample(self, batch_size: int, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
        return self.gather(self.draw(batch_size, generator))

    def gather(self, idx: torch.Tensor) -> Dict[str, torch.Tensor]:
        cols = self.rows.gather(idx)
        frames = take(self._store, cols.pop(IDS))   # (batch, 2 * stack, frame)
        c = self.layout.stack
        cols[OBS] = self.layout.join(frames[:, :c], cols.pop(OBS_REST, None))
        cols[NEW_OBS] = self.layout.join(frames[:, c:], cols.pop(NEW_REST, None))
        return cols

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        state = self.rows.state_dict()   # oldest first where rows were dropped past a wrap
        data = dict(state["data"])
        frames = torch.zeros((0, self.layout.frame), dtype=torch.uint8)
        if IDS in data:   # nothing added yet: no columns at all
            ids = data[IDS].numpy()
            live, inverse = np.unique(ids, return_inverse=True)   # each live frame once, renumbered
            data[IDS] = torch.from_numpy(inverse.reshape(ids.shape).astype(np.int64))
            # to the host a chunk at a time: a copy of every live frame on the device could not fit
            frames = torch.cat([self._store[torch.as_tensor(live[a:a + 4096], device=self.device)].cpu()
                                for a in range(0, len(live), 4096)])
        return {**state, "data": data, "added": self.added, "frames": frames,
                "layout": dataclasses.asdict(self.layout)}

    def load_state_dict(self, state: dict) -> None:
        version, lay = self._version, self.layout
        self.__init__(state["capacity"], self.device, lay)
        self._version = version + 1   # never an old value: captured updates key their graphs by it
        saved = Layout(**state["layout"]) if "frames" in state else None
        if saved is not None and saved not in outcomes(lay):
            return self._add_rows(as_rows(state))   # laid out otherwise (frame_stack changed): as rows
        if not state["data"]:   # saved before anything was added
            self.added = state["added"]
            return
        if saved is None:
            return self._add_rows(state)
        self._lay_out(saved)
        frames, data = state["frames"], state["data"]
        m, ids = len(frames), data[IDS].numpy()
        self._grow(max(m, initial_slots(self.capacity, self.layout)))
        self._store[:m] = frames.to(self.device)
        for pid, frame in enumerate(frames.numpy()):
            key = hashlib.sha256(frame).digest()
            self._key[pid], self._by_key[key] = key, pid
        self._refs[:] = np.bincount(ids.ravel(), minlength=self.slots)
        self._n_free = self.slots - m   # slots 0 .. m - 1 hold the frames
        self._free[:self._n_free] = np.arange(self.slots - 1, m - 1, -1)
        self.rows.load_state_dict({k: v for k, v in state.items() if k not in ("frames", "layout")})
        self._ids[:len(ids)] = ids
        self.added = state["added"]

    def _add_rows(self, state: dict) -> None:
        """A rows replay's state added row by row, oldest first (replay_store was "rows")."""
        data, size, pos = state["data"], state["size"], state["pos"]
        first = pos % size if size == state["capacity"] and size else 0
        order = (first + np.arange(size)) % max(1, size)
        for a in range(0, size, 4096):
            at = torch.as_tensor(order[a:a + 4096])
            self.add({k: v[at].numpy() for k, v in data.items()})
        self.added = state["added"]


def as_rows(state: dict) -> dict:
    """A FrameReplay's state as a ReplayBuffer's: each row's obs and new_obs laid out again."""
    lay = Layout(**state["layout"])
    data = dict(state["data"])
    if not data:
        return {k: v for k, v in state.items() if k not in ("frames", "layout")}
    frames = take(state["frames"], data.pop(IDS))
    data[OBS] = lay.join(frames[:, :lay.stack], data.pop(OBS_REST, None))
    data[NEW_OBS] = lay.join(frames[:, lay.stack:], data.pop(NEW_REST, None))
    return {k: v for k, v in state.items() if k not in ("frames", "layout")} | {"data": data}
