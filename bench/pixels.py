"""DQN on an Atari game from pixels, through the bridge: the trainer daemon and an ale-py simulator process.

    python bench/pixels.py [--game Pong] [--env-steps 20000] [--seed 0] [--stack-in simulator|trainer]
                           [--set KEY=VALUE ...] [--out FILE]

Needs ale-py (`pip install ale-py`, or the `atari` extra: it ships the ROMs). The simulator is
simbridge-sim's loop (sims/gym_sim.py) on `<Game>NoFrameskip-v4` preprocessed as CleanRL's
dqn_atari.py does, with gymnasium's wrappers: up to 30 no-op starts, frame skip 4 (max over the
last two frames), 84x84 grayscale, 4 frames stacked in the simulator, so the trainer receives
uint8 (4, 84, 84) observations (CHW: "auto" takes nature_cnn). `--stack-in trainer` sends single
frames, uint8 (84, 84, 1), and the trainer stacks them (the policy's `frame_stack = 4`): the network
reads (84, 84, 4), the same four frames in HWC. Not copied: CleanRL's episodic life
and FIRE reset wrappers, and reward clipping (Pong's rewards are +-1 already, so its returns are
the game's score either way).

The learner takes CleanRL's hyperparameters (learning rate 1e-4, batch 32, gamma 0.99, one update
per 4 env steps, hard target copy every 1000 env steps = 250 updates, MSE loss, epsilon 1 -> 0.01
over the first 10% of steps; not its unclipped gradients: DQN's grad_clip 10 stays, TOML has no None), scaled to the budget: `--env-steps` N gives a replay of
min(N, 100k) transitions (56 KiB a transition as rows, obs and new_obs; the replay keeps each frame
once, about 9 KiB: trainer/learners/frame_replay.py), learning_starts N/10
and epsilon over N/10. `--set KEY=VALUE` (a TOML value) overrides any learner key.

Prints one JSON object: the game, the command's settings, `curve` (env_steps, episodes, the mean
return of the last 10 episodes, wall seconds from the first env step), the final figures, and the
published reference: CleanRL's dqn_atari.py on PongNoFrameskip-v4 reached a mean evaluation return
of 17.8 +- 1.8 after 10M env steps (model card of cleanrl/PongNoFrameskip-v4-dqn_atari-seed1 on
Hugging Face); a random policy scores about -20.7.
"""
from simbridge.wire.grpc_tuning import prefer_iomgr_tcp

prefer_iomgr_tcp()   # before anything imports grpc: see simbridge/wire/grpc_tuning.py
import argparse
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import emit  # noqa: E402

from simbridge.trainer.config.values import parse_overrides, toml_value  # noqa: E402
from simbridge.trainer.run import reporting  # noqa: E402
from simbridge.trainer.run.launch import child_env, free_port, stop_all, wait_for_health  # noqa: E402
from simbridge.trainer.run.rundir import METRICS  # noqa: E402

ENV_ID = "simbridge/AtariPixels-v0"
FRAMES = 4   # stacked, in the simulator or by the trainer (--stack-in)
REFERENCE = {"source": "huggingface.co/cleanrl/PongNoFrameskip-v4-dqn_atari-seed1 (CleanRL dqn_atari.py)",
             "env": "PongNoFrameskip-v4", "env_steps": 10_000_000, "mean_return": 17.8, "std": 1.83}


def make_env(game: str = "Pong", stack: bool = True):
    """<game>NoFrameskip-v4 with CleanRL's observation preprocessing (see the module's docstring);
    stack=False: single frames (84, 84, 1), for the trainer to stack."""
    import ale_py
    import gymnasium as gym
    gym.register_envs(ale_py)
    env = gym.make(f"{game}NoFrameskip-v4")
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True,
                                          grayscale_newaxis=not stack, terminal_on_life_loss=False, scale_obs=False)
    return gym.wrappers.FrameStackObservation(env, FRAMES) if stack else env


def learner_config(env_steps: int, seed: int, overrides: dict) -> dict:
    tenth = max(1_000, env_steps // 10)
    return {"hidden": [512], "lr": 1e-4, "batch_size": 32, "gamma": 0.99, "buffer_size": min(env_steps, 100_000),
            "learning_starts": tenth, "updates_per_step": 0.25, "target_update_interval": 250, "tau": 1.0,
            "loss": "mse", "epsilon_initial": 1.0, "epsilon_final": 0.01,
            "epsilon_timesteps": tenth, "vis_encode_type": "nature_cnn", "seed": seed, **overrides}


def simulator(argv: List[str]) -> int:
    """The simulator process: registers the preprocessed game and runs simbridge-sim's loop on it."""
    import gymnasium as gym
    from simbridge.sims import gym_sim
    p = argparse.ArgumentParser()
    p.add_argument("--game", default="Pong")
    p.add_argument("--stack-in", default="simulator")
    args, rest = p.parse_known_args(argv)
    gym.registry.pop(ENV_ID, None)
    gym.register(ENV_ID, entry_point=make_env, kwargs={"game": args.game, "stack": args.stack_in == "simulator"})
    return gym_sim.main(["--env", ENV_ID, *rest])


def run(args) -> dict:
    cfg = learner_config(args.env_steps, args.seed, dict(parse_overrides(args.set)))
    tmp = Path(tempfile.mkdtemp(prefix="simbridge-pixels-"))
    logdir, address = tmp / "run", f"127.0.0.1:{free_port()}"
    (tmp / "config.toml").write_text("\n".join([
        "[server]", f'address = "{address}"', "rollout_fragment_length = 32", "experience_queue_size = 4",
        f"max_policy_memory_mb = {args.max_memory_mb}",
        "[run]", f'logdir = "{logdir}"', f"total_env_steps = {args.env_steps}", f"seed = {args.seed}",
        "checkpoint_every_env_steps = 100000000", "print_every_s = 5",
        "[policies.default_policy]", 'algorithm = "dqn"', f"config = {toml_value(cfg)}",
        f"frame_stack = {FRAMES if args.stack_in == 'trainer' else 1}"]) + "\n")
    env = child_env()
    log = open(tmp / "processes.log", "w")
    procs: List[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "simbridge.trainer.cli", "run", "--config",
                                       str(tmp / "config.toml")], env=env, cwd=str(ROOT), stdout=log, stderr=log))
        wait_for_health(address, timeout=120)
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--simulator", "--game", args.game,
                                       "--stack-in", args.stack_in, "--address", address, "--quiet", "--seed", str(args.seed)],
                                      env=env, cwd=str(ROOT), stdout=log, stderr=log))
        deadline = time.monotonic() + args.timeout_s
        while time.monotonic() < deadline and procs[0].poll() is None and procs[1].poll() is None:
            time.sleep(1.0)
    finally:
        stop_all(list(reversed(procs)))
        log.close()
    path = logdir / METRICS   # read once the daemon is done: its last record is the budget's end
    recs = reporting.read_metrics(path) if path.exists() else []   # the last: the "stop" record, at the end
    if not recs:
        raise SystemExit(f"pixels.py: no metrics were written; see {tmp / 'processes.log'}")
    start = max([r["wall_s"] for r in recs if r["env_steps"] == 0], default=0.0)
    curve, step = [], max(1, args.env_steps // 20)
    for r in recs:
        if r["env_steps"] and (not curve or r["env_steps"] - curve[-1]["env_steps"] >= step or r is recs[-1]):
            curve.append({"env_steps": r["env_steps"], "episodes": r.get("episodes"),
                          "return_mean_10": r.get("return_mean_10", {}).get("default_policy"),
                          "wall_s": round(r["wall_s"] - start, 1)})
    last = recs[-1]
    return {"bench": "pixels", "game": f"{args.game}NoFrameskip-v4", "algorithm": "dqn", "config": cfg,
            "stack_in": args.stack_in,
            "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPUs", "env_steps": last["env_steps"],
            "episodes": last.get("episodes"), "updates": last.get("updates", {}).get("default_policy"),
            "final_return_mean_10": last.get("return_mean_10", {}).get("default_policy"),
            "wall_s": round(last["wall_s"] - start, 1),
            "env_steps_per_s": round(last["env_steps"] / max(1e-9, last["wall_s"] - start), 1),
            "curve": curve, "reference": REFERENCE, "logs": str(tmp)}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--simulator"]:
        return simulator(argv[1:])
    p = argparse.ArgumentParser(prog="bench/pixels.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--game", default="Pong", help="an Atari game of ale-py (default: %(default)s)")
    p.add_argument("--env-steps", type=int, default=20_000, help="env steps (agent steps after frame skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stack-in", choices=("simulator", "trainer"), default="simulator",
                   help="who stacks the 4 frames: the simulator (gymnasium's FrameStackObservation) or the "
                        "trainer (the policy's frame_stack = 4) (default: %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a learner config key, value as in TOML")
    p.add_argument("--max-memory-mb", type=int, default=8192, help="[server] max_policy_memory_mb")
    p.add_argument("--timeout-s", type=float, default=3600.0)
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    try:
        import ale_py  # noqa: F401
    except ImportError:
        print("pixels.py: needs ale-py: pip install ale-py (or the atari extra)", file=sys.stderr)
        return 2
    out = run(args)
    return emit(out, args.out)


if __name__ == "__main__":
    sys.exit(main())
