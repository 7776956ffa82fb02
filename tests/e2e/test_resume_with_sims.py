"""Kill the trainer daemon for real while a simulator runs; resume it; the simulator goes on."""
import signal
import subprocess
import sys


from simbridge.trainer.run.launch import child_env, free_port, stop_all, wait_for_health
from support.daemon import metrics
from support.waits import wait

CONFIG = """
[server]
address = "{address}"
rollout_fragment_length = 16
[run]
logdir = "{logdir}"
checkpoint_every_env_steps = 100000
print_every_s = 0.5
[policies.default_policy]
algorithm = "random"
"""


def test_daemon_sigterm_resume_simulator_goes_on(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    logdir = tmp_path / "run"
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(CONFIG.format(address=address, logdir=logdir))
    env = child_env()
    daemon = [sys.executable, "-m", "simbridge.trainer.cli", "run", "--config", str(cfg)]
    d1 = subprocess.Popen(daemon, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sim = None
    d2 = None
    try:
        wait_for_health(address, timeout=60)
        sim = subprocess.Popen([sys.executable, "-m", "simbridge.sims.gym_sim", "--address", address, "--quiet",
                                "--slots", "2", "--seed", "0"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait(lambda: any(r["env_steps"] > 300 for r in metrics(logdir)), 60, "first env steps")
        d1.send_signal(signal.SIGTERM)
        assert d1.wait(30) == 0
        before = metrics(logdir)[-1]
        assert before.get("event") == "stop"
        assert sim.poll() is None, "the simulator must survive the daemon's restart"
        d2 = subprocess.Popen(daemon + ["--resume"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(lambda: metrics(logdir)[-1]["env_steps"] > before["env_steps"] + 300
             and metrics(logdir)[-1].get("sessions", 0) >= 1, 60, "the simulator to come back")
        resumed = [r for r in metrics(logdir) if r.get("event") == "resume"]
        assert resumed and resumed[0]["env_steps"] >= before["env_steps"]   # counts continue
        assert sim.poll() is None
    finally:
        stop_all([sim, d1, d2], timeout=20)
    if sim is not None:
        err = sim.stderr.read()
        assert "going on with new episodes" in err, err
