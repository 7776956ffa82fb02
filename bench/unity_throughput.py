#!/usr/bin/env python
"""Decisions/s of the Unity connector through the bridge against the same Unity test peer
driven by a plain mlagents_envs UnityEnvironment loop (no bridge), in one run.

The peer is tests/sims/unity_peer (a Python stand-in for a Unity player, the "build"). The
bridge side is `simbridge-server` with its random policy (bench/throughput.py starts it) and
`python -m simbridge.sims.unity.connector` as a process, as a user runs them. The connector
has no clock of its own, so it runs twice, with --max-steps SHORT and LONG agent decisions:
(LONG - SHORT) / (wall LONG - wall SHORT) takes the start-up (Unity's launch, the session)
out. The bare loop times its own steps after a warm-up, random actions for every agent that
asked, the peer's work per agent included in both.

    nice -n 5 .venv/bin/python bench/unity_throughput.py --agents 8 --rounds 2   # ~1 min

--nets tcp,uds,shm runs the connector pair once per transport in each round (the bridge on
HOST:PORT, unix:PATH, shm+unix:PATH: docs/transports.md), keyed `<net>_bridge_decisions_per_s`
and `<net>_bridge_vs_bare` beside the one bare loop of the round; tcp alone keeps the old keys.
"""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):   # run as `python bench/unity_throughput.py`: the checkout, for `bench.`
    sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402  (server start, child bookkeeping)
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "sims"))
from unity_peer.harness import PEER, free_base_port  # noqa: E402


def _child_env() -> dict:
    return dict(os.environ, SIMBRIDGE_PEER_PYTHON=sys.executable,
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def connector_wall(address: str, decisions: int, agents: int, scene: str, tmp: Path) -> float:
    cmd = [sys.executable, "-m", "simbridge.sims.unity.connector", "--address", address, "--env", str(PEER),
           "--base-port", str(free_base_port()), "--timeout-wait", "30", "--connect-timeout", "10",
           "--log-folder", str(tmp), "--no-graphics", "--max-steps", str(decisions),
           "--env-args", "--scene", scene, "--agents", str(agents)]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_child_env(), cwd=str(REPO))
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise RuntimeError(f"connector exited {run.returncode}:\n{run.stderr[-2000:]}")
    summary = json.loads([x for x in run.stdout.splitlines() if x.startswith("{")][-1])
    if summary["steps"] < decisions:
        raise RuntimeError(f"connector stopped after {summary['steps']} of {decisions} decisions")
    return wall


def bare_rate(decisions: int, agents: int, scene: str, tmp: Path) -> float:
    """Decisions/s of a plain UnityEnvironment loop against the peer (after 200 warm-up steps)."""
    import simbridge.sims.unity  # noqa: F401  (mlagents_envs 0.28's protos on protobuf 7: compat.py)
    from mlagents_envs.base_env import ActionTuple
    from mlagents_envs.environment import UnityEnvironment

    os.environ["SIMBRIDGE_PEER_PYTHON"] = sys.executable
    env = UnityEnvironment(file_name=str(PEER), base_port=free_base_port(), no_graphics=True, timeout_wait=30,
                           log_folder=str(tmp), additional_args=["--scene", scene, "--agents", str(agents)])
    try:
        env.reset()
        done_decisions, t0 = 0, None
        for step in range(10**7):
            if step == 200:
                done_decisions, t0 = 0, time.perf_counter()
            for name, spec in env.behavior_specs.items():
                steps, _ = env.get_steps(name)
                if len(steps):
                    done_decisions += len(steps)
                    env.set_actions(name, spec.action_spec.random_action(len(steps)) if spec.action_spec
                                    else ActionTuple())
            env.step()
            if t0 is not None and done_decisions >= decisions:
                return done_decisions / (time.perf_counter() - t0)
        raise RuntimeError("unreachable")
    finally:
        env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--scene", default="ball")
    p.add_argument("--short", type=int, default=1000, help="decisions of the short connector run")
    p.add_argument("--long", type=int, default=9000, help="decisions of the long connector run")
    p.add_argument("--rounds", type=int, default=2, help="connector pair and bare loop, alternating")
    p.add_argument("--nets", default="tcp", help="transports for the bridge, comma list of tcp, uds, shm")
    a = p.parse_args()
    import tempfile

    nets = [n.strip() for n in a.nets.split(",") if n.strip()]
    if not nets or set(nets) - {"tcp", "uds", "shm"}:
        p.error(f"--nets {a.nets!r}: a comma list of tcp, uds, shm")
    key = {n: ("" if nets == ["tcp"] else f"{n}_") for n in nets}
    children = harness.Children()
    out = {"agents": a.agents, "scene": a.scene, "load_before": os.getloadavg()[0], "bare_decisions_per_s": [],
           **{f"{key[n]}bridge_decisions_per_s": [] for n in nets}}
    try:
        with tempfile.TemporaryDirectory(prefix="sb-unity-bench-") as tmp:
            for _ in range(a.rounds):
                for net in nets:
                    proc, address = harness.start_bridge_server(children, net=net)
                    short = connector_wall(address, a.short, a.agents, a.scene, Path(tmp))
                    long_ = connector_wall(address, a.long, a.agents, a.scene, Path(tmp))
                    children.stop(proc)
                    # A difference that start-up noise could swamp gives no rate (one printed 79x the bare
                    # loop): null, with the two walls beside it.
                    valid = long_ - short > 0.25 * long_
                    out[f"{key[net]}bridge_decisions_per_s"].append(
                        round((a.long - a.short) / (long_ - short)) if valid else None)
                    out.setdefault(f"{key[net]}walls_short_long_s", []).append([round(short, 2), round(long_, 2)])
                out["bare_decisions_per_s"].append(round(bare_rate(a.long - a.short, a.agents, a.scene, Path(tmp))))
    finally:
        children.stop_all()
    for net in nets:
        out[f"{key[net]}bridge_vs_bare"] = [round(b / r, 2) if b and r else None for b, r in
                                            zip(out[f"{key[net]}bridge_decisions_per_s"], out["bare_decisions_per_s"])]
    out["load"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
