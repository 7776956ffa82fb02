import fcntl
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

# One OpenMP and BLAS thread per test process and every process it starts (before numpy or torch
# load here): three workers share two cores, and torch's intra-op threads spin-wait after each op
# (in-process learners and servers: 24.1 -> 21.1 CPU-s for tests/trainer's learner files, 2 vs 1).
# The trainer pins its own threads ([run] torch_threads); this is the rest (workers, examples, sims).
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from simbridge.server.runtime import BridgeConfig, BridgeRuntime  # noqa: E402
from simbridge.server.service import BridgeServer  # noqa: E402


# The bridge's transports on one host (docs/transports.md). A test that takes the `net` argument
# runs once on each, and every server its fixtures start listens there: TCP on loopback, or a
# Unix socket in a private directory of its own.
# A test that the shared-memory step channel can serve too (shm+unix:PATH: gRPC on a Unix socket, the
# steps through shared memory) asks for it with @pytest.mark.nets("tcp", "uds", "shm").
NETS = ("tcp", "uds")


def pytest_configure(config):
    config.addinivalue_line("markers", "nets(*names): the transports a `net` test runs on (default tcp, uds)")
    if os.environ.get("SIMBRIDGE_TEST_CPU"):
        config.pluginmanager.register(_CpuLog(os.environ["SIMBRIDGE_TEST_CPU"]), "simbridge-cpu-log")


# `make test` runs the suite on pytest-xdist workers (-n 3 --dist loadfile: a 2-core machine's tests
# wait on processes and timers about half their time). A file is one worker's: module fixtures that
# build into a shared folder (build/gazebo-gz) or are whole runs (a connector run, a fuzzed server)
# happen once. SLOW_FIRST: files of learning runs and builds are handed out first, so that no worker
# ends the run on a 2-minute solve while the others idle (serial runs keep this order too; no result
# depends on it). Under xdist it orders files with equal numbers of tests: xdist hands out the
# files with the most tests first, which mixes the learning runs with files of quick tests; keeping
# this order instead (--no-loadscope-reorder) put three learning runs on two cores at once and a
# fresh clone's run took 8:47 instead of 8:21 (docs/benchmarks.md, session 18).
SLOW_FIRST = ("sims/test_gazebo_sim.py", "trainer/test_distributed.py", "e2e/", "trainer/test_distributed_datasets.py",
              "trainer/test_datasets.py", "trainer/test_learner_process.py", "trainer/test_user_errors.py",
              "trainer/test_trainer_daemon.py", "sims/test_unity_", "trainer/test_resume_kill.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = os.path.relpath(str(item.path), os.path.join(ROOT, "tests")).replace(os.sep, "/")
        return next((i for i, p in enumerate(SLOW_FIRST) if path.startswith(p)), len(SLOW_FIRST))
    items.sort(key=rank)   # stable: collection order within a rank


def pytest_collection_finish(session):
    """Collection imported torch and the project (some 200,000 objects that live as long as the
    worker): frozen, the collector's full passes over the tests' own objects no longer walk them
    (trainer/run/gcquiet.py says what the collector costs a process otherwise)."""
    import gc
    gc.freeze()


def pytest_generate_tests(metafunc):
    if "net" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("nets")
        metafunc.parametrize("net", marker.args if marker else NETS)


@pytest.fixture
def listen_address(request):
    """A factory of fresh addresses to serve on, on the test's `net` (TCP when it has none)."""
    net = request.getfixturevalue("net") if "net" in request.fixturenames else "tcp"
    if net == "tcp":
        yield lambda: "127.0.0.1:0"
        return
    # Short: a socket path must fit in 108 bytes, and pytest's tmp_path holds the test's name.
    directory = tempfile.mkdtemp(prefix="sb-uds-")
    made = itertools.count()
    scheme = "shm+unix" if net == "shm" else "unix"
    yield lambda: f"{scheme}:{directory}/bridge{next(made)}.sock"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def make_server(listen_address):
    """Start real BridgeServers on loopback (or the test's `net`); all are stopped at teardown."""
    servers = []

    def _make(runtime=None, security=None, **config):
        rt = runtime or BridgeRuntime(BridgeConfig(**config))
        srv = BridgeServer(rt, listen_address(), security=security).start()
        servers.append(srv)
        return srv

    yield _make
    for s in servers:
        s.stop(grace=0)


@pytest.fixture
def server(make_server):
    return make_server()


@pytest.fixture
def kill_simulator():
    """SIGKILLs a simulator process that serves `runtime` (mid-run: a step may be on the wire or in
    the ring) and waits, bounded, until the server has ended its session; returns the episode
    summaries that ended as client_lost (truncated: no terminal state)."""
    def _kill(proc: subprocess.Popen, runtime, timeout_s: float = 8.0):
        try:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        deadline = time.monotonic() + timeout_s
        while (runtime.snapshot()["open_episodes"] or runtime.session_ids()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runtime.snapshot()["open_episodes"] == 0 and not runtime.session_ids(), \
            "the dead simulator's episodes stayed open"
        return [s for s in runtime.metrics.recent if s["end_reason"] == "client_lost"]
    return _kill


# Every CMake build the tests start (the SDK, MuJoCo, the Gazebo layer and plugin, a consumer of the
# installed SDK) compiles through ccache where it is installed (`make test` installs it): a run
# recompiles only what changed since the last run on this machine. CMake reads the launcher; ccache
# reads the base directory: paths under the checkout hash as relative ones, so another clone or
# worktree of the same sources finds the same objects (release builds: no -g, no directory in them).
if shutil.which("ccache"):
    os.environ.setdefault("CMAKE_CXX_COMPILER_LAUNCHER", "ccache")
    os.environ.setdefault("CCACHE_BASEDIR", ROOT)

CPP_SOURCE = os.path.join(ROOT, "sims", "cpp")
CPP_BUILD = os.path.join(ROOT, "build", "cpp")
_cpp_built = {}   # the one build of a test run: {"error": message or None}


def _missing_cpp_tools():
    missing = [t for t in ("cmake", "protoc", "grpc_cpp_plugin", "pkg-config") if shutil.which(t) is None]
    if not os.path.exists("/usr/include/grpcpp/grpcpp.h"):
        missing.append("grpc++ headers (libgrpc++-dev)")
    return missing


def _build_cpp_once():
    """build/cpp: configured once per run (seconds; picks up a newly installed MuJoCo), then an
    incremental build; a cold one takes minutes on 2 cores."""
    if _cpp_built or _missing_cpp_tools():
        return
    _cpp_built["error"] = None
    os.makedirs(CPP_BUILD, exist_ok=True)
    # pytest-xdist's workers share build/cpp: one builds while the others wait, then finds it built
    # (its own cmake run is then an up-to-date check of seconds).
    with open(os.path.join(CPP_BUILD, ".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for step, timeout in ((["-S", CPP_SOURCE, "-B", CPP_BUILD, "-DCMAKE_BUILD_TYPE=Release"], 300),
                              (["--build", CPP_BUILD, "-j2"], 900)):
            try:
                out = subprocess.run(["cmake", *step], capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                _cpp_built["error"] = f"cmake {' '.join(step)} ran past {timeout} s"
                return
            if out.returncode != 0:
                _cpp_built["error"] = out.stdout[-4000:] + out.stderr[-4000:]
                return


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """The C++ build runs before the first test that needs it starts its clock: a cold build does not
    fit in one test's timeout, and a build cut short by one would fail every C++ test of the run."""
    if "cpp_build" in getattr(item, "fixturenames", ()):
        _build_cpp_once()
    yield


# SIMBRIDGE_TEST_CPU=FILE: one JSON line per test with its wall time and the CPU seconds it cost,
# this process's and its reaped children's (trainers, simulators, compilers), setup to teardown;
# when it ended and on which xdist worker: the run's timeline (does a worker idle at the end?).
# Wall time alone hides whether a slow test computes or waits: that decides how to make it cheaper.
class _CpuLog:
    def __init__(self, path: str):
        self.path = path

    @staticmethod
    def _cpu_s() -> float:
        import resource
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        import json
        t0, c0 = time.monotonic(), self._cpu_s()
        yield
        with open(self.path, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "wall_s": round(time.monotonic() - t0, 3),
                                "cpu_s": round(self._cpu_s() - c0, 3), "ended": round(time.time(), 2),
                                "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}) + "\n")


@pytest.fixture(scope="session")
def cpp_build():
    """The C++ SDK, its examples and (with mujoco-core installed) the MuJoCo simulator, built once per
    run into build/cpp. Skips naming the Debian packages only where the build tools are absent."""
    missing = _missing_cpp_tools()
    if missing:
        pytest.skip(f"C++ SDK build tools absent ({', '.join(missing)}): "
                    f"apt-get install cmake g++ pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev")
    _build_cpp_once()
    assert _cpp_built["error"] is None, _cpp_built["error"]
    return CPP_BUILD


@pytest.fixture(scope="session")
def cpp_install(cpp_build, tmp_path_factory):
    """The SDK installed as a package from the run's one build (`cmake --install`, seconds): the
    prefix to put in CMAKE_PREFIX_PATH."""
    prefix = tmp_path_factory.mktemp("simbridge-prefix")
    out = subprocess.run(["cmake", "--install", cpp_build, "--prefix", str(prefix)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return prefix


def pytest_sessionfinish(session, exitstatus):
    """A test that leaves a non-daemon thread behind makes the interpreter wait for it at exit
    (CI would hang after the last test): name such threads."""
    import threading
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if left:
        print("\nnon-daemon threads left running: " + ", ".join(f"{t.name} ({t.__class__.__name__})" for t in left),
              file=sys.stderr)
