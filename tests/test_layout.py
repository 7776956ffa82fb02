"""The house: rooms that import only the rooms below them, one installed package, small modules.

- The import contracts (pyproject's [tool.importlinter]) hold and no module import circle
  exists, checked on the installed layout (tools/lint_imports.py), and a planted violation
  of each kind is caught.
- The simulator SDK loads in a fresh interpreter without any server or trainer module and
  without torch.
- A wheel of the project installs one top-level package, simbridge (and its console scripts).
- No hand-written module is much over 400 lines.
"""
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("lint_imports", ROOT / "tools" / "lint_imports.py")
lint_imports = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lint_imports)

MAX_MODULE_LINES = 440   # "~400": a module past this holds two jobs


def test_room_contracts_hold_and_no_module_import_circle(tmp_path):
    report, ok = lint_imports.check(lint_imports.installed_tree(tmp_path))
    assert ok, report
    assert "0 broken" in report and "import circle" not in report, report


@pytest.mark.parametrize("module, planted, expect", [
    ("client/slot_client.py", "import simbridge.server.runtime", "imports wire only BROKEN"),
    ("wire/tensors.py", "from simbridge.client import policy_client", "imports nothing else of simbridge BROKEN"),
    ("server/batcher.py", "import torch", "nothing outside the trainer imports torch BROKEN"),
    ("sims/common.py", "from simbridge.server import runtime", "never the server or the trainer BROKEN"),
    ("wire/tensors.py", "def _later():\n    from simbridge.wire import spaces",
     {"simbridge.wire.spaces", "simbridge.wire.tensors"}),   # an import circle with both in it
])
def test_a_planted_violation_is_caught(tmp_path, module, planted, expect):
    tree = lint_imports.installed_tree(tmp_path)
    with open(tree / "simbridge" / module, "a") as f:
        f.write("\n\n" + planted + "\n")
    report, ok = lint_imports.check(tree)
    assert not ok
    if isinstance(expect, set):
        circles = [set(line.split(": ", 1)[1].split(" <-> ")) for line in report.splitlines()
                   if line.startswith("import circle: ")]
        assert any(expect <= c for c in circles), report
    else:
        assert expect in " ".join(report.split()), report


def test_the_simulator_sdk_loads_no_server_no_trainer_and_no_torch():
    probe = (
        "import sys\n"
        "import simbridge.client, simbridge.client.slot_client, simbridge.client.local_client\n"
        "import simbridge.client.external_env, simbridge.sims.gym_sim, simbridge.sims.multiagent_sim\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch'\n"
        "             or m.startswith(('simbridge.server', 'simbridge.trainer')))\n"
        "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"the simulator side loaded {out.stdout.strip()}"


def test_a_wheel_installs_only_the_simbridge_package(tmp_path):
    src = tmp_path / "src"   # a copy: building writes build/ and *.egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("simbridge", "trainer", "sims"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    wheel, = tmp_path.glob("simbridge-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"simbridge", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, top
    for path in ("simbridge/trainer/daemon.py", "simbridge/sims/gym_sim.py", "simbridge/sims/unity/connector.py",
                 "simbridge/wire/v1/simbridge_pb2.py", "simbridge/trainer/configs/cartpole_dqn.toml"):
        assert path in names, f"{path} missing from the wheel"
    entry_points = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}"
                                               f".dist-info/entry_points.txt").decode()
    for line in entry_points.splitlines():
        if "=" in line:
            assert line.split("=", 1)[1].strip().startswith("simbridge."), line


def test_no_hand_written_module_is_much_over_400_lines():
    big = {}
    for folder in ("simbridge", "trainer", "sims"):
        for path in (ROOT / folder).rglob("*.py"):
            if "_pb2" in path.name:
                continue   # generated
            n = len(path.read_text().splitlines())
            if n > MAX_MODULE_LINES:
                big[str(path.relative_to(ROOT))] = n
    assert not big, f"modules that hold two jobs: {big}"
