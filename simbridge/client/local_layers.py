"""The numpy building blocks of a LocalPolicy: observation preprocessing, the dense layer
stack (with its allocation-free single-observation path) and pools of pre-drawn random
numbers. See simbridge.client.local_policy."""
import math
from typing import Any, List, Optional, Tuple

import gymnasium as gym
import numpy as np

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.preprocess import flat_dim, flatten
from simbridge.wire.v1 import simbridge_pb2 as pb

LAYER_OPS = ("linear", "relu", "tanh")
_POOL = 4096  # random numbers drawn per refill


class PolicyFormatError(ValueError):
    """A PortablePolicy this module cannot run (unknown op, shapes that do not chain, ...)."""


# ---------------------------------------------------------------- preprocessing

def single_flattener(space: gym.Space):
    """One observation -> 1-D float32 vector, into a buffer reused across calls when possible."""
    if isinstance(space, gym.spaces.Box) and space.dtype == np.float32:
        if len(space.shape) == 1:
            return lambda obs: obs  # the client hands over a float32 array of the box's shape
        return lambda obs: obs.reshape(-1)
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)):
        buf = np.empty(flat_dim(space), np.float32)

        def cast(obs):
            np.copyto(buf, np.asarray(obs).reshape(-1), casting="unsafe")
            return buf
        return cast
    if isinstance(space, gym.spaces.Discrete):
        buf = np.zeros(int(space.n), np.float32)
        start = int(space.start)

        def one_hot(obs):
            buf.fill(0.0)
            buf[int(obs) - start] = 1.0
            return buf
        return one_hot
    return lambda obs: flatten(space, sb_spaces.batch_row0(space, obs))[0]


def has_nan(value: Any) -> bool:
    if isinstance(value, dict):
        return any(has_nan(v) for v in value.values())
    if isinstance(value, tuple):
        return any(has_nan(v) for v in value)
    a = np.asarray(value)
    return a.dtype.kind == "f" and a.size > 0 and math.isnan(a.sum())


# ---------------------------------------------------------------- layers

class Dense:
    """The layer stack, weights transposed (in, out), float32 and contiguous."""

    def __init__(self, layers, in_dim: int):
        self.ops: List[Tuple[str, Optional[np.ndarray], Optional[np.ndarray]]] = []
        dim = in_dim
        for i, layer in enumerate(layers):
            if layer.op == "linear":
                w = _tensor(layer.weight, f"layer {i} weight")
                b = _tensor(layer.bias, f"layer {i} bias")
                if w.ndim != 2 or w.shape[1] != dim or b.shape != (w.shape[0],):
                    raise PolicyFormatError(f"layer {i}: linear weight {w.shape} and bias {b.shape} do not "
                                            f"fit an input of {dim} features (weight is (out, in))")
                self.ops.append(("linear", np.ascontiguousarray(w.T, np.float32),
                                 np.ascontiguousarray(b, np.float32)))
                dim = w.shape[0]
            elif layer.op in ("relu", "tanh"):
                self.ops.append((layer.op, None, None))
            else:
                raise PolicyFormatError(f"layer {i}: unknown op {layer.op!r} (known: {', '.join(LAYER_OPS)})")
        self.out_dim = dim
        self._plan_single(in_dim)

    def _plan_single(self, in_dim: int) -> None:
        """forward1's steps. Each vector carries a trailing 1 and each weight its bias as a last
        row, so a linear layer is one dot into a preallocated buffer: for one observation the
        numpy calls cost more than the arithmetic."""
        self._x = np.ones(in_dim + 1, np.float32)
        self._x_in = self._x[:in_dim]
        cur, view = self._x, self._x_in
        self._plan = []
        for op, wt, b in self.ops:
            if op == "linear":
                out = np.ones(wt.shape[1] + 1, np.float32)
                self._plan.append((0, cur, np.ascontiguousarray(np.vstack([wt, b[None]])), out[:-1]))
                cur, view = out, out[:-1]
            else:
                self._plan.append((1 if op == "relu" else 2, view, None, None))
        self._out = view

    def forward(self, x: np.ndarray) -> np.ndarray:
        """(N, in) -> (N, out), float32."""
        x = np.asarray(x, np.float32)
        for op, wt, b in self.ops:
            if op == "linear":
                x = x @ wt + b
            elif op == "relu":
                x = np.maximum(x, 0.0)
            else:
                x = np.tanh(x)
        return x

    def forward1(self, x: np.ndarray) -> np.ndarray:
        """(in,) -> (out,), in preallocated buffers (valid until the next call)."""
        np.copyto(self._x_in, x, casting="unsafe")
        dot, maximum, zero = np.dot, np.maximum, _ZERO
        for kind, a, w, out in self._plan:
            if kind == 0:
                dot(a, w, out=out)
            elif kind == 1:
                maximum(a, zero, out=a)
            else:
                np.tanh(a, out=a)
        return self._out


_ZERO = np.float32(0.0)


class OnnxNet:
    """Dense's interface over a PortablePolicy's ONNX model, for policies whose network is no dense
    stack (a convolutional encoder): run through onnxruntime, which must be installed."""

    def __init__(self, model: bytes, in_dim: int, what: str):
        try:
            import onnxruntime as ort
        except ImportError:
            raise PolicyFormatError(f"{what} has a convolutional encoder: it acts locally only through its ONNX "
                                    f"model, and onnxruntime is not installed (pip install onnxruntime), or act "
                                    f"through the server instead of locally") from None
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1   # one simulator step at a time: threads would only spin
        try:
            self._session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        except Exception as e:   # onnxruntime raises its own types for a model it cannot load
            raise PolicyFormatError(f"{what}: its ONNX model does not load ({e})") from None
        self.ops = [("onnx", None, None)]
        self._x1 = np.zeros((1, in_dim), np.float32)
        self.out_dim = int(self.forward(self._x1).shape[1])

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self._session.run(["out"], {"obs": np.asarray(x, np.float32)})[0]

    def forward1(self, x: np.ndarray) -> np.ndarray:
        np.copyto(self._x1[0], x, casting="unsafe")
        return self.forward(self._x1)[0]


def _tensor(t: pb.Tensor, what: str) -> np.ndarray:
    try:
        return tensors.from_tensor(t)
    except Exception as e:
        raise PolicyFormatError(f"{what}: {e}") from None


class Pool:
    """Pre-drawn random numbers: one refill per _POOL draws instead of a call per step."""

    def __init__(self, draw):
        self._draw = draw
        self._buf = draw(_POOL)
        self._i = 0

    def next(self):
        if self._i >= len(self._buf):
            self._buf = self._draw(_POOL)
            self._i = 0
        v = self._buf[self._i]
        self._i += 1
        return v
