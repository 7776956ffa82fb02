"""The trainer daemon: config parsing and its errors, and `simbridge-trainer run` as a real
process with real simulator processes against it (metrics, TensorBoard, checkpoints,
SIGTERM, --resume, policies_to_train), then `plot`.

The learner is tests/linear_q_learner.py (algorithm = "linear_q_learner:LinearQLearner",
tests/ on the daemon's PYTHONPATH), so nothing here depends on DQN or SAC.
"""
import json
from pathlib import Path

import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.trainer import cli
from simbridge.trainer.run.checkpoint import load_checkpoint
from simbridge.trainer.config.trainer_config import (ALGORITHMS, DEFAULT_CONFIG, ConfigError, load_config, parse_config,
                                      resolve_algorithm)
from simbridge.trainer.daemon import TrainerDaemon
from simbridge.trainer.run.launch import free_port
from simbridge.trainer.run.reporting import read_metrics
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.errors import BridgeError
from simbridge.wire.v1 import simbridge_pb2 as pb
from support.daemon import kill, metrics, start_sim, start_trainer
from support.waits import wait

LINEAR_Q = "linear_q_learner:LinearQLearner"

# ---------------------------------------------------------------- config


def test_shipped_configs_parse():
    cfg = load_config()  # the embedded default
    assert Path(cfg.source) == DEFAULT_CONFIG
    assert cfg.server.address == "127.0.0.1:50051" and cfg.server.experience_queue_size == 4
    assert cfg.run.logdir == "runs/cartpole_dqn" and cfg.run.checkpoint_every_env_steps == 10000
    assert cfg.policies["default_policy"].algorithm == "dqn"
    assert cfg.mapping.default == "default_policy" and cfg.policies_to_train == ["default_policy"]

    ma = load_config(DEFAULT_CONFIG.parent / "multiagent.toml")
    assert ma.mapping.rules == [("player_*", "nim"), ("cart_[02]", "p0"), ("cart_*", "p1")]
    assert ma.policies_to_train == ["nim", "p0"] and not ma.trainable("p1")
    assert ma.policies["nim"].observation_space == gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    assert ma.policies["nim"].action_space == gym.spaces.Discrete(3)
    assert ma.policies["p0"].observation_space is None  # from the handshake


def test_config_defaults_and_values():
    cfg = parse_config("""
        policies_to_train = ["a"]
        [server]
        max_wait_ms = 2
        [run]
        seed = 3
        keep_replay_in_checkpoint = true
        [policies.a]
        algorithm = "sac"
        config = { batch_size = 32 }
        action_space = { type = "Box", low = -2.0, high = 2.0, shape = [1] }
        observation_space = { type = "MultiDiscrete", nvec = [3, 4] }
        [policies.b]
        algorithm = "dqn"
        [mapping]
        rules = ["x*=a"]
        default = "b"
    """)
    assert cfg.server.max_wait_ms == 2.0 and cfg.server.rollout_fragment_length == 200
    assert cfg.run.seed == 3 and cfg.run.keep_replay_in_checkpoint and cfg.run.total_env_steps == 0
    assert cfg.policies["a"].config == {"batch_size": 32}
    assert cfg.policies["a"].action_space == gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    assert cfg.policies["a"].observation_space == gym.spaces.MultiDiscrete([3, 4])
    assert cfg.trainable("a") and not cfg.trainable("b")
    # Default mapping: the only policy; no default at all when several and none is default_policy.
    one = parse_config('[policies.solo]\nalgorithm = "random"')
    assert one.mapping.default == "solo" and one.policies_to_train == []
    two = parse_config('[policies.x]\nalgorithm = "dqn"\n[policies.y]\nalgorithm = "sac"')
    assert two.mapping.default is None and two.policies_to_train == ["x", "y"]


BAD_CONFIGS = [
    ('[policies.p]\nalgorithm = "a2c"', ["unknown algorithm 'a2c'", "dqn", "ppo", "random", "sac", "module:Class"]),
    ('[policies.p]\nconfig = {}', ["no algorithm"]),
    ("[run]\nlogdir = 'x'", ["no [policies.<id>]"]),
    ('[policies.p0]\nalgorithm = "dqn"\n[mapping]\nrules = ["player_*=nim"]',
     ["player_*=nim", "'nim'", "not defined", "[policies.nim]"]),
    ('[policies.p0]\nalgorithm = "dqn"\n[mapping]\ndefault = "other"', ["default = 'other'", "[policies.other]"]),
    ('[policies.p0]\nalgorithm = "dqn"\n[mapping]\nrules = ["no-equals-sign"]', ["PATTERN=POLICY"]),
    ('policies_to_train = ["p9"]\n[policies.p0]\nalgorithm = "dqn"', ["'p9'", "not defined", "['p0']"]),
    ('policies_to_train = ["r"]\n[policies.r]\nalgorithm = "random"', ["cannot learn"]),
    ('[policies.p0]\nalgorithm = "dqn"\npolicies_to_train = ["p0"]', ["top-level key", "first [table]"]),
    ('[run]\nchekpoint_every = 5\n[policies.p]\nalgorithm = "dqn"', ["chekpoint_every", "checkpoint_every_env_steps"]),
    ('[run]\ntotal_env_steps = "lots"\n[policies.p]\nalgorithm = "dqn"', ["total_env_steps", "int"]),
    ('[server]\naddress = "localhost"\n[policies.p]\nalgorithm = "dqn"', ["HOST:PORT"]),
    ('[server]\nbatch_mode = "whole"\n[policies.p]\nalgorithm = "dqn"', ["complete_episodes"]),
    ('[policies.p]\nalgorithm = "dqn"\naction_space = { type = "Discrete", n = 2 }', ["both", "neither"]),
    ('[policies.p]\nalgorithm = "dqn"\naction_space = { type = "Graph" }\nobservation_space = { type = "Discrete", n = 2 }',
     ["type = 'Graph'", "Discrete"]),
    ('[policies.p]\nalgorithm = "dqn"\naction_space = { type = "Discrete" }\nobservation_space = { type = "Discrete", n = 2 }',
     ["needs 'n'"]),
    ('[policies.p]\nalgorithm = "random"\nconfig = { lr = 1 }', ["lr", "seed"]),
    ("this is = not toml [", ["not valid TOML"]),
]


@pytest.mark.parametrize("text,expected", BAD_CONFIGS)
def test_config_errors_name_the_fix(text, expected):
    with pytest.raises(ConfigError) as e:
        parse_config(text, "t.toml")
    msg = str(e.value)
    assert msg.startswith("t.toml"), msg
    for piece in expected:
        assert piece in msg, f"{piece!r} not in {msg!r}"


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config .*--config"):
        load_config(tmp_path / "nope.toml")


def test_resolve_algorithm():
    assert ALGORITHMS == {"dqn": "simbridge.trainer.learners.dqn:DQNLearner", "sac": "simbridge.trainer.learners.sac:SACLearner",
                          "ppo": "simbridge.trainer.learners.ppo:PPOLearner"}
    spec = parse_config(f'[policies.p]\nalgorithm = "{LINEAR_Q}"\nconfig = {{ lr = 0.1 }}').policies["p"]
    assert resolve_algorithm(spec).__name__ == "LinearQLearner"
    spec = parse_config(f'[policies.p]\nalgorithm = "{LINEAR_Q}"\nconfig = {{ learning_rate = 0.1 }}').policies["p"]
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['learning_rate'\].*known: .*'lr'"):
        resolve_algorithm(spec)
    spec = parse_config('[policies.p]\nalgorithm = "no_such_module_xyz:Learner"').policies["p"]
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_xyz'.*PYTHONPATH"):
        resolve_algorithm(spec)
    spec = parse_config('[policies.p]\nalgorithm = "json:dumps"').policies["p"]
    with pytest.raises(ConfigError, match="not a simbridge.trainer.learners.base.Learner"):
        resolve_algorithm(spec)
    assert resolve_algorithm(parse_config('[policies.p]\nalgorithm = "random"').policies["p"]) is None


def test_daemon_builds_declared_policies_and_refuses_unmapped_agents(tmp_path):
    cfg = parse_config(f"""
        policies_to_train = ["q"]
        [run]
        logdir = "{tmp_path}"
        seed = 0
        [policies.q]
        algorithm = "{LINEAR_Q}"
        observation_space = {{ type = "Box", low = 0.0, high = 1.0, shape = [2] }}
        action_space = {{ type = "Discrete", n = 3 }}
        [policies.frozen]
        algorithm = "{LINEAR_Q}"
        [policies.r]
        algorithm = "random"
        [mapping]
        rules = ["q_*=q", "f_*=frozen", "r_*=r"]
    """)
    d = TrainerDaemon(cfg)
    assert set(d.runtime.policies) == {"q"}  # declared: built at startup, kept by the runtime only
    assert d.runtime.policies["q"].trainable
    assert d.runtime.policy_mapping_fn("f_1", None) == "frozen"
    with pytest.raises(BridgeError) as e:
        d.runtime.policy_mapping_fn("stranger", None)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "[mapping] default" in e.value.message
    box, disc = gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2)
    # First use of "frozen": the runtime calls the daemon's factory and keeps what it builds.
    rt = d.runtime
    s = rt.session(rt.create_session(pb.CreateSessionRequest(
        client_name="t", observation_space=sb_spaces.space_to_proto(box),
        action_space=sb_spaces.space_to_proto(disc)), True).session_id, True)
    rt.handle("start_episode", pb.StartEpisodeRequest(episode_ids=["e"]), True, bound=s)
    rt.handle("get_action", pb.GetActionRequest(rows=[pb.AgentRows(
        episode_ids=["e"], agent_ids=["f_1"],
        observations=pb.Value(tensor=tensors.to_tensor(np.zeros((1, 4), np.float32))))]), True, bound=s)
    frozen = rt.policies["frozen"]
    assert not frozen.trainable and set(rt.policies) == {"q", "frozen"}
    assert type(rt.policy_factory("r", box, disc)).__name__ == "RandomPolicy"
    with pytest.raises(BridgeError, match="cannot create policy 'q'.*Box"):
        rt.policy_factory("q", box, gym.spaces.Box(-1.0, 1.0, (2,), np.float32))  # linear-Q needs Discrete


def test_run_refuses_a_used_logdir_and_a_missing_checkpoint(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    # a free port, not the default 50051: a trainer the developer runs beside the suite holds it
    cfg.write_text(f'[server]\naddress = "127.0.0.1:{free_port()}"\n[run]\nlogdir = "{tmp_path / "run"}"\n'
                   '[policies.p]\nalgorithm = "random"\n')
    assert cli.main(["run", "--config", str(cfg), "--resume"]) == 2
    assert "no checkpoint.pt" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    assert cli.main(["run", "--config", str(cfg)]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert cli.main(["plot", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


# ---------------------------------------------------------------- the daemon as a process


@pytest.mark.parametrize("learner_process", [False, True], ids=["inline", "learner_process"])
def test_daemon_end_to_end_sigterm_resume_and_plot(tmp_path, learner_process):
    address = "127.0.0.1:0"   # each trainer takes a free port and names it (launch.start_server)
    logdir = tmp_path / "run"
    cfg_path = tmp_path / "linear.toml"
    cfg_path.write_text(f"""
        policies_to_train = ["p0"]
        [server]
        address = "{address}"
        rollout_fragment_length = 50
        experience_queue_size = 4
        [run]
        logdir = "{logdir}"
        checkpoint_every_env_steps = 300
        print_every_s = 0.3
        seed = 0
        learner_process = {str(learner_process).lower()}
        [policies.p0]
        algorithm = "{LINEAR_Q}"
        config = {{ learning_starts = 50, batch_size = 32, updates_per_step = 0.25 }}
        [policies.p1]
        algorithm = "{LINEAR_Q}"
        config = {{ learning_starts = 50, batch_size = 32 }}
        [mapping]
        rules = ["cart_1=p1"]
        default = "p0"
    """)
    daemon = start_trainer(cfg_path)
    address = daemon.address
    # gym_sim (agent0 -> p0) and a 2-cart multi-agent sim (cart_0 -> p0, cart_1 -> p1, frozen).
    sims = [start_sim("gym_sim", "simbridge.sims.gym_sim", address, "--slots", "4", "--seed", "1"),
            start_sim("ma_sim", "simbridge.sims.multiagent_sim", address, "--game", "simultaneous", "--agents", "2")]
    try:
        def trained_and_checkpointed():
            recs = metrics(logdir)
            return ((logdir / "checkpoint.pt").exists() and len(recs) >= 3
                    and recs[-1]["versions"].get("p0", 0) > 0 and {"p0", "p1"} <= set(recs[-1]["return_mean"]))
        wait(trained_and_checkpointed, 60, "updates, returns and a checkpoint", [daemon, *sims])
        assert list(logdir.glob("events.out.tfevents.*")), "no TensorBoard event file"
        saved, given = load_config(logdir / "config.toml"), load_config(cfg_path)   # the effective config
        assert (saved.server, saved.run, saved.mapping) == (given.server, given.run, given.mapping)
        assert {pid: (p.algorithm, p.config) for pid, p in saved.policies.items()} == {
            pid: (p.algorithm, p.config) for pid, p in given.policies.items()}

        # SIGTERM with simulators still connected: final metrics line + checkpoint, exit 0.
        rc = daemon.stop(timeout=30)
        out = "\n".join(daemon.lines)
        assert rc == 0, out
        assert "[trainer] env steps" in out and "return(10) p0" in out and "length(10) p0" in out and "p0: v" in out
        assert "stopping (SIGTERM)" in out
    finally:
        kill(daemon, *sims)

    recs = metrics(logdir)
    assert recs[0]["event"] == "start" and recs[-1]["event"] == "stop"
    steps = [r["env_steps"] for r in recs]
    assert steps == sorted(steps) and steps[-1] > 0
    for r in recs:
        assert set(r) >= {"env_steps", "wall_s", "return_mean", "updates", "losses", "versions"}
        assert r["versions"].get("p1", 0) == 0 and r["updates"].get("p1", 0) == 0  # frozen
    p0_versions = [r["versions"]["p0"] for r in recs if "p0" in r["versions"]]
    assert p0_versions == sorted(p0_versions) and p0_versions[-1] > 0
    assert "loss" in recs[-1]["losses"]["p0"] and "p1" not in recs[-1]["losses"]

    ckpt = load_checkpoint(logdir / "checkpoint.pt")
    c = ckpt["counters"]
    assert c["env_steps"] == recs[-1]["env_steps"] and c["episodes"] == recs[-1]["episodes"]
    assert c["recent"] and c["wall_s"] > 0
    assert ckpt["policies"]["p0"]["version"] == recs[-1]["versions"]["p0"] > 0
    assert ckpt["policies"]["p1"]["version"] == 0 and ckpt["policies"]["p1"]["state"]["updates"] == 0
    assert "replay" not in ckpt["policies"]["p0"]["state"]  # keep_replay_in_checkpoint = false

    # --resume with a step budget: counters, returns and versions continue; it stops by itself.
    n_before = len(recs)
    total = c["env_steps"] + 300
    daemon = start_trainer(cfg_path, "--resume", "--total-env-steps", str(total), name="trainer-resumed")
    address = daemon.address
    sim = start_sim("gym_sim2", "simbridge.sims.gym_sim", address, "--slots", "4")
    try:
        wait(lambda: daemon.poll() is not None, 60, "the resumed daemon to reach total_env_steps")
        daemon.wait_output()
        assert daemon.poll() == 0, "\n".join(daemon.lines)
        assert "resumed at" in "\n".join(daemon.lines)
        # the simulator heard that training is over: a normal end, not a lost trainer
        wait(lambda: sim.poll() is not None, 30, "the simulator to end at TRAINING_OVER")
        sim.wait_output()
        assert sim.poll() == 0 and '"ended": "training_over"' in "\n".join(sim.lines), "\n".join(sim.lines)
    finally:
        kill(daemon, sim)

    after = metrics(logdir)
    assert after[:n_before] == recs  # appended, not truncated
    first = after[n_before]
    assert first["event"] == "resume" and first["env_steps"] >= c["env_steps"]
    assert first["episodes"] >= c["episodes"] and first["wall_s"] >= c["wall_s"]
    assert first["versions"]["p0"] == ckpt["policies"]["p0"]["version"]  # restored before any simulator
    assert first["return_mean"] == recs[-1]["return_mean"]  # the last 100 returns came back
    assert after[-1]["env_steps"] >= total and after[-1]["versions"]["p1"] == 0
    ckpt2 = load_checkpoint(logdir / "checkpoint.pt")
    assert ckpt2["counters"]["env_steps"] >= total
    assert ckpt2["policies"]["p0"]["version"] >= ckpt["policies"]["p0"]["version"]
    assert ckpt2["policies"]["p1"]["version"] == 0

    # plot: learning curves from metrics.jsonl.
    png = tmp_path / "curves.png"
    assert cli.main(["plot", str(logdir), "--out", str(png)]) == 0
    assert png.exists() and png.stat().st_size > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_read_metrics_drops_records_superseded_by_a_resume(tmp_path):
    lines = [{"env_steps": 100}, {"env_steps": 200}, {"env_steps": 300},   # 300: after the last checkpoint
             {"env_steps": 200, "event": "resume"}, {"env_steps": 250}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n{\"env_st")  # torn last line
    assert [r["env_steps"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [100, 200, 200, 250]


def test_the_tests_live_reader_leaves_a_record_still_being_written(tmp_path):
    """support.daemon.metrics polls metrics.jsonl while the trainer appends to it: a last line without
    its newline is half a record (CI once read one and failed), read whole the next time."""
    whole = json.dumps({"env_steps": 100}) + "\n"
    (tmp_path / "metrics.jsonl").write_text(whole + '{"env_steps": 2')
    assert metrics(tmp_path) == [{"env_steps": 100}]
    (tmp_path / "metrics.jsonl").write_text(whole + json.dumps({"env_steps": 200}) + "\n")
    assert [r["env_steps"] for r in metrics(tmp_path)] == [100, 200]
    (tmp_path / "metrics.jsonl").write_text('{"env_st\n' + whole)   # torn before the last: not the writer's
    with pytest.raises(json.JSONDecodeError):
        metrics(tmp_path)
