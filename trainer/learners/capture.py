"""How a learner's gradient updates run: eagerly, as one CUDA graph, or through torch.compile.

The config key `update_path` (every learner, COMMON_DEFAULTS):
  "auto"     graph on cuda, eager elsewhere
  "eager"    plain PyTorch, one kernel launch per op
  "graph"    the whole update (replay gather, losses, backward, optimizer steps, target update,
             metrics) captured once as a torch.cuda.CUDAGraph and replayed: one launch per update.
             cuda only; elsewhere, or when capture fails, eager (the log says why)
  "compile"  torch.compile: inductor's kernels (fused element-wise work) for the step; on cuda
             the compiled step is captured as one CUDA graph, as on "graph". Not torch.compile's
             own CUDA graphs (mode "reduce-overhead"): they skip a step that writes its inputs in
             place, as every update does (its weights, moments, metrics), which left it 9-13x
             slower than "graph" on an H200. Compiling costs seconds (cuda) to minutes (this
             project's 2-core CPU) and won nothing certain on the CPU (docs/benchmarks.md), so
             "auto" does not pick it.

Why a graph: on a GPU a small-network update is bound by its ~100 kernel launches and by host
synchronisation, not by arithmetic (an eager update runs as fast at 4,096 rows as at 256; the
graph's figures are in docs/benchmarks.md, "The GPU"). Capturing the update needs what a graph can
replay:
  - no host synchronisation inside it: the metrics are a device vector the graph writes into
    `latest` and adds into `total`, read back when the learner asks (once per train() call, or
    fewer: `Updates.read`), never per update;
  - static inputs: the learner's random draws for the update (replay indices, SAC's noise) are made
    eagerly with its generator, the same stream as eager's, and copied into the graph's buffers;
    the replay storage is read inside the graph, so a reallocated storage (its `storage_version`)
    selects a new graph;
  - per-update scalars as device tensors: a learning rate that changes lives in the optimizer as a
    tensor (`optim.set_lr` fills it); Adam is fused (its step count on the device, capturable);
  - python choices (DQN's target-update turn) pick one of a few graphs (`key`).
On cuda the update's float32 matrix products use TensorFloat-32 tensor cores (the learner's `tf32`,
default true): the eager, warm-up, capture and compile runs switch cuBLAS to TF32 around the step
and back after it (a replay runs the kernels chosen at capture), so acting passes and other
learners keep their own precision. Why: the products are a large part of what grows with the
batch (TF32 against full float32: docs/benchmarks.md, "The GPU").
The first WARMUP updates of each graph run eagerly on a side stream (Adam's state and cuBLAS's
workspaces exist before capture, as CUDA graphs need); capture records without executing, so the
replay right after it is the update itself. Graph and eager compute the same function with the
same draws: results agree to float rounding (tests/trainer/test_update_paths.py).
"""
import contextlib
import logging
import time
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

log = logging.getLogger("simbridge.trainer")

PATHS = ("auto", "eager", "graph", "compile")
WARMUP = 3   # eager updates on a side stream before a graph is captured (PyTorch's whole-network recipe)

Inputs = Dict[str, torch.Tensor]


def check(setting: str) -> None:
    """A ValueError unless `setting` is an `update_path` value."""
    if setting not in PATHS:
        raise ValueError(f"update_path = {setting!r}: use one of {list(PATHS)} (\"auto\": a CUDA graph on cuda, "
                         f"eager on the CPU)")


def resolve(setting: str, device: torch.device) -> Tuple[str, str]:
    """(path, why) for the `update_path` setting on this device."""
    check(setting)
    if setting == "auto":
        if device.type == "cuda":
            return "graph", "auto on cuda"
        return "eager", f"auto on {device.type}: CUDA graphs need cuda, and torch.compile lost to eager on the CPU"
    if setting == "graph" and device.type != "cuda":
        return "eager", f"update_path \"graph\" needs a cuda device, the learner is on {device.type}"
    if setting == "compile" and not hasattr(torch, "compile"):
        return "eager", "this torch has no torch.compile"
    return setting, "as configured"


class _Precision:
    """cuBLAS's float32 matmul precision for the block: "tf32" or "ieee" (full float32), restored
    after it. torch >= 2.9 refuses a mix of its new API (fp32_precision) and the legacy flag
    (allow_tf32) in one process: the new one where it exists."""

    def __init__(self, tf32: bool):
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            self.flag, self.value = "fp32_precision", "tf32" if tf32 else "ieee"
        else:   # older torch
            self.flag, self.value = "allow_tf32", tf32
        self.saved = None

    def __enter__(self):
        self.saved = getattr(torch.backends.cuda.matmul, self.flag)
        setattr(torch.backends.cuda.matmul, self.flag, self.value)
        return self

    def __exit__(self, *exc):
        setattr(torch.backends.cuda.matmul, self.flag, self.saved)
        return False


class Updates:
    """Runs one learner's update step on its path and keeps the step's metrics on the device.

    step(inputs) -> a 1-d float tensor of len(names) metrics; it may read the learner's networks,
    optimizers and replay storage, and must not synchronise with the host. `run(inputs, key)`
    performs one update; `read()` returns the latest update's metrics as floats (one host sync),
    `mean()` their average since `clear()`."""

    def __init__(self, owner: str, step: Callable[[Inputs], torch.Tensor], names: Sequence[str], path: str,
                 reason: str, device: torch.device, optimizers: Sequence = (),
                 compiler: Optional[Callable] = None, quiet: bool = False, tf32: bool = True):
        """compiler: what the compile path wraps the step with (default torch.compile; tests pass
        their own); quiet: no start-up line (a learner that only acts); tf32: on cuda, the step's
        float32 matrix products on TensorFloat-32 tensor cores (False: full float32)."""
        self.owner, self.step, self.names = owner, step, tuple(names)
        self.device = device
        self.optimizers = list(optimizers)
        self.path, self.reason = path, reason
        self._compiler = compiler
        self.latest = torch.zeros(len(self.names), device=device)
        self.total = torch.zeros(len(self.names), device=device)
        self.count = 0            # updates summed into total since clear()
        self.ran = 0              # updates run
        self._graphs: Dict[Hashable, list] = {}   # key -> [eager runs so far, graph, static inputs]
        self._compiled = None
        self._uncaptured: Optional[str] = None   # why a compiled step on cuda runs without a graph
        self._side: Optional[torch.cuda.Stream] = None
        # cuBLAS's precision around the steps that choose kernels; nothing to switch off cuda
        self._precision = _Precision(tf32) if device.type == "cuda" else contextlib.nullcontext()
        self.tf32 = tf32 and device.type == "cuda"
        if not quiet:
            log.info("%s: updates run %s (%s)", owner, self.describe(), reason)

    def describe(self) -> str:
        how = {"graph": "as one CUDA graph", "compile": "through torch.compile", "eager": "eagerly"}[self.path]
        if self.path == "compile" and self._captures():
            how += ", captured as one CUDA graph"
        return how + (", float32 products on TF32 tensor cores" if self.tf32 else "")

    # ---------------------------------------------------------------- running

    def _body(self, inputs: Inputs) -> None:
        m = self.step(inputs)
        self.latest.copy_(m)
        self.total.add_(m)

    def _captures(self) -> bool:
        """Whether updates are replayed from CUDA graphs: "graph", and "compile" on cuda."""
        return self.path == "graph" or (self.path == "compile" and self.device.type == "cuda"
                                        and self._uncaptured is None)

    def run(self, inputs: Inputs, key: Hashable = ()) -> None:
        if self._captures():
            self._run_graph(inputs, key)
        else:
            with self._precision:
                self._run_once(inputs)
        self.count += 1
        self.ran += 1

    def _run_once(self, inputs: Inputs) -> None:
        """One update outside a graph: the compiled step on the compile path (eager from now on if
        it fails), else the eager step."""
        if self.path == "compile":
            self._run_compiled(inputs)
        else:
            self._body(inputs)

    def _fall_back(self, why: str) -> None:
        log.warning("%s: updates run eagerly from now on (%s)", self.owner, why)
        if self.path == "compile":
            # gradients a compiled step made may live in its CUDA graphs' memory, which eager
            # must not read: the next backward makes them anew
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
        self.path, self.reason = "eager", why
        self._graphs.clear()
        self._compiled = None

    def _compiled_body(self) -> Callable[[Inputs], None]:
        if self._compiled is None:
            _allow_recompiles()
            # inductor's kernels only: on cuda this class captures the compiled step itself
            compiler = self._compiler or (lambda fn: torch.compile(fn, mode="default", dynamic=False))
            self._compiled = compiler(self._body)
        return self._compiled

    def _run_compiled(self, inputs: Inputs) -> None:
        first = self._compiled is None
        if first:   # the learner's pause, said before it (the simulators may wait for it meanwhile)
            log.info("%s: torch.compile is building the update; updates wait for it (seconds on a GPU, up to a "
                     "minute on a small CPU)", self.owner)
        started = time.perf_counter()
        try:
            self._compiled_body()(inputs)
        except Exception as e:   # noqa: BLE001 - an op inductor cannot build: eager still can
            self._fall_back(f"torch.compile failed: {type(e).__name__}: {str(e)[:200]}")
            self._body(inputs)
            return
        if first:
            log.info("%s: torch.compile built the update in %.1f s", self.owner, time.perf_counter() - started)

    def _hooked(self) -> Optional[str]:
        for opt in self.optimizers:
            # a step replaced on the instance (a data-parallel group's gradient exchange) or torch.optim's hooks
            if "step" in vars(opt) or getattr(opt, "_optimizer_step_pre_hooks", None) \
                    or getattr(opt, "_optimizer_step_post_hooks", None):
                return "a wrapped optimizer step (a data-parallel group's gradient exchange) cannot be captured"
        return None

    def _run_graph(self, inputs: Inputs, key: Hashable) -> None:
        full_key = (key, tuple((k, tuple(v.shape), v.dtype) for k, v in inputs.items()))
        entry = self._graphs.get(full_key)
        if entry is None:
            why = self._hooked()
            if why is not None:
                if self.path == "compile":   # the compiled step still runs, its kernels launched one by one
                    log.warning("%s: compiled updates run without a CUDA graph (%s)", self.owner, why)
                    self._uncaptured = why
                else:
                    self._fall_back(why)
                with self._precision:
                    self._run_once(inputs)
                return
            entry = self._graphs[full_key] = [0, None, None]
        if entry[1] is not None:
            for k, v in entry[2].items():
                v.copy_(inputs[k])
            entry[1].replay()
            return
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with self._precision:
            self._warm_or_capture(entry, inputs)

    def _warm_or_capture(self, entry: list, inputs: Inputs) -> None:
        if entry[0] < WARMUP:
            # on the compile path the first warm-up compiles (outside any capture)
            with torch.cuda.stream(self._side):
                self._run_once(inputs)
            torch.cuda.current_stream(self.device).wait_stream(self._side)
            entry[0] += 1
            return
        static = {k: v.clone() for k, v in inputs.items()}
        step = self._compiled_body() if self.path == "compile" else self._body
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the bridge's threads may run acting passes on this GPU meanwhile
            with torch.cuda.graph(graph, stream=self._side, capture_error_mode="thread_local"):
                step(static)
        except Exception as e:   # noqa: BLE001 - an op that cannot be captured: eager still runs it
            torch.cuda.synchronize(self.device)
            self._fall_back(f"CUDA graph capture failed: {type(e).__name__}: {str(e)[:200]}")
            self._body(inputs)
            return
        entry[1], entry[2] = graph, static
        graph.replay()   # capture recorded the update without running it

    def reset(self) -> None:
        """Forgets the captured graphs (the optimizers' state or the replay storage was replaced):
        the next updates warm up and capture again."""
        self._graphs.clear()

    # ---------------------------------------------------------------- metrics

    def read(self) -> Dict[str, float]:
        """The latest update's metrics (one host read-back)."""
        return dict(zip(self.names, self.latest.tolist()))

    def mean(self) -> Dict[str, float]:
        """The metrics averaged over the updates since clear() (one host read-back)."""
        if self.count == 0:
            return {}
        return {n: v / self.count for n, v in zip(self.names, self.total.tolist())}

    def clear(self) -> None:
        self.total.zero_()
        self.count = 0


def _allow_recompiles(limit: int = 64) -> None:
    """dynamo keeps at most `recompile_limit` (8) compiled versions of one code object, and every
    learner in a process compiles `Updates._body` and its step's pieces anew (their guards name the
    learner's own tensors), about two versions each (the first update has no gradients and no
    optimizer state yet). Past the limit dynamo runs a piece eagerly without a word: instead the
    limit is raised, and a piece that still reaches it raises, which the compile path reports as
    a fall-back to eager."""
    import torch._dynamo.config as dynamo_config   # only here: a learner that never compiles never imports dynamo
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"   # torch < 2.6
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))
    if hasattr(dynamo_config, "fail_on_recompile_limit_hit"):
        dynamo_config.fail_on_recompile_limit_hit = True


def stack(values: List[torch.Tensor]) -> torch.Tensor:
    """Scalar tensors -> the float32 metrics vector a step returns."""
    return torch.stack([v.detach().float().reshape(()) for v in values])
