"""Learner update speed: updates/s per learner, device, batch size and update path, in one run.

    python bench/learner_speed.py [--devices cpu,cuda] [--batches 256,4096] [--paths eager,graph]
                                  [--window 0.3] [--repeats 3] [--threads 1] [--compile] [--tf32 on|off|both]
                                  [--profile K] [--blas cublas|cublaslt] [--grad-row-chunks auto,1,8]
                                  [--adam-slices on,off] [--bias-grad sum,product]
                                  [--replay-gather packed,columns] [--out FILE]

For each learner (DQN with the CartPole preset, SAC with the Pendulum preset, PPO's minibatch step
with the CartPole preset), each device present (cpu; cuda when torch sees one) and each batch size:
the learner's own update loop (`run_update_steps`: replay draws on the device, the update on its
path, metrics left on the device) over a replay of 5,000 synthetic transitions, timed in `--repeats`
windows of at least `--window` seconds, the device synchronised at both ends of each. Paths: eager
everywhere; "graph" (a CUDA graph per update) on cuda; "compile" (torch.compile; on cuda its kernels
captured as one CUDA graph) with --compile or --paths only: compiling takes minutes on a small CPU.
--grad-row-chunks: the learners' `grad_row_chunks` (weight gradients of batches >= 1,024 rows summed
in chunks: trainer/learners/splitk.py; "auto", the default, cuts the twin critics' batched products
on cuda), one row per value. --adam-slices: whether large tensors reach the multi-tensor kernels
(fused Adam, the target update) in slices on cuda ("on", the learners' way: trainer/learners/optim.py)
or whole ("off"), one row per value. --bias-grad: layers' bias gradients over batches of >= 1,024
rows as a sum ("sum", PyTorch's way and the default) or as a product with ones ("product":
trainer/learners/splitk.py's BIAS_BY_PRODUCT, on every device), one row per value. --replay-gather:
the replay's columns of one dtype in one storage, one index op per dtype ("packed", the default:
trainer/learners/replay.py's PACK) or a storage and an index op per column ("columns").
Prints one JSON object:
  results: {learner, device, batch, path, tf32 (cuda: float32 products on TF32 tensor cores, the
           learners' default; --tf32 both measures full float32 beside it), updates_per_s (median), spread [min, max], cpu_ms_per_update
           (process CPU time per update, median), updates timed, warmup_s (building, filling, first
           updates and any capture or compile), with --profile K: profile, the K ops with the most
           self time per update (on the device on cuda)}
  ratios:  (rows with the defaults: grad_row_chunks "auto", adam_slices "on", bias_grad "sum",
           replay_gather "packed") per learner/device/batch, each path's rate over eager's (`graph_vs_eager`) and the
           compile path's over the graph path's (`compile_vs_graph`, cuda), and per
           learner/device/path the batch-4,096 rate over the batch-256 rate (`b4096_vs_b256`), and on
           cuda with --tf32 both, TF32's rate over full float32's (`tf32_vs_fp32`); per
           learner/device/batch/path, each grad_row_chunks K's rate over "auto"'s (`chunksK_vs_auto`),
           adam_slices "off"'s rate over "on"'s (`slicesoff_vs_on`), bias_grad "product"'s over "sum"'s
           (`biasproduct_vs_sum`), replay_gather "columns"'s over "packed"'s (`gathercolumns_vs_packed`);
           a row off two defaults names both
  acting:  the acting copy's forward pass (compute_actions, explore) per call, in microseconds of wall
           and of process CPU time, at 1 and 256 rows, on each device, for each preset's network and a [1024, 1024] MLP
  targets: on cuda, the GPU issue's bars (SAC >= 1,000 and DQN >= 2,500 updates/s at batch 256 on
           the fastest path, batch 4,096 at >= 0.8x batch 256) and whether each was met
On the CPU the default run takes well under a minute.
"""
import argparse
import contextlib
import itertools
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import emit  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from simbridge.trainer.learners import optim, replay, splitk  # noqa: E402
from simbridge.trainer.learners.dqn import DQNLearner  # noqa: E402
from simbridge.trainer.learners.nstep import DISCOUNTS  # noqa: E402
from simbridge.trainer.learners.ppo import MINIBATCH_KEYS, PPOLearner  # noqa: E402
from simbridge.trainer.learners.presets import DQN_CARTPOLE, PPO_CARTPOLE, SAC_PENDULUM  # noqa: E402
from simbridge.trainer.learners.sac import SACLearner  # noqa: E402
from simbridge.wire.columns import ACTIONS, NEW_OBS, OBS, REWARDS  # noqa: E402

LEARNERS = {
    "dqn": (DQNLearner, DQN_CARTPOLE, "CartPole-v1"),
    "sac": (SACLearner, SAC_PENDULUM, "Pendulum-v1"),
    "ppo": (PPOLearner, PPO_CARTPOLE, "CartPole-v1"),
}
REPLAY_ROWS = 5_000
TARGETS = {"sac": 1_000.0, "dqn": 2_500.0}   # updates/s at batch 256 on cuda (the GPU issue)
DEFAULT_CHUNKS = "auto"   # the learners' grad_row_chunks default: the rows the ratios compare
# A row's settings beside the learners' defaults, each compared with its default in the ratios:
# row key -> (default, tag in a ratio's name)
VARIANTS = {"grad_row_chunks": (DEFAULT_CHUNKS, "chunks"), "adam_slices": ("on", "slices"),
            "bias_grad": ("sum", "bias"), "replay_gather": ("packed", "gather")}


def default_row(r: dict) -> bool:
    return all(r.get(k, default) == default for k, (default, _) in VARIANTS.items())


@contextlib.contextmanager
def switches(slices: str, bias: str, gather: str = "packed"):
    """The module settings a row runs with, held over its build, capture and timing: slices "on",
    the multi-tensor kernels take large tensors in slices on cuda (optim.SLICED_DEVICES, the
    learners' way), "off" whole; bias "product", large batches' bias gradients as products on every
    device (splitk.BIAS_BY_PRODUCT), "sum" PyTorch's reduction (the learners' way); gather "packed",
    the replay's columns of one dtype in one storage (replay.PACK, the learners' way), "columns" a
    storage each."""
    saved = optim.SLICED_DEVICES, splitk.BIAS_BY_PRODUCT, replay.PACK
    optim.SLICED_DEVICES = ("cuda",) if slices == "on" else ()
    splitk.BIAS_BY_PRODUCT = ("cpu", "cuda") if bias == "product" else ()
    replay.PACK = gather == "packed"
    try:
        yield
    finally:
        optim.SLICED_DEVICES, splitk.BIAS_BY_PRODUCT, replay.PACK = saved


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(name: str, device: str, batch: int, path: str, tf32: bool = True, chunks=DEFAULT_CHUNKS):
    cls, preset, env_id = LEARNERS[name]
    env = gym.make(env_id)
    cfg = {**preset, "seed": 0, "update_path": path, "tf32": tf32, "grad_row_chunks": chunks}
    if name != "ppo":
        cfg["batch_size"] = batch
    learner = cls(env.observation_space, env.action_space, cfg, device=device, acting_device="learner")
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((REPLAY_ROWS, env.observation_space.shape[0])).astype(np.float32)
    if name == "ppo":
        lay, dev = learner.layout, learner.device
        mb = {"obs": torch.as_tensor(obs[:batch], device=dev),
              "idx": torch.as_tensor(rng.integers(0, 2, (batch, len(lay.nvec))), device=dev),
              "a": torch.zeros((batch, 0), device=dev),
              "logp": torch.full((batch,), -0.69, device=dev),
              "adv": torch.as_tensor(rng.standard_normal(batch).astype(np.float32), device=dev),
              "targets": torch.as_tensor(rng.standard_normal(batch).astype(np.float32), device=dev)}
        assert set(mb) == set(MINIBATCH_KEYS)
        learner.updater.clear()

        def steps(n: int) -> None:
            for _ in range(n):
                learner.updater.run(mb)
        return learner, steps
    actions = learner.store_actions(np.stack([env.action_space.sample() for _ in range(REPLAY_ROWS)]))
    learner.replay.add({OBS: obs, NEW_OBS: obs + 0.01, ACTIONS: actions,
                        REWARDS: rng.standard_normal(REPLAY_ROWS).astype(np.float32),
                        DISCOUNTS: np.full(REPLAY_ROWS, 0.99, np.float32)})
    return learner, learner.run_update_steps


def measure(name: str, device: str, batch: int, path: str, window: float, repeats: int, tf32: bool = True,
            profile_top: int = 0, chunks=DEFAULT_CHUNKS, slices: str = "on", bias: str = "sum",
            gather: str = "packed") -> dict:
    with switches(slices, bias, gather):
        row = _measure(name, device, batch, path, window, repeats, tf32, profile_top, chunks)
    row.update(adam_slices=slices, bias_grad=bias, replay_gather=gather)
    return row


def _measure(name: str, device: str, batch: int, path: str, window: float, repeats: int, tf32: bool,
             profile_top: int, chunks) -> dict:
    t0 = time.perf_counter()
    learner, steps = build(name, device, batch, path, tf32, chunks)
    dev = learner.device
    steps(6)                       # warm-up: a graph's capture, a compile, lazy allocations
    learner.updater.read()
    sync(dev)
    warmup_s = time.perf_counter() - t0
    rates, cpu = [], []
    chunk = 4
    timed = 0
    for _ in range(repeats):
        n = 0
        sync(dev)
        c0, t = time.process_time(), time.perf_counter()
        while True:
            steps(chunk)
            n += chunk
            sync(dev)
            elapsed = time.perf_counter() - t
            if elapsed >= window:
                break
            if elapsed < window / 8:
                chunk *= 2
        learner.updater.read()      # the loop's read-back: once per window, as train() once per call
        rates.append(n / elapsed)
        cpu.append(1e3 * (time.process_time() - c0) / n)
        timed += n
    row = {"learner": name, "device": str(dev), "batch": batch, "path": learner.updater.path,
           "path_asked": path, "tf32": learner.updater.tf32, "grad_row_chunks": chunks, "updates_per_s": round(statistics.median(rates), 1),
           "spread": [round(min(rates), 1), round(max(rates), 1)],
           "cpu_ms_per_update": round(statistics.median(cpu), 3), "updates": timed,
           "warmup_s": round(warmup_s, 2)}
    if profile_top:
        row["profile"] = profile(learner, steps, profile_top)
    return row


def profile(learner, steps, top: int, updates: int = 20) -> list:
    """The `top` ops by self time on the device (cuda; on the CPU, by self CPU time) over `updates`
    more updates of a warm learner, per update: what grows with the batch."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    sync(learner.device)
    cuda = learner.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=acts) as prof:
        steps(updates)
        sync(learner.device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0.0), reverse=True)[:top]
    return [{"op": kernel_name(e.key), "self_us_per_update": round(getattr(e, key, 0.0) / updates, 1),
             "calls_per_update": round(e.count / updates, 2)} for e in rows]


# what CUDA kernels' names repeat, and what tells them apart: the functors and ops in their templates
# (the fused Adam and every _foreach_ op are all `multi_tensor_apply_kernel<...>`)
_NOISE = ("void ", "at::native::", "(anonymous namespace)::", "std::enable_if<!(false), void>::type ", "internal::")
_WHICH = re.compile(r"(\w*(?:Functor|functor|Ops|_kernel_cuda|Metadata)\w*)")


def kernel_name(name: str, width: int = 90) -> str:
    """A profile row's op, short: `multi_tensor_apply_kernel<FusedAdamMathFunctor>` for the fused
    Adam, cuBLAS's and ATen's op names as they are (cut to `width`)."""
    for noise in _NOISE:
        name = name.replace(noise, "")
    head, _, rest = name.partition("<")
    which = [w for w in dict.fromkeys(_WHICH.findall(rest)) if not w.endswith("Metadata")]
    return (f"{head}<{'/'.join(which)}>" if which else name)[:width]


def acting_latency(device: str, window: float = 0.15) -> list:
    out = []
    nets = [("dqn", DQNLearner, DQN_CARTPOLE, "CartPole-v1", None), ("sac", SACLearner, SAC_PENDULUM, "Pendulum-v1", None),
            ("sac-1024x1024", SACLearner, SAC_PENDULUM, "Pendulum-v1", [1024, 1024])]
    for label, cls, preset, env_id, hidden in nets:
        env = gym.make(env_id)
        cfg = {**preset, "seed": 0, "random_warmup": False} if cls is SACLearner else {**preset, "seed": 0}
        if hidden:
            cfg["hidden"] = hidden
        learner = cls(env.observation_space, env.action_space, cfg, device=device, acting_device="learner",
                      trainable=False)
        params = sum(p.numel() for p in learner.acting.parameters())
        for rows in (1, 256):
            obs = np.random.default_rng(0).standard_normal((rows, env.observation_space.shape[0])).astype(np.float32)
            for _ in range(3):
                learner.compute_actions(obs)
            calls, t, c = 0, time.perf_counter(), time.process_time()
            while calls < 3 or time.perf_counter() - t < window:
                learner.compute_actions(obs)     # returns numpy: the device synchronises every call
                calls += 1
            out.append({"network": label, "parameters": params, "device": device, "rows": rows,
                        "us_per_call": round(1e6 * (time.perf_counter() - t) / calls, 1),
                        "cpu_us_per_call": round(1e6 * (time.process_time() - c) / calls, 1)})
    return out


def ratios(results: list) -> dict:
    out = {}

    def precision(device, tf32):   # the tag cuda rows carry
        return "" if not device.startswith("cuda") else ("/tf32" if tf32 else "/fp32")

    def key(r):
        return r["learner"], r["device"], r["batch"], r["path_asked"], r["tf32"]
    by = {key(r): r["updates_per_s"] for r in results if default_row(r)}
    for r in results:
        one = by.get(key(r))
        if default_row(r) or not one:
            continue
        name = "_".join(f"{tag}{r[k]}_vs_{default}" for k, (default, tag) in VARIANTS.items()
                        if r.get(k, default) != default)
        out[f'{r["learner"]}/{r["device"]}{precision(r["device"], r["tf32"])}/b{r["batch"]}/{r["path_asked"]}'
            f'/{name}'] = round(r["updates_per_s"] / one, 3)
    for (learner, device, batch, path, tf32), rate in by.items():
        tag = precision(device, tf32)
        eager = by.get((learner, device, batch, "eager", tf32))
        if path != "eager" and eager:
            out[f"{learner}/{device}{tag}/b{batch}/{path}_vs_eager"] = round(rate / eager, 3)
        graph = by.get((learner, device, batch, "graph", tf32))
        if path == "compile" and graph:
            out[f"{learner}/{device}{tag}/b{batch}/compile_vs_graph"] = round(rate / graph, 3)
        small = by.get((learner, device, 256, path, tf32))
        if batch == 4096 and small:
            out[f"{learner}/{device}{tag}/{path}/b4096_vs_b256"] = round(rate / small, 3)
        if tf32:
            full = by.get((learner, device, batch, path, False))
            if full:
                out[f"{learner}/{device}/b{batch}/{path}/tf32_vs_fp32"] = round(rate / full, 3)
    return out


def targets(results: list) -> dict:
    out = {}
    for learner, bar in TARGETS.items():
        # the learners' defaults: TF32 on cuda
        cuda = [r for r in results if r["learner"] == learner and r["device"].startswith("cuda") and r["tf32"]]
        b256 = [r for r in cuda if r["batch"] == 256 and default_row(r)]
        if not b256:
            continue
        best = max(b256, key=lambda r: r["updates_per_s"])
        big = [r for r in cuda if r["batch"] == 4096 and r["path_asked"] == best["path_asked"]]
        out[learner] = {"bar_b256": bar, "best_b256": best["updates_per_s"], "path": best["path_asked"],
                        "b256_met": best["updates_per_s"] >= bar}
        if big:   # the fastest grad_row_chunks at 4,096 (a setting a default can take)
            top = max(big, key=lambda r: r["updates_per_s"])
            out[learner].update(b4096=top["updates_per_s"], b4096_grad_row_chunks=top.get("grad_row_chunks", DEFAULT_CHUNKS),
                                b4096_met=top["updates_per_s"] >= 0.8 * best["updates_per_s"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    have_cuda = torch.cuda.is_available()
    ap.add_argument("--devices", default="cpu,cuda" if have_cuda else "cpu")
    ap.add_argument("--batches", default="256,4096")
    ap.add_argument("--learners", default="dqn,sac,ppo")
    ap.add_argument("--paths", default=None, help="default: eager, and graph on cuda")
    ap.add_argument("--tf32", choices=["on", "off", "both"], default="on",
                    help="on cuda, the learners' tf32 key (default on, as the learners): both measures each")
    ap.add_argument("--compile", action="store_true", help="also the torch.compile path (minutes on a small CPU)")
    ap.add_argument("--window", type=float, default=0.3, help="seconds per timed window")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the trainer's default: 1)")
    ap.add_argument("--no-acting", action="store_true")
    ap.add_argument("--blas", choices=["cublas", "cublaslt"], default=None,
                    help="on cuda, torch's preferred BLAS library for the run (default: torch's own choice)")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="also each row's K costliest ops per update (torch.profiler: self time on the "
                         "device on cuda, self CPU time on the CPU)")
    ap.add_argument("--grad-row-chunks", default=DEFAULT_CHUNKS, metavar="K,...",
                    help="the learners' grad_row_chunks (\"auto\" or a number), one row per value "
                         "(trainer/learners/splitk.py)")
    ap.add_argument("--adam-slices", default="on", metavar="on,off",
                    help="large tensors to the fused Adam and the target update in slices on cuda (on) or "
                         "whole (off), one row per value (trainer/learners/optim.py)")
    ap.add_argument("--bias-grad", default="sum", metavar="sum,product",
                    help="large batches' bias gradients as a sum (PyTorch's) or a product with ones, one "
                         "row per value (trainer/learners/splitk.py)")
    ap.add_argument("--replay-gather", default="packed", metavar="packed,columns",
                    help="the replay's columns of one dtype in one storage (packed) or a storage each, one "
                         "row per value (trainer/learners/replay.py)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.blas and have_cuda:
        torch.backends.cuda.preferred_blas_library(args.blas)
    started = time.perf_counter()
    tf32s = {"on": (True,), "off": (False,), "both": (True, False)}[args.tf32]
    results = []
    for device in args.devices.split(","):
        if device.startswith("cuda") and not have_cuda:
            print(f"skipping {device}: torch sees no CUDA device", file=sys.stderr)
            continue
        paths = args.paths.split(",") if args.paths else (["eager", "graph"] if device.startswith("cuda") else ["eager"])
        if args.compile and "compile" not in paths:
            paths.append("compile")
        for learner in args.learners.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                for path in paths:
                    for tf32 in tf32s if device.startswith("cuda") else (True,):
                        for chunks, slices, bias, gather in itertools.product(
                                (k if k == "auto" else int(k) for k in args.grad_row_chunks.split(",")),
                                args.adam_slices.split(","), args.bias_grad.split(","),
                                args.replay_gather.split(",")):
                            r = measure(learner, device, batch, path, args.window, args.repeats, tf32,
                                        args.profile, chunks, slices, bias, gather)
                            print(json.dumps(r), file=sys.stderr, flush=True)
                            results.append(r)
    acting = []
    if not args.no_acting:
        for device in args.devices.split(","):
            if not device.startswith("cuda") or have_cuda:
                acting += acting_latency(device)
    report = {"bench": "learner_speed", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                          "threads": args.threads, "load_1min": round(os.getloadavg()[0], 2),
                          "blas": str(torch.backends.cuda.preferred_blas_library()) if have_cuda else None,
                          "gpu": torch.cuda.get_device_name(0) if have_cuda else None},
              "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "results": results, "ratios": ratios(results), "acting": acting, "targets": targets(results),
              "wall_s": round(time.perf_counter() - started, 1)}
    return emit(report, args.out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
