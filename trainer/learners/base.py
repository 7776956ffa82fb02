"""Learner: a Policy the bridge serves actions from, that also learns off-policy.

The bridge's gRPC threads call `compute_actions` (batched by the dynamic
batcher) while the daemon's learner thread calls `add` and `train`. Acting uses
its own copy of the networks, refreshed after each train() call under a lock,
so a forward pass never sees half-updated weights; `version` counts the
gradient updates in the weights that act.

Updates run on the path `update_path` picks (trainer/learners/capture.py: eager, one CUDA graph
per update, or torch.compile), with their metrics kept on the device and read back once per
train() call. A learner implements `update_step(inputs)` (the update as tensor ops, no host sync)
and lists its metrics in METRICS; `update(batch)` is the same step, eager, for callers that bring
their own batch (a data-parallel group). A learner without METRICS implements `update(batch)`
alone and trains eagerly through it.

Where the acting copy lives: `acting_device` (trainer/learners/placement.py).

Replay ratio: `train()` performs the updates that are due, `updates_per_step`
per agent step added once `learning_starts` steps were seen. The daemon calls
it before taking more experience, so a slow learner slows the simulators
(the bridge's queue fills and blocks) instead of falling behind.
"""
import copy
import threading
from typing import Any, Callable, Dict, Hashable, Literal, Optional, Tuple, TypeVar, Union

import gymnasium as gym
import numpy as np
import torch

from simbridge.server.policies import ActionBatch, Policy
from simbridge.server.sample_batch import SampleBatch
from simbridge.trainer.learners import capture, export, optim, placement, splitk
from simbridge.trainer.learners import encoders, frame_replay, nstep
from simbridge.trainer.learners.nstep import NStepAccumulator
from simbridge.wire.columns import ACTIONS, NEW_OBS, OBS
from simbridge.wire.preprocess import flat_dim
from simbridge.wire.v1 import simbridge_pb2 as pb

Read = TypeVar("Read")

COMMON_DEFAULTS = {
    "gamma": 0.99,
    "n_step": 1,
    "buffer_size": 100_000,
    "batch_size": 256,
    "learning_starts": 1_000,
    "updates_per_step": 1.0,   # gradient updates per agent step (replay ratio)
    "hidden": [256, 256],
    "seed": None,
    "vis_encode_type": "auto",  # image observations' encoder: trainer/learners/encoders.py
    "update_path": "auto",     # "auto" | "eager" | "graph" | "compile": trainer/learners/capture.py
    "tf32": True,              # on cuda, the updates' float32 products on TF32 tensor cores (capture.py)
    "grad_row_chunks": "auto",  # weight gradients of batches >= 1,024 rows summed in chunks (splitk.py)
    "replay_store": "auto",    # "auto" | "rows" | "frames": a camera's frames kept once (frame_replay.py)
    "frame_stack": 1,          # frames an observation stacks: the trainer sets the policy's frame_stack
}


def trains(policy: Policy) -> bool:
    """Whether the daemon feeds `policy` experience and runs its updates."""
    return bool(getattr(policy, "trainable", False)) and hasattr(policy, "train")


class Learner(Policy):
    DEFAULTS: Dict[str, Any] = {}
    ON_POLICY = False   # True: trains in iterations over its own rows, no replay ratio (PPO)
    # The type of each config key whose default (None) does not say it; the others take their
    # default's type (the trainer config checks `policies.<id>.config` against these at start-up).
    CONFIG_TYPES: Dict[str, Any] = {"seed": int, "vis_encode_type": encoders.VIS_ENCODE_TYPE,
                                    "grad_row_chunks": Union[Literal["auto"], int],
                                    "replay_store": Literal[frame_replay.STORES]}

    @classmethod
    def config_defaults(cls) -> Dict[str, Any]:
        return {**COMMON_DEFAULTS, **cls.DEFAULTS}

    @classmethod
    def check_config(cls, cfg: Dict[str, Any]) -> None:
        """A ValueError for a value the learner cannot train with that no space decides (its keys
        and types are checked already). Run as the trainer's config loads, before a port binds or
        a file is written, and again when a learner is made; subclasses add their own."""
        splitk.check(cfg["grad_row_chunks"], cls.__name__)
        capture.check(cfg["update_path"])
        nstep.check(cfg["n_step"])
        frame_replay.check(cfg["replay_store"])
        if cfg["frame_stack"] < 1:
            raise ValueError(f"frame_stack = {cfg['frame_stack']}: frames an observation stacks, 1 or more")

    @classmethod
    def config_types(cls) -> Dict[str, Any]:
        types: Dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            types.update(getattr(klass, "CONFIG_TYPES", {}))
        return types
    # For memory_estimate: MLPs of shape [obs + act, *hidden, act + 1] the learner trains, and the
    # copies of their parameters it keeps (weights, target, acting copy, gradients, Adam's two moments).
    NETWORKS = 1
    PARAM_COPIES = 6

    @classmethod
    def memory_estimate(cls, observation_space: gym.Space, action_space: gym.Space,
                        config: Optional[dict] = None) -> Dict[str, int]:
        """Bytes the learner would take for these spaces, before building it: {"replay": the
        buffer at capacity, "transition": one transition of it, "networks": parameters and their
        copies}. An estimate (an observation's row twice per transition, or a camera's frames as
        frame_replay.py first makes its store), to refuse a space the memory cannot hold instead of
        failing to allocate it mid-run."""
        cfg = {**COMMON_DEFAULTS, **cls.DEFAULTS, **(config or {})}
        obs, act = encoders.feature_count(observation_space, cfg), flat_dim(action_space)
        kept = {**cfg, "replay_store": "rows"} if cls.ON_POLICY else cfg   # PPO's rollouts are rows
        transition = frame_replay.obs_bytes(observation_space, kept) + 4 * act + 64   # + the action, its scalars
        sizes = [obs + act, *cfg["hidden"], act + 1]
        params = sum((a + 1) * b for a, b in zip(sizes, sizes[1:])) + encoders.encoder_params(observation_space, cfg)
        return {"replay": int(cfg["buffer_size"]) * transition, "transition": transition,
                "networks": cls.NETWORKS * cls.PARAM_COPIES * 4 * params}

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: Optional[dict] = None, device: Optional[str] = None, trainable: bool = True,
                 acting_device: Optional[str] = None, acting_only: bool = False):
        """device: where it trains ("auto": cuda when there is one); acting_device: where its acting
        copy lives ("auto", "cpu", "learner": trainer/learners/placement.py; None: "auto").
        acting_only: this object never updates (a frozen policy, or one a learner process trains):
        its optimizers are optim.HeldOptimizer, which keep the state a checkpoint gives them."""
        super().__init__(observation_space, action_space)
        cfg = {**COMMON_DEFAULTS, **self.DEFAULTS}
        unknown = set(config or {}) - set(cfg)
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown config keys {sorted(unknown)}; "
                             f"known: {sorted(cfg)}")
        cfg.update(config or {})
        self.check_config(cfg)
        self.config = cfg
        self.device = placement.pick_device(device)
        # Where a learner process trains it (trainer/run/learner_process.py): its device, unless the
        # daemon built this copy on the CPU only to act (trainer/run/factory.py)
        self.trains_on = self.device
        self.trainable = trainable
        self.acting_only = acting_only
        self.update_path, self._path_reason = capture.resolve(cfg["update_path"], self.device)
        self.generator = torch.Generator(device=self.device)
        self.rng = np.random.default_rng(cfg["seed"])
        if cfg["seed"] is not None:
            torch.manual_seed(cfg["seed"])
            self.generator.manual_seed(cfg["seed"])
        self.replay = self.new_replay()
        self._replay_version = 0   # the replay storage the captured updates read
        self.nstep = NStepAccumulator(cfg["n_step"], cfg["gamma"])
        self.agent_steps = 0          # transitions added
        self.updates = 0              # gradient updates done
        self.updates_forgiven = 0     # due updates skipped (resumed without a replay buffer)
        self._act_lock = threading.Lock()
        self._exports = export.PortableCache()
        self.build()
        for m in list(vars(self).values()):
            if isinstance(m, torch.nn.Module):
                splitk.set_chunks(m, cfg["grad_row_chunks"], self.device.type)
        if trainable:
            encoders.say_cost(type(self), observation_space, action_space, cfg, frame_replay.says(self.replay))
        self.acting_device, self.acting_reason = placement.acting_device(
            acting_device, self.device, self.modules_for_acting(), flat_dim(observation_space))
        self.acting = copy.deepcopy(self.modules_for_acting()).to(self.acting_device)
        # acting draws its noise from its own generator, on the acting copy's device: it runs on the
        # bridge's threads, apart from the updates' draws
        self.act_generator = torch.Generator(device=self.acting_device)
        if cfg["seed"] is not None:
            self.act_generator.manual_seed(cfg["seed"] + 1)
        self.last_metrics: Dict[str, float] = {}
        self._metrics_read_at: Optional[int] = None   # self.updates when the metrics were last read back
        self._updater: Optional[capture.Updates] = None
        if trainable:
            placement.say_gpu_neighbours(self.device, type(self).__name__)
        # A LearnerProcess (trainer/run/learner_process.py) when another process trains this learner:
        # this object then only acts, and its state is that process's.
        self.trained_by = None

    # ------------------------------------------------------------ to implement

    def build(self) -> None:
        """Create networks and optimizers."""
        raise NotImplementedError

    def modules_for_acting(self) -> torch.nn.Module:
        """The module(s) compute_actions needs; copied for acting."""
        raise NotImplementedError

    def act(self, module: torch.nn.Module, obs: torch.Tensor, explore: bool):
        """Actions (np, env space) and logp (np or None) for flat obs, with the acting copy."""
        raise NotImplementedError

    # The names of update_step's metrics vector, in order; () for a learner that implements
    # update() alone (it then trains eagerly, one update() per step).
    METRICS: Tuple[str, ...] = ()

    def update_step(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        """One gradient update as tensor ops with no host synchronisation (capture.py captures it):
        `inputs` holds a replay sample's columns, or "idx" (rows of the replay to gather, inside the
        step), plus the learner's own random draws (draw_inputs); returns the METRICS vector
        (capture.stack). Python values it reads are set by prepare_update."""
        raise NotImplementedError

    def draw_inputs(self, batch_size: int) -> Dict[str, torch.Tensor]:
        """The random draws of one update from self.generator, eagerly (the same stream on every
        path): the replay rows, and whatever else update_step draws (SAC: its noise)."""
        return {"idx": self.replay.draw(batch_size, self.generator), **self.extra_draws(batch_size)}

    def extra_draws(self, batch_size: int) -> Dict[str, torch.Tensor]:
        return {}

    def prepare_update(self) -> Hashable:
        """Sets what changes between updates outside the captured step (learning rates as tensors,
        schedules); returns a key for the python choices the step makes (a graph per key)."""
        return ()

    def host_metrics(self) -> Dict[str, float]:
        """Metrics known on the host (schedules), reported beside the step's."""
        return {}

    def rows(self, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The batch an update_step trains on: the replay rows at inputs["idx"], or the columns given."""
        return self.replay.gather(inputs["idx"]) if "idx" in inputs else inputs

    @property
    def updater(self) -> Optional[capture.Updates]:
        """What runs update_step on the update path (None without METRICS); made, and its path
        logged, when first needed: a learner whose updates run in a learner process says nothing."""
        if self._updater is None and self.METRICS:
            self._updater = capture.Updates(type(self).__name__, self.update_step, self.METRICS, self.update_path,
                                            self._path_reason, self.device, self.optimizers(),
                                            tf32=self.config["tf32"])
        return self._updater

    def optimizers(self) -> list:
        return [obj for name, obj in vars(self).items() if isinstance(obj, optim.STEPPING)]

    def _refuse_acting_only(self) -> None:
        if self.acting_only:
            raise RuntimeError(f"this {type(self).__name__} was built acting_only (frozen, or trained by a "
                               f"learner process): it has no optimizer to update with")

    def adam(self, params, lr: float, **kw):
        """build()'s Adam: as the update path needs it (optim.adam), or held (acting_only)."""
        if self.acting_only:
            return optim.HeldOptimizer()
        return optim.adam(params, lr, self.update_path, self.device, **kw)

    def update(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        """One eager gradient update from a replay sample; returns scalar metrics (a host read-back:
        train() runs the same step without one per update)."""
        self._refuse_acting_only()
        self.prepare_update()
        m = self.update_step({**batch, **self.extra_draws(len(next(iter(batch.values()))))})
        return {**dict(zip(self.METRICS, m.tolist())), **self.host_metrics()}

    def store_actions(self, actions: np.ndarray) -> np.ndarray:
        """Actions as the replay keeps them (e.g. scaled to [-1, 1]); identity by default."""
        return actions

    def export_layers(self, acting: torch.nn.Module) -> export.Exported:
        """The acting copy as dense layers and an action head (built with trainer/learners/export.py's
        blocks), called while the acting copy cannot change; None: no portable form (default)."""
        return None

    # ------------------------------------------------------------ serving

    def obs_tensor(self, obs_batch: Any) -> torch.Tensor:
        # The bridge's observations are read-only views of the request: torch gets a copy.
        return torch.tensor(encoders.obs_rows(self.observation_space, obs_batch), device=self.acting_device)

    def compute_actions(self, obs_batch: Any, explore: bool = True) -> ActionBatch:
        placement.pin_torch_threads()
        obs = self.obs_tensor(obs_batch)
        with self._act_lock, torch.no_grad():
            actions, logp = self.act(self.acting, obs, explore)
        return ActionBatch(actions, logp)

    def acting_snapshot(self, read: Callable[[torch.nn.Module], Read]) -> Tuple[int, Read]:
        """(version, read(acting copy)) as one consistent snapshot: no train() swaps the weights
        in between. `read` runs under the acting lock, which compute_actions waits on: keep it short."""
        with self._act_lock:
            return self.version, read(self.acting)

    def portable(self, include_onnx: bool = False) -> Optional[pb.PortablePolicy]:
        """The acting networks as a PortablePolicy for clients that act locally (shared, cached per
        version: copy before changing); None when this learner has no portable form."""
        return self._exports.get(self.version, self._export_snapshot, include_onnx)

    def _export_snapshot(self) -> Optional[pb.PortablePolicy]:
        version, (exported, encoder) = self.acting_snapshot(
            lambda acting: (self.export_layers(acting), export.encoder_of(acting)))
        if exported is None:
            return None
        layers, head = exported
        return export.message(version, self.observation_space, self.action_space, layers, head, encoder)

    # ------------------------------------------------------------ learning

    def new_replay(self):
        """An empty replay buffer: a camera's frames kept once (frame_replay.py), else rows."""
        return frame_replay.make(self.observation_space, self.config, self.device)

    def count_rows(self, batch: SampleBatch) -> None:
        """Counts a learner keeps of the rows added (none by default). Called for every batch
        added, here and on a learner process's parent side, whose acting copy may depend on them."""

    def add(self, batch: SampleBatch) -> None:
        if not self.trainable or batch.count == 0:
            return
        self.count_rows(batch)
        cols = self.nstep.add(batch)
        if cols:
            cols[OBS] = encoders.obs_rows(self.observation_space, cols[OBS])
            cols[NEW_OBS] = encoders.obs_rows(self.observation_space, cols[NEW_OBS])
            cols[ACTIONS] = self.store_actions(np.asarray(cols[ACTIONS]))
            self.replay.add(cols)
        self.agent_steps += batch.count

    def _update_target(self) -> int:
        return int((self.agent_steps - self.config["learning_starts"]) * self.config["updates_per_step"])

    def learning_rate(self) -> float:
        """lr, decayed linearly to lr_final over lr_timesteps agent steps (lr_final None: constant);
        for learners whose config has these keys."""
        cfg = self.config
        if cfg["lr_final"] is None:
            return cfg["lr"]
        frac = min(1.0, self.agent_steps / max(1, cfg["lr_timesteps"]))
        return cfg["lr"] + frac * (cfg["lr_final"] - cfg["lr"])

    def updates_made_due(self, rows_from: int, rows_to: int) -> float:
        """Updates the agent steps from `rows_from` to `rows_to` make due at the replay ratio: none
        before learning_starts (the rate limiter of trainer/run/learner_process.py counts rows in
        flight with it; counting those too held the simulators for seconds at a run's start)."""
        start = self.config["learning_starts"]
        return self.config["updates_per_step"] * (max(0, rows_to - start) - max(0, rows_from - start))

    def waiting_rows(self) -> int:
        """Rows the next updates can draw on: the replay buffer's (PPO: those its next iteration takes)."""
        return len(self.replay)

    def updates_due(self) -> int:
        if (not self.trainable or self.agent_steps < self.config["learning_starts"]
                or len(self.replay) < self.config["batch_size"]):
            return 0
        return max(0, self._update_target() - self.updates - self.updates_forgiven)

    def train(self, max_updates: Optional[int] = None) -> Dict[str, float]:
        due = self.updates_due()
        if max_updates is not None:
            due = min(due, max_updates)
        if due == 0:
            return {}
        self._refuse_acting_only()
        if not self.METRICS:
            metrics: Dict[str, float] = {}
            for _ in range(due):
                metrics = self.update(self.replay.sample(self.config["batch_size"], self.generator))
                self.updates += 1
            self.sync_acting()
            self.last_metrics = metrics
            return metrics
        self.run_update_steps(due)
        self.sync_acting()
        read_at = self._metrics_read_at
        if read_at is None or self.updates - read_at >= self.config.get("metrics_every", 1):
            self.last_metrics = {**self.updater.read(), **self.host_metrics(), **frame_replay.metrics(self.replay)}
            self._metrics_read_at = self.updates
        return self.last_metrics

    def run_update_steps(self, n: int) -> None:
        """n updates from the replay on the update path: no host sync, no hand-over to acting."""
        batch_size = self.config["batch_size"]
        if self.replay.storage_version != self._replay_version:   # graphs of replaced storage: dropped
            if self._updater is not None:
                self._updater.reset()
            self._replay_version = self.replay.storage_version
        for _ in range(n):
            key = self.prepare_update()
            self.updater.run(self.draw_inputs(batch_size), (key, self.replay.storage_version))
            self.updates += 1

    def sync_acting(self) -> None:
        state = self.modules_for_acting().state_dict()
        with self._act_lock:
            self.acting.load_state_dict(state)
            self.version = self.updates

    # ------------------------------------------------------------ checkpoints

    def state_dict(self, include_replay: bool = False) -> dict:
        if self.trained_by is not None:
            return self.trained_by.state(include_replay)
        state = {"agent_steps": self.agent_steps, "updates": self.updates,
                 "updates_forgiven": self.updates_forgiven, "config": self.config,
                 "nets": self.nets_state(), "rng": self.rng.bit_generator.state}
        if include_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.agent_steps, self.updates = state["agent_steps"], state["updates"]
        self.load_nets_state(state["nets"])
        self.rng.bit_generator.state = state["rng"]
        self.updates_forgiven = state.get("updates_forgiven", 0)
        if "replay" in state:
            replay = encoders.replay_in_layout(self.observation_space, state["replay"])
            self.replay.load_state_dict(frame_replay.for_store(self.replay, replay))
        else:
            # An empty buffer must not pay off the updates that were due at the
            # checkpoint: that burst would overfit its first few transitions.
            self.updates_forgiven = max(0, self._update_target() - self.updates)
        self.sync_acting()

    def nets_state(self) -> dict:
        """Networks, target networks and optimizers (override to add more); the same on every
        update path (optim.optimizer_state: learning rates as floats)."""
        state = {name: optim.optimizer_state(obj) if isinstance(obj, optim.OPTIMIZERS) else obj.state_dict()
                 for name, obj in vars(self).items()
                 if isinstance(obj, (torch.nn.Module, *optim.OPTIMIZERS)) and name != "acting"}
        # a held optimizer given nothing is left out: the learner that loads this keeps its own
        return {name: sd for name, sd in state.items() if sd is not None}

    def load_nets_state(self, state: dict) -> None:
        for name, sd in state.items():
            obj = getattr(self, name)
            if isinstance(obj, optim.OPTIMIZERS):
                optim.load_optimizer(obj, sd)
            else:
                obj.load_state_dict(sd)
        if self._updater is not None:
            self._updater.reset()
