"""`simbridge-unity`: train Unity ML-Agents behaviors with the simbridge trainer.

    simbridge-trainer run --config trainer/configs/unity_3dball.toml &
    simbridge-unity --env Build/3DBall.x86_64 --num-envs 4 --no-graphics
    simbridge-unity                                   # the Editor: press Play when asked

Each instance is a Unity player started by mlagents_envs.UnityEnvironment
(0.28.0, communication API 1.5.0: com.unity.ml-agents 1.9 to 3.0) on port
base-port + i, in a process of its own, with one simbridge session per
behavior. Every behavior becomes a policy on the trainer: its agent ids are
"<behavior>/<agent id>", so `[mapping] rules = ["3DBall*=ball"]` picks it.
Each Unity agent-episode is a simbridge episode; see sims/unity/behavior.py for
the exact mapping and sims/unity/spaces.py for the spaces (docs/unity.md).

Budgets (--max-steps counts agent decisions, --episodes finished
agent-episodes) are split evenly over the instances. Stopping (SIGTERM,
Ctrl-C, a budget) ends the open episodes as truncated at their latest
observation and closes Unity. Exit codes: 0 done, 2 simbridge server
problem, 3 Unity problem (never connected, quit, crashed, wrong version).
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import json
import math
import multiprocessing
import os
import queue
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Optional, Tuple

from simbridge.sims.unity import compat

compat.install()

from mlagents_envs.exception import (UnityCommunicatorStoppedException, UnityEnvironmentException,  # noqa: E402
                                     UnityObservationException, UnityTimeOutException, UnityWorkerInUseException)
from mlagents_envs import logging_util  # noqa: E402
from mlagents_envs.side_channel.engine_configuration_channel import EngineConfigurationChannel  # noqa: E402
from mlagents_envs.side_channel.environment_parameters_channel import EnvironmentParametersChannel  # noqa: E402
from mlagents_envs.side_channel.stats_side_channel import StatsSideChannel  # noqa: E402

from simbridge.client.policy_client import MultiAgentPolicyClient, open_channel  # noqa: E402
from simbridge.console import Console, on_hangup  # noqa: E402
from simbridge.wire.errors import BridgeError, Reason  # noqa: E402
from simbridge.sims.common import Stats, StopFlag, add_common_args, client_security, run_cli  # noqa: E402
from simbridge.sims.unity.behavior import BehaviorBridge  # noqa: E402
from simbridge.sims.unity.environment import BridgeUnityEnvironment, UnityPackageRefused  # noqa: E402
from simbridge.sims.unity.spaces import CAMERA_DTYPES, behavior_spaces  # noqa: E402

PROG = "simbridge-unity"
EDITOR_PORT = 5004
BUILD_PORT = 5005
EXIT_UNITY = 3
SUPPORTED = "com.unity.ml-agents 1.9 to 3.0 (communication API 1.5.0)"


class UnityProblem(Exception):
    """Unity could not be started or stopped talking; the message says what to do."""


# ---------------------------------------------------------------- options

def _env_param(text: str) -> Tuple[str, float]:
    key, sep, value = text.partition("=")
    try:
        if not sep or not key:
            raise ValueError
        return key, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--env-param {text!r}: use KEY=NUMBER, e.g. gravity=9.81 "
                                         f"(Unity environment parameters are floats)") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, print_every=100)
    u = p.add_argument_group("Unity")
    u.add_argument("--env", metavar="PATH", help="the Unity build (e.g. Build/3DBall.x86_64); omit to attach to the "
                                                 "Editor, which you start with Play once this waits")
    u.add_argument("--num-envs", type=int, default=1, metavar="N",
                   help="Unity instances, each on its own port (base-port + i) and process (default: %(default)s)")
    u.add_argument("--base-port", type=int, default=None, metavar="P",
                   help=f"port of instance 0 (default: {BUILD_PORT} with --env, {EDITOR_PORT} for the Editor)")
    u.add_argument("--no-graphics", action="store_true", help="start builds with -nographics -batchmode (headless)")
    u.add_argument("--timeout-wait", type=float, default=60.0, metavar="S",
                   help="seconds to wait for Unity to connect and for each of its messages (default: %(default)s)")
    u.add_argument("--time-scale", type=float, default=20.0, help="simulation speed-up (default: %(default)s)")
    u.add_argument("--width", type=int, default=84, help="screen width (default: %(default)s)")
    u.add_argument("--height", type=int, default=84, help="screen height (default: %(default)s)")
    u.add_argument("--quality-level", type=int, default=5, help="Unity quality level (default: %(default)s)")
    u.add_argument("--target-frame-rate", type=int, default=-1, help="(default: %(default)s, unbounded)")
    u.add_argument("--capture-frame-rate", type=int, default=60, help="(default: %(default)s)")
    u.add_argument("--env-param", type=_env_param, action="append", default=[], metavar="KEY=NUMBER",
                   help="environment parameter (Academy.Instance.EnvironmentParameters), repeatable")
    u.add_argument("--num-areas", type=int, default=1, help="training areas a scene should replicate, for scenes "
                                                            "that read it (default: %(default)s)")
    u.add_argument("--log-folder", metavar="DIR", help="write each player's log to DIR/Player-<i>.log")
    u.add_argument("--max-steps", type=int, default=0, metavar="N",
                   help="stop after N agent decisions in all (0: no bound; default: %(default)s)")
    u.add_argument("--action-masks", choices=["auto", "on", "off"], default="auto",
                   help="give discrete behaviors an 'action_mask' observation key: auto = if the first "
                        "decisions carry masks (default: %(default)s)")
    u.add_argument("--camera-dtype", choices=CAMERA_DTYPES, default="uint8",
                   help="how cameras (rank-3 observations) are sent: uint8, their 8-bit pixels (a quarter of "
                        "the floats' size, also in the trainer's replay), or float32 in [0, 1] (default: "
                        "%(default)s; a camera of floats needs float32)")
    u.add_argument("--group-reward-weight", type=float, default=1.0, metavar="W",
                   help="reward sent = reward + W * group reward (default: %(default)s)")
    u.add_argument("--env-args", nargs=argparse.REMAINDER, default=[],
                   help="everything after this goes to the Unity build's command line (must come last)")
    return p


def _check_args(args) -> Optional[str]:
    if args.num_envs < 1:
        return "--num-envs must be >= 1"
    if args.env is None and args.num_envs > 1:
        return "the Editor is one instance: --num-envs > 1 needs a build (--env PATH)"
    if args.timeout_wait <= 0:
        return "--timeout-wait must be > 0"
    if args.max_steps < 0 or args.episodes < 0:
        return "--max-steps and --episodes must be >= 0"
    return None


def base_port(args) -> int:
    if args.base_port is not None:
        return args.base_port
    return BUILD_PORT if args.env else EDITOR_PORT


# ---------------------------------------------------------------- one instance

def _side_channels(args):
    engine = EngineConfigurationChannel()
    engine.set_configuration_parameters(width=args.width, height=args.height, quality_level=args.quality_level,
                                        time_scale=args.time_scale, target_frame_rate=args.target_frame_rate,
                                        capture_frame_rate=args.capture_frame_rate)
    params = EnvironmentParametersChannel()
    for key, value in args.env_param:
        params.set_float_parameter(key, value)
    return [engine, params, StatsSideChannel()]


def _check_server(args) -> None:
    """Fail before starting Unity when no simbridge server answers."""
    open_channel(args.address, args.connect_timeout, security=client_security(args),
                 fix=f"start the trainer (`simbridge-trainer run --address {args.address}`) or pass the "
                     f"right --address").close()


def open_environment(args, worker_id: int, channels) -> BridgeUnityEnvironment:
    port = base_port(args) + worker_id
    where = f"the Unity build {args.env!r}" if args.env else "the Unity Editor"
    seed = (args.seed if args.seed is not None else 0) + worker_id
    if args.env is None:
        print(f"{PROG}: listening on port {port}: press Play in the Unity Editor "
              f"(waiting {args.timeout_wait:g}s)", file=sys.stderr, flush=True)
    try:
        env = BridgeUnityEnvironment(file_name=args.env, worker_id=worker_id, base_port=base_port(args), seed=seed,
                                     no_graphics=args.no_graphics, timeout_wait=args.timeout_wait,
                                     additional_args=list(args.env_args), side_channels=channels,
                                     log_folder=args.log_folder, num_areas=args.num_areas)
    except UnityWorkerInUseException:
        raise UnityProblem(f"port {port} is in use (another Unity connector or trainer?): pass a free "
                           f"--base-port (instance i uses base-port + i)") from None
    except UnityTimeOutException:
        if args.env:
            fix = (f"check that the build runs on this machine (pass --no-graphics on a headless one), that it uses "
                   f"{SUPPORTED}, that its agents' Behavior Type is Default, and that nothing blocks port {port}; "
                   f"raise --timeout-wait if it only starts slowly")
        else:
            fix = (f"press Play in the Editor within --timeout-wait seconds; the scene needs {SUPPORTED} and "
                   f"agents whose Behavior Type is Default")
        raise UnityProblem(f"{where} did not connect on port {port} within {args.timeout_wait:g}s: {fix}") from None
    except UnityPackageRefused as e:
        raise UnityProblem(f"{where} uses com.unity.ml-agents {e.package_version}, which refuses mlagents-envs "
                           f"0.28.0: upgrade the package to 1.9 or later ({SUPPORTED})") from None
    except UnityEnvironmentException as e:
        raise UnityProblem(f"cannot start {where}: {e}") from None
    if env.unity_communication_version != env.API_VERSION:
        print(f"{PROG}: warning: {where} speaks communication API {env.unity_communication_version} (package "
              f"{env.unity_package_version}); this connector is tested with {SUPPORTED}", file=sys.stderr, flush=True)
    return env


class Instance:
    """One Unity instance: its environment, behaviors and budget."""

    def __init__(self, args, worker_id: int, stats: Stats, stop: StopFlag, max_steps: int, max_episodes: int):
        self.args = args
        self.worker_id = worker_id
        self.stats = stats
        self.stop = stop
        self.max_steps = max_steps
        self.max_episodes = max_episodes
        self.bridges: Dict[str, BehaviorBridge] = {}
        self.unity_steps = 0
        self.stats_channel: Optional[StatsSideChannel] = None
        self.stopped_by = ""
        self._pool: Optional[ThreadPoolExecutor] = None

    def _bridge(self, name: str, spec, decision) -> BehaviorBridge:
        masks = self.args.action_masks
        with_mask = masks == "on" or (masks == "auto" and decision.action_mask is not None)
        spaces = behavior_spaces(spec, with_mask, self.args.camera_dtype)
        client = MultiAgentPolicyClient(self.args.address, spaces.observation_space, spaces.action_space,
                                        transport=self.args.transport, connect_timeout_s=self.args.connect_timeout,
                                        client_name=f"{PROG}[{name}]#{self.worker_id}",
                                        security=client_security(self.args))
        if not self.args.quiet:
            print(f"{PROG}#{self.worker_id}: behavior {name!r}: observation {spaces.observation_space}, "
                  f"action {spaces.action_space}", file=sys.stderr, flush=True)
        return BehaviorBridge(name, spaces, client, training=not self.args.no_training,
                              group_reward_weight=self.args.group_reward_weight, evaluation=self.args.eval)

    def _count_finished(self) -> None:
        for name, bridge in self.bridges.items():
            for ep, truncated in bridge.take_finished():
                self.stats.episode(ep.ret, truncated, {name: ep.ret})

    def _step_behaviors(self, steps: dict) -> dict:
        """Each behavior's step (its round trip to the server); concurrently when there are several,
        since they are separate sessions. Returns behavior -> ActionTuple or None."""
        work = [(name, dec, term) for name, (dec, term) in steps.items()]
        if len(work) == 1:
            name, dec, term = work[0]
            return {name: self.bridges[name].step(dec, term)}
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="behavior")
        done = self._pool.map(lambda w: self.bridges[w[0]].step(w[1], w[2]), work)
        return dict(zip([w[0] for w in work], done))

    def _must_stop(self) -> bool:
        if self.stop:
            self.stopped_by = self.stop.signal_name or "stop"
        elif self.max_steps and self.stats.steps >= self.max_steps:
            self.stopped_by = "max_steps"
        elif self.max_episodes and self.stats.episodes >= self.max_episodes:
            self.stopped_by = "episodes"
        return bool(self.stopped_by)

    def run(self) -> dict:
        channels = _side_channels(self.args)
        self.stats_channel = channels[-1]
        env = open_environment(self.args, self.worker_id, channels)
        self.stats.connected = True
        problem = None
        try:
            env.reset()
            while True:
                steps = {name: env.get_steps(name) for name in env.behavior_specs}
                for name, (dec, _) in steps.items():
                    if name not in self.bridges:
                        self.bridges[name] = self._bridge(name, env.behavior_specs[name], dec)
                if self._must_stop():
                    for name, (dec, term) in steps.items():
                        self.stats.cut += self.bridges[name].finish(dec, term)
                    self._count_finished()
                    break
                for name, actions in self._step_behaviors(steps).items():
                    self.stats.steps += len(steps[name][0])
                    if actions is not None:
                        env.set_actions(name, actions)
                self._count_finished()
                env.step()
                self.unity_steps += 1
        except UnityCommunicatorStoppedException:
            problem = (f"the Unity environment on port {base_port(self.args) + self.worker_id} quit after "
                       f"{self.unity_steps} steps; its open episodes end truncated")
        except UnityTimeOutException as e:
            problem = f"{e}: the Unity environment stopped answering; its open episodes end truncated"
        except UnityEnvironmentException as e:  # the player process exited
            problem = f"the Unity environment stopped: {e}; its open episodes end truncated"
        except UnityObservationException as e:  # a sensor the connector cannot carry: named, no traceback
            problem = f"{e}; its open episodes end truncated"
        finally:
            if self._pool is not None:
                self._pool.shutdown()
            for b in self.bridges.values():
                try:
                    self.stats.cut += b.close()
                except BridgeError:
                    pass  # the server is gone too: nothing left to tell it
            env.close()
        if problem:
            raise UnityProblem(problem)
        return self.summary()

    def summary(self) -> dict:
        out = {"worker_id": self.worker_id, "port": base_port(self.args) + self.worker_id,
               "unity_steps": self.unity_steps, "stopped_by": self.stopped_by,
               "behaviors": {n: {"observation_space": str(b.spaces.observation_space),
                                 "action_space": str(b.spaces.action_space), "decisions": b.decisions,
                                 "session_losses": b.session_losses}
                             for n, b in self.bridges.items()}}
        if self.stats_channel is not None:
            got = self.stats_channel.get_and_reset_stats()
            if got:
                out["unity_stats"] = {k: [float(v) for v, _ in vals][-1] for k, vals in got.items() if vals}
        return out


def run_instance(args, worker_id: int) -> Tuple[int, dict]:
    """Run one instance in this process (simbridge.sims.common.run_cli prints its JSON summary);
    returns (exit code, summary)."""
    share = max(1, args.num_envs)
    max_steps = math.ceil(args.max_steps / share) if args.max_steps else 0
    max_episodes = math.ceil(args.episodes / share) if args.episodes else 0
    stats = Stats(f"{PROG}#{worker_id}", args.print_every, args.quiet)
    # which instance, also in a failed one's summary (Instance.run() gives them again on success)
    extra: Dict[str, object] = {"worker_id": worker_id, "port": base_port(args) + worker_id}

    def body(stop: StopFlag, stats: Stats) -> dict:
        _check_server(args)
        try:
            extra.update(Instance(args, worker_id, stats, stop, max_steps, max_episodes).run())
        except UnityProblem as e:
            extra["error"] = str(e)
            print(f"{PROG}#{worker_id}: error: {e}", file=sys.stderr, flush=True)
        except BridgeError as e:
            if e.reason == Reason.SPACE_MISMATCH and args.camera_dtype == "uint8" and "uint8" in e.message:
                raise BridgeError(e.code, f"{e.message}. A policy that learned its cameras as floats (the "
                                  f"connector's --camera-dtype float32, the only form before bytes) takes them so: "
                                  f"run the connector with --camera-dtype float32", e.reason) from None
            raise
        return extra

    code = run_cli(PROG, body, stats)
    if code == 0 and "error" in extra:
        code = EXIT_UNITY
    return code, {**stats.summary(), **extra}


# ---------------------------------------------------------------- several instances

def _child(args, worker_id: int, results) -> None:
    code, summary = run_instance(args, worker_id)
    results.put((worker_id, code, json.dumps(summary)))


def run_many(args) -> int:
    """One process per instance (each prints its own summary); the parent forwards SIGTERM,
    SIGINT and SIGHUP (its terminal closed; not where ignored) as SIGTERM, and prints the merged
    summary last."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(args, i, results), name=f"{PROG}#{i}") for i in range(args.num_envs)]
    for p in procs:
        p.start()

    def forward(signum, frame):
        for p in procs:
            if p.pid and p.exitcode is None:
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    hup = on_hangup(forward)
    if hup is not None:
        old[signal.SIGHUP] = hup
    got: Dict[int, Tuple[int, dict]] = {}
    try:
        while len(got) < len(procs):
            try:
                wid, code, text = results.get(timeout=0.5)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break  # a child died without a result
                continue
            got[wid] = (code, json.loads(text))
        for p in procs:
            p.join()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    codes = [got[i][0] if i in got else (procs[i].exitcode or 1) for i in range(len(procs))]
    instances = [got[i][1] if i in got else {"worker_id": i, "error": f"exited with code {procs[i].exitcode}"}
                 for i in range(len(procs))]
    keys = ("episodes", "steps", "terminated", "truncated", "cut_at_exit")
    total = {k: sum(s.get(k) or 0 for s in instances) for k in keys}
    print(json.dumps({**total, "num_envs": args.num_envs, "instances": instances}), file=Console(sys.stdout),
          flush=True)
    return max(codes)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    problem = _check_args(args)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    if args.log_folder:
        # mlagents-envs wants it absolute, and the player does not make it (a missing one ended the
        # player at its first log line, seen as "Environment shut down")
        args.log_folder = os.path.abspath(args.log_folder)
        try:
            os.makedirs(args.log_folder, exist_ok=True)
        except OSError as e:
            print(f"{PROG}: error: --log-folder {args.log_folder}: {e.strerror}", file=sys.stderr)
            return 2
    # mlagents_envs' loggers print to stdout themselves ("[INFO] Connected new brain: ...").
    logging_util.set_log_level(logging_util.WARNING if args.quiet else logging_util.INFO)
    if args.num_envs == 1:
        return run_instance(args, 0)[0]
    return run_many(args)


if __name__ == "__main__":
    sys.exit(main())
