"""docs/trainer.md's "Run the trainer from a script" example, run as written there (only its logdir
moved to a temporary directory), with a real simulator process between its halves; then what the
run left: the effective config with the overrides, TensorBoard's hparams and the new scalars."""
import re
import subprocess
import sys
from pathlib import Path

from simbridge.trainer.config.trainer_config import load_config
from simbridge.trainer.run.launch import ROOT, child_env, python_module

DOC = ROOT / "docs" / "trainer.md"
MARKER = "<!-- embedding example: tests/trainer/test_embedding.py"


def _example() -> str:
    text = DOC.read_text()
    start = text.index(MARKER)
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_the_documented_embedding_example_runs_as_written(tmp_path, monkeypatch):
    code = _example()
    assert "from simbridge.trainer import TrainerDaemon, load_config" in code
    logdir = tmp_path / "scripted"
    code = code.replace('"runs/scripted"', repr(str(logdir)))
    lines = code.splitlines(keepends=True)
    cut = [i for i, line in enumerate(lines) if line.startswith("# ... simulators connect")]
    assert cut, "the example lost its '# ... simulators connect' line"
    first, second = "".join(lines[:cut[0]]), "".join(lines[cut[0] + 1:])
    monkeypatch.chdir(ROOT)   # the example's config path is relative to the checkout
    scope: dict = {}
    exec(compile(first, "docs/trainer.md", "exec"), scope)
    daemon = scope["daemon"]
    try:
        assert daemon.serving.is_set() and not daemon.address.endswith(":0")
        sim = subprocess.run(python_module("simbridge.sims.gym_sim", "--address", daemon.address, "--episodes", "20",
                                           "--quiet", "--seed", "1"),
                             capture_output=True, text=True, timeout=120, env=child_env())
        assert sim.returncode == 0, sim.stderr
    finally:
        exec(compile(second, "docs/trainer.md", "exec"), scope)
    assert not scope["thread"].is_alive()

    saved = load_config(logdir / "config.toml")
    assert saved.run.seed == 3 and saved.policies["default_policy"].config["lr"] == 3e-4
    assert Path(saved.run.logdir) == logdir

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2
    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    ea.Reload()
    content = ea.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hp = start.session_start_info.hparams
    assert hp["policies.default_policy.config.lr"].number_value == 3e-4
    assert hp["run.seed"].number_value == 3 and hp["policies.default_policy.algorithm"].string_value == "dqn"
    scalars = set(ea.Tags()["scalars"])
    assert {"env/return_mean_10/default_policy", "env/episode_length_mean_10/default_policy",
            "learner/default_policy/lr"} <= scalars, scalars


def test_the_readme_embedding_example_saved_as_a_script_runs_once(tmp_path):
    """Issue 27 #2: the block saved as a file and run with `python file.py`, as a user runs it: no
    `if __name__ == "__main__":` guard. The learner processes (multiprocessing spawn) used to run
    the script again: a second daemon, then multiprocessing's bootstrapping RuntimeError. Here a
    simulator between the halves makes the learner process train, in a fresh interpreter."""
    code = _example().replace('"runs/scripted"', repr(str(tmp_path / "scripted")))
    code = code.replace('"trainer/configs/cartpole_dqn.toml"', repr(str(ROOT / "trainer/configs/cartpole_dqn.toml")))
    sim = ("import subprocess, sys\n"
           "subprocess.run([sys.executable, '-m', 'simbridge.sims.gym_sim', '--address', daemon.address, "
           "'--episodes', '20', '--quiet', '--seed', '1'], check=True, timeout=180)\n"
           "print('exit code', daemon.exit_code)\n")
    code = code.replace("# ... simulators connect to daemon.address and learn ...\n", sim)
    assert sim in code and "__main__" not in code
    script = tmp_path / "train.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env=child_env(), cwd=tmp_path)
    both = out.stdout + out.stderr
    assert out.returncode == 0, both
    assert both.count("listening on") == 1, both
    assert "bootstrapping" not in both and "Traceback" not in both, both
    assert "exit code 0" in out.stdout, both
