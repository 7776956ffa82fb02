"""Finding a bridge host: a ready channel to one address (`open_channel`), or to one of several
(`connect_any`); why none gets ready, in words, is simbridge.client.diagnosis's.

Several addresses come as a list or "h1:p1,h2:p2" (`parse_addresses`). A client starts at
`start_index`: a hash of the host name and process id, plus one for each client this process made
before, so simulator processes spread over the addresses and the clients of one process go round
them. An address a client of this process moved away from (`mark_down`) is tried last for 30 s.

A process that is stopping (simbridge.client.stopping) gives up waiting for a server at once.
"""
import itertools
import logging
import math
import os
import socket
import threading
import time
import zlib
from typing import Dict, List, Optional, Sequence, Tuple, Union

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from simbridge.client.diagnosis import CLIENT_CERT_WANTED, TLS_FIX, TLS_REFUSED, TLS_SERVER, why_not_ready
from simbridge.client.security import ClientSecurity
from simbridge.client.stopping import Stopped, check_stopping
from simbridge.wire.addresses import address_problem, grpc_address
from simbridge.wire.errors import BridgeError
from simbridge.wire.grpc_tuning import RECONNECT_OPTIONS

log = logging.getLogger("simbridge.client")

# With other addresses to go to, how long a client tries to resume on the server it lost before
# it moves: a broken stream to a live server resumes in milliseconds; a server that stopped
# answering for this long has lost the session's open episodes anyway (they end at its timeout).
FAILOVER_AFTER_S = 2.0
_DOWN_FOR_S = 30.0
_down_since: Dict[str, float] = {}
_clients_made = itertools.count()


def mark_down(address: str) -> None:
    """A client moved away from `address`: the process's next clients try it last for a while."""
    _down_since[address] = time.monotonic()


Addresses = Union[str, Sequence[str]]


def parse_addresses(address: Addresses) -> List[str]:
    """One address, a list of them, or a comma-separated string "h1:p1,h2:p2", as a list of
    HOST:PORT or unix:PATH (each checked: simbridge.wire.addresses); a BridgeError naming the fix
    for a bad one."""
    items = address.split(",") if isinstance(address, str) else [str(a) for a in address]
    out = [a.strip() for a in items if a.strip()]
    if not out:
        raise BridgeError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"no address given ({address!r}): pass HOST:PORT, or several as \"h1:p1,h2:p2\"")
    for a in out:
        problem = address_problem(a)
        if problem:
            raise BridgeError(grpc.StatusCode.INVALID_ARGUMENT, f"{problem} (the trainer's [server] address)")
    return list(dict.fromkeys(out))


def start_index(n: int) -> int:
    """Where a new client starts in a list of n addresses: a hash of this host and process, plus
    the number of clients this process made before (deterministic for a given process; spreads
    processes over the addresses, and a process's clients round them)."""
    base = zlib.crc32(f"{socket.gethostname()}/{os.getpid()}".encode())
    return (base + next(_clients_made)) % n


def try_order(addresses: List[str], start: int) -> List[str]:
    """The addresses from `start` round, the ones a client of this process left recently last."""
    ring = addresses[start:] + addresses[:start]
    now = time.monotonic()
    recent = {a for a in ring if now - _down_since.get(a, -_DOWN_FOR_S) < _DOWN_FOR_S}
    return [a for a in ring if a not in recent] + [a for a in ring if a in recent]


def close_unwatched(channel: grpc.Channel) -> None:
    """Close a channel whose ready future was just cancelled or met: gRPC's polling thread goes
    on watching it for up to 0.2 s, and a channel closed under it raises in that thread."""
    timer = threading.Timer(0.5, channel.close)
    timer.daemon = True
    timer.start()


def close_in_background(channel: grpc.Channel) -> None:
    """Close a channel that was ready (open_channel's) without waiting: its ready future left gRPC's
    polling thread in a watch with a 0.2 s deadline, and gRPC's close waits for that watch
    (grpc/grpc#3064), so a client closed soon after it connected waited up to 0.2 s in close()
    (the 204 bad-input tests: 55 s, 24 s without). The caller has ended its session and cancelled
    its stream; the close itself cancels any call left, as before, a moment later."""
    threading.Thread(target=channel.close, name="simbridge-channel-close", daemon=True).start()


def _new_channel(address: str, security: ClientSecurity) -> grpc.Channel:
    return security.channel(address, options=[
        ("grpc.max_receive_message_length", 256 * 1024 * 1024),
        ("grpc.max_send_message_length", 256 * 1024 * 1024),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        *RECONNECT_OPTIONS])


def connect_any(addresses: List[str], connect_timeout_s: float, fix: Optional[str] = None,
                security: Optional[ClientSecurity] = None) -> Tuple[str, grpc.Channel]:
    """The first of `addresses`, in their order, whose server answers, and a ready channel to it.
    Each gets a short look in turn (one that cannot answer, an HTTP server say, is dropped at
    once) until connect_timeout_s is spent; then a BridgeError naming every address and why."""
    if len(addresses) == 1:
        return addresses[0], open_channel(addresses[0], connect_timeout_s, fix, security)
    security = security or ClientSecurity.from_env()
    fix = fix or "start a trainer at one of them, or pass the trainers' addresses"
    pending = dict.fromkeys(addresses)     # a channel each, made at its first turn
    ready = {}
    why: Dict[str, str] = {}
    deadline = time.monotonic() + connect_timeout_s
    told = False
    try:
        while True:
            for a in list(pending):
                check_stopping(f"waiting for a simbridge trainer at {', '.join(addresses)}")
                if pending[a] is None:
                    pending[a] = _new_channel(a, security)
                    ready[a] = grpc.channel_ready_future(pending[a])
                try:
                    ready[a].result(timeout=max(0.0, min(0.3, deadline - time.monotonic())))
                    say_if_starting(pending[a], a)
                    return a, security.wrap(pending.pop(a))
                except grpc.FutureTimeoutError:
                    pass
                why[a], hopeless = why_not_ready(a, pending[a], security)
                if hopeless:
                    ready[a].cancel()
                    close_unwatched(pending.pop(a))
            if not pending or time.monotonic() >= deadline:
                said = "; ".join(f"{a}: {why.get(a, 'not tried')}" for a in addresses)
                raise BridgeError(grpc.StatusCode.UNAVAILABLE,
                                  f"no simbridge trainer at any of {len(addresses)} addresses ({said}): {fix}")
            if not told:
                told = True
                log.warning("no simbridge trainer at any of %s yet; waiting up to %.0f s for one: %s",
                            ", ".join(addresses), connect_timeout_s, fix)
    finally:
        for a, ch in pending.items():
            if ch is not None:
                ready[a].cancel()
                close_unwatched(ch)


def connect_first(address: Addresses, connect_timeout_s: float,
                  security: Optional[ClientSecurity] = None) -> Tuple[List[str], str, grpc.Channel]:
    """A new client's connection: (all its addresses, the one it connected to, a ready channel)."""
    addresses = parse_addresses(address)
    chosen, channel = connect_any(try_order(addresses, start_index(len(addresses))), connect_timeout_s,
                                  security=security)
    return addresses, chosen, channel


def open_channel(address: Addresses, connect_timeout_s: float, fix: Optional[str] = None,
                 security: Optional[ClientSecurity] = None) -> grpc.Channel:
    """A channel to a simbridge server, ready; a BridgeError naming the fix when none answers
    (`fix`: what the caller's user should do instead of starting a trainer). An address without a
    port and one where something other than gRPC answers (an HTTP server) fail at once; with
    nothing listening it waits up to connect_timeout_s (a trainer may be starting), saying so once.
    Several addresses (a list or "h1:p1,h2:p2"): one of them, from start_index (connect_any).
    `security`: TLS and token (default: ClientSecurity.from_env())."""
    addresses = parse_addresses(address)
    if len(addresses) > 1:
        return connect_any(try_order(addresses, start_index(len(addresses))), connect_timeout_s, fix,
                           security)[1]
    given = addresses[0]
    address = grpc_address(given)   # shm+unix:PATH: its session and health are on gRPC at unix:PATH
    security = security or ClientSecurity.from_env()
    channel = _new_channel(address, security)
    fix = fix or f"start one with `simbridge-trainer run --address {given}`, or pass the trainer's address"
    ready = grpc.channel_ready_future(channel)
    deadline = time.monotonic() + connect_timeout_s
    told, wait_s = False, 0.3   # a first look soon: an HTTP server there fails at once
    while True:
        try:
            # In steps of at most 0.25 s: a process that stops gives up the wait within that.
            for _ in range(max(1, math.ceil(wait_s / 0.25))):
                check_stopping(f"waiting for the simbridge trainer at {address}")
                try:
                    ready.result(timeout=max(0.0, min(0.25, deadline - time.monotonic())))
                    say_if_starting(channel, address)
                    return security.wrap(channel)
                except grpc.FutureTimeoutError:
                    pass
        except Stopped:
            ready.cancel()
            close_unwatched(channel)
            raise
        what, hopeless = why_not_ready(address, channel, security)
        if hopeless or time.monotonic() >= deadline:
            ready.cancel()
            close_unwatched(channel)
            msg = f"no simbridge trainer at {address}: {what}: {fix}"
            if what.startswith(TLS_REFUSED):   # a server is there; its certificate is what fails, and `what` says the fix
                msg = f"this client refuses the server at {address}: {what}"
            elif what == TLS_SERVER:   # a server is there, and `what` says the fix
                msg = f"the server at {address} speaks TLS, this client plain text: {TLS_FIX}"
            elif what == CLIENT_CERT_WANTED:
                msg = f"the server at {address} refuses this client: {what}"
            elif security.uses_tls:
                msg += (" (this client uses TLS: a server without TLS, or a certificate that --tls-ca does not "
                        "verify or whose name does not match, fails the same way; see --tls-server-name)")
            raise BridgeError(grpc.StatusCode.UNAVAILABLE, msg) from None
        wait_s = 1.0
        if not told:
            told = True
            log.warning("no simbridge trainer at %s yet: %s; waiting up to %.0f s for one: %s", address, what,
                        connect_timeout_s, fix)


def say_if_starting(channel: grpc.Channel, address: str) -> None:
    """A trainer still starting listens and answers health NOT_SERVING, holding calls until it
    serves (trainer/run/listen.py): say so, since the client's first call will wait."""
    try:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2.0).status
    except grpc.RpcError:   # no health service, or an old server: nothing to say
        return
    if status == health_pb2.HealthCheckResponse.NOT_SERVING:
        log.warning("the simbridge trainer at %s is still starting (loading torch and its learners): this client "
                    "waits until it serves", address)
