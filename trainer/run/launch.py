"""Small helpers to run a bridge server and simulators as child processes.

Used by `python -m simbridge.trainer.demo` and meant for any launcher (the trainer
daemon, scripts, tests): start a process with its output read line by line on
a thread, wait until a server's gRPC health check answers, stop a process
politely (SIGTERM, then kill).
"""
import collections
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Deque, List, Optional, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from simbridge.wire.addresses import grpc_address
from simbridge.wire.grpc_tuning import RECONNECT_OPTIONS

LineHandler = Callable[[str, str], None]  # (process name, line without newline)

# What simbridge-trainer and simbridge-server print once serving: the address clients dial.
_LISTENING = re.compile(r"listening on (\S+)")

# The directory holding the simbridge and sims packages: children can import
# both even when the checkout is not installed.
ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual bind-to-0 trick)."""
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> List[int]:
    """n distinct TCP ports that were free a moment ago: bound together, then closed (free_port
    twice can give the same port twice; a test's two dead addresses were once one)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def python_module(module: str, *args: str) -> List[str]:
    """argv for `python -m module args...` with this interpreter, unbuffered."""
    return [sys.executable, "-u", "-m", module, *map(str, args)]


def child_env(extra: Optional[dict] = None) -> dict:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


class Proc:
    """A child process whose stdout+stderr lines go to `on_line` and are kept (the last `keep`)."""

    def __init__(self, name: str, argv: Sequence[str], on_line: Optional[LineHandler] = None,
                 env: Optional[dict] = None, cwd: Optional[str] = None, keep: int = 200,
                 own_session: bool = False):
        """own_session: out of the caller's process group, so that a Ctrl-C at the terminal reaches
        the caller only, which then stops its children in its own order. No preexec_fn: Python run
        in the forked child of a process running gRPC threads can be aborted by gRPC's fork
        handlers; what a child needs set goes in its argv (bench/harness.py's dying_with_parent)."""
        self.name = name
        self.argv = list(argv)
        self.lines: Deque[str] = collections.deque(maxlen=keep)
        self._on_line = on_line
        # Where it serves: the address its first "listening on ADDRESS" line named (start_server
        # sets the one it checked health at)
        self.address: Optional[str] = None
        self._announced = threading.Event()
        self.popen = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, text=True, bufsize=1,
                                      env=env if env is not None else child_env(), cwd=cwd or str(ROOT),
                                      start_new_session=own_session)
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if self.address is None and (m := _LISTENING.search(line)):
                self.address = m.group(1)
                self._announced.set()
            if self._on_line is not None:
                try:
                    self._on_line(self.name, line)
                except Exception:  # a faulty printer must not stop the reading
                    pass
        self.popen.stdout.close()
        self._announced.set()   # no more lines: nothing to wait for

    def wait_address(self, timeout: float) -> Optional[str]:
        """The address its "listening on" line named: None if it exited, or `timeout` passed, first."""
        self._announced.wait(timeout)
        return self.address

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> Optional[int]:
        return self.popen.poll()

    def wait_output(self, timeout: float = 5.0) -> None:
        """Wait until everything the process wrote was read (after it exited)."""
        self._reader.join(timeout)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to `timeout` s, then SIGKILL. Returns the exit code."""
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGTERM)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.wait_output()
        return self.popen.returncode


def stop_all(popens: Sequence[Optional[subprocess.Popen]], timeout: float = 30.0) -> None:
    """SIGTERM every live process at once (so they shut down in parallel), then wait for each
    up to `timeout` s and kill what is left. None entries are skipped."""
    live = [p for p in popens if p is not None]
    for p in live:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in live:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_for_health(address: str, timeout: float = 30.0, proc: Optional[Proc] = None,
                    service: str = "") -> None:
    """Block until the gRPC health service at `address` answers SERVING.

    Raises RuntimeError early when `proc` (the server) exits meanwhile, with
    its last output lines, and at the timeout.
    """
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(grpc_address(address), options=RECONNECT_OPTIONS) as channel:   # shm+unix: too
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if proc is not None and proc.poll() is not None:
                raise _exited(proc, address)
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no healthy server at {address} after {timeout:.0f}s")
            time.sleep(0.1)


def _exited(proc: Proc, address: str) -> RuntimeError:
    proc.wait_output()
    tail = "\n".join(list(proc.lines)[-15:])
    return RuntimeError(f"{proc.name} exited with code {proc.poll()} before serving on {address}:\n{tail}")


def start_server(name: str, argv: Sequence[str], address: str, timeout: float = 30.0,
                 on_line: Optional[LineHandler] = None, **kwargs) -> Proc:
    """Start a server process and return once its health check answers (stopping it on failure).
    An address with port 0 (HOST:0, as passed in argv) lets the server take a free port: the Proc's
    `address` is then the one it announced. A port picked here beforehand (free_port) can be taken
    by another process in the seconds the server takes to load torch."""
    proc = Proc(name, argv, on_line, **kwargs)
    try:
        if address.endswith(":0"):
            t0 = time.monotonic()
            announced = proc.wait_address(timeout)
            if announced is None:
                if not proc._announced.is_set():   # still running, and silent about its address
                    raise RuntimeError(f"{name} announced no address after {timeout:.0f}s")
                try:
                    proc.popen.wait(5.0)   # its output ended: it is exiting
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"{name} closed its output without announcing an address") from None
                raise _exited(proc, address)
            address, timeout = announced, max(1.0, timeout - (time.monotonic() - t0))
        wait_for_health(address, timeout, proc)
        proc.address = address
    except BaseException:
        proc.stop()
        raise
    return proc
