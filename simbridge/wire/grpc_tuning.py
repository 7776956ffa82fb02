"""Which TCP path gRPC takes, chosen before grpc is imported.

Since grpcio 1.6x, gRPC moves TCP bytes through its EventEngine, which hands
each message across a few more threads than its older iomgr path did. For a
simulator in lockstep with its policy that is pure latency: on the 2-core
development VM the EventEngine path cost about 15% more server CPU per Step
and 15-35% of lockstep throughput (docs/benchmarks.md, "gRPC's TCP path").

simbridge's own programs (server, trainer, reference simulators, benchmark)
therefore call `prefer_iomgr_tcp()` before importing grpc, and so do their
child processes, which inherit the setting. A program of yours that uses the
client library may call it too, first thing. It only ever fills in
GRPC_EXPERIMENTS when the user left it unset, and
SIMBRIDGE_GRPC_EVENT_ENGINE=1 keeps gRPC's own default. Should a later grpcio
drop these experiments, gRPC logs that it ignores them and carries on.
"""
import os

IOMGR_TCP = "-event_engine_client,-event_engine_listener"

# Channel options for every simbridge client: gRPC waits 1 s after a refused connection, then
# backs off by 1.6x, so a simulator started a few seconds before its server would connect
# seconds late. Retrying every 0.1-1 s costs nothing on loopback and little elsewhere.
# grpc.min_reconnect_backoff_ms is not a backoff at all: gRPC takes it as one connection attempt's
# deadline, handshake included. At 100 ms (the attempt's deadline then grows with the backoff to
# its 1 s cap) a server whose HTTP/2 SETTINGS came after a second (a slow link with TLS, a loaded
# host) was never reached; gRPC's default, 20 s, would hold a client on a host that accepts but
# never answers for 20 s before it fails over. 2 s: both (tests/client/test_grpc_tuning.py,
# test_failover.py).
CONNECT_ATTEMPT_MS = 2000
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 1000),
                     ("grpc.min_reconnect_backoff_ms", CONNECT_ATTEMPT_MS)]


def prefer_iomgr_tcp() -> bool:
    """Ask gRPC for its iomgr TCP path, unless the user chose otherwise. True if set here.

    Also gRPC's own log at errors only, where the user set no GRPC_VERBOSITY: grpcio 1.85 prints
    INFO lines ("Handshake failed ..." twice for each refused TLS connection, a trainer's for every
    probe of its port) around the program's own words, which name the fix."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if "GRPC_EXPERIMENTS" in os.environ or os.environ.get("SIMBRIDGE_GRPC_EVENT_ENGINE") == "1":
        return False
    os.environ["GRPC_EXPERIMENTS"] = IOMGR_TCP
    # On that path a channel nobody is polling (a client sleeping between connection attempts)
    # notices a finished connect only at gRPC's backup poll, every 5 s by default: a simulator
    # started before its server would connect up to 5 s late. Every 0.2 s costs nothing.
    os.environ.setdefault("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "200")
    return True
