"""The run's bridge server, bound before anything heavy loads (no torch here).

`simbridge-trainer run` binds its port and answers health NOT_SERVING within a second or two of
its start, then imports torch, loads a resumed run's checkpoint and journal and builds its
learners (seconds, tens of seconds on a loaded machine) while the simulators that connect
meanwhile wait; TrainerDaemon.run serves once the run is ready. A simulator started beside the
trainer (`simbridge-trainer run & simbridge-sim`) finds the port at once instead of running out
of its connect timeout.
"""
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.security import SecurityConfigError, ServerSecurity
from simbridge.server.service import BridgeServer
from simbridge.trainer.config.trainer_config import ConfigError, TrainerConfig


def bridge_config(cfg: TrainerConfig) -> BridgeConfig:
    s = cfg.server
    # With a journal (and journal_before_answer), a streamed call is applied and journaled
    # before it is answered: every answer a simulator got is then on record.
    return BridgeConfig(rollout_fragment_length=s.rollout_fragment_length, batch_mode=s.batch_mode,
                        count_steps_by=s.count_steps_by, max_wait_ms=s.max_wait_ms,
                        experience_queue_size=s.experience_queue_size, step_timeout_s=s.step_timeout_s,
                        answer_before_commit=not (cfg.run.journal and cfg.run.journal_before_answer))


def bind_server(cfg: TrainerConfig, runtime) -> BridgeServer:
    """The run's server on `runtime`, bound, not started; ConfigError naming the fix when the
    address cannot be bound or the TLS settings cannot work (nothing is written before this)."""
    s = cfg.server
    try:
        return BridgeServer(runtime, s.address, security=ServerSecurity(
            tls_cert=s.tls_cert, tls_key=s.tls_key, tls_client_ca=s.tls_client_ca,
            auth_token_file=s.auth_token_file, insecure=s.insecure))
    except SecurityConfigError as e:
        raise ConfigError(str(e)) from None
    except RuntimeError as e:
        raise ConfigError(f"{e} (nothing was written to {cfg.run.logdir})") from None


def listen_early(cfg: TrainerConfig) -> BridgeServer:
    """The run's server, listening and answering health NOT_SERVING, its calls held until
    TrainerDaemon.run serves (the daemon sets the runtime's policies up meanwhile)."""
    return bind_server(cfg, BridgeRuntime(bridge_config(cfg))).start(serving=False)
