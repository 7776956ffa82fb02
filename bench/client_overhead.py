#!/usr/bin/env python
"""What SlotClient costs beyond the least a Python simulator can send, in interleaved windows.

One `simbridge-server` process (random policy) on TCP or a Unix socket; in this process, one
SlotClient session, the same Step content every time (fixed observations, reward 1, no episode
end: the server's work is the same in every case), alternating windows of --window seconds,
--rounds times:
  bare   a prebuilt Step, only its seq set, serialized and sent on SlotClient's own stream
         (simbridge/client/direct_stream.py), the answer not decoded: the least a Python
         simulator can do per Step;
  conn   SlotClient's Connection.call with that prebuilt Step (seq, resend bookkeeping, the
         answer decoded);
  slot   SlotClient.step: the Step encoded from numpy and the actions decoded, the whole API;
  slot_iterator  the same on a second SlotClient whose stream is grpcio's public API (a queue-fed
         request iterator, SIMBRIDGE_GRPC_STREAM=iterator): the client as it was before.
No simulator is stepped: the figures are the client's alone.
Windows next to each other share the machine's mood, so the medians of the per-round ratios
(slot_vs_bare, ...) hold on a noisy machine where absolute rates do not. One JSON object out.

    .venv/bin/python bench/client_overhead.py --net tcp --slots 1 --rounds 5
"""
import sys
from pathlib import Path

if __package__ in (None, ""):   # run as `python bench/client_overhead.py`: the checkout, for `bench.`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness  # noqa: E402  (first: it sets gRPC's TCP path; the server)
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def _window(fn, seconds):
    """(calls per second, client CPU microseconds per call) of fn over `seconds`."""
    k, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        fn()
        k += 1
    return k / (time.perf_counter() - t0), 1e6 * (time.process_time() - c0) / k


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--net", choices=("tcp", "uds"), default="tcp")
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--window", type=float, default=1.0, help="seconds per window (default 1)")
    args = p.parse_args(argv)
    import gymnasium as gym

    from simbridge.client.direct_stream import STREAM_ENV, IteratorStream
    from simbridge.client.slot_client import SlotClient
    from simbridge.wire.v1 import simbridge_pb2 as pb

    children = harness.Children()
    try:
        proc, address = harness.start_bridge_server(children, net=args.net)
        n = args.slots
        space = gym.make("CartPole-v1").observation_space
        client = SlotClient(address, space, gym.spaces.Discrete(2), n, client_name="overhead")
        with harness.environ(**{STREAM_ENV: "iterator"}):
            before = SlotClient(address, space, gym.spaces.Discrete(2), n, client_name="overhead-iterator")
        assert type(before._conn._stream) is IteratorStream
        obs, ones, no = np.zeros((n, 4), np.float32), np.ones(n, np.float32), np.zeros(n, bool)
        client.step(obs)
        before.step(obs)
        envelope = pb.StreamRequest()
        client._encode_obs(envelope.step.observations, obs, "observations")
        client._fill_outcome(envelope.step, ones, no, no, None)
        conn = client._conn

        def bare():
            conn._seq += 1
            envelope.step.header.seq = conn._seq
            conn._stream.send(envelope.SerializeToString())
            conn._stream.recv()

        cases = {"bare": bare,
                 "conn": lambda: conn.call("step", envelope.step, envelope=envelope),
                 "slot": lambda: client.step(obs, ones, no, no),
                 "slot_iterator": lambda: before.step(obs, ones, no, no)}
        for fn in cases.values():
            _window(fn, 0.3)   # warm-up
        runs = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, fn in cases.items():
                runs[name].append(_window(fn, args.window))
        client.close()
        before.close()
    finally:
        children.stop_all()
    out = {"net": args.net, "slots": n, "rounds": args.rounds, "window_s": args.window}
    for name, got in runs.items():
        out[f"{name}_calls_per_s"] = round(float(np.median([r for r, _ in got])), 1)
        out[f"{name}_client_cpu_us_per_call"] = round(float(np.median([c for _, c in got])), 1)
    for name in ("conn", "slot", "slot_iterator"):
        ratios = [a[0] / b[0] for a, b in zip(runs[name], runs["bare"])]
        out[f"{name}_vs_bare"] = round(float(np.median(ratios)), 3)
        out[f"{name}_vs_bare_runs"] = [round(r, 3) for r in ratios]
    ratios = [a[0] / b[0] for a, b in zip(runs["slot"], runs["slot_iterator"])]
    out["slot_direct_vs_iterator"] = round(float(np.median(ratios)), 3)
    out["slot_direct_vs_iterator_runs"] = [round(r, 3) for r in ratios]
    out["loadavg_1m"] = round(os.getloadavg()[0], 2)
    out["address"] = address if args.net == "tcp" else "unix:<temporary directory>"
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
