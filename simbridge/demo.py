"""`make demo` (python -m simbridge.demo): a bridge server and three simulators, live.

Starts a bridge server serving a random policy on a free loopback port, waits
for its health check, launches three reference simulators as separate
processes (CartPole with one env, CartPole with 8 envs stepped together, and
turn-based Nim with two players), shows the server's progress lines for
--seconds, then stops everything (SIGTERM, then kill) and prints a summary.
"""
import argparse
import json
import signal
import sys
import threading
import time
from typing import Dict, List, Optional

from simbridge.launch import Proc, free_port, python_module, start_server

# name, what it is, python -m argv (address added)
SIMULATORS = [
    ("cartpole", "gym_sim CartPole-v1, 1 env", ["sims.gym_sim", "--env", "CartPole-v1", "--seed", "1"]),
    ("cartpole-x8", "gym_sim CartPole-v1, 8 envs batched",
     ["sims.gym_sim", "--env", "CartPole-v1", "--slots", "8", "--seed", "2"]),
    ("nim", "multiagent_sim turn_based (Nim)", ["sims.multiagent_sim", "--game", "turn_based", "--seed", "3"]),
]


class _Console:
    """Prints child output with a [name] prefix; keeps the JSON lines (summaries) aside."""

    def __init__(self):
        self._lock = threading.Lock()
        self.json: Dict[str, dict] = {}

    def say(self, msg: str) -> None:
        with self._lock:
            print(f"demo: {msg}", flush=True)

    def on_line(self, name: str, line: str) -> None:
        if line.startswith("{"):
            try:
                self.json[name] = json.loads(line)
                return
            except ValueError:
                pass
        with self._lock:
            print(f"[{name}] {line}", flush=True)


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _summary(console: _Console, sims: List[Proc], seconds: float) -> List[str]:
    out = [f"summary after {seconds:.1f} s:"]
    final = console.json.get("server", {}).get("final")
    if final:
        pol = ", ".join(f"{p} {_fmt(r)}" for p, r in sorted(final["policy_return_mean"].items()))
        out.append(f"  server        episodes {final['episodes']:6d}  env steps {final['env_steps']:8d}  "
                   f"return mean by policy: {pol or '-'}")
    for (name, what, _), proc in zip(SIMULATORS, sims):
        s = console.json.get(name)
        if s is None:
            out.append(f"  {name:12s}  no summary (exit code {proc.poll()})")
            continue
        extra = ""
        if s.get("first_mover_win_rate") is not None:
            extra = f"  first mover won {s['first_mover_win_rate']:.0%}"
        out.append(f"  {name:12s}  episodes {s['episodes']:6d}  env steps {s['steps']:8d}  "
                   f"return mean {_fmt(s['return_mean']):>7s}  ({s['steps_per_s']:.0f} steps/s; {what}){extra}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m simbridge.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="how long to let it run (default: %(default)s)")
    p.add_argument("--print-every", type=float, default=2.0, help="seconds between server progress lines (default: %(default)s)")
    args = p.parse_args(argv)

    def _interrupt(*_):
        raise KeyboardInterrupt
    # Ctrl-C (also when started in the background) and SIGTERM: stop everything cleanly.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)

    console = _Console()
    address = f"127.0.0.1:{free_port()}"
    console.say(f"starting a bridge server (random policy) on {address} ...")
    t0 = time.monotonic()
    try:
        server = start_server("server", python_module("simbridge.server_cli", "--address", address,
                                                      # Nim's players have other spaces than CartPole's:
                                                      # they get a policy of their own.
                                                      "--policy-map", "player_*=nim",
                                                      "--print-every", args.print_every, "--log-level", "WARNING"),
                              address, timeout=60.0, on_line=console.on_line)
    except RuntimeError as e:
        console.say(f"the server did not start: {e}")
        return 1
    except KeyboardInterrupt:
        console.say("interrupted while the server was starting")
        return 130
    console.say(f"server healthy after {time.monotonic() - t0:.1f} s; starting {len(SIMULATORS)} simulators:")
    sims: List[Proc] = []
    failed: Optional[str] = None
    interrupted = False
    t_run = time.monotonic()
    try:
        for name, what, cmd in SIMULATORS:
            proc = Proc(name, python_module(*cmd, "--address", address, "--quiet"), console.on_line)
            sims.append(proc)
            console.say(f"  {name:12s} pid {proc.pid:7d}  {what}")
        console.say(f"running for {args.seconds:.0f} s (server progress every {args.print_every:g} s) ...")
        t_run = time.monotonic()
        deadline = t_run + args.seconds
        while time.monotonic() < deadline:
            if server.poll() is not None:
                failed = f"the server exited early (code {server.poll()})"
                break
            dead = [s for s in sims if s.poll() is not None]
            if dead:
                failed = ", ".join(f"{s.name} exited early (code {s.poll()})" for s in dead)
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        interrupted = True
        console.say("interrupted")
    finally:
        elapsed = time.monotonic() - t_run
        console.say("stopping the simulators, then the server ...")
        for s in sims:
            s.stop(timeout=10.0)
        server.stop(timeout=10.0)
    for line in _summary(console, sims, elapsed):
        console.say(line)
    if failed:
        console.say(f"FAILED: {failed}")
        return 1
    if interrupted:
        return 130
    console.say("done. Try it by hand: `simbridge-server` in one shell, `simbridge-sim --slots 8` in another.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
