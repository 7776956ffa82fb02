"""The clients' stream without gRPC's helper threads (simbridge/client/direct_stream.py) and its
fallback on grpcio's public API: the same answers, the same resume and exactly-once resend, and
no stall when many pipelined requests go out before any answer is read."""
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from simbridge.client import direct_stream
from simbridge.client.policy_client import PolicyClient
from simbridge.client.slot_client import SlotClient

OBS = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
ACT = gym.spaces.Discrete(2)


@pytest.fixture(params=["direct", "iterator"])
def stream_kind(request, monkeypatch):
    monkeypatch.setenv(direct_stream.STREAM_ENV, request.param)
    return request.param


def test_slot_steps_resume_after_a_broken_stream_and_count_once(make_server, stream_kind, net):
    srv = make_server()
    c = SlotClient(srv.address, OBS, ACT, 3)
    expected = direct_stream.DirectStream if stream_kind == "direct" else direct_stream.IteratorStream
    assert type(c._conn._stream) is expected
    obs, ones, no = np.zeros((3, 2), np.float32), np.ones(3, np.float32), np.zeros(3, bool)
    c.step(obs)
    for _ in range(10):
        c.step(obs, ones, no, no)
    c._conn._stream.cancel()                 # the stream dies under the client
    for _ in range(10):
        assert c.step(obs, ones, no, no).shape == (3,)
    assert c._conn.reconnects == 1 and c.policy_versions.tolist() == [0, 0, 0]
    c.close(ones, no, np.ones(3, bool), obs)
    srv.runtime.flush()
    assert srv.runtime.snapshot()["env_steps"] == 3 * 21      # every Step applied once, for each slot
    assert [s["length"] for s in srv.runtime.metrics.recent] == [21, 21, 21]


def test_5k_pipelined_requests_before_a_read_never_stall(make_server, stream_kind):
    """A DirectStream keeps reading answers while it waits to send: flow control never stops it
    (5,000 answers of about 20 bytes on the wire: more than HTTP/2's first 64 KiB window)."""
    srv = make_server(experience_queue_size=100_000)
    c = PolicyClient(srv.address, OBS, ACT, coalesce_rewards=False)   # each log_returns its own request
    eid = c.start_episode()
    c.get_action(eid, np.zeros(2, np.float32))
    done = threading.Event()

    def pipeline():
        for _ in range(5_000):
            c.log_returns(eid, 1.0)           # pipelined: no answer read
        c.flush()
        done.set()

    worker = threading.Thread(target=pipeline, daemon=True)
    t0 = time.monotonic()
    worker.start()
    assert done.wait(60), "the pipelined requests stalled"
    assert time.monotonic() - t0 < 60
    c.end_episode(eid, np.zeros(2, np.float32))
    c.close()
    assert srv.runtime.metrics.recent[-1]["total_reward"] == 5_000.0


def test_without_grpcs_internals_the_public_api_serves(make_server, monkeypatch):
    monkeypatch.setattr(direct_stream, "_DIRECT", False)
    srv = make_server()
    c = SlotClient(srv.address, OBS, ACT, 2)
    assert type(c._conn._stream) is direct_stream.IteratorStream
    assert c.step(np.zeros((2, 2), np.float32)).shape == (2,)
    c.close()


def test_an_untested_grpcio_release_gets_the_public_api(make_server, monkeypatch):
    """A grpcio whose Cython layer DirectStream was not tested with must not break the clients."""
    monkeypatch.delenv(direct_stream.STREAM_ENV, raising=False)
    monkeypatch.setattr(direct_stream, "TESTED_GRPC", ("0.1",))
    srv = make_server()
    c = SlotClient(srv.address, OBS, ACT, 2)
    assert type(c._conn._stream) is direct_stream.IteratorStream
    c.close()
    monkeypatch.setenv(direct_stream.STREAM_ENV, "direct")   # asked for explicitly: tried anyway
    c = SlotClient(srv.address, OBS, ACT, 2)
    assert type(c._conn._stream) is direct_stream.DirectStream
    c.close()


def test_internals_that_changed_their_signature_fall_back(make_server, monkeypatch):
    def changed(*args, **kwargs):
        raise TypeError("segregated_call() takes 3 positional arguments")
    monkeypatch.setattr(direct_stream.DirectStream, "__init__", changed)
    srv = make_server()
    c = SlotClient(srv.address, OBS, ACT, 2)
    assert type(c._conn._stream) is direct_stream.IteratorStream
    assert c.step(np.zeros((2, 2), np.float32)).shape == (2,)
    c.close()


class _Interrupted(Exception):
    pass


def test_an_interrupted_wait_leaves_a_stream_that_reports_cancelled(monkeypatch):
    """Ctrl-C while a DirectStream waits for an answer: grpcio destroys the call under it; the
    stream then says CANCELLED (which a Connection reconnects on) instead of reading a dead queue."""
    import os
    import signal
    from concurrent import futures

    import grpc

    release = threading.Event()

    def never_answers(requests, context):
        for _ in requests:
            release.wait(30)
            yield b""

    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.Hung", {"S": grpc.stream_stream_rpc_method_handler(never_answers)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")

    def interrupt(*_):
        raise _Interrupted()

    old = signal.signal(signal.SIGINT, interrupt)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    try:
        stream = direct_stream.open_stream(channel, "/t.Hung/S")
        assert type(stream) is direct_stream.DirectStream
        stream.send(b"x")
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(_Interrupted):
            stream.recv()
        assert time.monotonic() - t0 < 5
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    with pytest.raises(grpc.RpcError) as e:
        stream.send(b"y")
    assert e.value.code() == grpc.StatusCode.CANCELLED
    stream.cancel()
    release.set()
    channel.close()
    server.stop(0)
