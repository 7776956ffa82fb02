"""trainer/run/reporting.py's TensorBoard scalars: one event per record, every scalar of the record at
its env step, the values metrics.jsonl has."""
import io

from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.trainer.run.reporting import Reporter, read_metrics
from simbridge.trainer.run.rundir import METRICS


def test_each_record_is_one_tensorboard_event_holding_every_scalar_at_its_env_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    runtime = BridgeRuntime(BridgeConfig())
    reporter = Reporter(runtime, tmp_path, io.StringIO(), 1, lambda: 0.0)
    reporter.open()
    try:
        first = reporter.record()
        runtime.metrics.env_steps = 7   # a second record at another step
        second = reporter.record("stop")
    finally:
        reporter.close()
    assert [r["env_steps"] for r in read_metrics(tmp_path / METRICS)] == [0, 7]
    ea = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"env/steps_per_s", "env/episodes", "env/episodes_cut", "health/experience_blocked_s",
            "health/empty_episodes", "health/sessions_timed_out", "health/upload_refused_chunks",
            "health/upload_refused_steps"} <= tags, tags
    for tag, key in (("env/episodes", "episodes"), ("health/sessions_timed_out", "sessions_timed_out")):
        events = ea.Scalars(tag)
        assert [e.step for e in events] == [0, 7]
        assert [e.value for e in events] == [float(first[key]), float(second[key])]
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    (events_file,) = tmp_path.glob("events.out.tfevents.*")
    with_scalars = [e for e in EventFileLoader(str(events_file)).Load() if e.HasField("summary")]
    assert [e.step for e in with_scalars] == [0, 7]   # one event per record, not one per scalar


def test_the_waiting_lines_example_simulator_carries_the_flags_the_server_asks_for():
    """A trainer with TLS and a token: the `simbridge-sim --address ...` it suggests while it waits
    would fail without them (a newcomer's audit, 28 Nov)."""
    import dataclasses

    from simbridge.trainer.config.sections import ServerSection
    from simbridge.trainer.daemon import simulator_flags
    plain = ServerSection()
    assert simulator_flags(plain) == ""
    tls = dataclasses.replace(plain, tls_cert="server.pem", tls_key="server.key", auth_token_file="tokens.txt")
    assert simulator_flags(tls) == " --tls-ca CA.pem --tls-server-name CERT_NAME --auth-token-file TOKEN_FILE"
    mtls = dataclasses.replace(tls, tls_client_ca="ca.pem", auth_token_file="")
    assert simulator_flags(mtls) == \
        " --tls-ca CA.pem --tls-server-name CERT_NAME --tls-cert CLIENT.pem --tls-key CLIENT.key"
