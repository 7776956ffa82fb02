"""A uniform replay buffer of torch tensors on the learner's device.

Storage is allocated on the first write from the columns' shapes and dtypes,
written circularly with one slice assignment per column (two when wrapping),
and sampled with torch.randint on the same device, so on a GPU the sampled
batch never leaves it. `sample` is `gather(draw(...))`: a captured update (trainer/learners/
capture.py) draws the indices eagerly and gathers inside its CUDA graph, from storage whose
reallocation `storage_version` counts.
"""
from typing import Dict, Optional

import numpy as np
import torch


class ReplayBuffer:
    def __init__(self, capacity: int, device: torch.device | str = "cpu"):
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self._data: Dict[str, torch.Tensor] = {}
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
            for k, v in columns.items():
                v = np.asarray(v)
                self._data[k] = torch.zeros((self.capacity,) + v.shape[1:],
                                            dtype=torch.from_numpy(v[:1].copy()).dtype, device=self.device)
            self.storage_version += 1
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

    def gather(self, idx: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {k: v[idx] for k, v in self._data.items()}

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "pos": self._pos, "size": self._size, "added": self.added,
                "data": {k: v[:self._size].cpu() for k, v in self._data.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.capacity = state["capacity"]
        self._pos, self._size, self.added = state["pos"], state["size"], state["added"]
        self._data = {}
        self.storage_version += 1
        for k, v in state["data"].items():
            store = torch.zeros((self.capacity,) + tuple(v.shape[1:]), dtype=v.dtype, device=self.device)
            store[:len(v)] = v.to(self.device)
            self._data[k] = store
