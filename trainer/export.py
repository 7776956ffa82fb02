"""Learners -> PortablePolicy (and ONNX), for simulators that act locally.

What is exported is the *acting* copy of a learner's networks (the one the
bridge serves actions from, under its lock), tagged with that copy's version,
so a local client acts exactly as the server would at that version:

* DQN (Discrete, MultiDiscrete): the Q-network's body and its side-by-side
  branch heads as one final linear layer giving every branch's Q-values
  (sum(nvec) outputs, no -inf padding). A dueling network's
  V + A - mean(A) is linear in the last hidden layer, so it is folded into that
  final layer: the exported outputs are the Q-values themselves. Head
  "q_argmax" with the learner's current epsilon, and, when the observation
  carries action masks, where they start in the flattened observation.
* SAC (Box): the actor's MLP, whose last layer already gives [mean, raw
  log_std]; head "tanh_gaussian" with log_std_squash = 1 (the actor squashes
  log_std with tanh into [LOG_STD_MIN, LOG_STD_MAX]). During its random
  warm-up SAC acts uniformly at random, and so does the export ("random").

The observation preprocessing is "flatten" (simbridge/preprocess.py), the same in
simbridge/local_policy.py. ONNX (only when asked): a model from the flattened
observation "obs" (batch, features) to the head input "out", built from the
very weights of the portable message.

Exports are cached per learner and version: a version is exported once, its
ONNX at most once, and GetPolicy calls in between cost a dictionary lookup.
"""
import io
import threading
import warnings
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.v1 import simbridge_pb2 as pb

_CACHE_ATTR = "_portable_cache"
_CACHE_CREATE = threading.Lock()

Layers = List[Tuple[str, Optional[np.ndarray], Optional[np.ndarray]]]  # (op, weight (out, in), bias)


class _Cache:
    def __init__(self):
        self.lock = threading.Lock()
        self.version: Optional[int] = None
        self.msg: Optional[pb.PortablePolicy] = None
        self.with_onnx: Optional[pb.PortablePolicy] = None


def _cache_of(learner) -> _Cache:
    cache = getattr(learner, _CACHE_ATTR, None)
    if cache is None:
        with _CACHE_CREATE:
            cache = getattr(learner, _CACHE_ATTR, None)
            if cache is None:
                cache = _Cache()
                setattr(learner, _CACHE_ATTR, cache)
    return cache


def portable(learner, include_onnx: bool = False) -> Optional[pb.PortablePolicy]:
    """The learner's acting policy as a PortablePolicy (shared, cached: copy before changing);
    None for learners this module does not know."""
    from simbridge.trainer.dqn import DQNLearner
    from simbridge.trainer.sac import SACLearner
    if not isinstance(learner, (DQNLearner, SACLearner)):
        return None
    cache = _cache_of(learner)
    with cache.lock:
        if cache.msg is None or cache.version != learner.version:
            with learner._act_lock:  # the acting copy and its version, as one consistent snapshot
                version = learner.version
                layers, head = _dqn(learner) if isinstance(learner, DQNLearner) else _sac(learner)
            cache.msg = _message(learner, version, layers, head)
            cache.version, cache.with_onnx = version, None
        if not include_onnx:
            return cache.msg
        if cache.with_onnx is None:
            msg = pb.PortablePolicy()
            msg.CopyFrom(cache.msg)
            if msg.layers:
                msg.onnx_model = onnx_bytes(layers_of(msg), int(tensors.from_tensor(msg.layers[0].weight).shape[1]))
            cache.with_onnx = msg
        return cache.with_onnx


# ---------------------------------------------------------------- per algorithm

def _linear(m: nn.Linear) -> Tuple[str, np.ndarray, np.ndarray]:
    return ("linear", m.weight.detach().cpu().double().numpy(), m.bias.detach().cpu().double().numpy())


def _mlp_layers(modules) -> Layers:
    out: Layers = []
    for m in modules:
        if isinstance(m, nn.Linear):
            out.append(_linear(m))
        elif isinstance(m, nn.ReLU):
            out.append(("relu", None, None))
        elif isinstance(m, nn.Tanh):
            out.append(("tanh", None, None))
        else:
            raise TypeError(f"cannot export layer {type(m).__name__}")
    return out


def _dqn(learner) -> Tuple[Layers, pb.ActionHead]:
    q = learner.acting
    layers = _mlp_layers(q.body)
    _, w, b = _linear(q.advantage)
    if q.dueling:
        # Q_b(a) = V + A_b(a) - mean_a' A_b(a'): one linear map of the last hidden layer.
        nvec = np.asarray(learner.nvec, np.int64)
        branch = np.repeat(np.arange(len(nvec)), nvec)
        mean = (branch[:, None] == branch[None, :]) / nvec[branch][:, None]   # block averaging
        _, wv, bv = _linear(q.value)
        w = w - mean @ w + wv
        b = b - mean @ b + bv
    layers.append(("linear", w, b))
    head = pb.ActionHead(kind="q_argmax", branch_sizes=[int(n) for n in learner.nvec])
    head.params["epsilon"] = float(learner.epsilon())
    mask = getattr(learner, "mask_columns", None)  # action masks read from the observation (trainer/dqn.py)
    if mask is not None:
        head.params["action_mask_offset"] = float(mask.start)
    return layers, head


def _sac(learner) -> Tuple[Layers, pb.ActionHead]:
    from simbridge.trainer.sac import LOG_STD_MAX, LOG_STD_MIN
    cfg = learner.config
    if cfg["random_warmup"] and learner.agent_steps < cfg["learning_starts"]:
        return [], pb.ActionHead(kind="random")   # as SACLearner.act during its warm-up
    head = pb.ActionHead(kind="tanh_gaussian")
    head.params.update({"log_std_min": LOG_STD_MIN, "log_std_max": LOG_STD_MAX, "log_std_squash": 1.0,
                        "deterministic": 0.0})
    return _mlp_layers(learner.acting.net), head


def _message(learner, version: int, layers: Layers, head: pb.ActionHead) -> pb.PortablePolicy:
    msg = pb.PortablePolicy(version=int(version), preprocessor="flatten",
                            observation_space=sb_spaces.space_to_proto(learner.observation_space),
                            action_space=sb_spaces.space_to_proto(learner.action_space))
    for op, w, b in layers:
        layer = msg.layers.add(op=op)
        if op == "linear":
            tensors.fill_tensor(layer.weight, np.ascontiguousarray(w, np.float32))
            tensors.fill_tensor(layer.bias, np.ascontiguousarray(b, np.float32))
    msg.head.CopyFrom(head)
    return msg


# ---------------------------------------------------------------- ONNX

def layers_of(msg: pb.PortablePolicy) -> Layers:
    return [(l.op, tensors.from_tensor(l.weight) if l.op == "linear" else None,
             tensors.from_tensor(l.bias) if l.op == "linear" else None) for l in msg.layers]


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


def onnx_bytes(layers: Layers, in_dim: int) -> bytes:
    """ONNX model "obs" (batch, in_dim) float32 -> "out" (batch, out)."""
    module = torch_module(layers)
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated, and exactly what a plain MLP needs
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, (torch.zeros(1, in_dim),), buf, input_names=["obs"], output_names=["out"],
                          dynamic_axes={"obs": {0: "batch"}, "out": {0: "batch"}}, dynamo=False)
    return buf.getvalue()
