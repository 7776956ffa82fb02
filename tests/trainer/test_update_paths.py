"""Update paths (trainer/learners/capture.py) and acting placement (trainer/learners/placement.py).

On the CPU: "auto" and "graph" fall back to eager and say why; the step's metrics reach the learner
with one read-back per train() call; a checkpoint written with one optimizer form (a tensor
learning rate, as the graph and compile paths keep it) loads into the other; the compile path's
machinery (a stand-in compiler: torch.compile itself takes minutes on this CPU) equals eager, and
falls back when compiling fails. The CUDA graph path itself runs only where torch sees a GPU
(the tests marked `cuda`): equal to eager within float tolerance, checkpoints across paths, and
the compile path's step captured as a graph there.
"""
import io
import logging
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from simbridge.trainer.config.sections import RunSection
from simbridge.trainer.config.trainer_config import CONFIG_DIR
from simbridge.trainer.config.values import ConfigError
from simbridge.trainer.learners import capture, optim, placement
from simbridge.trainer.learners.dqn import DQNLearner
from simbridge.trainer.learners.nstep import DISCOUNTS
from simbridge.trainer.learners.ppo import PPOLearner
from simbridge.trainer.learners.presets import DQN_CARTPOLE, PPO_CARTPOLE, SAC_PENDULUM
from simbridge.trainer.learners.sac import SACLearner
from simbridge.trainer.run.launch import child_env
from simbridge.wire.columns import ACTIONS, NEW_OBS, OBS, REWARDS
from support.batches import acted_rows   # a fragment with the bridge's columns, acted by the learner

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA graph path needs a GPU")
CARTPOLE, PENDULUM = gym.make("CartPole-v1"), gym.make("Pendulum-v1")
CONFIGS = str(CONFIG_DIR)   # the installed package's: the GPU check runs these tests from a copy of tests/ alone


def learner(kind: str, device: str = "cpu", **cfg):
    env, cls, preset = {"dqn": (CARTPOLE, DQNLearner, DQN_CARTPOLE), "sac": (PENDULUM, SACLearner, SAC_PENDULUM),
                        "ppo": (CARTPOLE, PPOLearner, PPO_CARTPOLE)}[kind]
    small = {"hidden": [32, 32]}
    if kind != "ppo":
        small.update(batch_size=64, learning_starts=100, buffer_size=1000)
    return cls(env.observation_space, env.action_space, {**preset, **small, "seed": 0, **cfg}, device=device)


def fill(learner, rows: int = 300, seed: int = 0) -> None:
    """Transitions with the bridge's columns, enough to make updates due."""
    rng = np.random.default_rng(seed)
    space = learner.observation_space
    obs = rng.uniform(-1, 1, (rows,) + space.shape).astype(np.float32)
    learner.action_space.seed(seed)
    actions = np.stack([learner.action_space.sample() for _ in range(rows)])
    learner.replay.add({OBS: obs, NEW_OBS: obs * 0.9, ACTIONS: learner.store_actions(actions),
                        REWARDS: rng.standard_normal(rows).astype(np.float32),
                        DISCOUNTS: np.where(rng.random(rows) < 0.1, 0.0, 0.99).astype(np.float32)})
    learner.agent_steps += rows


def weights(learner) -> list:
    return [t.detach().cpu().clone() for m in (learner.modules_for_acting(),) for t in m.state_dict().values()]


def through_bytes(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


# ------------------------------------------------------------------ choosing the path

@pytest.mark.parametrize("setting, why", [("auto", "auto on cpu"), ("graph", "needs a cuda device")])
def test_capture_falls_back_to_eager_on_the_cpu_and_the_log_says_why(caplog, setting, why):
    caplog.set_level(logging.INFO, logger="simbridge.trainer")
    dqn = learner("dqn", update_path=setting)
    fill(dqn)
    dqn.train(max_updates=2)
    dqn.train(max_updates=2)
    assert dqn.update_path == "eager" and dqn.updater.path == "eager"
    lines = [r.getMessage() for r in caplog.records if "updates run" in r.getMessage()]
    assert len(lines) == 1 and "DQNLearner: updates run eagerly" in lines[0] and why in lines[0], lines


def test_a_bad_update_path_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"update_path = 'cudagraph'.*'auto', 'eager', 'graph', 'compile'"):
        learner("sac", update_path="cudagraph")


def test_a_learner_that_does_not_update_itself_says_nothing_about_updates(caplog):
    """Not trained, or trained in a learner process (the parent's learner only acts)."""
    caplog.set_level(logging.INFO, logger="simbridge.trainer")
    DQNLearner(CARTPOLE.observation_space, CARTPOLE.action_space, {"seed": 0}, device="cpu", trainable=False)
    acting_only = DQNLearner(CARTPOLE.observation_space, CARTPOLE.action_space, {"seed": 0}, device="cpu")
    acting_only.compute_actions(np.zeros((2, 4), np.float32))
    assert not [r for r in caplog.records if "updates run" in r.getMessage()]


# ------------------------------------------------------------------ metrics, read back once per train()

@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_metrics_reach_the_learner_with_one_read_back_per_train_call(kind, monkeypatch):
    trained, by_hand = learner(kind), learner(kind)
    fill(trained)
    fill(by_hand)
    reads = []
    real_read = capture.Updates.read
    monkeypatch.setattr(capture.Updates, "read", lambda self: reads.append(1) or real_read(self))
    metrics = trained.train(max_updates=20)
    assert trained.updates == 20 and len(reads) == 1
    assert set(metrics) >= set(trained.METRICS) and np.all(np.isfinite(list(metrics.values())))
    assert trained.last_metrics is metrics
    # the same 20 updates as update() on the same draws: the reported metrics are the 20th's
    for _ in range(20):
        expected = by_hand.update(by_hand.replay.sample(by_hand.config["batch_size"], by_hand.generator))
        by_hand.updates += 1
    for name in trained.METRICS:
        assert metrics[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name
    for a, b in zip(weights(trained), weights(by_hand)):
        assert torch.equal(a, b)


def test_sac_reads_metrics_back_after_metrics_every_updates_at_most_once_per_call(monkeypatch):
    sac = learner("sac", metrics_every=50)
    fill(sac)
    reads = []
    real_read = capture.Updates.read
    monkeypatch.setattr(capture.Updates, "read", lambda self: reads.append(sac.updates) or real_read(self))
    for _ in range(4):
        sac.train(max_updates=20)
    assert reads == [20, 80]   # the first call reads (none yet), then once 50 more ran


def test_ppo_reports_the_iterations_mean_metrics_read_back_once():
    ppo = learner("ppo", train_batch_size=64, minibatch_size=16, num_epochs=2)
    ppo.add(acted_rows(ppo, 64))
    m = ppo.train()
    assert ppo.iteration is None and ppo.updates == 8
    assert set(ppo.METRICS) <= set(m) and all(np.isfinite(m[k]) for k in ppo.METRICS)
    assert ppo.updater.count == 8


# ------------------------------------------------------------------ checkpoints across paths

def tensor_lr_learner(kind: str, **cfg):
    """A learner whose optimizers keep a tensor learning rate, as on the graph and compile paths
    (optim.adam), with a compile step that is the eager step itself."""
    lr = learner(kind, update_path="compile", **cfg)
    lr.updater._compiler = lambda fn: fn
    for opt in lr.optimizers():
        assert all(isinstance(g["lr"], torch.Tensor) for g in opt.param_groups)
    return lr


@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_a_checkpoint_from_one_optimizer_form_loads_into_the_other_and_training_goes_on_the_same(kind):
    eager, tensor_lr = learner(kind), tensor_lr_learner(kind)
    fill(eager)
    fill(tensor_lr)
    eager.train(max_updates=15)
    tensor_lr.train(max_updates=15)
    for a, b in zip(weights(eager), weights(tensor_lr)):
        torch.testing.assert_close(a, b)
    # each one's checkpoint into a fresh learner of the other form
    into_tensor, into_eager = tensor_lr_learner(kind, seed=5), learner(kind, seed=5)
    into_tensor.load_state_dict(through_bytes(eager.state_dict(include_replay=True)))
    into_eager.load_state_dict(through_bytes(tensor_lr.state_dict(include_replay=True)))
    for opt in into_eager.optimizers():
        assert all(isinstance(g["lr"], float) for g in opt.param_groups)
    for opt in into_tensor.optimizers():
        assert all(isinstance(g["lr"], torch.Tensor) for g in opt.param_groups)
    for lrn in (eager, tensor_lr, into_tensor, into_eager):
        lrn.generator.manual_seed(9)
        lrn.train(max_updates=10)
    reference = weights(eager)
    for other in (tensor_lr, into_tensor, into_eager):
        assert other.updates == 25
        for a, b in zip(reference, weights(other)):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_an_acting_only_copy_holds_no_optimizer_and_passes_a_checkpoints_optimizer_state_on(kind):
    """The daemon's copy of a learner that a learner process trains (or of a frozen one) builds no
    optimizer, and a resumed checkpoint's optimizer state goes through it to the learner that
    trains: the same state, and the same training after it."""
    trained = learner(kind)
    fill(trained)
    trained.train(max_updates=15)
    env, cls = (CARTPOLE, DQNLearner) if kind == "dqn" else (PENDULUM, SACLearner)
    acting = cls(env.observation_space, env.action_space, dict(trained.config), device="cpu", acting_only=True)
    assert acting.optimizers() == []
    assert not any(k.endswith("opt") or k == "optimizer" for k in acting.state_dict()["nets"])   # nothing to pass on yet
    acting.load_state_dict(through_bytes(trained.state_dict(include_replay=True)))
    with pytest.raises(RuntimeError, match="acting_only"):
        acting.train()
    resumed = learner(kind, seed=5)
    resumed.load_state_dict(through_bytes(acting.state_dict(include_replay=True)))
    for a, b in zip(trained.optimizers(), resumed.optimizers()):
        sa, sb = optim.optimizer_state(a), optim.optimizer_state(b)
        assert sa["param_groups"] == sb["param_groups"]
        for pa, pb in zip(sa["state"].values(), sb["state"].values()):
            for key in pa:
                torch.testing.assert_close(pa[key], pb[key])
    for lrn in (trained, resumed):
        lrn.generator.manual_seed(9)
        lrn.train(max_updates=10)
    for a, b in zip(weights(trained), weights(resumed)):
        torch.testing.assert_close(a, b)


def test_neither_a_daemons_acting_copies_nor_learners_that_train_import_torch_dynamo():
    """torch.optim's first use imports torch._dynamo (1.5 CPU-s of every trainer's and learner process's
    start). The daemon of a run whose learners train in learner processes builds no optimizer; DQN, SAC
    and PPO that train step trainer/learners/optim.py's Adam (gradient clipping included) and write
    their state without it. One fresh interpreter for both: what each part had imported is printed."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = ("import sys, gymnasium as gym\n"
            f"sys.path[:0] = [{here!r}, {os.path.dirname(here)!r}]\n"
            "from simbridge.trainer.config.trainer_config import load_config\n"
            "from simbridge.trainer.run.factory import PolicyFactory\n"
            f"for toml, env in (('cartpole_dqn', 'CartPole-v1'), ('pendulum_sac', 'Pendulum-v1'), "
            f"                  ('cartpole_ppo', 'CartPole-v1')):\n"
            f"    e = gym.make(env)\n"
            f"    cfg = load_config({CONFIGS!r} + '/' + toml + '.toml')\n"
            f"    p = PolicyFactory(cfg)('default_policy', e.observation_space, e.action_space)\n"
            f"    p.compute_actions(e.observation_space.sample()[None])\n"
            f"    assert p.acting_only and not p.optimizers(), toml\n"
            "print('torch._dynamo' in sys.modules)\n"
            "from test_update_paths import acted_rows, fill, learner\n"
            "for kind in ('dqn', 'sac', 'ppo'):\n"
            "    lrn = learner(kind, train_batch_size=32, minibatch_size=16) if kind == 'ppo' else learner(kind)\n"
            "    lrn.add(acted_rows(lrn, 32)) if kind == 'ppo' else fill(lrn)\n"
            "    lrn.train(max_updates=3)\n"
            "    assert lrn.updates >= 3 and lrn.optimizers(), kind\n"
            "    lrn.state_dict()\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "False"], out.stdout   # after the daemon's part, after training


def test_a_decaying_learning_rate_reaches_a_tensor_lr_optimizer():
    dqn = tensor_lr_learner("dqn", lr=1e-3, lr_final=1e-4, lr_timesteps=1000)
    fill(dqn, 500)
    dqn.train(max_updates=1)
    assert dqn.optimizer.param_groups[0]["lr"].item() == pytest.approx(dqn.learning_rate(), rel=1e-6)
    assert dqn.learning_rate() < 1e-3


# ------------------------------------------------------------------ the compile path's machinery

def test_compile_path_runs_the_compiled_step_and_equals_eager():
    compiled = []
    eager, comp = learner("sac"), learner("sac", update_path="compile")

    def compiler(fn):
        compiled.append(fn)
        return fn
    comp.updater._compiler = compiler
    assert comp.updater.path == "compile"
    for lrn in (eager, comp):
        fill(lrn)
        lrn.train(max_updates=12)
    assert len(compiled) == 1 and comp.updater.path == "compile"
    for a, b in zip(weights(eager), weights(comp)):
        torch.testing.assert_close(a, b)
    assert comp.last_metrics["critic_loss"] == pytest.approx(eager.last_metrics["critic_loss"], rel=1e-5)


@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_the_whole_update_traces_under_torch_compile_without_falling_back(kind, caplog):
    """torch.compile with its aot_eager backend: dynamo, AOT autograd and fake tensors, where an op
    that cannot be traced fails (as the learners' fused Adam with a tensor learning rate did: the
    compile path had fallen back to eager on every device), without inductor's code generation
    (minutes on this CPU). 4-6 s each."""
    from torch._dynamo.utils import counters
    caplog.set_level(logging.INFO, logger="simbridge.trainer")
    torch._dynamo.reset()   # versions other tests compiled, which this learner's guards may pass
    eager, comp = learner(kind), learner(kind, update_path="compile")
    comp.updater._compiler = lambda fn: torch.compile(fn, backend="aot_eager", dynamic=False)
    for lrn in (eager, comp):
        fill(lrn)
        lrn.train(max_updates=3)
    graphs = counters["stats"]["unique_graphs"]
    for lrn in (eager, comp):
        lrn.train(max_updates=4)
    # the first two updates compile (no gradients, then no optimizer state yet); later ones reuse
    # them (dropped gradients had recompiled at every update)
    assert counters["stats"]["unique_graphs"] == graphs
    assert comp.updater.path == "compile", comp.updater.reason
    built = [r.getMessage() for r in caplog.records if "torch.compile built the update in" in r.getMessage()]
    assert len(built) == 1 and built[0].startswith(type(comp).__name__), built
    assert not [r for r in caplog.records if "eagerly from now on" in r.getMessage()]
    for a, b in zip(weights(eager), weights(comp)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # every learner in a process compiles its own versions of one code object: room for many, and
    # past it an error (a fall-back the log names), not dynamo's silent eager run
    import torch._dynamo.config as dynamo_config
    assert dynamo_config.recompile_limit >= 64 and dynamo_config.fail_on_recompile_limit_hit


def test_a_compiled_step_past_dynamos_recompile_limit_falls_back_and_says_so(caplog, monkeypatch):
    import torch._dynamo.config as dynamo_config
    real = capture._allow_recompiles

    def then_one(limit: int = 64) -> None:
        real(limit)
        dynamo_config.recompile_limit = 1   # a first update without gradients, a second with: two versions
    monkeypatch.setattr(capture, "_allow_recompiles", then_one)
    eager, comp = learner("dqn"), learner("dqn", update_path="compile")
    comp.updater._compiler = lambda fn: torch.compile(fn, backend="aot_eager", dynamic=False)
    torch._dynamo.reset()   # other tests' versions of the same steps, whose guards this learner may pass
    with dynamo_config.patch(recompile_limit=dynamo_config.recompile_limit,   # as they were, after
                             fail_on_recompile_limit_hit=dynamo_config.fail_on_recompile_limit_hit):
        for lrn in (eager, comp):
            fill(lrn)
            lrn.train(max_updates=5)
    assert comp.updater.path == "eager" and comp.updates == 5
    assert any("torch.compile failed" in r.getMessage() and "recompile" in r.getMessage().lower()
               for r in caplog.records), [r.getMessage()[:300] for r in caplog.records]
    for a, b in zip(weights(eager), weights(comp)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_failing_compile_falls_back_to_eager_says_so_and_loses_no_update(caplog):
    def broken(fn):
        def run(inputs):
            raise RuntimeError("inductor: no C compiler")
        return run
    eager, comp = learner("dqn"), learner("dqn", update_path="compile")
    comp.updater._compiler = broken
    for lrn in (eager, comp):
        fill(lrn)
        lrn.train(max_updates=10)
    assert comp.updater.path == "eager" and comp.updates == 10
    assert any("updates run eagerly from now on (torch.compile failed: RuntimeError: inductor: no C compiler"
               in r.getMessage() for r in caplog.records)
    for a, b in zip(weights(eager), weights(comp)):
        torch.testing.assert_close(a, b)


def test_a_compile_failing_after_compiled_steps_drops_their_gradients_and_loses_no_update(caplog):
    """On cuda, a compiled step's gradients can live in its CUDA graphs' memory, which the next
    compiled run overwrites: reading one eagerly raised ("accessing tensor output of CUDAGraphs that
    has been overwritten", SAC on an H200). The fall-back drops them; eager makes them anew."""
    calls = []

    def fails_third(fn):
        def run(inputs):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("cudagraph trees: overwritten output")
            return fn(inputs)
        return run
    eager, comp = learner("sac"), learner("sac", update_path="compile")
    comp.updater._compiler = fails_third
    fill(eager), fill(comp)
    comp.train(max_updates=2)
    before = comp.log_alpha.grad
    comp.train(max_updates=10)
    eager.train(max_updates=12)
    assert comp.updater.path == "eager" and comp.updates == 12
    assert comp.log_alpha.grad is not before
    for a, b in zip(weights(eager), weights(comp)):
        torch.testing.assert_close(a, b)


def test_tf32_is_switched_around_a_step_and_restored():
    """On cuda the updates' float32 products run on TF32 tensor cores (the learners' `tf32`); the
    switch is cuBLAS's process-wide flag, so it is set around each step that picks kernels and put
    back after (acting passes and other learners keep theirs). Setting it needs no GPU."""
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    for want, inside in ((True, "tf32"), (False, "ieee")):
        with capture._Precision(want):
            assert matmul.fp32_precision == inside
        assert matmul.fp32_precision == before
    dqn = learner("dqn")
    assert dqn.config["tf32"] is True and dqn.updater.tf32 is False   # nothing to switch on the CPU
    assert "TF32" not in dqn.updater.describe()
    assert learner("dqn", tf32=False).config["tf32"] is False


def test_graph_path_refuses_a_wrapped_optimizer_step_and_runs_eagerly(caplog):
    """A data-parallel group's gradient exchange wraps each optimizer's step on the instance
    (trainer/distributed/group.py); a graph would replay the step without running the exchange.
    Exercised on the CPU by calling the graph runner directly."""
    dqn = learner("dqn")
    fill(dqn)
    calls = []
    real_step = dqn.optimizer.step
    dqn.optimizer.step = lambda *a, **k: calls.append(1) or real_step(*a, **k)
    dqn.updater.path = "graph"
    dqn.train(max_updates=3)
    assert dqn.updater.path == "eager" and dqn.updates == 3 and len(calls) == 3
    assert any("wrapped optimizer step" in r.getMessage() for r in caplog.records)


def test_compile_path_with_a_wrapped_optimizer_step_runs_compiled_without_a_graph(caplog):
    """On cuda the compile path captures its compiled step as a graph, which a data-parallel
    group's wrapped step forbids; the compiled step then still runs, launched op by op, and the
    log says so. The cuda decision is reached on the CPU by calling the graph runner directly."""
    compiled = []
    dqn, eager = learner("dqn", update_path="compile"), learner("dqn")
    dqn.updater._compiler = lambda fn: compiled.append(fn) or fn
    calls = []
    real_step = dqn.optimizer.step
    dqn.optimizer.step = lambda *a, **k: calls.append(1) or real_step(*a, **k)
    dqn.updater.device = torch.device("cuda")   # only compared: nothing is allocated there
    assert dqn.updater._captures() and "captured as one CUDA graph" in dqn.updater.describe()
    for lrn in (dqn, eager):
        fill(lrn)
        lrn.train(max_updates=3)
    assert dqn.updater.path == "compile" and not dqn.updater._captures()
    assert dqn.updates == 3 and len(calls) == 3 and len(compiled) == 1
    assert "captured" not in dqn.updater.describe()
    assert any("compiled updates run without a CUDA graph (a wrapped optimizer step" in r.getMessage()
               for r in caplog.records)
    for a, b in zip(weights(eager), weights(dqn)):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------ acting placement

def test_acting_device_auto_keeps_small_networks_on_the_cpu_and_sends_large_ones_to_the_learner():
    gpu = torch.device("cuda")   # only compared, never used
    small = torch.nn.Linear(4, 2)
    large = torch.nn.Linear(1024, 1024)
    assert placement.acting_device("auto", gpu, small, 4)[0] == torch.device("cpu")
    assert placement.acting_device("auto", gpu, large, 4)[0] == gpu
    assert placement.acting_device("auto", gpu, small, 84 * 84 * 3)[0] == gpu     # images
    assert placement.acting_device("learner", gpu, small, 4)[0] == gpu
    assert placement.acting_device("cpu", gpu, large, 4)[0] == torch.device("cpu")
    assert placement.acting_device("auto", torch.device("cpu"), large, 4)[0] == torch.device("cpu")
    with pytest.raises(ValueError, match="acting_device = 'gpu'.*'auto', 'cpu', 'learner'"):
        placement.acting_device("gpu", gpu, small, 4)


def test_acting_copy_lives_on_the_acting_device_and_follows_training():
    sac = SACLearner(PENDULUM.observation_space, PENDULUM.action_space,
                     {**SAC_PENDULUM, "hidden": [16], "batch_size": 32, "learning_starts": 50, "seed": 0},
                     device="cpu", acting_device="cpu")
    fill(sac, 100)
    sac.train(max_updates=5)
    assert all(p.device.type == "cpu" for p in sac.acting.parameters())
    assert sac.act_generator.device.type == "cpu"
    for a, b in zip(sac.acting.parameters(), sac.actor.parameters()):
        assert torch.equal(a, b)


def test_no_gpu_neighbours_line_without_a_gpu(caplog):
    caplog.set_level(logging.INFO, logger="simbridge.trainer")
    assert placement.gpu_neighbours(torch.device("cpu")) == []
    placement.say_gpu_neighbours(torch.device("cpu"), "DQNLearner")
    assert not caplog.records


def test_run_acting_device_is_a_checked_config_key():
    assert RunSection().acting_device == "auto"
    with pytest.raises(ConfigError, match=r"\[run\] acting_device = 'gpu'.*\"auto\".*\"cpu\".*\"learner\""):
        RunSection(acting_device="gpu").check("trainer.toml")


# ------------------------------------------------------------------ on a GPU: the CUDA graph path

@cuda
@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_graph_path_equals_eager_on_cuda(kind):
    eager, graph = learner(kind, "cuda", update_path="eager"), learner(kind, "cuda", update_path="graph")
    assert graph.updater.path == "graph"
    for lrn in (eager, graph):
        fill(lrn)
        lrn.train(max_updates=capture.WARMUP + 20)   # warm-up, capture, replays
    assert graph.updater.path == "graph" and len(graph.updater._graphs) >= 1
    for a, b in zip(weights(eager), weights(graph)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for name in graph.METRICS:
        assert graph.last_metrics[name] == pytest.approx(eager.last_metrics[name], rel=1e-3, abs=1e-4), name


@cuda
@pytest.mark.parametrize("kind, real", [("dqn", True), ("sac", False)])
def test_compile_path_captures_the_compiled_step_as_a_graph_and_equals_eager_on_cuda(kind, real):
    """The compile path on cuda: inductor's kernels (DQN: the real torch.compile, seconds on a GPU
    machine; SAC: a stand-in compiler) captured as one CUDA graph by the learner, not by
    torch.compile's own CUDA graphs (which skip a step that writes its inputs in place)."""
    compiled = []
    eager, comp = learner(kind, "cuda", update_path="eager"), learner(kind, "cuda", update_path="compile")
    if not real:
        comp.updater._compiler = lambda fn: compiled.append(fn) or fn
    for lrn in (eager, comp):
        fill(lrn)
        lrn.train(max_updates=capture.WARMUP + 20)
    assert comp.updater.path == "compile", comp.updater.reason
    assert len(comp.updater._graphs) >= 1 and all(e[1] is not None for e in comp.updater._graphs.values())
    assert real or len(compiled) == 1
    for a, b in zip(weights(eager), weights(comp)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for name in comp.METRICS:
        assert comp.last_metrics[name] == pytest.approx(eager.last_metrics[name], rel=1e-3, abs=1e-4), name


@cuda
def test_graph_path_with_a_hard_target_every_third_update_equals_eager_on_cuda():
    cfg = {"target_update_interval": 3, "tau": 1.0, "lr_final": 1e-5, "lr_timesteps": 400}
    eager, graph = learner("dqn", "cuda", update_path="eager", **cfg), learner("dqn", "cuda", update_path="graph", **cfg)
    for lrn in (eager, graph):
        fill(lrn)
        lrn.train(max_updates=30)
    assert len(graph.updater._graphs) == 2   # one per target turn
    for a, b in zip(weights(eager), weights(graph)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@cuda
@pytest.mark.parametrize("tf32", [True, False])
def test_a_cuda_update_runs_with_its_tf32_setting_and_leaves_the_flag_as_it_was(tf32):
    before = torch.backends.cuda.matmul.fp32_precision
    dqn = learner("dqn", "cuda", update_path="graph", tf32=tf32)
    fill(dqn)
    dqn.train(max_updates=capture.WARMUP + 3)
    assert dqn.updater.tf32 is tf32 and ("TF32" in dqn.updater.describe()) is tf32
    assert torch.backends.cuda.matmul.fp32_precision == before
    assert np.all(np.isfinite(list(dqn.last_metrics.values())))


@cuda
def test_ppo_minibatch_graph_equals_eager_on_cuda():
    runs = []
    for path in ("eager", "graph"):
        ppo = learner("ppo", "cuda", update_path=path, train_batch_size=64, minibatch_size=16, num_epochs=4)
        ppo.add(acted_rows(ppo, 64))
        ppo.train()
        runs.append(ppo)
    assert runs[1].updater.path == "graph"
    for a, b in zip(weights(runs[0]), weights(runs[1])):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@cuda
@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_a_graph_checkpoint_loads_on_the_cpu_and_a_cpu_one_on_the_graph_path(kind):
    graph, cpu = learner(kind, "cuda", update_path="graph"), learner(kind)
    for lrn in (graph, cpu):
        fill(lrn)
        lrn.train(max_updates=10)
    on_cpu, on_graph = learner(kind, seed=3), learner(kind, "cuda", update_path="graph", seed=3)
    on_cpu.load_state_dict(through_bytes(graph.state_dict(include_replay=True)))
    on_graph.load_state_dict(through_bytes(cpu.state_dict(include_replay=True)))
    for lrn in (on_cpu, on_graph):
        lrn.train(max_updates=10)          # the graph is captured again on the loaded state
        assert lrn.updates == 20 and np.all(np.isfinite(list(lrn.last_metrics.values())))
    assert on_graph.updater.path == "graph"


@pytest.mark.parametrize("acting, built_on", [("auto", "cpu"), ("cpu", "cpu")])
def test_the_daemons_copy_of_a_gpu_learner_with_a_learner_process_is_built_on_the_cpu(acting, built_on, monkeypatch):
    """[run] device "cuda" with a learner process: the daemon's copy only acts, on the CPU for a small
    network, so nothing in the daemon touches the GPU (no second CUDA context); its learner process
    is told to train on cuda. Runs without a GPU: nothing here allocates on cuda (torch is told it
    has one, so that the factory accepts the device)."""
    from simbridge.trainer.config.trainer_config import load_config
    from simbridge.trainer.run.factory import PolicyFactory
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = load_config(overrides=[("run.device", "cuda"), ("run.acting_device", acting), ("run.learner_process", True)])
    policy = PolicyFactory(cfg).build("default_policy", CARTPOLE.observation_space, CARTPOLE.action_space)
    assert policy.device.type == built_on and policy.acting_device.type == "cpu"
    assert policy.trains_on == torch.device("cuda")
    assert all(p.device.type == "cpu" for p in policy.acting.parameters())


def test_a_gpu_shared_with_other_processes_is_said_once_naming_them(monkeypatch, caplog):
    """nvidia-smi's compute apps on the learner's GPU, other than this process: one warning naming
    them (the parent, a daemon's acting copy on the GPU, marked as this trainer). nvidia-smi and the
    device are stand-ins here: the line's logic without a GPU."""
    import subprocess
    import types
    uuid = "GPU-1234abcd"
    rows = [f"{uuid}, {os.getpid()}, 700", f"{uuid}, {os.getppid()}, 830", "GPU-other, 4242, 100", f"{uuid}, 999, 50"]
    monkeypatch.setattr(placement.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(placement.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "\n".join(rows), ""))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="1234abcd"))
    monkeypatch.setattr(placement, "_said", set())
    gpu = torch.device("cuda:0")
    assert placement.gpu_neighbours(gpu) == [(os.getppid(), 830), (999, 50)]
    placement.say_gpu_neighbours(gpu, "SACLearner")
    placement.say_gpu_neighbours(gpu, "SACLearner")
    lines = [r.getMessage() for r in caplog.records if "also use" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"pid {os.getppid()} (this trainer) 830 MiB" in lines[0] and "pid 999 50 MiB" in lines[0]
    assert "SACLearner trains on cuda:0, which 2 other process(es) also use" in lines[0]
