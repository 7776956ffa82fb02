"""The trainer config's policies, built: what the runtime calls on a policy's first use.

A policy is a Learner subclass (built with the run's seed, device and whether it is in
policies_to_train), "random" (RandomPolicy), or a Policy subclass that only acts (built with
its config as keywords). The classes are resolved when the factory is made, so an unknown
module or config key fails before anything is served.
"""
import logging
import threading
from typing import Callable, Optional

from simbridge.server.mapping import pattern_mapping
from simbridge.server.policies import Policy, RandomPolicy
from simbridge.trainer.config.trainer_config import TrainerConfig
from simbridge.trainer.config.algorithms import resolve_algorithm
from simbridge.trainer.config.values import ConfigError
from simbridge.trainer.learners import placement
from simbridge.trainer.learners.base import Learner, trains
from simbridge.trainer.run.learner_process import refuse_in_learner_bootstrap
from simbridge.wire.errors import Reason, invalid_argument, resource_exhausted
from simbridge.wire.preprocess import flat_dim

log = logging.getLogger("simbridge.trainer")


class PolicyFactory:
    """`factory(pid, obs_space, act_space)`: the runtime's policy_factory (any gRPC thread; no
    lock of the runtime's is assumed held). `build` is the same without the refusal's wording."""

    def __init__(self, cfg: TrainerConfig):
        # The daemon's first act: in a learner process re-running an unguarded script, stop here.
        refuse_in_learner_bootstrap()
        self.cfg = cfg
        self.classes = {pid: resolve_algorithm(spec, cfg.source, cfg.overrides) for pid, spec in cfg.policies.items()}
        try:   # before serving: a device this process cannot use fails the start, not the first learner
            placement.pick_device(cfg.run.device)
        except ValueError as e:
            raise ConfigError(f"{cfg.where}: [run] {e} (the command line's --device)") from None
        # A learner seeds torch's global generator, then draws its initial weights from it:
        # two built at once would interleave those draws and break the run's seeding.
        self._build_lock = threading.Lock()

    def learners_to_train(self) -> list:
        """The ids of the config's policies that are Learners in policies_to_train."""
        return [pid for pid, c in self.classes.items()
                if c is not None and issubclass(c, Learner) and self.cfg.trainable(pid)]

    def mapping_fn(self) -> Callable[[str, Optional[object]], str]:
        m = self.cfg.mapping
        fn = pattern_mapping(m.rules, default=m.default or "")

        def mapping(agent_id: str, episode=None) -> str:
            pid = fn(agent_id, episode)
            if not pid:
                raise invalid_argument(
                    f"agent {agent_id!r} matches no [mapping] rule of the trainer config and no default "
                    f"policy is set: add a rule for it or set [mapping] default")
            return pid
        return mapping

    def build(self, pid: str, obs_space, act_space) -> Policy:
        spec, cls = self.cfg.policies[pid], self.classes[pid]
        run = self.cfg.run
        seed = None if run.seed is None else run.seed + list(self.cfg.policies).index(pid)
        with self._build_lock:
            if cls is None:
                return RandomPolicy(obs_space, act_space, seed=spec.config.get("seed", seed))
            if issubclass(cls, Learner):
                config = self.learner_config(pid)
                if seed is not None:
                    config.setdefault("seed", seed)
                return self._learner(pid, cls, obs_space, act_space, config)
            return cls(obs_space, act_space, **spec.config)

    def learner_config(self, pid: str) -> dict:
        """The policy's learner config, with the frames its observations stack (the replay keeps
        a camera's frames once: trainer/learners/frame_replay.py)."""
        spec = self.cfg.policies[pid]
        return {**spec.config, "frame_stack": spec.frame_stack} if spec.frame_stack > 1 else dict(spec.config)

    def build_at_start(self, pid: str, obs_space, act_space, source: str) -> Policy:
        """build() for a policy made before any simulator connects (the config's own spaces, a
        dataset's): one the spaces refuse is the start-up's ConfigError, `source` naming whence
        the spaces came."""
        try:
            return self.build(pid, obs_space, act_space)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{source}: cannot create policy {pid!r} for observation {obs_space}, "
                              f"action {act_space}: {e}") from None

    def _learner(self, pid: str, cls, obs_space, act_space, config: dict) -> Learner:
        run, trainable = self.cfg.run, self.cfg.trainable(pid)
        device = placement.pick_device(run.device)
        # Frozen, or trained by a learner process: this copy never updates, and holds no optimizer.
        acting_only = run.learner_process or not trainable
        if run.learner_process and trainable and device.type != "cpu" and run.acting_device != "learner":
            # A learner process trains it on the GPU and this copy only acts: built on the CPU when it
            # acts there, so that the GPU holds one CUDA context, the learner process's.
            learner = cls(obs_space, act_space, config=config, device="cpu", acting_device="cpu",
                          acting_only=True)
            where, why = placement.acting_device(run.acting_device, device, learner.modules_for_acting(),
                                                 flat_dim(obs_space))
            if where.type == "cpu":
                learner.trains_on, learner.acting_reason = device, why
                return learner
        return cls(obs_space, act_space, config=config, device=run.device, trainable=trainable,
                   acting_device=run.acting_device, acting_only=acting_only)

    def check_memory(self, pid: str, obs_space, act_space) -> None:
        """RESOURCE_EXHAUSTED / SPACE_TOO_LARGE when the learner for these spaces would need more than
        [server] max_policy_memory_mb: refused before anything is allocated, the trainer runs on."""
        cls = self.classes[pid]
        if cls is None or not issubclass(cls, Learner):
            return
        est = cls.memory_estimate(obs_space, act_space, self.learner_config(pid))
        budget_mb = self.cfg.server.max_policy_memory_mb
        need = est["replay"] + est["networks"]
        if need <= budget_mb * 2**20:
            return
        mb = lambda x: f"{x / 2**20:,.0f} MiB"   # noqa: E731
        log.error("refused policy %r for observation %s, action %s: it would need %s, [server] "
                  "max_policy_memory_mb is %d", pid, obs_space, act_space, mb(need), budget_mb)
        raise resource_exhausted(
            f"the trainer cannot hold policy {pid!r} for observation space {obs_space}, action space "
            f"{act_space}: it would need about {mb(need)} (replay buffer {mb(est['replay'])}: buffer_size "
            f"x {est['transition']:,} bytes per transition; networks {mb(est['networks'])}), more than its "
            f"budget of {budget_mb:,} MiB: send smaller observations, lower [policies.{pid}] buffer_size or "
            f"hidden, or raise [server] max_policy_memory_mb", Reason.SPACE_TOO_LARGE)

    def __call__(self, pid: str, obs_space, act_space) -> Policy:
        if pid not in self.cfg.policies:
            raise invalid_argument(f"policy {pid!r} is not defined in the trainer config: add "
                                   f"[policies.{pid}] or map the agent to one of {sorted(self.cfg.policies)}")
        self.check_memory(pid, obs_space, act_space)
        try:
            policy = self.build(pid, obs_space, act_space)
        except Exception as e:
            log.error("cannot create policy %r for observation %s, action %s: %s", pid, obs_space,
                      act_space, e)
            raise invalid_argument(
                f"the trainer cannot create policy {pid!r} (algorithm {self.cfg.policies[pid].algorithm!r}) "
                f"for observation space {obs_space}, action space {act_space}: {e}; map these agents "
                f"to a policy whose algorithm fits (dqn: Discrete and MultiDiscrete actions, sac: Box actions, ppo: "
                f"any of those and Unity's hybrid Dict actions)") from None
        log.info("policy %r created (%s) for observation %s, action %s%s", pid, type(policy).__name__,
                 obs_space, act_space, "" if trains(policy) else ", not trained")
        if isinstance(policy, Learner):
            log.info("policy %r learns on %s, acts on %s (%s)", pid, policy.trains_on, policy.acting_device,
                     policy.acting_reason)
        return policy
