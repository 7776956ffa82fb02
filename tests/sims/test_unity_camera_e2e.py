"""A Unity camera trains through the connector: the test peer's Camera scene (a 3x5x5 CHW camera, sent
as PNG, sent by the connector as its uint8 pixels; actions move a marker column towards the
middle: -0.1 a step, +1 there) learned by DQN through the convolutional encoder "auto" picks at 5x5
(match3). The daemon and the connector (driving the peer, 8 agents) are processes on loopback.

A random policy scores 0.25 on average over the peer's 8-step episodes (a mean of 10 episodes reaches
0.8 by chance once in 250 windows, so the test judges the mean of the last 100: random, 0.25 +- 0.05);
the best is 0.95 (the marker starts one or two columns away). The test allows 12k env steps.
"""
import torch
from unity_peer.harness import train_through_connector

BUDGET = 12_000


def r100(rec):
    """The mean return of the last 100 episodes, once there are 100 (before that, a mean of a few
    lucky random episodes passed the target at 24 env steps, in a full run under load)."""
    if rec.get("episodes", 0) < 100:
        return None
    return (rec.get("return_mean") or {}).get("camera")


def test_dqn_learns_the_peers_camera_scene_through_the_connector_with_a_cnn(tmp_path):
    config = tmp_path / "camera.toml"
    config.write_text("""[server]
rollout_fragment_length = 32
experience_queue_size = 4
[run]
seed = 0
print_every_s = 0.5
torch_threads = 1
checkpoint_every_env_steps = 1000000
[policies.camera]
algorithm = "dqn"
config = { hidden = [64], lr = 1e-3, gamma = 0.9, buffer_size = 10000, batch_size = 32, learning_starts = 200, epsilon_timesteps = 1500, epsilon_final = 0.02, updates_per_step = 0.25 }
[mapping]
rules = ["Camera*=camera"]
default = "camera"
""")
    recs, connector_err = train_through_connector(tmp_path, config, "camera", BUDGET, 150,
                                                  lambda rec: (r100(rec) or -9) >= 0.7)
    assert recs, f"no metrics were written; connector: {connector_err[-2000:]}"
    scored = [r for r in recs if r100(r) is not None]
    assert scored, f"no camera episodes finished; connector: {connector_err[-2000:]}"
    last = scored[-1]
    print(f"camera return(100): {r100(scored[0]):.2f} at {scored[0]['env_steps']} -> {r100(last):.2f} at "
          f"{last['env_steps']} env steps, {last['wall_s']:.1f}s")
    assert r100(last) >= 0.7 and last["env_steps"] <= BUDGET and last["versions"]["camera"] > 0
    # the policy learned through a convolutional encoder (match3's first convolution: 35 3x3 filters over 3 channels)
    nets = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True, map_location="cpu")
    q = nets["policies"]["camera"]["state"]["nets"]["q"]
    assert q["encoder.images.0.encoder.0.0.weight"].shape == (35, 3, 3, 3)
