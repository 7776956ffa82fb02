"""Console scripts without their extra: one line naming the fix and exit code 2, no traceback.

`simbridge-trainer` needs the trainer extra, `simbridge-unity` the unity extra
(simbridge/extras.py). Each command runs in a subprocess whose sitecustomize.py makes the
listed modules unimportable, exactly as when they are not installed (ModuleNotFoundError
with their name).
"""
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from simbridge.extras import EXTRAS
from simbridge.trainer.run.launch import free_port

ROOT = Path(__file__).resolve().parent.parent

MISSING_FINDER = """
import importlib.abc, os, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    blocked = set(os.environ["SIMBRIDGE_TEST_NOT_INSTALLED"].split(","))

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""

CLI = "from simbridge.trainer.cli import main; import sys; sys.exit(main())"   # the console script
UNITY = "from simbridge.sims.unity.program import main; import sys; sys.exit(main())"


def _run(tmp_path, missing, argv):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(MISSING_FINDER)
    env = dict(os.environ, SIMBRIDGE_TEST_NOT_INSTALLED=",".join(missing),
               PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))


def _assert_names_the_fix(out, module, extra="trainer"):
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert module in lines[0] and f"pip install 'simbridge[{extra}]'" in lines[0], lines[0]
    if extra == "trainer":
        assert "torch first" in lines[0], lines[0]


@pytest.mark.parametrize("entry", [["-c", CLI], ["-m", "simbridge.trainer.cli"]])
def test_run_without_torch(tmp_path, entry):
    out = _run(tmp_path, ["torch"], [*entry, "run", "--logdir", str(tmp_path / "run"), "--address",
                                        f"127.0.0.1:{free_port()}"])   # not :1, where other tests expect no listener
    _assert_names_the_fix(out, "torch")
    assert not (tmp_path / "run").exists()


def test_plot_without_matplotlib(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"env_steps": 1, "return_mean": {}, "losses": {}}) + "\n")
    out = _run(tmp_path, ["matplotlib"], ["-c", CLI, "plot", str(tmp_path)])
    _assert_names_the_fix(out, "matplotlib")


def test_the_cli_module_imports_without_torch(tmp_path):
    probe = ("import sys, simbridge.trainer.cli as c; c.build_parser().parse_args(['run']); "
             "print(sorted(m for m in ('torch', 'simbridge.trainer.daemon') if m in sys.modules))")
    out = _run(tmp_path, ["torch", "tensorboard", "matplotlib"], ["-c", probe])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_other_missing_modules_are_not_blamed_on_the_extra(tmp_path):
    out = _run(tmp_path, ["gymnasium"], ["-c", CLI, "run", "--logdir", str(tmp_path / "run")])
    assert out.returncode != 0 and "simbridge[trainer]" not in out.stderr
    assert "No module named 'gymnasium'" in out.stderr


@pytest.mark.parametrize("entry", [["-c", UNITY], ["-m", "simbridge.sims.unity.program"]])
def test_unity_connector_without_mlagents(tmp_path, entry):
    out = _run(tmp_path, ["mlagents_envs"], [*entry, "--address", "127.0.0.1:1"])
    _assert_names_the_fix(out, "mlagents_envs", extra="unity")


def test_the_extras_modules_are_the_packages_pyproject_lists():
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, (modules, _) in EXTRAS.items():
        packages = {re.split(r"[<>=!~\[ ]", req)[0].lower().replace("-", "_") for req in optional[extra]}
        assert packages == set(modules), f"the {extra} extra lists {packages}, extras.py knows {set(modules)}"


def test_the_console_scripts_point_at_the_guarded_programs():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["simbridge-trainer"] == "simbridge.trainer.cli:main"
    assert scripts["simbridge-unity"] == "simbridge.sims.unity.program:main"
