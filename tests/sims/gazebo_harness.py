"""Running real gz-sim 8 (Harmonic) worlds with the simbridge plugin against a real trainer daemon.

Used by tests/sims/test_gazebo_sim.py and bench/gazebo_farm.py. Nothing here builds Gazebo: it finds
an installed prefix (docs/gazebo.md) and skips the caller otherwise.

Every world runs as its own `gz sim -s` process with GZ_IP=127.0.0.1 (gz-transport's discovery stays
on loopback) and a GZ_PARTITION of its own, so that parallel worlds, and other test runs on the same
machine, never see each other's topics and services (`/world/cartpole/control` is the same name in
every cart-pole world). Processes are stopped by their own PID, every wait is bounded.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "sims" / "gazebo"
WORLDS = SOURCE / "worlds"
CACHE_PREFIX = Path.home() / ".cache" / "simbridge" / "gz-harmonic"
NO_PREFIX = ("no gz-sim 8 (Harmonic) found: set GZ_PREFIX, put a prefix in ~/.cache/simbridge/gz-harmonic "
             "or gz on PATH (docs/gazebo.md)")

ENDED = re.compile(r"simbridge: episode (\d+) ended after (\d+) actions, by (its limits|a world reset from outside)")
SUMMARY = re.compile(r"simbridge: (\d+) episodes ended \((\d+) actions\), (\d+) open \((\d+) actions\), "
                     r"(\d+) sessions lost")


def _is_prefix(prefix: Path) -> bool:
    return (prefix / "bin" / "gz").exists() and any(prefix.glob("lib*/**/cmake/gz-sim8/gz-sim8-config.cmake"))


def find_prefix() -> Optional[Path]:
    """$GZ_PREFIX, else ~/.cache/simbridge/gz-harmonic, else the prefix of `gz` on PATH; None if none has gz-sim 8."""
    candidates = []
    if os.environ.get("GZ_PREFIX"):
        candidates.append(Path(os.environ["GZ_PREFIX"]))
    candidates.append(CACHE_PREFIX)
    gz = shutil.which("gz")
    if gz:
        candidates.append(Path(gz).resolve().parent.parent)
    for prefix in candidates:
        if _is_prefix(prefix):
            return prefix
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gz_env(prefix: Path, plugin_dir: Path, address: str, partition: Optional[str] = None) -> dict:
    """The environment one `gz sim` process needs: the prefix's libraries (they carry no RPATH), gz-tools'
    command files (gz is a Ruby front-end), the plugin's folder, loopback discovery, its own partition."""
    env = dict(os.environ)
    libs = [str(p) for p in (prefix / "lib", prefix / "lib64") if p.exists()]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    env["GZ_CONFIG_PATH"] = str(prefix / "share" / "gz")
    env["GZ_SIM_SYSTEM_PLUGIN_PATH"] = str(plugin_dir)
    env["PATH"] = str(prefix / "bin") + os.pathsep + env.get("PATH", "")
    env["GZ_IP"] = "127.0.0.1"
    env["GZ_PARTITION"] = partition or f"simbridge-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    env["SIMBRIDGE_ADDRESS"] = address   # wins over the world's <address>
    env.pop("GZ_SIM_RESOURCE_PATH", None)
    return env


def stop_process(proc: Optional[subprocess.Popen], sig: int = signal.SIGTERM, timeout: float = 30.0) -> Optional[int]:
    """Signal one process by its PID and wait for it, bounded; SIGKILL if it does not go."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    return proc.returncode


def wait_until(pred: Callable[[], object], timeout: float, what: str, proc_checks=(), poll: float = 0.25):
    """Poll pred until it is true, for at most `timeout` s; fail early if a process in proc_checks exits."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        for name, proc, log in proc_checks:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode} while waiting for {what}:\n"
                                     + tail(log))
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def trainer_executable() -> str:
    here = Path(sys.executable).parent / "simbridge-trainer"
    return str(here) if here.exists() else (shutil.which("simbridge-trainer") or "simbridge-trainer")


def with_plugin_params(sdf: Path, out_dir: Path, **params) -> Path:
    """A copy of the world (in out_dir) whose simbridge <plugin> block has these parameters too."""
    text = sdf.read_text()
    block = text.index('<plugin filename="simbridge-gz-system"')
    end = text.index("</plugin>", block)
    extra = "".join(f"<{k}>{v}</{k}>" for k, v in params.items())
    path = Path(out_dir) / sdf.name
    path.write_text(text[:end] + extra + text[end:])
    return path


def camera_world(out_dir: Path, width: int, height: int, update_rate: float = 0, sensor_width: Optional[int] = None,
                 image_format: str = "L8", render_ms: float = 1.0, **params) -> Path:
    """The pendulum world with sims/gazebo/tests/fake_camera_system.cpp's stand-in camera on its model
    (width x height, image_format, update_rate Hz: 0 every iteration; sensor_width: another width than
    the plugin is told; render_ms: the wall time a frame takes it) and the plugin reading it as <camera_topic>."""
    path = with_plugin_params(WORLDS / "pendulum.sdf", out_dir, camera_topic="/pendulum/camera", camera_width=width,
                              camera_height=height, camera_format=image_format, **params)
    text = path.read_text()
    camera = ('<plugin filename="simbridge-gz-test-camera" name="simbridge::gazebo::FakeCamera">'
              f'<topic>/pendulum/camera</topic><joint>hinge</joint><width>{sensor_width or width}</width>'
              f'<height>{height}</height><format>{image_format}</format><update_rate>{update_rate}</update_rate>'
              f'<render_ms>{render_ms}</render_ms></plugin>')
    end = text.rindex("</model>")
    path.write_text(text[:end] + camera + text[end:])
    return path


class Trainer:
    """`simbridge-trainer run` as its own process, on loopback, with its output in LOGDIR/../NAME.log."""

    def __init__(self, logdir: Path, address: Optional[str] = None, config: Optional[Path] = None,
                 overrides=(), resume: bool = False, name: str = "trainer"):
        self.logdir = Path(logdir)
        self.address = address or f"127.0.0.1:{free_port()}"
        self.log = self.logdir.parent / f"{name}.log"
        cmd = [trainer_executable(), "run", "--address", self.address, "--logdir", str(self.logdir),
               "--device", "cpu"]
        if config is not None:
            cmd += ["--config", str(config)]
        if resume:
            cmd.append("--resume")
        for o in overrides:
            cmd += ["--set", o]
        self.logdir.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, cwd=ROOT)

    def metrics(self) -> list:
        path = self.logdir / "metrics.jsonl"
        if not path.exists():
            return []
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:   # a line being written
                pass
        return rows

    def last(self) -> dict:
        rows = self.metrics()
        return rows[-1] if rows else {}

    def wait_serving(self, timeout: float = 180.0) -> None:
        """The bridge answers gRPC health checks (torch imports and the learner start first)."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            def serving():
                try:
                    return stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0).status == \
                        health_pb2.HealthCheckResponse.SERVING
                except grpc.RpcError:
                    return False
            wait_until(serving, timeout, f"the trainer to serve on {self.address}",
                       [("the trainer", self.proc, self.log)], poll=0.3)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> Optional[int]:
        try:
            return stop_process(self.proc, sig, timeout)
        finally:
            self._out.close()


class World:
    """One `gz sim -s -r` process (its own partition) running `world` with the plugin; output in LOG."""

    def __init__(self, prefix: Path, plugin_dir: Path, world: Path, address: str, log: Path,
                 iterations: Optional[int] = None, partition: Optional[str] = None, verbosity: int = 3,
                 plugin: bool = True):
        self.env = gz_env(prefix, plugin_dir, address, partition)
        self.partition = self.env["GZ_PARTITION"]
        self.log = Path(log)
        # stdbuf -oL: gz's console writes through stdio, block-buffered into a file; line-buffered, the
        # log holds every line up to the process's end, however it ends
        self.gz = str(prefix / "bin" / "gz")
        cmd = (["stdbuf", "-oL"] if shutil.which("stdbuf") else []) + [self.gz, "sim", "-s", "-r", "-v", str(verbosity)]
        if iterations is not None:
            cmd += ["--iterations", str(iterations)]
        cmd.append(str(world))
        self._out = open(self.log, "ab")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT)

    def text(self) -> str:
        """The world's output, gz's console colours taken out."""
        return re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text(errors="replace")) if self.log.exists() else ""

    def episodes(self, by_reset: bool = False) -> list:
        """(number, actions) of every episode the plugin logged as ended by its limits (by_reset: those a
        world reset from outside cut short instead)."""
        wanted = "a world reset from outside" if by_reset else "its limits"
        return [(int(n), int(a)) for n, a, by in ENDED.findall(self.text()) if by == wanted]

    def summary(self) -> Optional[dict]:
        m = SUMMARY.search(self.text())
        if not m:
            return None
        return dict(zip(("episodes", "actions", "open", "open_actions", "sessions_lost"), map(int, m.groups())))

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._out.flush()

    def stop(self, timeout: float = 60.0) -> Optional[int]:
        """gz-sim's own stop (its /server_control service, `stop: true`): it stops its loop and unloads
        its systems, so the plugin logs its summary. Not SIGINT: gz-common 5's signal handler logs
        through the logger's lock, and a SIGINT that lands while gz writes a log line (at every world
        reset, UserCommands advertises its ~30 services again) hung gz for good (gdb: the main thread,
        interrupted inside FileLogger::Buffer::sync, waiting in the handler for the lock it held).
        A world still running after `timeout` gets its threads' stacks written into its log (gdb,
        where there is one), then SIGKILL."""
        try:
            if self.proc.poll() is None:
                self._request_stop()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._write_stacks()
            return stop_process(self.proc, signal.SIGKILL, 30)
        finally:
            self._out.close()

    def _request_stop(self) -> None:
        try:
            out = subprocess.run([self.gz, "service", "-s", "/server_control", "--reqtype", "gz.msgs.ServerControl",
                                  "--reptype", "gz.msgs.Boolean", "--timeout", "5000", "--req", "stop: true"],
                                 env=self.env, capture_output=True, text=True, timeout=60)
            said = f"rc {out.returncode}: {(out.stdout + out.stderr).strip()[-300:]}"
        except subprocess.TimeoutExpired:
            said = "no answer within 60 s"
        self._out.write(f"\n[harness] asked gz sim to stop (/server_control stop: true): {said}\n".encode())
        self._out.flush()

    def _write_stacks(self) -> None:
        self._out.write(f"\n[harness] gz sim still running {self.proc.pid} after its stop; its threads:\n".encode())
        self._out.flush()
        if shutil.which("gdb"):
            try:
                subprocess.run(["gdb", "-p", str(self.proc.pid), "-batch", "-ex", "thread apply all bt 30"],
                               stdout=self._out, stderr=subprocess.STDOUT, timeout=60)
            except subprocess.TimeoutExpired:
                pass
        self._out.flush()


def configure_and_build(prefix: Path, build: Path, timeout: float = 900.0, sdk: Optional[Path] = None) -> dict:
    """Configure sims/gazebo against `prefix` with the plugin required and warnings as errors, then
    build. The plugin's and the layer's objects are removed first, so their files are compiled (and any
    warning shows) on every call. The SDK: the installed simbridge_client package at `sdk` (the test
    run's one build, as an engine would link it), else sims/cpp built once per build folder."""
    build.mkdir(parents=True, exist_ok=True)
    for target in ("simbridge-gz-system.dir", "simbridge_gz_logic.dir"):
        shutil.rmtree(build / "CMakeFiles" / target, ignore_errors=True)
    for so in build.glob("libsimbridge-gz-system*"):
        so.unlink()
    configure = subprocess.run(
        ["cmake", "-S", str(SOURCE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={prefix}" + (f";{sdk}" if sdk else ""), f"-DSIMBRIDGE_GZ_SDK_FROM_SOURCE={'OFF' if sdk else 'ON'}",
         # named, not searched: find_package keeps the package folder it found first in the build's
         # cache, and an earlier run's SDK prefix (a temporary folder that may still exist) would win
         *([f"-Dsimbridge_client_DIR={sdk / 'lib' / 'cmake' / 'simbridge_client'}"] if sdk else []),
         "-DSIMBRIDGE_GZ_REQUIRE_PLUGIN=ON", "-DSIMBRIDGE_GZ_WERROR=ON"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    result = {"configure": configure.stdout + configure.stderr, "configure_rc": configure.returncode}
    if configure.returncode != 0:
        return result
    built = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT)
    result.update(build=built.stdout + built.stderr, build_rc=built.returncode,
                  plugin=next(iter(build.glob("libsimbridge-gz-system.so")), None))
    return result
