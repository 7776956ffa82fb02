"""The trainer config's types: every key checked at start-up (the learners' `config` overrides
against their defaults too), "did you mean", `--set` overrides and the CLI's flags, and the
effective config written back as TOML that parses to the same config.

The CLI cases run `simbridge-trainer run` as a process and read what a user reads."""
import subprocess
import sys

import pytest
import torch

from simbridge.trainer.config.trainer_config import CONFIG_DIR, ConfigError, load_config, parse_config, resolve_algorithm
from simbridge.trainer.config.values import parse_overrides
from simbridge.trainer.config.writer import config_toml, flat_config
from simbridge.trainer.run.launch import child_env


def _resolved(text: str, overrides=()):
    cfg = parse_config(text, "t.toml", overrides)
    for spec in cfg.policies.values():
        resolve_algorithm(spec, cfg.source, cfg.overrides)
    return cfg


DQN = '[policies.default_policy]\nalgorithm = "dqn"\n'

BAD = [
    # (config text, overrides, pieces of the message)
    (DQN + 'config = { lr = "5e-4" }', (),
     ["policies.default_policy.config.lr", "expected a float", "got a string", "without quotes: lr = 5e-4"]),
    (DQN + "config = { lrr = 5e-4 }", (), ["'lrr'", "did you mean 'lr'?"]),
    (DQN + "config = { double_q = 1 }", (), ["config.double_q", "true or false", "got an integer"]),
    (DQN + 'config = { hidden = [64, "64"] }', (), ["config.hidden[1]", "an integer"]),
    (DQN + "config = { hidden = 64 }", (), ["config.hidden", "a list of integers"]),
    ('[policies.p]\nalgorithm = "sac"\nconfig = { target_entropy = true }', (), ["target_entropy", "a string or a float"]),
    ('[policies.p]\nalgorithm = "ppo"\nconfig = { max_policy_lag = 1.5 }', (), ["max_policy_lag", "an integer"]),
    ("[run]\nseed = \"3\"\n" + DQN, (), ["run.seed", "an integer", "without quotes: seed = 3"]),
    ("[server]\ninsecure = \"yes\"\n" + DQN, (), ["server.insecure", "true or false"]),
    ("[rn]\nseed = 1\n" + DQN, (), ["unknown key(s) ['rn']", "did you mean 'run'?"]),
    (DQN, [("run.sed", 1)], ["(overridden: run.sed)", "did you mean 'seed'?"]),
    (DQN, [("policies.default_policy.config.lr", "fast")],
     ["--set policies.default_policy.config.lr (over t.toml)", "expected a float", "got a string"]),
    # Issue 27 #7: a learner's unknown key that --set brought was blamed on the file
    (DQN, [("policies.default_policy.config.lrr", 3e-4)],
     ["--set policies.default_policy.config.lrr (over t.toml)", "unknown key(s) ['lrr']", "did you mean 'lr'?"]),
    (DQN, [("run.print_every_s", -1)], ["print_every_s must be > 0"]),
    # values build() refused only when the first simulator connected, after the run was written
    (DQN + 'config = { loss = "l1" }', (), ["(DQNLearner)", "loss must be 'huber' or 'mse', got 'l1'"]),
    (DQN, [("policies.default_policy.config.logged_actions", "foo")],
     ["--set policies.default_policy.config.logged_actions", "logged_actions must be one of"]),
    ('[policies.p]\nalgorithm = "ppo"\nconfig = { batch_size = 64 }', (), ["PPO has no replay buffer", "batch_size"]),
    ('[policies.p]\nalgorithm = "ppo"\nconfig = { num_epochs = 0 }', (), ["num_epochs >= 1"]),
    (DQN + "config = { n_step = 0 }", (), ["n_step must be >= 1"]),
    (DQN + 'config = { update_path = "fast" }', (), ["update_path = 'fast'", "use one of"]),
]


@pytest.mark.parametrize("text,overrides,pieces", BAD)
def test_bad_values_fail_naming_key_type_and_fix(text, overrides, pieces):
    with pytest.raises(ConfigError) as e:
        _resolved(text, overrides)
    msg = str(e.value)
    by_set = any(k.startswith("policies.") for k, _ in overrides)
    assert msg.startswith("--set " if by_set else "t.toml"), msg
    for piece in pieces:
        assert piece in msg, f"{piece!r} not in {msg!r}"


def test_ints_are_floats_and_values_keep_their_types():
    cfg = _resolved(DQN + "config = { lr = 1, tau = 0, hidden = [32, 32] }\n[run]\nprint_every_s = 3\n")
    c = cfg.policies["default_policy"].config
    assert c == {"lr": 1.0, "tau": 0.0, "hidden": [32, 32]} and type(c["lr"]) is float
    assert cfg.run.print_every_s == 3.0 and type(cfg.run.print_every_s) is float


def test_overrides_parse_as_toml_values():
    assert parse_overrides(["a.b=3e-4", "run.device=cpu", 'x="s p"', "h=[64, 64]", "f=true"]) == [
        ("a.b", 3e-4), ("run.device", "cpu"), ("x", "s p"), ("h", [64, 64]), ("f", True)]
    for bad in ("novalue", "=3", "a..b=1"):
        with pytest.raises(ConfigError, match="--set KEY=VALUE"):
            parse_overrides([bad])
    with pytest.raises(ConfigError, match=r"\[policies.default_polcy\]: no algorithm: did you mean "
                                          r"\[policies.default_policy\]\?"):   # a misspelt id (audit)
        load_config(None, parse_overrides(["policies.default_polcy.config.lr=3e-4"]))
    for unclosed in ("run.print_every_s=[1", 'a.b="abc', "a.b={x = 1"):   # were taken as strings (audit)
        with pytest.raises(ConfigError, match="is not a TOML value .*close what it opens"):
            parse_overrides([unclosed])
    cfg = load_config(None, parse_overrides(["policies.default_policy.config.lr=3e-4", "run.seed=7",
                                             "server.rollout_fragment_length=16"]))
    assert cfg.policies["default_policy"].config["lr"] == 3e-4 and cfg.run.seed == 7
    assert cfg.server.rollout_fragment_length == 16


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIG_DIR.glob("*.toml")))
def test_the_effective_config_parses_back_to_the_same_config(name):
    cfg = load_config(CONFIG_DIR / name, [("run.seed", 11)])
    again = parse_config(config_toml(cfg), "config.toml")
    for attr in ("server", "run", "mapping", "policies_to_train"):
        assert getattr(again, attr) == getattr(cfg, attr), attr
    for pid, spec in cfg.policies.items():
        other = again.policies[pid]
        assert (other.algorithm, other.config) == (spec.algorithm, spec.config)
        assert other.observation_space == spec.observation_space and other.action_space == spec.action_space
    flat = flat_config(cfg)
    assert flat["run.seed"] == 11 and all(isinstance(v, (bool, int, float, str)) for v in flat.values())


def _trainer(*args, timeout=60):
    out = subprocess.run([sys.executable, "-m", "simbridge.trainer.cli", "run", *args], capture_output=True,
                         text=True, timeout=timeout, env=child_env(), stdin=subprocess.DEVNULL)
    return out


def test_cli_refuses_a_bad_value_at_start_up_and_writes_nothing(tmp_path):
    logdir = tmp_path / "run"
    out = _trainer("--logdir", str(logdir), "--address", "127.0.0.1:0",
                         "--set", 'policies.default_policy.config.lr="5e-4"')
    assert out.returncode == 2, out
    err = out.stderr.strip()
    assert err.startswith("simbridge-trainer: error: ") and "Traceback" not in err, err
    assert "policies.default_policy.config.lr" in err and "expected a float" in err, err
    assert not logdir.exists()
    out = _trainer("--logdir", str(logdir), "--device", "gpu")
    assert out.returncode == 2 and "device = 'gpu'" in out.stderr, out.stderr
    assert "\"cuda:N\"" in out.stderr and not logdir.exists()
    out = _trainer("--logdir", str(logdir), "--set", "run.sed=1")
    assert out.returncode == 2 and "did you mean 'seed'?" in out.stderr, out.stderr
    if not torch.cuda.is_available():   # a device this machine lacks: said at start, not by a failed learner later
        out = _trainer("--logdir", str(logdir), "--address", "127.0.0.1:0", "--device", "cuda")
        assert out.returncode == 2 and "[run] device = 'cuda': torch sees no CUDA device" in out.stderr, out.stderr
        assert "overridden: server.address, run.logdir, run.device" in out.stderr, out.stderr
        assert 'use "auto" (the GPU when there is one) or "cpu"' in out.stderr and not logdir.exists()


@pytest.mark.parametrize("name, cuda, count, visible, pieces", [
    ("cuda", None, 0, None, ["torch sees no CUDA device", "is built without CUDA"]),
    ("cuda", "12.8", 0, "", ["CUDA_VISIBLE_DEVICES hides every GPU"]),
    ("cuda:0", "12.8", 0, "0", ["no GPU, or no driver for it: nvidia-smi"]),
    ("cuda:2", "12.8", 2, None, ["torch sees 2 CUDA device(s), cuda:0 to cuda:1"]),
])
def test_a_device_torch_cannot_use_is_refused_with_why(monkeypatch, name, cuda, count, visible, pieces):
    from simbridge.trainer.learners import placement
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(ValueError) as e:
        placement.pick_device(name)
    assert str(e.value).startswith(f"device = {name!r}: ") and all(p in str(e.value) for p in pieces), str(e.value)
    assert placement.pick_device("cpu") == torch.device("cpu")
    assert placement.pick_device("auto") == torch.device("cuda" if count else "cpu")
