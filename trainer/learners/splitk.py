"""A layer's gradients over many rows, for large batches on a GPU: weight gradients summed over row
chunks (split-K), and bias gradients as products.

A layer's weight gradient is one matrix product whose output is the layer's weights (128x128,
256x256: a handful of tiles) and whose inner dimension is the batch. At 4,096 rows a GEMM
kernel that gives each output tile one thread block runs a few blocks on a GPU of 132
multiprocessors, each looping over all the rows. Here the rows are cut into `chunks` equal
parts, the parts' products run as one batched product (chunks times the blocks) and are summed:
the same gradient, up to the order of float additions. Where cuBLAS already splits the inner
dimension itself this gains nothing: it does for 2-D products, not for batched ones (the twin
critics' layers), on the H200 measured (bench/gpu_check.sh). The learners' `grad_row_chunks`
picks: "auto" (the default) cuts batched products on cuda only, a number cuts every layer.

A bias's gradient is the layer's output gradient summed over the rows: PyTorch's column
reduction of a (4,096, 256) gradient took 10.8 us on an H200 (DQN's (4,096, 128): 8.5 us, the
costliest kernel of its update at that batch), where a product with a vector of ones is a GEMV
that cuBLAS spreads over the rows. On the device types in BIAS_BY_PRODUCT, for batches of at least
MIN_ROWS rows, the bias gradient is that product: the same sum in another order. BIAS_BY_PRODUCT is
empty until a GPU says it pays (bench/layer_products.py times both forms one by one;
bench/learner_speed.py --bias-grad sum,product in whole updates).

The forward pass is the plain product (addmm / bmm, then the bias); only the backward differs, and
only for batches of at least MIN_ROWS rows.
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
BIAS_BY_PRODUCT: tuple = ()   # device types whose large batches take bias gradients as products


def chunks_for(rows: int, chunks: int) -> int:
    """How many chunks a product over `rows` rows is cut into (1: not cut)."""
    if chunks <= 1 or rows < MIN_ROWS:
        return 1
    while chunks > 1 and rows % chunks:
        chunks //= 2
    return chunks


def _by_product(x: torch.Tensor) -> bool:
    """Whether a layer reading `x` (rows in its second-to-last dimension) takes its bias gradient as a product."""
    return x.device.type in BIAS_BY_PRODUCT and x.shape[-2] >= MIN_ROWS


def _bias_grad(g: torch.Tensor, by_product: bool) -> torch.Tensor:
    """The sum of g over its rows: (R, o) -> (o,), (H, R, o) -> (H, 1, o); as a product with ones
    (by_product) or a reduction."""
    if g.dim() == 2:
        return torch.mv(g.t(), g.new_ones(g.shape[0])) if by_product else g.sum(0)
    if by_product:
        return torch.bmm(g.new_ones(g.shape[0], 1, g.shape[1]), g)
    return g.sum(1, keepdim=True)


def _chunked_weight_grad(x: torch.Tensor, g: torch.Tensor, k: int) -> torch.Tensor:
    """sum over rows of x[..., r, :]^T g[..., r, :] as k partial products, batched (k = 1: one).
    x: (*lead, R, i), g: (*lead, R, o) -> (*lead, i, o)."""
    if k == 1:
        return x.transpose(-2, -1) @ g
    *lead, rows, i = x.shape
    o = g.shape[-1]
    xs = x.reshape(-1, rows // k, i)   # (lead*k, R/k, i): consecutive rows per chunk
    gs = g.reshape(-1, rows // k, o)
    part = torch.bmm(xs.transpose(1, 2), gs)   # (lead*k, i, o)
    return part.view(*lead, k, i, o).sum(len(lead))


class _Linear(torch.autograd.Function):
    """y = x @ w^T + b for x (R, i), w (o, i), b (o,) or None."""

    @staticmethod
    def forward(ctx, x, w, b, k, by_product):
        ctx.save_for_backward(x, w)
        ctx.k, ctx.has_bias, ctx.by_product = k, b is not None, by_product
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = g @ w
        if ctx.needs_input_grad[1]:
            # sum of g_r^T x_r: (o, i) as the weight is (a transposed (i, o) was copied into place
            # by autograd, one more kernel per layer)
            gw = _chunked_weight_grad(g, x, ctx.k)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = _bias_grad(g, ctx.by_product)
        return gx, gw, gb, None, None


class _BMM(torch.autograd.Function):
    """y = x @ w + b for x (H, R, i) (an expanded input too), w (H, i, o), b (H, 1, o)."""

    @staticmethod
    def forward(ctx, x, w, b, k, by_product):
        ctx.save_for_backward(x, w)
        ctx.k, ctx.by_product = k, by_product
        return torch.bmm(x, w).add_(b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = torch.bmm(g, w.transpose(1, 2))
        if ctx.needs_input_grad[1]:
            gw = _chunked_weight_grad(x, g, ctx.k)
        if ctx.needs_input_grad[2]:
            gb = _bias_grad(g, ctx.by_product)
        return gx, gw, gb, None, None


def _wants_grad(w: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and w.requires_grad


def bmm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, chunks: int) -> torch.Tensor:
    """torch.bmm(x, w) + b, its weight gradient in `chunks` row chunks and its bias gradient
    maybe a product (see the module)."""
    k = chunks_for(x.shape[1], chunks)
    by_product = _by_product(x)
    if (k == 1 and not by_product) or not _wants_grad(w):
        # the product, then the bias: torch.compile fuses the bias into what follows (a relu),
        # where baddbmm first copies the bias over every row
        return torch.bmm(x, w).add_(b)
    return _BMM.apply(x, w, b, k, by_product)


class Linear(nn.Linear):
    """nn.Linear (the same parameters and state dict) whose weight gradient is summed in
    `grad_row_chunks` chunks for inputs of one batch dimension with enough rows."""

    grad_row_chunks = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or not _wants_grad(self.weight):
            return F.linear(x, self.weight, self.bias)
        k = chunks_for(x.shape[0], self.grad_row_chunks)
        by_product = self.bias is not None and _by_product(x)
        if k == 1 and not by_product:
            return F.linear(x, self.weight, self.bias)
        return _Linear.apply(x, self.weight, self.bias, k, by_product)


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
