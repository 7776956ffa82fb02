"""The twin critics' layer products, each way of writing them timed alone: what an update of many
rows spends on them, and which formulation is cheapest on this device.

    python bench/twin_products.py [--rows 256,4096] [--out FILE]

For the layers of SAC's twin critic ([obs + act, 256, 256, 1], two heads, bench/learner_speed.py's
Pendulum preset) at each row count: the forward product with its bias and relu (baddbmm; bmm then
the bias; two addmm; addmm with the relu fused), the weight gradient (one batched product; two
2-D products; the batched product in 4-32 row chunks, trainer/learners/splitk.py), the input
gradient and the bias gradient. On cuda each op is captured REPS times in a CUDA graph and
replayed (the learners' graph path), TF32 on, best of 5 replays of 10, in microseconds per op; on
the CPU one call each, timed (a smoke run: the figures that matter are the GPU's).
Prints one JSON object: {"device", "rows": [{"rows", "in", "out", "<formulation>": us, ...}]}.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPS = 20
HEADS = 2
LAYERS = ((4, 256), (256, 256), (256, 1))   # Pendulum: 3 observation values + 1 action


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


def layer(rows: int, i: int, o: int, dev: torch.device) -> dict:
    cuda = dev.type == "cuda"
    x, w = torch.randn(HEADS, rows, i, device=dev), torch.randn(HEADS, i, o, device=dev)
    b, g = torch.randn(HEADS, 1, o, device=dev), torch.randn(HEADS, rows, o, device=dev)
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
        "bgrad_sum": lambda: g.sum(1, keepdim=True),
    }
    return {"rows": rows, "in": i, "out": o, **{name: timed(fn, cuda) for name, fn in ops.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="256,4096")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":   # the learners' default on cuda (capture.py)
        torch.backends.cuda.matmul.allow_tf32 = True
    rows = [layer(r, i, o, dev) for r in (int(v) for v in args.rows.split(",")) for i, o in LAYERS]
    report = {"bench": "twin_products", "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "reps_per_graph": REPS, "rows": rows}
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
