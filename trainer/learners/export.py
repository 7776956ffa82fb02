"""Building blocks for a learner's portable form (PortablePolicy, and ONNX), for simulators
that act locally.

Each learner says how it exports itself (`Learner.export_layers`, trainer/learners/dqn.py and
trainer/learners/sac.py): the dense layers of its *acting* copy and an action head. This module
only knows layers and messages, never a learner:

* `linear`/`mlp_layers`: torch modules -> (op, weight, bias) layers, in float64 so a
  learner can fold layers together (DQN's dueling head) before they are rounded;
* `message`: layers + head -> PortablePolicy (preprocessor "flatten",
  simbridge/wire/preprocess.py, the same as simbridge/client/local_policy.py);
* `PortableCache`: exports cached per version: a version is exported once, its ONNX at
  most once, and GetPolicy calls in between cost a dictionary lookup;
* `onnx_bytes`: an ONNX model from the flattened observation "obs" (batch, features) to
  the head input "out", built from the very weights of the portable message.

A policy with a convolutional encoder (trainer/learners/encoders.py) has no portable form as dense
layers: its message carries no layers, the same head, and the ONNX model of the encoder and the
layers together (`message(..., encoder)`), whether include_onnx was asked for or not. Clients run
it through onnxruntime (simbridge/client/local_policy.py) or an engine's ONNX runtime.
"""
import copy
import io
import threading
import warnings
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from simbridge.wire import spaces as sb_spaces
from simbridge.wire.preprocess import flat_dim
from simbridge.wire import tensors
from simbridge.wire.v1 import simbridge_pb2 as pb

Layers = List[Tuple[str, Optional[np.ndarray], Optional[np.ndarray]]]  # (op, weight (out, in), bias)
#: What a learner exports: its layers and action head, or None when it has no portable form.
Exported = Optional[Tuple[Layers, pb.ActionHead]]


# ---------------------------------------------------------------- torch -> layers

def linear(m: nn.Linear) -> Tuple[str, np.ndarray, np.ndarray]:
    return ("linear", m.weight.detach().cpu().double().numpy(), m.bias.detach().cpu().double().numpy())


def mlp_layers(modules) -> Layers:
    out: Layers = []
    for m in modules:
        if isinstance(m, nn.Linear):
            out.append(linear(m))
        elif isinstance(m, nn.ReLU):
            out.append(("relu", None, None))
        elif isinstance(m, nn.Tanh):
            out.append(("tanh", None, None))
        else:
            raise TypeError(f"cannot export layer {type(m).__name__}")
    return out


# ---------------------------------------------------------------- layers -> message

def encoder_of(acting: nn.Module) -> Optional[nn.Module]:
    """A copy of the acting network's encoder (encoders.Encoded's; None without one), taken while
    it cannot change."""
    encoder = getattr(acting, "encoder", None)
    return copy.deepcopy(encoder).cpu().eval() if isinstance(encoder, nn.Module) else None


def message(version: int, observation_space, action_space, layers: Layers,
            head: pb.ActionHead, encoder: Optional[nn.Module] = None) -> pb.PortablePolicy:
    """The portable message; with an encoder, the layers go into its ONNX model instead (see above)."""
    msg = pb.PortablePolicy(version=int(version), preprocessor="flatten",
                            observation_space=sb_spaces.space_to_proto(observation_space),
                            action_space=sb_spaces.space_to_proto(action_space))
    if encoder is not None and layers:
        msg.onnx_model = onnx_bytes(layers, flat_dim(observation_space), encoder)
        layers = []
    for op, w, b in layers:
        layer = msg.layers.add(op=op)
        if op == "linear":
            tensors.fill_tensor(layer.weight, np.ascontiguousarray(w, np.float32))
            tensors.fill_tensor(layer.bias, np.ascontiguousarray(b, np.float32))
    msg.head.CopyFrom(head)
    return msg


class PortableCache:
    """One policy's latest export and its ONNX twin, rebuilt when the version moves on."""

    def __init__(self):
        self._lock = threading.Lock()
        self._version: Optional[int] = None
        self._msg: Optional[pb.PortablePolicy] = None
        self._with_onnx: Optional[pb.PortablePolicy] = None

    def get(self, version: int, snapshot: Callable[[], Optional[pb.PortablePolicy]],
            include_onnx: bool = False) -> Optional[pb.PortablePolicy]:
        """The cached message for `version`, else `snapshot()` (a consistent message, or None for a
        policy without portable form; its own version may be newer than `version`)."""
        with self._lock:
            if self._msg is None or self._version != version:
                msg = snapshot()
                if msg is None:
                    return None
                self._msg, self._version, self._with_onnx = msg, msg.version, None
            if not include_onnx:
                return self._msg
            if self._with_onnx is None:
                msg = pb.PortablePolicy()
                msg.CopyFrom(self._msg)
                if msg.layers:
                    msg.onnx_model = onnx_bytes(layers_of(msg), int(tensors.from_tensor(msg.layers[0].weight).shape[1]))
                self._with_onnx = msg
            return self._with_onnx


# ---------------------------------------------------------------- ONNX

def layers_of(msg: pb.PortablePolicy) -> Layers:
    return [(l.op, tensors.from_tensor(l.weight) if l.op == "linear" else None,
             tensors.from_tensor(l.bias) if l.op == "linear" else None) for l in msg.layers]


def torch_twin(policy, msg: pb.PortablePolicy) -> nn.Module:
    """The torch module `msg`'s ONNX model was exported from: its dense layers, or for a CNN policy
    (no layers in the message) the policy's acting encoder and layers as they are now."""
    if msg.layers:
        return torch_module(layers_of(msg))
    _, (exported, encoder) = policy.acting_snapshot(lambda acting: (policy.export_layers(acting), encoder_of(acting)))
    return nn.Sequential(encoder, torch_module(exported[0])).eval()


def torch_module(layers: Layers) -> nn.Sequential:
    """The dense stack as a torch module (float32), same weights."""
    mods: List[nn.Module] = []
    for op, w, b in layers:
        if op == "linear":
            lin = nn.Linear(w.shape[1], w.shape[0])
            with torch.no_grad():
                lin.weight.copy_(torch.as_tensor(np.array(w, np.float32)))
                lin.bias.copy_(torch.as_tensor(np.array(b, np.float32)))
            mods.append(lin)
        else:
            mods.append(nn.ReLU() if op == "relu" else nn.Tanh())
    return nn.Sequential(*mods).eval()


def onnx_bytes(layers: Layers, in_dim: int, encoder: Optional[nn.Module] = None) -> bytes:
    """ONNX model "obs" (batch, in_dim) float32 -> "out" (batch, out); with an encoder, the
    flattened observation goes through it before the layers."""
    module = torch_module(layers) if encoder is None else nn.Sequential(encoder, torch_module(layers)).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated, and exactly what a plain MLP needs
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, (torch.zeros(1, in_dim),), buf, input_names=["obs"], output_names=["out"],
                          dynamic_axes={"obs": {0: "batch"}, "out": {0: "batch"}}, dynamo=False)
    return buf.getvalue()
