"""A uniform replay buffer of torch tensors on the learner's device.

Storage is allocated on the first write from the columns' shapes and dtypes,
written circularly with one slice assignment per column (two when wrapping),
and sampled with torch.randint on the same device, so on a GPU the sampled
batch never leaves it. `sample` is `gather(draw(...))`: a captured update (trainer/learners/
capture.py) draws the indices eagerly and gathers inside its CUDA graph, from storage whose
reallocation `storage_version` counts.

Columns of one dtype share one storage, a column a span of its rows (`_data` holds each column's
view): a sample is one index op per dtype, not one per column. On a GPU each index op is a kernel
of a few microseconds whatever its width; DQN's five columns were about 18 us of a 4,096-row update
(H200, 28 Nov). PACK = False keeps a storage per column (bench/learner_speed.py --replay-gather).
"""
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch


PACK = True   # read when the storage is allocated


def take(store: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """store[idx] (rows of a 2-D store; idx of any shape). On the CPU as index_select: advanced
    indexing there copies element by element, index_select a row at a time (256 rows of 10 float32:
    29 -> 4 us; of a 21 KB camera frame: 3.9 -> 0.4 ms). On a GPU both are one kernel: kept as
    measured there."""
    if store.device.type != "cpu":
        return store[idx]
    return store.index_select(0, idx.reshape(-1)).view(*idx.shape, *store.shape[1:])


class ReplayBuffer:
    def __init__(self, capacity: int, device: torch.device | str = "cpu"):
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self._data: Dict[str, torch.Tensor] = {}   # column -> its rows: a view into one of the stores
        # each store (capacity, width) with its columns' (name, first, end, row shape) spans
        self._stores: List[Tuple[torch.Tensor, List[Tuple[str, int, int, tuple]]]] = []
        self._pos = 0
        self._size = 0
        self.added = 0
        self.storage_version = 0   # bumped whenever the storage tensors are replaced

    def __len__(self) -> int:
        return self._size

    def add(self, columns: Dict[str, np.ndarray]) -> None:
        if not columns:
            return
        n = len(next(iter(columns.values())))
        if n == 0:
            return
        if not self._data:
            self._allocate({k: (np.asarray(v).shape[1:], torch.from_numpy(np.asarray(v)[:1].copy()).dtype)
                            for k, v in columns.items()})
        if n > self.capacity:  # keep the newest
            columns = {k: np.asarray(v)[-self.capacity:] for k, v in columns.items()}
            n = self.capacity
        first = min(n, self.capacity - self._pos)
        for k, store in self._data.items():
            # Writable too: rows read back from the journal or a learner process's pipe are views
            # of read-only bytes, which torch warns about (the store copies them either way).
            v = torch.as_tensor(np.require(columns[k], requirements=["C", "W"]), device=self.device)
            store[self._pos:self._pos + first] = v[:first]
            if first < n:
                store[:n - first] = v[first:]
        self._pos = (self._pos + n) % self.capacity
        self._size = min(self._size + n, self.capacity)
        self.added += n

    def sample(self, batch_size: int, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
        return self.gather(self.draw(batch_size, generator))

    def draw(self, batch_size: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Uniform row indices (on the device, no host sync)."""
        return torch.randint(0, self._size, (batch_size,), device=self.device, generator=generator)

    def oldest(self, n: int) -> np.ndarray:
        """Positions of the n oldest rows, oldest first: those the next n rows past capacity replace."""
        return (self._pos - self._size + np.arange(n)) % self.capacity

    def next_positions(self, n: int) -> np.ndarray:
        """Where the next n rows added go."""
        return (self._pos + np.arange(n)) % self.capacity

    def gather(self, idx: torch.Tensor) -> Dict[str, torch.Tensor]:
        out = {}
        for store, spans in self._stores:
            rows = take(store, idx)
            for k, first, end, shape in spans:
                out[k] = rows[:, first:end].view((len(idx),) + shape)
        return out

    def _allocate(self, columns: Dict[str, Tuple[tuple, torch.dtype]]) -> None:
        """Zeroed stores for columns {name: (row shape, dtype)}: one per dtype (PACK), or per column."""
        groups: Dict[object, list] = {}
        for k, (shape, dtype) in columns.items():
            groups.setdefault(dtype if PACK else k, []).append((k, tuple(shape), dtype))
        self._data, self._stores = {}, []
        for members in groups.values():
            widths = [int(np.prod(shape, dtype=np.int64)) for _, shape, _ in members]
            store = torch.zeros((self.capacity, sum(widths)), dtype=members[0][2], device=self.device)
            spans, first = [], 0
            for (k, shape, _), width in zip(members, widths):
                self._data[k] = store[:, first:first + width].view((self.capacity,) + shape)
                spans.append((k, first, first + width, shape))
                first += width
            self._stores.append((store, spans))
        self.storage_version += 1

    def state_dict(self) -> dict:
        # views: torch.save writes each store once, however many columns it holds
        return {"capacity": self.capacity, "pos": self._pos, "size": self._size, "added": self.added,
                "data": {k: v[:self._size].cpu() for k, v in self._data.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.capacity = state["capacity"]
        self._pos, self._size, self.added = state["pos"], state["size"], state["added"]
        self._allocate({k: (tuple(v.shape[1:]), v.dtype) for k, v in state["data"].items()})
        for k, v in state["data"].items():
            self._data[k][:len(v)] = v.to(self.device)
