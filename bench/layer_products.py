"""The learners' layer ops at large batches, each way of writing them timed alone: what an update
of many rows spends on them, and which formulation is cheapest on this device.

    python bench/layer_products.py [--rows 256,4096] [--out FILE]

Two kinds of layer, at each row count:
  twin   SAC's twin critic ([obs + act, 256, 256, 1], two heads, bench/learner_speed.py's Pendulum
         preset): the forward product with its bias and relu (baddbmm; bmm then the bias; two addmm;
         addmm with the relu fused), the weight gradient (one batched product; two 2-D products; the
         batched product in 4-32 row chunks, trainer/learners/splitk.py), the input gradient and the
         bias gradient (a sum over the rows; a batched product with a row of ones), and the
         products with bfloat16 operands (the ceiling of lower-precision products);
  plain  DQN's Q network ([4, 128, 128, 2], the CartPole preset, 2-D products): the forward addmm with
         its relu, the weight and input gradients, the bias gradient three ways (`g.sum(0)`, which
         PyTorch's addmm backward runs: on the H200 its column reduction was the costliest kernel of
         DQN's 4,096-row update, 8.5 us a layer; a matrix-vector product with ones; a product
         of a row of ones), and on the last layer the Q value of the taken action with its gradient
         (`gather` and its scatter backward, against a one-hot mask's multiply and sum).
And each network's optimizer step: the fused Adam over its parameters (capturable, a tensor learning
rate: the graph path's) and the target update's `_foreach_lerp_`, each with the tensors whole and
in slices of 4,096 elements (trainer/learners/optim.py: one thread block per 65,536 elements whole).
And each learner's replay sample, the rows' gather that opens its update: a storage per column (an
index kernel each: DQN's five were about 18 us at 4,096 rows on the H200) against the columns of one
dtype in one storage (trainer/learners/replay.py's PACK, the default).
On cuda each op is captured REPS times in a CUDA graph and replayed (the learners' graph path), TF32
on, best of 5 replays of 10, in microseconds per op; on the CPU one call each, timed (a smoke run:
the figures that matter are the GPU's).
Prints one JSON object: {"device", "rows": [{"layer": "twin"|"plain", "rows", "in", "out",
"<formulation>": us, ...}], "optimizers": [{"network", "parameters", "adam_whole", "adam_sliced",
"lerp_whole", "lerp_sliced"}], "replays": [{"learner", "rows", "columns", "stores_packed",
"gather_columns", "gather_packed"}]}.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import emit  # noqa: E402
from simbridge.trainer.learners import optim, replay  # noqa: E402

REPS = 20
HEADS = 2
TWIN_LAYERS = ((4, 256), (256, 256), (256, 1))   # Pendulum: 3 observation values + 1 action
PLAIN_LAYERS = ((4, 128), (128, 128), (128, 2))  # CartPole: 4 observation values, 2 actions


def timed(fn, cuda: bool) -> float:
    if not cuda:
        t = time.perf_counter()
        fn()
        return round((time.perf_counter() - t) * 1e6, 1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up outside the capture (cuBLAS's workspaces)
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPS):
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        for _ in range(10):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / (10 * REPS))
    return round(best, 2)


def chunked(x: torch.Tensor, g: torch.Tensor, k: int) -> torch.Tensor:
    heads, rows, i = x.shape
    o = g.shape[-1]
    part = torch.bmm(x.reshape(heads * k, rows // k, i).transpose(1, 2), g.reshape(heads * k, rows // k, o))
    return part.view(heads, k, i, o).sum(1)


def same(ops: dict, prefix: str) -> None:
    """The formulations named `prefix`* compute the same values (to TF32 rounding over the rows):
    a faster one that computes something else is no candidate."""
    results = [ops[k]() for k in ops if k.startswith(prefix)]
    for got in results[1:]:
        ref = results[0]
        for a, b in zip(ref if isinstance(ref, tuple) else (ref,), got if isinstance(got, tuple) else (got,)):
            torch.testing.assert_close(b.reshape(a.shape), a, rtol=1e-2, atol=0.2)


def twin_layer(rows: int, i: int, o: int, dev: torch.device) -> dict:
    cuda = dev.type == "cuda"
    x, w = torch.randn(HEADS, rows, i, device=dev), torch.randn(HEADS, i, o, device=dev)
    b, g = torch.randn(HEADS, 1, o, device=dev), torch.randn(HEADS, rows, o, device=dev)
    ones = torch.ones(HEADS, 1, rows, device=dev)
    xh, wh, gh = x.bfloat16(), w.bfloat16(), g.bfloat16()
    xs, gs = [x[h].contiguous() for h in range(HEADS)], [g[h].contiguous() for h in range(HEADS)]
    ws, bs = [w[h].t().contiguous() for h in range(HEADS)], [b[h, 0].contiguous() for h in range(HEADS)]
    ops = {
        "fwd_baddbmm_relu": lambda: torch.baddbmm(b, x, w).relu_(),
        "fwd_bmm_add_relu": lambda: torch.bmm(x, w).add_(b).relu_(),
        "fwd_2x_addmm_relu": lambda: [torch.addmm(bs[h], xs[h], ws[h].t()).relu_() for h in range(HEADS)],
        "fwd_2x_addmm_relu_fused": lambda: [torch._addmm_activation(bs[h], xs[h], ws[h].t()) for h in range(HEADS)],
        "wgrad_bmm": lambda: torch.bmm(x.transpose(1, 2), g),
        "wgrad_2x_mm": lambda: [gs[h].t() @ xs[h] for h in range(HEADS)],
        **{f"wgrad_chunks{k}": (lambda k=k: chunked(x, g, k)) for k in (4, 8, 16, 32) if rows >= 1024},
        "dgrad_bmm": lambda: torch.bmm(g, w.transpose(1, 2)),
        # bfloat16 operands (cast beforehand): the products' ceiling at half the bytes and twice the
        # tensor-core rate, the candidate left for the batch-4,096 bar (a change of numerics)
        "fwd_bmm_bf16": lambda: torch.bmm(xh, wh),
        "wgrad_bmm_bf16": lambda: torch.bmm(xh.transpose(1, 2), gh),
        **({"wgrad_chunks8_bf16": lambda: chunked(xh, gh, 8)} if rows >= 1024 else {}),
        "dgrad_bmm_bf16": lambda: torch.bmm(gh, wh.transpose(1, 2)),
        "bgrad_sum": lambda: g.sum(1, keepdim=True),
        "bgrad_bmm_ones": lambda: torch.bmm(ones, g),
    }
    same(ops, "bgrad_")
    return {"layer": "twin", "rows": rows, "in": i, "out": o, **{name: timed(fn, cuda) for name, fn in ops.items()}}


def plain_layer(rows: int, i: int, o: int, dev: torch.device, last: bool) -> dict:
    """last: the Q network's output layer, where the taken action's value is picked."""
    cuda = dev.type == "cuda"
    x, w, b = torch.randn(rows, i, device=dev), torch.randn(o, i, device=dev), torch.randn(o, device=dev)
    g = torch.randn(rows, o, device=dev)
    ones, ones_row = torch.ones(rows, device=dev), torch.ones(1, rows, device=dev)
    ops = {
        "fwd_addmm_relu": lambda: torch.addmm(b, x, w.t()).relu_(),
        "wgrad_mm": lambda: g.t() @ x,
        "dgrad_mm": lambda: g @ w,
        "bgrad_sum": lambda: g.sum(0),
        "bgrad_mv_ones": lambda: torch.mv(g.t(), ones),
        "bgrad_mm_ones": lambda: ones_row @ g,
    }
    if last:
        a, actions = torch.randint(0, o, (rows, 1), device=dev), torch.arange(o, device=dev)
        gy = torch.randn(rows, 1, device=dev)

        def onehot():
            mask = (a == actions).to(g.dtype)   # made from the actions at every update, as a learner would
            return (g * mask).sum(1, keepdim=True), mask * gy

        # the taken action's Q value and the gradient it sends back into the layer's output
        # (gather's backward: a scatter-add into zeros)
        ops["pick_gather"] = lambda: (g.gather(1, a), torch.zeros_like(g).scatter_add_(1, a, gy))
        ops["pick_onehot"] = onehot
    same(ops, "bgrad_")
    same(ops, "pick_")
    return {"layer": "plain", "rows": rows, "in": i, "out": o, **{name: timed(fn, cuda) for name, fn in ops.items()}}


# the parameter shapes of each preset's networks
NETWORKS = {
    "sac_twin_critic": [(HEADS, 4, 256), (HEADS, 1, 256), (HEADS, 256, 256), (HEADS, 1, 256), (HEADS, 256, 1),
                        (HEADS, 1, 1)],
    "sac_actor": [(256, 3), (256,), (256, 256), (256,), (2, 256), (2,)],
    "dqn_q": [(128, 4), (128,), (128, 128), (128,), (2, 128), (2,)],
}


def optimizer_steps(network: str, dev: torch.device) -> dict:
    shapes = NETWORKS[network]
    params = [torch.randn(s, device=dev) for s in shapes]
    grads, avgs, sqs, targets = ([torch.randn(s, device=dev) for s in shapes] for _ in range(4))
    sqs = [v.abs() for v in sqs]
    steps = [torch.ones((), device=dev) for _ in shapes]
    lr = torch.tensor(1e-3, device=dev)

    def adam(cut: bool):
        lists, (st,) = optim.sliced([params, grads, avgs, sqs], [steps]) if cut else ([params, grads, avgs, sqs], [steps])
        torch._fused_adam_(*lists, [], st, amsgrad=False, lr=lr, beta1=0.9, beta2=0.999, weight_decay=0.0,
                           eps=1e-8, maximize=False, grad_scale=None, found_inf=None)

    def lerp(cut: bool):
        (t, s), _ = optim.sliced([targets, params]) if cut else (([targets, params]), [])
        torch._foreach_lerp_(t, s, 0.005)

    saved = optim.SLICED_DEVICES
    optim.SLICED_DEVICES = (dev.type,)   # sliced here whatever the device: the CPU run is a smoke run
    try:
        ops = {"adam_whole": lambda: adam(False), "adam_sliced": lambda: adam(True),
               "lerp_whole": lambda: lerp(False), "lerp_sliced": lambda: lerp(True)}
        return {"network": network, "parameters": sum(p.numel() for p in params),
                **{name: timed(fn, dev.type == "cuda") for name, fn in ops.items()}}
    finally:
        optim.SLICED_DEVICES = saved


# each preset's replay columns: (row shape, dtype); DQN stores action indices, SAC scaled actions
REPLAYS = {
    "dqn": {"obs": ((4,), torch.float32), "new_obs": ((4,), torch.float32), "actions": ((), torch.int64),
            "rewards": ((), torch.float32), "discounts": ((), torch.float32)},
    "sac": {"obs": ((3,), torch.float32), "new_obs": ((3,), torch.float32), "actions": ((1,), torch.float32),
            "rewards": ((), torch.float32), "discounts": ((), torch.float32)},
}


def replay_gathers(learner: str, rows: int, dev: torch.device) -> dict:
    columns, buffers = REPLAYS[learner], {}
    gen = torch.Generator().manual_seed(0)
    data = {k: torch.randint(0, 2, (5_000,) + shape, generator=gen).to(dtype) if dtype == torch.int64
            else torch.randn((5_000,) + shape, generator=gen, dtype=dtype) for k, (shape, dtype) in columns.items()}
    saved = replay.PACK
    try:
        for packed in (False, True):
            replay.PACK = packed
            buffers[packed] = replay.ReplayBuffer(5_000, dev)
            buffers[packed].add({k: v.numpy() for k, v in data.items()})
    finally:
        replay.PACK = saved
    idx = buffers[True].draw(rows, torch.Generator(dev).manual_seed(1))
    ops = {f"gather_{way}": (lambda b=buffers[packed]: tuple(v for _, v in sorted(b.gather(idx).items())))
           for way, packed in (("columns", False), ("packed", True))}
    same(ops, "gather_")
    return {"learner": learner, "rows": rows, "columns": len(columns), "stores_packed": len(buffers[True]._stores),
            **{name: timed(fn, dev.type == "cuda") for name, fn in ops.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="256,4096")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":   # the learners' default on cuda (capture.py)
        torch.backends.cuda.matmul.allow_tf32 = True
    counts = [int(v) for v in args.rows.split(",")]
    rows = [twin_layer(r, i, o, dev) for r in counts for i, o in TWIN_LAYERS]
    rows += [plain_layer(r, i, o, dev, last=(i, o) == PLAIN_LAYERS[-1]) for r in counts for i, o in PLAIN_LAYERS]
    report = {"bench": "layer_products", "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "reps_per_graph": REPS, "rows": rows, "optimizers": [optimizer_steps(n, dev) for n in NETWORKS],
              "replays": [replay_gathers(n, r, dev) for n in REPLAYS for r in counts]}
    return emit(report, args.out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
