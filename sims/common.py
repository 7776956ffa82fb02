"""What the reference simulators share: CLI options, stop signals, stats, exit codes."""
import argparse
import collections
import json
import signal
import sys
import threading
import time
from typing import Callable, Dict, Optional, TypeVar

import gymnasium as gym
import numpy as np

from simbridge.client.stopping import Stopped, stop_waiting
from simbridge.client.policy_client import SessionLost
from simbridge.client.security import ClientSecurity, SecuritySettingError
from simbridge.console import Console, StopEvent, on_hangup
from simbridge.wire.errors import BridgeError, Reason


def add_common_args(p: argparse.ArgumentParser, print_every: int = 20) -> None:
    p.add_argument("--address", default="127.0.0.1:50051",
                   help="host:port (or unix:PATH, shm+unix:PATH) of the simbridge server, or several as "
                        "h1:p1,h2:p2 (connects to one, moves to another when it goes away: docs/scaling.md; "
                        "default: %(default)s)")
    p.add_argument("--episodes", type=int, default=0,
                   help="episodes to run, then exit (0: run until stopped; default: %(default)s)")
    p.add_argument("--transport", choices=["stream", "unary"], default="stream",
                   help="one bidirectional stream (default) or one RPC per call")
    p.add_argument("--seed", type=int, default=None, help="seed for the env(s) and the simulator's choices")
    p.add_argument("--no-training", action="store_true",
                   help="run episodes with training_enabled=False (the server collects no experience)")
    p.add_argument("--eval", action="store_true",
                   help="evaluation episodes: the policy's greedy actions, never trained, returns reported "
                        "apart (eval_return_mean)")
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the final JSON summary")
    p.add_argument("--print-every", type=int, default=print_every, metavar="N",
                   help="a progress line every N episodes (default: %(default)s)")
    p.add_argument("--connect-timeout", type=float, default=30.0, metavar="S",
                   help="seconds to wait at startup for a server to listen (a trainer started beside the "
                        "simulator binds its port within seconds, then holds its calls until it serves; "
                        "default: %(default)s)")
    g = p.add_argument_group("security (docs/security.md)")
    g.add_argument("--tls-ca", metavar="PEM", default="",
                   help="connect with TLS, verifying the server with these root certificates")
    g.add_argument("--tls-cert", metavar="PEM", default="", help="client certificate, for mutual TLS")
    g.add_argument("--tls-key", metavar="PEM", default="", help="the private key of --tls-cert")
    g.add_argument("--tls-server-name", metavar="NAME", default="",
                   help="the name to expect in the server's certificate (default: the host of --address)")
    g.add_argument("--auth-token-file", metavar="FILE", default="",
                   help="send this token on every call (default: $SIMBRIDGE_AUTH_TOKEN, if set)")


def client_security(args) -> ClientSecurity:
    """The TLS and token settings of add_common_args' flags."""
    return ClientSecurity.from_files(tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
                                     tls_server_name=args.tls_server_name, auth_token_file=args.auth_token_file)


class StopFlag:
    """Set by SIGTERM / SIGINT / SIGHUP (a closed terminal; not where ignored, as under nohup), or
    by request (run_cli's when stdout's reader left): the loop ends its open episodes (truncated)
    and exits cleanly.
    The clients stop waiting for the server at once (simbridge.client.connection.stop_waiting):
    a simulator connecting, reconnecting or waiting for an answer that does not come stops within
    a second, saying what it was waiting for.

    A second SIGINT raises KeyboardInterrupt for an impatient user.
    """

    def __init__(self):
        self._event = StopEvent()   # set by the signal handlers: simbridge/console.py
        self.signal_name: Optional[str] = None

    def install(self) -> "StopFlag":
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handler)
            signal.signal(signal.SIGINT, self._handler)
            on_hangup(self._handler)
        return self

    def _handler(self, signum, frame):
        if self._event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.request(signal.Signals(signum).name)

    def request(self, why: str) -> None:
        """Stop as a signal does; `why` (a signal's name) is said where the stop is."""
        if self.signal_name is None:
            self.signal_name = why
        self._event.set()
        stop_waiting()

    def set(self) -> None:
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()


class Stats:
    """Counts episodes and steps, prints progress lines, builds the JSON summary."""

    def __init__(self, prog: str, print_every: int = 20, quiet: bool = False, window: int = 20):
        self.prog = prog
        self.print_every = max(1, print_every)
        self.quiet = quiet
        self.episodes = 0           # episodes that ended by themselves (terminal or time limit)
        self.cut = 0                # episodes ended (truncated) because the simulator stopped
        self.terminated = 0
        self.truncated = 0
        self.steps = 0              # env steps (one per env copy per step)
        self.off_policy_steps = 0   # steps whose action the simulator chose (log_action)
        self.returns = []
        self.recent = collections.deque(maxlen=window)
        self.agent_returns: Dict[str, list] = collections.defaultdict(list)
        self.connected = False
        self.kept: Dict[str, object] = {}   # the body's clients, across its runs (keep_client)
        # Sections read when the summary is made, whichever way the run ends (a normal end, a signal
        # while the client waited for a server, an error): a local client's own counts, say.
        self.reports: Dict[str, Callable[[], dict]] = {}
        self._t0 = time.monotonic()
        self._last_t = self._t0
        self._last_steps = 0
        # progress lines and the JSON summary; run_cli stops the simulator when its reader leaves
        self.out = Console(sys.stdout)

    def episode(self, ret: float, truncated: bool, agent_returns: Optional[Dict[str, float]] = None) -> None:
        self.episodes += 1
        self.truncated += bool(truncated)
        self.terminated += not truncated
        self.returns.append(float(ret))
        self.recent.append(float(ret))
        for aid, r in (agent_returns or {}).items():
            self.agent_returns[aid].append(float(r))
        if not self.quiet and self.episodes % self.print_every == 0:
            now = time.monotonic()
            rate = (self.steps - self._last_steps) / max(now - self._last_t, 1e-9)
            self._last_t, self._last_steps = now, self.steps
            print(f"{self.prog}: episodes {self.episodes:6d} | return mean({len(self.recent)}) "
                  f"{np.mean(self.recent):8.2f} | steps {self.steps:8d} ({rate:7.0f}/s)", file=self.out, flush=True)

    def summary(self, **extra) -> dict:
        elapsed = time.monotonic() - self._t0
        out = {
            "episodes": self.episodes,
            "steps": self.steps,
            "return_mean": round(float(np.mean(self.returns)), 4) if self.returns else None,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "cut_at_exit": self.cut,
            "off_policy_steps": self.off_policy_steps,
            "elapsed_s": round(elapsed, 3),
            "steps_per_s": round(self.steps / max(elapsed, 1e-9), 1),
        }
        if self.agent_returns:
            out["agent_return_mean"] = {a: round(float(np.mean(v)), 4)
                                        for a, v in sorted(self.agent_returns.items())}
        for key, report in self.reports.items():
            out[key] = report()
        out.update(extra)
        return out


def cast_to_space(space: gym.Space, value):
    """Give Box leaves the space's dtype (the server checks dtypes strictly)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: cast_to_space(space[k], value[k]) for k in space.spaces}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(cast_to_space(s, v) for s, v in zip(space.spaces, value))
    if isinstance(space, gym.spaces.Box):
        return np.asarray(value, dtype=space.dtype)
    return value


Client = TypeVar("Client")


def keep_client(stats: Stats, make: Callable[[], Client], key: str = "") -> Client:
    """The body's client `key`, made on the body's first run. After SessionLost the client is
    already on its new session and run_cli runs the body again: it gets the same client back,
    so that one reconnect makes one session (a new client would open a second)."""
    if key not in stats.kept:
        stats.kept[key] = make()
    return stats.kept[key]


def run_cli(prog: str, body: Callable[[StopFlag, Stats], dict], stats: Stats) -> int:
    """Run a simulator body; map BridgeError to exit 2 with its message (no traceback).

    When the server restarted (a trainer daemon resumed from its checkpoint),
    the client reconnects but the open episodes are gone: the body runs again
    with new episodes, keeping the counts, instead of exiting (on the same client and its
    new session where the body keeps it: keep_client). Stopped by a signal while waiting for
    the server (connecting, reconnecting, or an answer that does not come): exit 0 at once."""
    stop = StopFlag().install()
    stats.out.on_gone = lambda: stop.request("its output closed")   # `simbridge-sim | head`
    try:
        while True:
            try:
                extra = body(stop, stats) or {}
                break
            except SessionLost as e:
                kept = e.new_session_id is not None and any(
                    getattr(c, "session_id", None) == e.new_session_id for c in stats.kept.values())
                if stop or not kept:
                    e.close_connection()  # the body starts over with a client of its own
                if stop:
                    extra = {}
                    break
                print(f"{prog}: {e.message}; going on with new episodes", file=sys.stderr, flush=True)
    except Stopped as e:
        print(f"{prog}: {e.message} ({stop.signal_name or 'a signal'})", file=sys.stderr, flush=True)
        print(json.dumps(stats.summary(stopped=e.message)), file=stats.out, flush=True)
        return 0
    except SecuritySettingError as e:
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        return 2
    except BridgeError as e:
        if e.reason == Reason.TRAINING_OVER:   # the learner ended the session on purpose: a normal end
            if not stats.quiet:
                print(f"{prog}: {e}: stopping", file=sys.stderr, flush=True)
            print(json.dumps(stats.summary(ended="training_over")), file=stats.out, flush=True)
            return 0
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        if stats.connected:
            print(json.dumps(stats.summary(error=str(e))), file=stats.out, flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130
    if stop.signal_name and not stats.quiet:
        print(f"{prog}: stopped ({stop.signal_name})", file=sys.stderr, flush=True)
    print(json.dumps(stats.summary(**extra)), file=stats.out, flush=True)
    return 0
