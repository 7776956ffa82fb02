"""The learners' optimizer: Adam on torch's fused kernel without torch.optim, gradient clipping, and
what checkpoints and update paths need of an optimizer (learning rates, state, a held place).

`Adam` is the algorithm, state and state_dict of `torch.optim.Adam(fused=True)` (the updates are bit for bit
equal, and a checkpoint written by either loads into the other), for two costs torch.optim adds:

- its first use imports torch._dynamo (its step and its param-group methods are wrapped for the
  compiler): 1.5 CPU-seconds of every learner process's start on the 2-core VM, where the rest of the
  process (torch included) is about 2.5;
- its step's Python (grouping tensors by device and dtype, per-step checks): 130 µs a step on a
  [4, 128, 128, 2] network against 36 for the kernel called alone, on one CPU thread of the 2-core VM
  (docs/benchmarks.md, "A learner's CPU without torch.optim").

What it leaves out, as the learners need none of it: amsgrad, maximize, AdamW's decoupled decay,
closures, gradient scaling, hooks, and devices without the fused kernel (`adam` picks
torch.optim.Adam there). A tensor learning rate (the graph and compile paths' `set_lr`) and
`capturable` (the step count on the device, read by the kernel there) work as in torch.
"""
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

# CUDA's multi-tensor kernels (the fused Adam, the _foreach_ ops) give each 65,536-element chunk of a
# tensor one thread block of 512 threads: a 256x256 layer's weights ran on one of an H200's 132
# multiprocessors, and SAC's three Adam steps took 103 us of its 483-us update at batch 256 on the
# graph path (DQN's one, with 128x128 layers, 10 of 161; docs/benchmarks.md, "Adam in slices").
# Given as slices of SLICE elements (views of the same memory: the kernels' in-place writes land in
# the tensors), a large tensor gets one block per slice. Element-wise arithmetic: the same results.
SLICE = 4096
SLICED_DEVICES = ("cuda",)


def sliced(lists: Sequence[Sequence[torch.Tensor]], repeated: Sequence[Sequence[torch.Tensor]] = ()
           ) -> Tuple[List[List[torch.Tensor]], List[List[torch.Tensor]]]:
    """Lists of tensors that correspond element for element (parameters, their gradients, Adam's
    moments) with each large contiguous tensor on a SLICED_DEVICES device cut alike into flat views
    of SLICE elements; `repeated` lists (Adam's step counts) repeat their element once per slice.
    Inside torch.compile: the lists as they are (inductor makes its own kernels)."""
    size = SLICE   # read at the call: tests and benches set it
    if _compiling() or not lists[0] or lists[0][0].device.type not in SLICED_DEVICES:
        return [list(x) for x in lists], [list(r) for r in repeated]   # the CPU's way: no Python per tensor
    out: List[List[torch.Tensor]] = [[] for _ in lists]
    again: List[List[torch.Tensor]] = [[] for _ in repeated]
    for i, group in enumerate(zip(*lists)):
        first = group[0]
        n = 1
        if first.device.type in SLICED_DEVICES and first.numel() > size and all(t.is_contiguous() for t in group):
            n = -(-first.numel() // size)
            for o, t in zip(out, group):
                o.extend(t.view(-1).split(size))
        else:
            for o, t in zip(out, group):
                o.append(t)
        for o, r in zip(again, repeated):
            o.extend([r[i]] * n)
    return out, again


@torch.no_grad()
def soft_update(targets: Iterable[torch.Tensor], sources: Iterable[torch.Tensor], tau: float) -> None:
    """targets <- targets + tau * (sources - targets), in place (a captured update replays it); tau >= 1:
    a copy. The target networks' Polyak averaging (DQN, SAC), in slices on cuda."""
    (t, s), _ = sliced([list(targets), list(sources)])
    if tau >= 1.0:
        torch._foreach_copy_(t, s)
    else:
        torch._foreach_lerp_(t, s, tau)


# torch.optim.Adam's param-group keys, so that state_dict()s are interchangeable.
_GROUP_DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
                   "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                   "fused": True, "decoupled_weight_decay": False}


class Adam:
    """`Adam(params, lr, eps=..., betas=..., weight_decay=..., capturable=...)`: step, zero_grad,
    state_dict and load_state_dict as torch.optim.Adam's, `param_groups` and `state` likewise."""

    def __init__(self, params: Iterable[torch.Tensor], lr, **options):
        unknown = set(options) - set(_GROUP_DEFAULTS)
        if unknown:
            raise TypeError(f"Adam: unsupported options {sorted(unknown)}")
        group = {"params": list(params), "lr": lr, **_GROUP_DEFAULTS, **options}
        if group["amsgrad"] or group["maximize"] or group["decoupled_weight_decay"] or not group["fused"]:
            raise ValueError("Adam: amsgrad, maximize and decoupled weight decay are not supported; it is fused")
        self.param_groups: List[dict] = [group]
        self.state: Dict[torch.Tensor, dict] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        # inside a torch.compile'd step the gradients are zeroed in place, never dropped: the
        # compiled pieces guard on the gradient tensors, and a new one at every update recompiled
        # them at every update (until dynamo gave up and ran them eagerly)
        set_to_none = set_to_none and not _compiling()
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if set_to_none:
            for p in params:
                p.grad = None
        elif params:
            # one kernel for them all: zeroed one by one they were 16 launches of SAC's compiled
            # update on an H200 (14 us of 278 at batch 256)
            torch._foreach_zero_([p.grad.detach_() for p in params])

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params, grads, avgs, avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state.get(p)
                if not st:   # as torch: float32 step count on the parameter's device (fused)
                    st = self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                          "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                          "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
                params.append(p)
                grads.append(p.grad)
                avgs.append(st["exp_avg"])
                avg_sqs.append(st["exp_avg_sq"])
                steps.append(st["step"])
            if not params:
                continue
            beta1, beta2 = group["betas"]
            torch._foreach_add_(steps, 1)
            if _compiling():
                traced_adam(params, grads, avgs, avg_sqs, steps, group)
                continue
            (params, grads, avgs, avg_sqs), (steps,) = sliced([params, grads, avgs, avg_sqs], [steps])
            torch._fused_adam_(params, grads, avgs, avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                               beta1=float(beta1), beta2=float(beta2), weight_decay=group["weight_decay"],
                               eps=group["eps"], maximize=False, grad_scale=None, found_inf=None)

    # ------------------------------------------------------------ torch.optim's state_dict form

    def state_dict(self) -> dict:
        """{"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}]}, indices counted
        over the groups in order (torch.optim's form)."""
        index: Dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: dict(st) for p, st in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads a state_dict of this form (this class's or torch.optim.Adam's): the saved groups'
        options and each parameter's state, cast to the parameter's device (step: float32)."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(saved, self.param_groups)):
            raise ValueError("loaded state dict has a different number of parameters or parameter groups")
        by_index = {i: p for s, g in zip(saved, self.param_groups) for i, p in zip(s["params"], g["params"])}
        self.state = {}
        for i, st in state_dict["state"].items():
            p = by_index[int(i)]
            self.state[p] = {k: (v.to(dtype=torch.float32, device=p.device) if k == "step"
                                 else v.to(dtype=p.dtype, device=p.device))
                             for k, v in st.items()}
        self.param_groups = [{**{k: v for k, v in s.items() if k != "params"}, "params": g["params"]}
                             for s, g in zip(saved, self.param_groups)]


def _compiling() -> bool:
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling and is_compiling())


def traced_adam(params, grads, avgs, avg_sqs, steps, group: dict) -> None:
    """The fused kernel's arithmetic (ATen's fused_adam_utils: the same formulas in the same order),
    as ops torch.compile can trace: `_fused_adam_` with a tensor learning rate has no fake kernel, so
    inductor refused the whole step (the compile path fell back to eager). Inductor fuses these into
    a few kernels. Equal to the fused kernel to float rounding (tests/trainer/test_optim.py)."""
    beta1, beta2 = group["betas"]
    lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
    for p, g, m, v, t in zip(params, grads, avgs, avg_sqs, steps):
        if decay:
            g = g.add(p, alpha=decay)
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = lr / (1 - torch.pow(beta1, t))
        denom = v.sqrt() / (1 - torch.pow(beta2, t)).sqrt() + eps
        p.sub_(step_size * m / denom)


def adam(params, lr: float, path: str, device: torch.device, **kw):
    """Adam as the update path needs it: the fused kernel where it exists (one launch per step; its
    step count lives on the device, so it is capturable), and on the graph and compile paths a tensor
    learning rate, which set_lr changes without recapturing. Elsewhere (mps) torch.optim's."""
    if device.type not in ("cpu", "cuda"):
        return torch.optim.Adam(params, lr=lr, **kw)
    if path in ("graph", "compile"):
        # a tensor lr: a schedule changes it in place, and neither a graph nor a compiled step
        # bakes in (or recompiles for) each new value
        return Adam(params, torch.tensor(float(lr), device=device), capturable=device.type == "cuda", **kw)
    return Adam(params, lr, **kw)


@torch.no_grad()
def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ (2-norm) in a third of its time on the CPU, equal to it bit for
    bit: the gradients scaled by min(1, max_norm / (norm + 1e-6)); returns the norm before clipping.
    No host synchronisation (capturable)."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else None)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))   # whole: torch's sums' order
    torch._foreach_mul_(sliced([grads])[0][0], torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


class HeldOptimizer:
    """An optimizer's place in a learner that only acts (frozen, or trained by a learner process):
    it keeps the state it is loaded with (a checkpoint's), which the learner's state_dict passes
    on, and builds nothing (a copy that never steps needs no moments)."""

    def __init__(self):
        self.state: Optional[dict] = None   # optimizer_state()'s form; None: nothing loaded


# What a learner counts as its optimizers (a plug-in learner may bring torch.optim's own), and what
# optimizer_state and load_optimizer take: those and a held place.
STEPPING = (Adam, torch.optim.Optimizer)
OPTIMIZERS = STEPPING + (HeldOptimizer,)


def set_lr(optimizer, value: float) -> None:
    """Sets every group's learning rate; a tensor one is filled in place (a graph reads it there).
    Unchanged values cost nothing (most updates: a schedule moves it once per agent step)."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            if group.get("_lr_value") != value:
                lr.fill_(value)
                group["_lr_value"] = value
        else:
            group["lr"] = value


def optimizer_state(optimizer) -> Optional[dict]:
    """state_dict with the learning rates as plain floats, so that a checkpoint written on one path
    loads on the other (a tensor lr on cuda in a CPU learner, or the reverse). A HeldOptimizer's:
    what it was given (None: nothing)."""
    if isinstance(optimizer, HeldOptimizer):
        return optimizer.state
    state = optimizer.state_dict()
    groups = []
    for g in state["param_groups"]:
        g = {k: v for k, v in g.items() if k != "_lr_value"}
        if isinstance(g["lr"], torch.Tensor):
            g["lr"] = float(g["lr"].item())
        groups.append(g)
    return {**state, "param_groups": groups}


# The options that belong to how this process runs the optimizer, not to the run being resumed.
_OWN_OPTIONS = ("capturable", "fused", "foreach", "differentiable")


def load_optimizer(optimizer, state: dict) -> None:
    """load_state_dict keeping this optimizer's own kernel options and lr type: a graph path's
    checkpoint (capturable, tensor lr) loads into an eager CPU learner and the reverse. A
    HeldOptimizer keeps the state as it is."""
    if isinstance(optimizer, HeldOptimizer):
        optimizer.state = state
        return
    own = [{k: g.get(k) for k in _OWN_OPTIONS} for g in optimizer.param_groups]
    tensor_lr = [g["lr"] if isinstance(g["lr"], torch.Tensor) else None for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, options, lr in zip(optimizer.param_groups, own, tensor_lr):
        group.update(options)
        saved = group["lr"]
        value = float(saved.item()) if isinstance(saved, torch.Tensor) else float(saved)
        group.pop("_lr_value", None)
        if lr is not None:
            group["lr"] = lr
            set_lr_group(group, value)
        else:
            group["lr"] = value
        # Adam keeps its step count on the device when fused or capturable, on the CPU otherwise
        device_step = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            step = st.get("step")
            if isinstance(step, torch.Tensor):
                st["step"] = step.to(p.device if device_step else "cpu", torch.float32)


def set_lr_group(group: dict, value: float) -> None:
    group["lr"].fill_(value)
    group["_lr_value"] = value
