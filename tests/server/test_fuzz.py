"""Hypothesis fuzzes every RPC of both services against a real `simbridge-server` process.

The server runs as a subprocess (`python -m simbridge.server.cli --address
127.0.0.1:0`), so a crash is a dead process and its memory is its own RSS. A
well-behaved CartPole PolicyClient (the witness) runs in a thread throughout.
Inputs come from bench/fuzzing.py and bench/fuzzcases.py, the generators
bench/fuzz.py drives at scale; here hypothesis makes every choice, so a failure
shrinks to a small input:

* random or damaged bytes on every unary RPC and on Streams (identity
  serializers: the bytes go out as they are);
* typed messages on every unary RPC: every field hostile, or a request a
  correct client would send in one of the rig's real sessions with a few fields
  replaced;
* Streams carrying random sequences of such requests.

After every example: no INTERNAL/UNKNOWN status and no StreamResponse.error
with one, no call past its deadline, every OK answer is the call's response
(one per stream request, in order, of its kind), the server process alive, and
the witness served within the last few seconds without an error. The last test
sends a mixed batch and checks the server's RSS, its log and the witness's
completed episodes.
"""
import threading
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bench import fuzzing, fuzzjudge, fuzzrig

WITNESS_MAX_GAP_S = 5.0    # the witness steps every few ms; this long without an action is a stall
RSS_GROWTH_MB = 64.0       # the mixed batch below may not grow the server by more
CALLS = 400                # the mixed batch: ~600 messages (a stream's requests each count)
LOG_BYTES = 16 * 1024      # nor its log: a traceback per bad request (~430 bytes) is unbounded cost
# ~25 s on 2 shared cores, server start included; derandomized: CI sees the same inputs every run
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

UNARY_RPCS = [r for r in fuzzing.rpcs() if r[1] != "Stream"]
STREAM_RPCS = [r for r in fuzzing.rpcs() if r[1] == "Stream"]


class HypothesisDraw:
    """fuzzing's Draw interface over hypothesis's `data`, so every choice shrinks."""

    def __init__(self, data):
        self.data = data

    def integer(self, lo, hi):
        return self.data.draw(st.integers(lo, hi))

    def boolean(self, p=0.5):
        return self.data.draw(st.integers(0, 99)) < p * 100

    def choice(self, seq):
        return self.data.draw(st.sampled_from(seq))

    def raw(self, max_size):
        if max_size <= 4096:
            return self.data.draw(st.binary(max_size=max_size))
        chunk = self.data.draw(st.binary(min_size=1, max_size=256))   # big inputs: a repeated chunk
        return chunk * self.data.draw(st.integers(0, max_size // len(chunk)))


@pytest.fixture(scope="module")
def rig():
    server = fuzzrig.ServerProcess()
    judge = fuzzjudge.Judge(server, server.address, unary_deadline_s=10.0, stream_deadline_s=20.0)
    witness = fuzzrig.Witness(server.address).start()
    time.sleep(0.3)   # the witness binds default_policy to the CartPole spaces before the fuzz does
    pool = fuzzrig.Pool(judge.channel)
    yield server, judge, witness, pool
    witness.finish()
    judge.close()
    server.stop(grace_s=3.0)


def _fuzz(rig, data, targets, raw):
    server, judge, witness, pool = rig
    before = len(judge.violations)
    svc, method = data.draw(st.sampled_from(targets), label="rpc")
    fuzzjudge.fuzz_one(judge, pool, HypothesisDraw(data), svc, method, raw=raw)
    new = judge.violations[before:]
    assert not new, "\n".join(new)
    assert server.alive(), f"the server exited with {server.proc.returncode}"
    assert not witness.errors, f"the well-behaved client failed: {witness.errors}"
    assert witness.gap_s() < WITNESS_MAX_GAP_S, f"the well-behaved client got no action for {witness.gap_s():.1f}s"


@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_random_bytes_on_every_rpc_get_a_precise_status(rig, data):
    _fuzz(rig, data, fuzzing.rpcs(), raw=True)


@settings(FUZZ, max_examples=800)
@given(data=st.data())
def test_typed_messages_on_every_unary_rpc_get_a_precise_status(rig, data):
    _fuzz(rig, data, UNARY_RPCS, raw=False)


@settings(FUZZ, max_examples=150, phases=(Phase.explicit, Phase.generate))   # a stream shrinks for ~40 s
@given(data=st.data())
def test_streams_of_random_requests_answer_each_in_order(rig, data):
    _fuzz(rig, data, STREAM_RPCS, raw=False)


def test_a_mixed_batch_leaves_the_server_small_quiet_and_serving(rig):
    """400 calls of every kind (seeded, as bench/fuzz.py sends them): the server's RSS and log
    stay bounded and the witness completes episodes throughout."""
    import random
    server, judge, witness, pool = rig
    rss0, log0 = server.rss_mb(), server.log_stats()["log_bytes"]
    steps0, episodes0 = witness.counters["steps"], witness.counters["episodes"]
    draw = fuzzing.RandomDraw(random.Random(13))
    targets = fuzzing.rpcs()
    deadline = time.monotonic() + 30
    for i in range(CALLS):
        svc, method = targets[i % len(targets)]
        fuzzjudge.fuzz_one(judge, pool, draw, svc, method, raw=draw.boolean(0.25))
        if time.monotonic() > deadline:
            break
    pool.refresh()
    assert server.alive()
    grown = server.rss_mb() - rss0
    assert grown < RSS_GROWTH_MB, f"the server grew by {grown:.0f} MB"
    assert witness.counters["episodes"] > episodes0 and witness.counters["steps"] > steps0 + 100
    assert not witness.errors
    log_grown = server.log_stats()["log_bytes"] - log0
    assert log_grown < LOG_BYTES, f"{log_grown} bytes of server log for {i + 1} fuzzed calls"


def test_the_judge_catches_internal_hangs_wrong_answers_and_crashes():
    """The invariants above hold only if the judge sees breaches: a stand-in server that answers
    INTERNAL, stalls, answers with another message, or with too few stream answers, is caught."""
    from concurrent import futures

    import grpc
    from simbridge.wire.v1 import simbridge_pb2 as pb

    release = threading.Event()

    def stall(req, ctx):
        release.wait(5)
        return b""

    def stream(requests, ctx):
        for i, _ in enumerate(requests):
            if i == 0:
                error = {"code": grpc.StatusCode.INTERNAL.value[0], "message": "boom"}
                yield pb.StreamResponse(error=error).SerializeToString()
            else:   # an answer of another kind, then the third request is never answered
                yield pb.StreamResponse(get_action=pb.GetActionResponse()).SerializeToString()
                return

    handlers = {
        "CreateSession": grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: ctx.abort(grpc.StatusCode.INTERNAL, "bug")),
        "GetAction": grpc.unary_unary_rpc_method_handler(stall),
        "StartEpisode": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"\xff\xff"),
        "CloseSession": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b""),
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(fuzzing.SERVICES["single"], handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    dead = type("Dead", (), {"alive": lambda self: False, "proc": type("P", (), {"returncode": -9})()})()
    judge = fuzzjudge.Judge(dead, f"127.0.0.1:{port}", unary_deadline_s=0.5, stream_deadline_s=2.0)
    try:
        judge.unary("single", "CreateSession", b"", "c")
        judge.unary("single", "GetAction", b"", "g")
        judge.unary("single", "StartEpisode", b"", "s")
        judge.unary("single", "CloseSession", b"", "ok")
        judge.stream("single", ["create_session", "start_episode", "get_action"], [b"", b"", b""], "st")
        # bad answers: StartEpisode's bytes, the stream's get_action for a start_episode, its missing third
        assert (judge.internal, judge.hangs, judge.bad_answers) == (2, 1, 3), judge.violations
        assert judge.codes["OK"] == 3 and not judge.crashed
        server.stop(0).wait()
        judge.unary("single", "CloseSession", b"", "after")   # UNAVAILABLE, and the process is gone
        assert judge.crashed, judge.codes
    finally:
        release.set()
        judge.close()
        server.stop(0)
