"""`simbridge-server`: the bridge on its own, serving a random policy.

Useful to connect a new simulator and watch the experience flow before any
learning is involved; the trainer daemon embeds the same server.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import json
import logging
import signal
import sys
import threading
import time

from simbridge.console import Console, StopEvent, exit_within, on_hangup
from simbridge.server.heap import keep_freed_memory
from simbridge.server.mapping import parse_rules, pattern_mapping
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.security import SecurityConfigError, ServerSecurity
from simbridge.server.service import BridgeServer


def drain(runtime: BridgeRuntime, stop: threading.Event) -> None:
    """Stand-in learner: consumes the experience so simulators never stall."""
    while not stop.is_set():
        runtime.experience.get(timeout=0.2)


def progress_line(snap: dict, steps_per_s: float) -> str:
    ret = snap["episode_return_mean"]
    ret_s = "-" if ret is None else f"{ret:8.2f}"
    return (f"sessions {snap['sessions']:3d} | episodes {snap['episodes']:7d} | env steps "
            f"{snap['env_steps']:9d} ({steps_per_s:8.0f}/s) | return mean(100) {ret_s} | "
            f"experience batches {snap['experience_queue']}")


def add_security_args(p: argparse.ArgumentParser) -> None:
    """The server's TLS and token flags (also the trainer's; docs/security.md)."""
    g = p.add_argument_group("security (docs/security.md)")
    g.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain (needs --tls-key)")
    g.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    g.add_argument("--tls-client-ca", metavar="PEM",
                   help="mutual TLS: require client certificates signed by these roots")
    g.add_argument("--auth-token-file", metavar="FILE",
                   help="require a token on every call (one accepted token per line); clients send it "
                        "as 'authorization: Bearer <token>'")
    g.add_argument("--insecure", action="store_true", default=None,
                   help="allow a non-loopback --address without TLS and authentication (a network you trust)")


def add_log_level(p: argparse.ArgumentParser) -> None:
    """--log-level, checked by argparse (a misspelt level was logging's traceback)."""
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   metavar="LEVEL", help="debug, info (the default), warning or error")


def _at_least(low: float, what: str):
    def parse(text: str) -> float:
        value = float(text)
        if not value >= low:
            raise argparse.ArgumentTypeError(f"{what} must be >= {low:g}, got {text}")
        return value
    return parse


def security_from_args(args, base: ServerSecurity = None) -> ServerSecurity:
    """`base` (e.g. a config file's settings) with the flags given on the command line over it."""
    base = base or ServerSecurity()
    return ServerSecurity(tls_cert=args.tls_cert or base.tls_cert, tls_key=args.tls_key or base.tls_key,
                          tls_client_ca=args.tls_client_ca or base.tls_client_ca,
                          auth_token_file=args.auth_token_file or base.auth_token_file,
                          insecure=base.insecure if args.insecure is None else args.insecure)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="simbridge-server", description=__doc__)
    p.add_argument("--address", default="127.0.0.1:50051",
                   help="host:port to listen on (default loopback only; 0.0.0.0:PORT exposes it), or "
                        "unix:PATH for a Unix socket on this machine (owner-only; docs/transports.md), "
                        "shm+unix:PATH for that socket and the steps through shared memory")
    p.add_argument("--rollout-fragment-length", type=int, default=200,
                   help="agent steps per experience fragment (default 200; >= 1)")
    p.add_argument("--batch-mode", default="truncate_episodes", choices=["truncate_episodes", "complete_episodes"],
                   help="fragments cut at rollout_fragment_length (default), or whole episodes")
    p.add_argument("--max-wait-ms", type=_at_least(0, "--max-wait-ms"), default=0.0,
                   help="dynamic batcher wait for more rows (default 0)")
    p.add_argument("--policy-map", action="append", default=[], metavar="PATTERN=POLICY",
                   help="map agent ids matching a glob to a policy, e.g. 'player_*=nim' (repeatable; "
                        "first match wins; others use default_policy). Agents with different spaces "
                        "need different policies.")
    add_security_args(p)
    p.add_argument("--print-every", type=_at_least(0, "--print-every"), default=2.0,
                   help="seconds between progress lines (0: quiet)")
    p.add_argument("--json", action="store_true", help="print progress as JSON lines")
    add_log_level(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if argv is None:   # the program's own process (not a caller's: tests call main(argv))
        keep_freed_memory()

    try:
        mapping = pattern_mapping(parse_rules(args.policy_map))
    except ValueError as e:
        p.error(str(e))
    cfg = BridgeConfig(rollout_fragment_length=args.rollout_fragment_length, batch_mode=args.batch_mode,
                       max_wait_ms=args.max_wait_ms)
    try:
        runtime = BridgeRuntime(cfg, policy_mapping_fn=mapping)
    except ValueError as e:   # a value the experience collector refuses (rollout_fragment_length < 1)
        p.error(str(e))
    try:
        server = BridgeServer(runtime, args.address, security=security_from_args(args)).start()
    except SecurityConfigError as e:
        print(f"simbridge-server: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"simbridge-server: error: {e}", file=sys.stderr)
        return 2
    stop = StopEvent()   # set by signal handlers: simbridge/console.py
    threading.Thread(target=drain, args=(runtime, stop), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C as KeyboardInterrupt also where it came ignored (started with `&` from a script), as the
    # trainer and simbridge-sim take it: `kill -INT PID` ran on unheard.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    on_hangup(lambda *_: stop.set())
    out = Console(sys.stdout, on_gone=stop.set)   # `| head`: stop as on SIGTERM (simbridge/console.py)
    print(f"simbridge-server listening on {server.address}", file=out, flush=True)
    last_steps, last_t = 0, time.monotonic()
    try:
        quiet = args.print_every == 0
        while not stop.wait(1.0 if quiet else args.print_every):
            if quiet:
                continue
            snap = runtime.snapshot()
            now = time.monotonic()
            rate = (snap["env_steps"] - last_steps) / max(now - last_t, 1e-9)
            last_steps, last_t = snap["env_steps"], now
            print(json.dumps(snap) if args.json else progress_line(snap, rate), file=out, flush=True)
    except KeyboardInterrupt:
        pass
    stop.set()
    try:
        server.stop()
    except KeyboardInterrupt:   # a second Ctrl-C: out at once, the calls cancelled, no final counts
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a third must not interrupt the way out
        exit_within(1.0, 130)
        server.abort()
        return 130
    print(json.dumps({"final": runtime.snapshot()}), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
