"""The floor cases of bench/throughput.py: bare echoes, no bridge, what the transport alone allows.

`floor` echoes bytes through a trivial grpcio service in another process (unary, a stream ping-pong,
and messages of a CartPole Step's sizes); `shm_floor` echoes a Step's sizes through the shared-memory
rings alone (simbridge/wire/shm_ring.py). The Step cases' *_vs_echo ratios divide by these.
"""
import functools
import multiprocessing as mp
import os
import socket
import time
import uuid

import numpy as np

from bench.harness import HOST, WARMUP_S, die_with_parent, key, listen_address, run_clients, socket_dir, summary

def _sized_answer(req, _answers={}):
    """The echo's answer: as many bytes as the request's first 4 bytes say (little-endian), or the
    request itself, so one echo stands for a Step whose answer is smaller than its request."""
    if len(req) < 8 or req[:4] == b"\0\0\0\0":
        return req
    size = int.from_bytes(req[:4], "little")
    answer = _answers.get(size)
    if answer is None:
        answer = _answers[size] = bytes(size)
    return answer


def _floor_server_main(address, port_q, stop_evt):
    """Child process: a trivial echo service, bytes in and out, no proto."""
    os.dup2(2, 1)
    die_with_parent()
    from concurrent import futures

    import grpc

    handlers = {
        "Ping": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req),
        "PingStream": grpc.stream_stream_rpc_method_handler(lambda it, ctx: (_sized_answer(m) for m in it)),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", handlers),))
    port = server.add_insecure_port(address)
    server.start()
    port_q.put(address if address.startswith("unix:") else f"{HOST}:{port}")
    stop_evt.wait()
    server.stop(0)



def step_message_sizes(n):
    """Bytes on the wire of a CartPole Step of n slots and of its answer, as SlotClient and the
    server make them (the bare echo of these sizes is what a Step could cost at best)."""
    import gymnasium as gym

    from simbridge.wire import leaf_codec, tensors
    from simbridge.wire.v1 import simbridge_pb2 as pb

    obs_space = gym.make("CartPole-v1").observation_space
    req = pb.StreamRequest()
    step = req.step
    step.header.seq = 123456   # the stream sends no session id: the stream is bound to it
    leaf_codec.batch_encoder(obs_space)(step.observations, np.zeros((n, 4), np.float32), "observations")
    tensors.fill_tensor(step.rewards, np.ones(n, np.float32))
    tensors.fill_tensor(step.terminated, np.zeros(n, bool))
    tensors.fill_tensor(step.truncated, np.zeros(n, bool))
    resp = pb.StreamResponse()
    tensors.fill_tensor(resp.step.actions.tensor, np.zeros(n, np.int64))
    tensors.fill_tensor(resp.step.policy_versions, np.zeros(n, np.int64))
    resp.step.policy_id = "default_policy"
    return req.ByteSize(), resp.ByteSize()


ECHO_SLOTS = (1, 64, 256)   # the echo of a Step of this many slots: floor's step*_ figures


def floor(children, seconds, net="tcp"):
    """Bare grpcio echo between two processes: what this machine allows per round trip.

    Unary calls (grpc_floor_*) and a bidi stream ping-pong of 48 bytes for reference
    (grpc_floor_stream_*), then stream echoes of the sizes of a CartPole Step of 1, 64 and 256 slots,
    request and answer (echo_step{1,64,256}_*): each Step case's *_vs_echo ratio puts it against the
    echo of its sizes on the same transport."""
    ctx = mp.get_context("spawn")
    port_q, stop_evt = ctx.Queue(), ctx.Event()
    bind = listen_address(net) if net != "tcp" else f"{HOST}:0"
    server = children.add(ctx.Process(target=_floor_server_main, args=(bind, port_q, stop_evt),
                                      name="bench-floor-server", daemon=True))
    server.start()
    sized = {}
    try:
        address = port_q.get(timeout=60)
        unary = run_clients(children, 1, "floor", address, "unary", seconds, server.pid)
        stream = run_clients(children, 1, "floor", address, "stream", seconds, server.pid)
        for n in ECHO_SLOTS:
            req, answer = step_message_sizes(n)
            sized[n] = (req, answer, run_clients(children, 1, "floor", address, f"stream:{req}:{answer}",
                                                 max(1.0, seconds / 2), server.pid))
    finally:
        stop_evt.set()
        children.stop(server)
    u, s = summary("floor_unary", unary), summary("floor_stream", stream)
    k = functools.partial(key, net)
    out = {
        k("grpc_floor_roundtrips_per_s"): u["floor_unary_steps_per_s"],
        k("grpc_floor_p50_ms"): u["floor_unary_p50_ms"],
        k("grpc_floor_p99_ms"): u["floor_unary_p99_ms"],
        k("grpc_floor_stream_roundtrips_per_s"): s["floor_stream_steps_per_s"],
        k("grpc_floor_stream_p50_ms"): s["floor_stream_p50_ms"],
        k("grpc_floor_stream_p99_ms"): s["floor_stream_p99_ms"],
        k("grpc_floor_server_cpu_us_per_call"): u.get("floor_unary_server_cpu_us_per_call"),
        k("grpc_floor_stream_server_cpu_us_per_call"): s.get("floor_stream_server_cpu_us_per_call"),
        k("grpc_floor_stream_client_cpu_cores"): s.get("floor_stream_client_cpu_cores"),
    }
    for n, (req, answer, res) in sized.items():
        e = summary("e", res)
        out[k(f"echo_step{n}_roundtrips_per_s")] = e["e_steps_per_s"]
        out[k(f"echo_step{n}_bytes")] = [req, answer]
        out[k(f"echo_step{n}_client_cpu_cores")] = e["e_client_cpu_cores"]
    return out


def _shm_echo_main(path, sizes, stop_evt):
    """Child process: the bare shared-memory echo (simbridge/wire/shm_ring.py, no bridge, no
    proto): a request of sizes[0] bytes is answered with sizes[1] bytes."""
    die_with_parent()
    from simbridge.wire import shm_ring

    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    conn, _ = listener.accept()
    cap = 1 << 20
    fds = [shm_ring.make_region(cap), os.eventfd(0, os.EFD_NONBLOCK), os.eventfd(0, os.EFD_NONBLOCK)]
    region = shm_ring.Region(fds[0], cap, fds[1], fds[2], conn, server=True,
                             spin_s=shm_ring.spin_seconds(shm_ring.SERVER_SPIN_ENV), fresh=True)
    socket.send_fds(conn, [shm_ring.answer(0, 0, cap)], fds)
    answer = b"a" * sizes[1]
    try:
        while not stop_evt.is_set():
            if region.incoming.get(timeout_s=0.5) is not None:
                region.outgoing.put(answer)
    except shm_ring.PeerGone:
        pass


def shm_floor(children, seconds):
    """The bare shared-memory echo of a CartPole Step's sizes: no bridge, no gRPC.

    simbridge/wire/shm_ring.py alone, 1, 64 and 256 slots, one simulator:
    shm_echo_step{1,64,256}_roundtrips_per_s, the floor of the shm_* Step cases (their *_vs_echo).
    With the TCP Step case and its shm_ twin in the same run, also
    shm_vs_tcp_*_free_bridge_ceiling (bench/ratios.py)."""
    from simbridge.wire import shm_ring

    ctx = mp.get_context("spawn")
    out = {}
    for n in ECHO_SLOTS:
        req, answer = step_message_sizes(n)
        path = f"{socket_dir()}/echo-{uuid.uuid4().hex[:8]}"
        stop_evt = ctx.Event()
        proc = children.add(ctx.Process(target=_shm_echo_main, args=(path, (req, answer), stop_evt),
                                        name="bench-shm-echo", daemon=True))
        proc.start()
        try:
            sock = socket.socket(socket.AF_UNIX)
            deadline = time.monotonic() + 30
            while True:
                try:
                    sock.connect(path)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            data, fds, _, _ = socket.recv_fds(sock, 4096, 3)
            cap = shm_ring.parse_answer(data)[2]
            region = shm_ring.Region(fds[0], cap, fds[1], fds[2], sock, server=False,
                                     spin_s=shm_ring.spin_seconds())
            message = b"r" * req
            count, t0, cpu0 = 0, None, None
            start = time.monotonic()
            while True:
                now = time.monotonic()
                if t0 is None and now - start >= WARMUP_S:
                    t0, cpu0, count = time.perf_counter(), time.process_time(), 0
                if t0 is not None and now - start >= WARMUP_S + max(1.0, seconds / 2):
                    break
                region.outgoing.put(message)
                region.incoming.get()
                count += 1
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            out[f"shm_echo_step{n}_roundtrips_per_s"] = round(count / wall, 1)
            out[f"shm_echo_step{n}_bytes"] = [req, answer]
            out[f"shm_echo_step{n}_client_cpu_us_per_call"] = round(cpu / count * 1e6, 1)
            region.close()
            sock.close()
            for fd in fds:
                os.close(fd)
        finally:
            stop_evt.set()
            children.stop(proc)
    return out
