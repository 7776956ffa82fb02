"""`simbridge-trainer` without the trainer extra: one line naming the fix and exit code 2, no traceback.

Each command runs in a subprocess whose sitecustomize.py makes the listed modules
unimportable, exactly as when they are not installed (ModuleNotFoundError with their name).
"""
import json
import os
import subprocess
import sys

import pytest

from simbridge.trainer.launch import ROOT

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


def _run(tmp_path, missing, argv):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(MISSING_FINDER)
    env = dict(os.environ, SIMBRIDGE_TEST_NOT_INSTALLED=",".join(missing),
               PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))


def _assert_names_the_fix(out, module):
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert module in lines[0] and "pip install 'simbridge[trainer]'" in lines[0], lines[0]
    assert "torch first" in lines[0], lines[0]


@pytest.mark.parametrize("entry", [["-c", CLI], ["-m", "simbridge.trainer.cli"]])
def test_run_without_torch(tmp_path, entry):
    out = _run(tmp_path, ["torch"], [*entry, "run", "--logdir", str(tmp_path / "run"), "--address", "127.0.0.1:1"])
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
