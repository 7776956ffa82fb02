"""Where a learner acts, and who else uses its GPU.

Acting (the forward passes the bridge asks for, `Learner.compute_actions`) runs on a copy of the
acting network; `[run] acting_device` (trainer/config/sections.py) says where that copy lives:
  "cpu"      always on the CPU
  "learner"  on the learner's device (a GPU when it trains on one)
  "auto"     the learner's device when that is the CPU; on a GPU, the CPU for a small network on
             flat observations (at most ACTING_CPU_MAX_PARAMS parameters and ACTING_CPU_MAX_OBS
             observation values), the GPU for a larger network or image observations.
Why the CPU for small networks: a simulator's call carries a few to a few hundred rows, and a
small MLP's forward pass on them costs microseconds on one core (bench/learner_speed.py's
"acting" figures), while on a GPU each call pays the copies in and out and a synchronisation, and
the acting copy's own CUDA context shares the GPU with the learner's (two contexts held an H200 at
33-50% while DQN CartPole ran 2.3x slower than with the GPU hidden: docs/benchmarks.md). A large
network's arithmetic is what a GPU is for.
"""
import logging
import os
import shutil
import subprocess
import threading
from typing import List, Optional, Tuple

import torch

log = logging.getLogger("simbridge.trainer")
_thread_state = threading.local()   # pin_torch_threads: per thread


def pick_device(name: Optional[str] = None) -> torch.device:
    """The device `name` names ("auto": cuda when torch sees one, else the CPU). A device this
    process cannot use is a ValueError that says why, at once: a learner built there failed later,
    in its learner process, with torch's own words, once the first simulator had connected."""
    if not name or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device = {name!r}: torch sees no CUDA device ({_why_no_cuda()}): use \"auto\" (the "
                             f"GPU when there is one) or \"cpu\"")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"device = {name!r}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device = {name!r}: torch sees no MPS device (Apple silicon's GPU): use \"auto\" or \"cpu\"")
    return device


def _why_no_cuda() -> str:
    if torch.version.cuda is None:
        return f"this torch, {torch.__version__}, is built without CUDA"
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return "CUDA_VISIBLE_DEVICES hides every GPU"
    return "no GPU, or no driver for it: nvidia-smi lists what the driver sees"


def pin_torch_threads() -> None:
    """Makes this thread use torch's configured intra-op thread count. torch.set_num_threads sets
    MKL's count for the calling thread only: a gRPC thread that runs a forward pass would
    otherwise use one OpenMP thread per core, whose spin-waiting took most of a core per
    simulator step (daemon CPU per step 7.7 ms against 2.3 ms with this, docs/benchmarks.md)."""
    if not getattr(_thread_state, "pinned", False):
        torch.set_num_threads(torch.get_num_threads())
        _thread_state.pinned = True


ACTING_DEVICES = ("auto", "cpu", "learner")
# The CPU acting copy's limits under "auto": a [256, 256] MLP has ~70k parameters, CartPole's DQN
# [128, 128] ~17k; an 84x84 image is 7,056 values per frame.
ACTING_CPU_MAX_PARAMS = 250_000
ACTING_CPU_MAX_OBS = 4_096


def acting_device(setting: Optional[str], learner_device: torch.device, acting: torch.nn.Module,
                  obs_dim: int) -> Tuple[torch.device, str]:
    """(the acting copy's device, why) for `[run] acting_device`."""
    setting = setting or "auto"
    if setting not in ACTING_DEVICES:
        raise ValueError(f"acting_device = {setting!r}: use one of {list(ACTING_DEVICES)} (\"auto\": the CPU for "
                         f"small networks on flat observations, the learner's device otherwise)")
    if setting == "cpu" or learner_device.type == "cpu":
        return torch.device("cpu"), "the CPU" if setting == "cpu" else "the learner's device"
    if setting == "learner":
        return learner_device, "as configured"
    params = sum(p.numel() for p in acting.parameters())
    if params <= ACTING_CPU_MAX_PARAMS and obs_dim <= ACTING_CPU_MAX_OBS:
        return torch.device("cpu"), (f"auto: a small network ({params:,} parameters, {obs_dim} observation values) "
                                     f"acts faster on the CPU")
    return learner_device, f"auto: {params:,} parameters, {obs_dim} observation values"


def gpu_neighbours(device: torch.device) -> List[Tuple[int, int]]:
    """(pid, MiB) of the other processes holding memory on this CUDA device, from nvidia-smi;
    [] when there is none, no nvidia-smi, or the device is not cuda."""
    if device.type != "cuda" or not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        return []
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError, RuntimeError, AttributeError):
        return []
    found = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        if uuid.replace("GPU-", "") not in parts[0] or int(parts[1]) == os.getpid():
            continue
        found.append((int(parts[1]), int(parts[2]) if parts[2].isdigit() else 0))
    return found


_said: set = set()


def say_gpu_neighbours(device: torch.device, who: str) -> None:
    """Logs, once per process and device, the other processes that use the learner's GPU: they
    take its time and memory (the daemon's own acting copy among them, with acting_device
    "learner" beside a learner process)."""
    key = str(device)
    if key in _said:
        return
    _said.add(key)
    others = gpu_neighbours(device)
    if not others:
        return
    parent = os.getppid()
    names = ", ".join(f"pid {pid}{' (this trainer)' if pid == parent else ''} {mib} MiB" for pid, mib in others)
    log.warning("%s trains on %s, which %d other process(es) also use: %s; they share its time and memory",
                who, device, len(others), names)
