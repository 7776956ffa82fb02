"""The C++ SDK as a package an engine installs (sims/cpp): `cmake --install` of the run's one build
(the cpp_install fixture), then a program outside the repository (tests/sims/cpp_consumer, copied
to a temporary folder) configured with find_package(simbridge_client) against that prefix alone,
built and run against a real bridge. It proves the package (config, version, imported target, its
link dependencies), public headers free of gRPC, typed Discrete actions both ways, and the log
callback receiving the SDK's messages: waiting for a trainer, a broken connection and a session the
restarted bridge no longer has, with nothing left on std::cerr.

Skipped only when the build tools are absent (Debian: cmake libgrpc++-dev protobuf-compiler-grpc
libprotobuf-dev)."""
import os
import re
import shutil
import subprocess
import time

import pytest

from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.sample_batch import SampleBatch
from simbridge.server.service import BridgeServer
from simbridge.trainer.run.launch import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONSUMER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpp_consumer")


def _pyproject_version() -> str:
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


@pytest.fixture(scope="module")
def consumer(cpp_install, tmp_path_factory):
    """The consumer program, configured and built outside the repository against the prefix alone."""
    src = tmp_path_factory.mktemp("engine") / "src"
    shutil.copytree(CONSUMER, src)
    build = src.parent / "build"
    configure = subprocess.run(["cmake", "-S", src, "-B", build, f"-DCMAKE_PREFIX_PATH={cpp_install}",
                                "-DCMAKE_BUILD_TYPE=Release"], capture_output=True, text=True, timeout=120)
    assert configure.returncode == 0, configure.stdout[-4000:] + configure.stderr[-4000:]
    compiled = subprocess.run(["cmake", "--build", build, "-j2"], capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stdout[-4000:] + compiled.stderr[-4000:]
    return {"program": str(build / "consumer"), "configure": configure.stdout}


def test_the_package_is_found_in_the_prefix_with_the_projects_version(consumer, cpp_install):
    found = re.search(r"simbridge_client (\S+) from (\S+)", consumer["configure"])
    assert found, consumer["configure"]
    assert found.group(1) == _pyproject_version()
    assert found.group(2).startswith(str(cpp_install))          # the prefix, not the repository's tree


def test_the_installed_headers_need_no_grpc_or_protobuf(cpp_install):
    headers = sorted((cpp_install / "include" / "simbridge").glob("*.hpp"))
    assert {h.name for h in headers} >= {"client.hpp", "error.hpp", "action.hpp", "options.hpp", "space.hpp"}
    for h in headers:
        text = h.read_text()
        includes = re.findall(r"#include\s*[<\"]([^>\"]+)", text)
        assert not [i for i in includes if "grpc" in i or "google/" in i], (h.name, includes)
        assert "grpc::" not in text, h.name


def test_an_engine_built_against_the_installed_sdk_acts_and_logs_through_its_callback(consumer):
    address, *dead = (f"127.0.0.1:{port}" for port in free_ports(3))
    dead = ",".join(dead)
    rt = BridgeRuntime(BridgeConfig(rollout_fragment_length=5))
    srv = BridgeServer(rt, address).start()
    fresh = None
    proc = subprocess.Popen([consumer["program"], address, dead], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or lines[-1] != "READY":
            line = proc.stdout.readline()
            assert line, f"the consumer ended early: {''.join(lines)}{proc.stderr.read()}"
            lines.append(line.strip())
        srv.stop(grace=0)
        fresh = BridgeServer(BridgeRuntime(BridgeConfig()), address).start()   # a restart: no sessions
        time.sleep(0.2)
        stdout, stderr = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.stop(grace=0)
        if fresh is not None:
            fresh.stop(grace=0)
    out = lines + stdout.splitlines()
    assert proc.returncode == 0, "\n".join(out) + stderr
    assert "simbridge:" not in stderr, stderr                       # the callback replaced std::cerr
    logs = [line for line in out if line.startswith("LOG ")]
    # Waiting for a trainer at two dead addresses, then the refusal as an exception.
    waiting = [line for line in logs if line.startswith("LOG info no simbridge trainer at any of ")]
    assert waiting and all(a in waiting[0] for a in dead.split(",")), logs   # in the order tried: either
    assert "ERROR UNAVAILABLE SERVER_UNAVAILABLE" in out
    # The restart: the broken connection and the forgotten session, each one message with its level.
    assert any(line.startswith(f"LOG warning connection to {address} broke") for line in logs), logs
    assert any(line.startswith(f"LOG warning the server at {address} no longer had session") for line in logs), logs
    assert out[-1] == "SESSIONLOST UNAVAILABLE SESSION_UNKNOWN"
    # Typed actions both ways: every step arrived, each action an index of Discrete(3).
    assert "STEPS 15" in out
    rt.flush()
    rows = SampleBatch.concat_samples([b.policy_batches["default_policy"] for b in rt.experience.get_all()])
    assert len(rows) == 15 and rt.snapshot()["episodes"] == 3
    assert set(rows["actions"].tolist()) <= {0, 1, 2} and (rows["actions"] == 2).sum() >= 3
