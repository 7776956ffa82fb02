"""A rank of a data-parallel group: who it is (torchrun's variables), the config it runs, joining the
process group, and the error when the group is lost. What the ranks then share is
trainer/distributed/group.py's exchange; the rank's loop is trainer/distributed/loop.py (docs/scaling.md).
"""
import datetime
import os
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.distributed as dist

from simbridge.trainer.config.trainer_config import ConfigError, TrainerConfig
from simbridge.wire.addresses import SHM, UNIX, grpc_address, is_shm, is_unix, unix_path


def timeout_s() -> float:
    """How long a collective waits for a rank before the group gives up (SIMBRIDGE_DIST_TIMEOUT_S)."""
    return float(os.environ.get("SIMBRIDGE_DIST_TIMEOUT_S", "60"))


@dataclass
class RankInfo:
    rank: int
    world: int
    local_rank: int

    @property
    def writes(self) -> bool:
        return self.rank == 0


def rank_from_env(env=os.environ) -> Optional[RankInfo]:
    """The rank torchrun (or a launcher setting the same variables) gave this process; None
    without WORLD_SIZE and RANK (a single-process run)."""
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return None
    try:
        info = RankInfo(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")))
    except ValueError:
        raise ConfigError(f"RANK={env.get('RANK')!r}, WORLD_SIZE={env.get('WORLD_SIZE')!r}, LOCAL_RANK="
                          f"{env.get('LOCAL_RANK')!r}: integers expected (as torchrun sets them)") from None
    if not 0 <= info.rank < info.world:
        raise ConfigError(f"RANK={info.rank} is outside WORLD_SIZE={info.world}")
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if key not in env:
            raise ConfigError(f"{key} is not set: start the ranks with torchrun (docs/scaling.md), or set "
                              f"MASTER_ADDR and MASTER_PORT to rank 0's host and a free port")
    return info


def rank_address(address: str, local_rank: int) -> str:
    """This rank's bridge address: the configured port plus LOCAL_RANK (several ranks on one host);
    for a Unix socket (unix:PATH or shm+unix:PATH), LOCAL_RANK k > 0 serves at PATH.k beside PATH."""
    if is_unix(address) or is_shm(address):
        scheme = SHM if is_shm(address) else UNIX
        return address if local_rank == 0 else f"{scheme}{unix_path(grpc_address(address))}.{local_rank}"
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"[server] address {address!r}: HOST:PORT, unix:PATH or shm+unix:PATH expected")
    return address if int(port) == 0 else f"{host}:{int(port) + local_rank}"


def prepare_config(cfg: TrainerConfig, info: RankInfo) -> List[str]:
    """The config as a rank runs it (its address, seed, no learner process, no journal); lines
    saying what was changed. ([dataset] works as in a single trainer, per rank: the daemon gives each
    rank its own dataset ids and its share of a warm start's episodes.)"""
    notes = []
    cfg.server.address = rank_address(cfg.server.address, info.local_rank)
    if cfg.run.device in ("auto", "cuda") and torch.cuda.is_available():   # one GPU per rank of a host
        cfg.run.device = f"cuda:{info.local_rank % torch.cuda.device_count()}"
        notes.append(f"device {cfg.run.device}")
    if cfg.run.seed is not None:   # each rank explores differently; rank 0's weights are broadcast
        cfg.run.seed += 1000 * info.rank
    if cfg.run.learner_process:
        cfg.run.learner_process = False
        notes.append("learner_process off: the group's updates run in each rank's loop")
    if cfg.run.journal:
        cfg.run.journal = False
        notes.append("journal off: a resume restarts the group from rank 0's checkpoint")
    return notes


def init_group(info: RankInfo, device: torch.device) -> str:
    """Joins the process group (env:// rendezvous at MASTER_ADDR:MASTER_PORT); the backend's name."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s())
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"
    # torchrun's agent may keep its store across restarts: the keys of an earlier attempt's group (its
    # ranks' addresses) would be read by this one. Each attempt's keys get a prefix of their own.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world,
                          is_master=info.rank == 0 and not agent_store, timeout=timeout,
                          multi_tenant=not agent_store)
    dist.init_process_group(backend, store=dist.PrefixStore(f"simbridge/attempt{restart}/", store),
                            rank=info.rank, world_size=info.world, timeout=timeout)
    return backend


class GroupLost(RuntimeError):
    """A collective failed: a rank died or stopped answering."""


def lost(e: BaseException, rank: int) -> GroupLost:
    return GroupLost(f"rank {rank} lost the process group ({_first_line(e)}): "
                     f"another rank died or hung; every rank stops. Restart the whole group with --resume "
                     f"(rank 0's checkpoint)")


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
