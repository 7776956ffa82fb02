"""Weight gradients summed over row chunks (split-K), for large batches on a GPU.

A layer's weight gradient is one matrix product whose output is the layer's weights (128x128,
256x256: a handful of tiles) and whose inner dimension is the batch. At 4,096 rows a GEMM
kernel that gives each output tile one thread block runs a few blocks on a GPU of 132
multiprocessors, each looping over all the rows. Here the rows are cut into `chunks` equal
parts, the parts' products run as one batched product (chunks times the blocks) and are summed:
the same gradient, up to the order of float additions. Where cuBLAS already splits the inner
dimension itself this gains nothing: it does for 2-D products, not for batched ones (the twin
critics' layers), on the H200 measured (bench/gpu_check.sh). The learners' `grad_row_chunks`
picks: "auto" (the default) cuts batched products on cuda only, a number cuts every layer.

The forward pass is the plain product (addmm / bmm); only the backward differs, and only for
batches of at least MIN_ROWS rows that divide into the chunks.
"""
import torch
from torch import nn
from torch.nn import functional as F

MIN_ROWS = 1024   # below it a layer's gradient is left to one product
# "auto"'s chunks for batched products on cuda: on an H200 a twin-critic layer's weight gradient
# over 4,096 rows took 40 us as one batched product and 10-14.5 us in 8 chunks; cuBLAS splits a
# 2-D product's inner dimension itself (chunks lost 4-6% of DQN's update rate), and on the CPU
# chunks gained nothing (docs/benchmarks.md, "Weight gradients in row chunks")
AUTO_BATCHED = 8


def chunks_for(rows: int, chunks: int) -> int:
    """How many chunks a product over `rows` rows is cut into (1: not cut)."""
    if chunks <= 1 or rows < MIN_ROWS:
        return 1
    while chunks > 1 and rows % chunks:
        chunks //= 2
    return chunks


def _chunked_weight_grad(x: torch.Tensor, g: torch.Tensor, k: int) -> torch.Tensor:
    """sum over rows of x[..., r, :]^T g[..., r, :] as k partial products, batched.
    x: (*lead, R, i), g: (*lead, R, o) -> (*lead, i, o)."""
    *lead, rows, i = x.shape
    o = g.shape[-1]
    xs = x.reshape(-1, rows // k, i)   # (lead*k, R/k, i): consecutive rows per chunk
    gs = g.reshape(-1, rows // k, o)
    part = torch.bmm(xs.transpose(1, 2), gs)   # (lead*k, i, o)
    return part.view(*lead, k, i, o).sum(len(lead))


class _Linear(torch.autograd.Function):
    """y = x @ w^T + b for x (R, i), w (o, i), b (o,) or None."""

    @staticmethod
    def forward(ctx, x, w, b, k):
        ctx.save_for_backward(x, w)
        ctx.k, ctx.has_bias = k, b is not None
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = g @ w
        if ctx.needs_input_grad[1]:
            gw = _chunked_weight_grad(x, g, ctx.k).transpose(0, 1)   # (i, o) -> (o, i)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g.sum(0)
        return gx, gw, gb, None


class _BMM(torch.autograd.Function):
    """y = x @ w for x (H, R, i) (an expanded input too), w (H, i, o)."""

    @staticmethod
    def forward(ctx, x, w, k):
        ctx.save_for_backward(x, w)
        ctx.k = k
        return torch.bmm(x, w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = torch.bmm(g, w.transpose(1, 2))
        if ctx.needs_input_grad[1]:
            gw = _chunked_weight_grad(x, g, ctx.k)
        return gx, gw, None


def _wants_grad(w: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and w.requires_grad


def bmm(x: torch.Tensor, w: torch.Tensor, chunks: int) -> torch.Tensor:
    """torch.bmm(x, w), its weight gradient in `chunks` row chunks (see the module)."""
    k = chunks_for(x.shape[1], chunks)
    if k == 1 or not _wants_grad(w):
        return torch.bmm(x, w)
    return _BMM.apply(x, w, k)


class Linear(nn.Linear):
    """nn.Linear (the same parameters and state dict) whose weight gradient is summed in
    `grad_row_chunks` chunks for inputs of one batch dimension with enough rows."""

    grad_row_chunks = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = chunks_for(x.shape[0], self.grad_row_chunks) if x.dim() == 2 else 1
        if k == 1 or not _wants_grad(self.weight):
            return F.linear(x, self.weight, self.bias)
        return _Linear.apply(x, self.weight, self.bias, k)


def check(setting, owner: str) -> None:
    """A ValueError unless `setting` is a `grad_row_chunks` value: "auto" or an integer >= 1."""
    if setting != "auto" and (not isinstance(setting, int) or isinstance(setting, bool) or setting < 1):
        raise ValueError(f"{owner}: grad_row_chunks must be \"auto\" or an integer >= 1 (1: one product), "
                         f"got {setting!r}")


def chunks_of(setting, device_type: str, batched: bool) -> int:
    """The chunks a layer takes for the learners' `grad_row_chunks`: a number, for every layer; or
    "auto": AUTO_BATCHED for batched products (`batched`) on cuda, else 1."""
    if setting != "auto":
        return setting
    return AUTO_BATCHED if batched and device_type == "cuda" else 1


def set_chunks(module: nn.Module, setting, device_type: str) -> None:
    """Every splitk.Linear under `module` (and any module with a `grad_row_chunks`; BATCHED_PRODUCT
    True: its products are batched) takes its chunks for `setting` on this device type."""
    for m in module.modules():
        if hasattr(m, "grad_row_chunks"):
            m.grad_row_chunks = chunks_of(setting, device_type, getattr(m, "BATCHED_PRODUCT", False))
