"""Speed of Gazebo worlds through simbridge: one world with and without the plugin, and N worlds on one trainer.

    python bench/gazebo_farm.py [--worlds 1,2,3,4] [--seconds 30] [--policy random|dqn] [--out FILE]
    python bench/gazebo_farm.py --cameras 0,32x32,84x84,320x240 [--seconds 15]

Needs a gz-sim 8 (Harmonic) prefix (GZ_PREFIX, ~/.cache/simbridge/gz-harmonic, or gz on PATH; docs/gazebo.md)
and builds the plugin into build/gazebo-gz as tests/sims/test_gazebo_sim.py does. Prints one JSON object:

- `no_plugin`: the cart-pole world with its simbridge <plugin> block removed, `gz sim -s -r --iterations N`
  timed for two N (the difference cancels start-up): iterations/s, the real-time factor, and the
  actions/s it would be at the world's steps_per_action (the ceiling physics alone sets).
- `bridge`: for each N in --worlds, N `gz sim -s -r` processes (each its own GZ_PARTITION) feeding one
  `simbridge-trainer run` (the random policy by default: the bridge and the plugin, not a learner), the
  aggregate env steps/s over --seconds after every world's session is up, and per world.
- `cameras` (with --cameras, instead of the two above): the pendulum world, one at a time, without a
  camera (0) and with the tests' stand-in camera (sims/gazebo/tests/fake_camera_system.cpp: gz-sensors'
  timing, its "render" instant) of each WxH, R8G8B8 at the action rate, its frame beside the joints in the
  observation; env steps/s and CPU ms per env step of the world's and the trainer's processes: what a
  camera's frames cost the plugin, the C++ SDK and the bridge, not a render. Each size runs with the
  trainer's journal on (the default: every transition's obs and new_obs written ahead) and off.
"""
import argparse
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "sims"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import proc_cpu_s  # noqa: E402
from bench.report import emit  # noqa: E402
from gazebo_harness import (NO_PREFIX, ROOT, WORLDS, Trainer, World, camera_world, configure_and_build,  # noqa: E402
                            find_prefix, gz_env, wait_until)

RANDOM = """
[server]
address = "127.0.0.1:50051"
rollout_fragment_length = 32
[run]
logdir = "runs/unused"
checkpoint_every_env_steps = 10000000
print_every_s = 0.5
[policies.default_policy]
algorithm = "random"
"""


def world_numbers(sdf: Path):
    text = sdf.read_text()
    step = float(re.search(r"<max_step_size>([\d.]+)</max_step_size>", text).group(1))
    per_action = int(re.search(r"<steps_per_action>(\d+)</steps_per_action>", text).group(1))
    return step, per_action


def without_plugin(sdf: Path, out: Path) -> Path:
    text = re.sub(r"\s*<plugin filename=\"simbridge-gz-system\".*?</plugin>", "", sdf.read_text(), flags=re.S)
    out.write_text(text)
    return out


def time_iterations(prefix: Path, plugin_dir: Path, sdf: Path, iterations: int) -> float:
    env = gz_env(prefix, plugin_dir, "127.0.0.1:1")
    start = time.monotonic()
    subprocess.run([str(prefix / "bin" / "gz"), "sim", "-s", "-r", "--iterations", str(iterations), str(sdf)],
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900, check=True)
    return time.monotonic() - start


def no_plugin(prefix, plugin_dir, sdf, tmp: Path) -> dict:
    bare = without_plugin(sdf, tmp / "bare.sdf")
    step, per_action = world_numbers(sdf)
    small, large = 2000, 42000
    t_small = time_iterations(prefix, plugin_dir, bare, small)
    t_large = time_iterations(prefix, plugin_dir, bare, large)
    rate = (large - small) / (t_large - t_small)
    return {"iterations_per_s": round(rate), "real_time_factor": round(rate * step, 1),
            "actions_per_s_ceiling": round(rate / per_action), "startup_s": round(t_small - small / rate, 2),
            "command": f"gz sim -s -r --iterations {large} (and {small}) {sdf.name} without the simbridge plugin"}


def farm(prefix, plugin_dir, sdf, n: int, seconds: float, policy: str, tmp: Path) -> dict:
    run = tmp / f"farm{n}"
    if policy == "random":
        config = tmp / "random.toml"
        config.write_text(RANDOM)
        trainer = Trainer(run / "logs", config=config)
    else:
        trainer = Trainer(run / "logs", overrides=["run.print_every_s=0.5"])
    worlds = []
    try:
        trainer.wait_serving()
        worlds = [World(prefix, plugin_dir, sdf, trainer.address, run / f"gz{i}.log") for i in range(n)]
        wait_until(lambda: trainer.last().get("sessions") == n, 180, f"{n} sessions",
                   [(f"world {i}", w.proc, w.log) for i, w in enumerate(worlds)])
        time.sleep(3.0)   # past the first episodes' start
        first = trainer.last()
        time.sleep(seconds)
        last = trainer.last()
        dt = last["wall_s"] - first["wall_s"]
        steps = last["env_steps"] - first["env_steps"]
        step, per_action = world_numbers(sdf)
        return {"worlds": n, "policy": policy, "env_steps": steps, "seconds": round(dt, 1),
                "steps_per_s": round(steps / dt, 1), "per_world_steps_per_s": round(steps / dt / n, 1),
                "real_time_factor_per_world": round(steps / dt / n * per_action * step, 2)}
    finally:
        for w in worlds:
            w.stop()
        trainer.stop()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of the process `pid` and its descendants, from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):   # gone meanwhile
            continue
    tree = {pid}
    for _ in range(8):   # a few generations: stdbuf -> gz (ruby) -> the server
        tree |= {p for p, ppid in parents.items() if ppid in tree}
    return sum(proc_cpu_s(p) or 0.0 for p in tree)


def camera_cost(prefix, plugin_dir, sizes, seconds: float, tmp: Path) -> list:
    rows = []
    for size, journal in ((size, journal) for size in sizes for journal in (True, False)):
        out = tmp / f"camera-{size}-{'journal' if journal else 'nojournal'}"
        out.mkdir()
        if size == "0":
            sdf = WORLDS / "pendulum.sdf"
        else:
            w, h = (int(x) for x in size.split("x"))
            sdf = camera_world(out, w, h, update_rate=50, image_format="R8G8B8", render_ms=0)
        config = out / "random.toml"
        config.write_text(RANDOM)
        trainer = Trainer(out / "logs", config=config, overrides=(f"run.journal={str(journal).lower()}",))
        world = None
        try:
            trainer.wait_serving()
            world = World(prefix, plugin_dir, sdf, trainer.address, out / "gz.log")
            wait_until(lambda: trainer.last().get("sessions") == 1, 180, "the world's session",
                       [("gz sim", world.proc, world.log)])
            time.sleep(3.0)
            first, cpu0 = trainer.last(), (tree_cpu_s(world.proc.pid), tree_cpu_s(trainer.proc.pid))
            time.sleep(seconds)
            last, cpu1 = trainer.last(), (tree_cpu_s(world.proc.pid), tree_cpu_s(trainer.proc.pid))
            steps = last["env_steps"] - first["env_steps"]
            dt = last["wall_s"] - first["wall_s"]
            rows.append({"camera": size, "journal": journal, "env_steps": steps, "seconds": round(dt, 1),
                         "steps_per_s": round(steps / dt, 1),
                         "world_cpu_ms_per_step": round(1000 * (cpu1[0] - cpu0[0]) / max(steps, 1), 3),
                         "trainer_cpu_ms_per_step": round(1000 * (cpu1[1] - cpu0[1]) / max(steps, 1), 3),
                         "inactive": "the plugin is inactive" in world.text()})
        finally:
            if world is not None:
                world.stop()
            trainer.stop()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="1,2,3,4", help="comma-separated N: worlds feeding one trainer")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured window per N")
    ap.add_argument("--policy", choices=("random", "dqn"), default="random")
    ap.add_argument("--world", default=str(WORLDS / "cartpole.sdf"))
    ap.add_argument("--cameras", help="comma-separated camera sizes WxH (0: none) on the pendulum world, "
                                      "instead of --worlds")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    prefix = find_prefix()
    if prefix is None:
        sys.exit(NO_PREFIX)
    built = configure_and_build(prefix, ROOT / "build" / "gazebo-gz")
    if built.get("build_rc") != 0 or built.get("plugin") is None:
        sys.exit("the plugin did not build:\n" + built.get("build", built["configure"])[-3000:])
    plugin_dir = built["plugin"].parent
    sdf = Path(args.world)
    with tempfile.TemporaryDirectory(prefix="gzfarm-") as tmp:
        tmp = Path(tmp)
        result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
                  "cpus": __import__("os").cpu_count(), "load_avg": __import__("os").getloadavg(),
                  "prefix": str(prefix)}
        if args.cameras:
            result["cameras"] = camera_cost(prefix, plugin_dir, args.cameras.split(","), args.seconds, tmp)
        else:
            result.update(world=sdf.name, no_plugin=no_plugin(prefix, plugin_dir, sdf, tmp),
                          bridge=[farm(prefix, plugin_dir, sdf, int(n), args.seconds, args.policy, tmp)
                                  for n in args.worlds.split(",")])
    emit(result, args.out, indent=2)


if __name__ == "__main__":
    main()
