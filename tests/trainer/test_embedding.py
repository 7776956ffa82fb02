"""docs/trainer.md's "Run the trainer from a script" example, run as written there (only its logdir
and config path made absolute), with a real simulator process between its halves; then what the
run left: the effective config with the overrides, TensorBoard's hparams and the new scalars."""
import re
import subprocess
import sys
from pathlib import Path

from simbridge.trainer.config.trainer_config import load_config
from simbridge.trainer.run.launch import ROOT, child_env

DOC = ROOT / "docs" / "trainer.md"
MARKER = "<!-- embedding example: tests/trainer/test_embedding.py"


def _example() -> str:
    text = DOC.read_text()
    start = text.index(MARKER)
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_the_documented_embedding_example_saved_as_a_script_runs_once_and_leaves_its_run(tmp_path):
    """The block saved as a file and run with `python file.py`, as a user runs it (issue 27 #2): no
    `if __name__ == "__main__":` guard. The learner processes (multiprocessing spawn) used to run
    the script again: a second daemon, then multiprocessing's bootstrapping RuntimeError. Here a
    simulator between the halves makes the learner process train, in a fresh interpreter. Then what
    the run left: the effective config with the overrides, TensorBoard's hparams and the new scalars."""
    logdir = tmp_path / "scripted"
    code = _example()
    assert "from simbridge.trainer import TrainerDaemon, load_config" in code
    code = code.replace('"runs/scripted"', repr(str(logdir)))
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
