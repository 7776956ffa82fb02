"""Image observations: the encoder each learner puts before its MLP (trainer/learners/encoders.py),
its errors, and uint8 kept from the client's message to the replay buffer."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from simbridge.client import PolicyClient
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.trainer.config.values import ConfigError
from simbridge.trainer.learners import encoders, frame_replay
from simbridge.trainer.learners.dqn import DQNLearner, QNetwork
from simbridge.trainer.learners.ppo import PPOLearner
from simbridge.trainer.learners.sac import SACLearner
from simbridge.wire import spaces as sb_spaces
from simbridge.wire import values
from simbridge.wire.columns import NEW_OBS, OBS
from simbridge.wire.preprocess import flatten
from simbridge.wire.v1 import simbridge_pb2 as pb

torch.set_num_threads(1)

CAMERA = gym.spaces.Box(0, 255, (20, 20, 1), np.uint8)           # HWC, uint8
SMALL = {"hidden": [16, 16], "seed": 0}
OFF = {**SMALL, "batch_size": 8, "learning_starts": 0}
ON = {**SMALL, "train_batch_size": 16, "minibatch_size": 8, "num_epochs": 1}


def image(shape, dtype=np.uint8):
    return gym.spaces.Box(0, 255 if dtype == np.uint8 else 1, shape, dtype)


@pytest.mark.parametrize("shape, kind", [((84, 84, 4), "nature_cnn"), ((4, 84, 84), "nature_cnn"),
                                         ((20, 20, 1), "simple"), ((3, 35, 40), "simple"),
                                         ((1, 12, 12), "match3"), ((3, 4, 4), "fully_connected")])
def test_auto_picks_the_largest_encoder_the_image_fits(shape, kind):
    enc = encoders.encoder_for(image(shape), {"hidden": [32], "vis_encode_type": "auto"})
    assert [p.kind for p in enc.images] == [kind]
    out = enc(torch.as_tensor(encoders.obs_rows(image(shape), np.stack([image(shape).sample()] * 3))))
    assert out.shape == (3, 32) and out.dtype == torch.float32


@pytest.mark.parametrize("kind, side", sorted(encoders.MIN_SIDE.items()))
def test_each_encoder_takes_its_minimum_and_refuses_one_pixel_less(kind, side):
    ok = encoders.encoder_for(image((side, side, 3)), {"hidden": [8], "vis_encode_type": kind})
    assert ok.images[0].kind == kind
    assert ok(torch.zeros(2, side * side * 3, dtype=torch.uint8)).shape == (2, 8)
    if side > 1:
        with pytest.raises(ValueError, match=rf"needs at least {side}x{side}.*set vis_encode_type"):
            DQNLearner(image((side - 1, side, 3)), gym.spaces.Discrete(2), {**OFF, "vis_encode_type": kind})


def test_unknown_encoder_name_is_a_config_error_naming_the_choices():
    from simbridge.trainer.config.trainer_config import parse_config, resolve_algorithm
    cfg = parse_config('[policies.p]\nalgorithm = "dqn"\nconfig = { vis_encode_type = "nature" }\n')
    with pytest.raises(ConfigError, match=r"vis_encode_type = \"nature\": expected one of \"auto\", \"simple\""):
        resolve_algorithm(cfg.policies["p"], cfg.source)


def test_hwc_and_chw_are_read_as_the_same_image():
    hwc = encoders.encoder_for(image((20, 24, 3)), {"hidden": [8]})
    chw = encoders.encoder_for(image((3, 20, 24)), {"hidden": [8]})
    chw.load_state_dict(hwc.state_dict())
    pixels = np.random.default_rng(0).integers(0, 256, (5, 3, 20, 24), dtype=np.uint8)
    a = hwc(torch.as_tensor(pixels.transpose(0, 2, 3, 1).reshape(5, -1)))
    b = chw(torch.as_tensor(pixels.reshape(5, -1)))
    torch.testing.assert_close(a, b)


def test_uint8_is_scaled_to_unit_range_and_float_images_are_not():
    u8 = encoders.encoder_for(image((1, 6, 6)), {"hidden": [4]})
    f32 = encoders.encoder_for(image((1, 6, 6), np.float32), {"hidden": [4]})
    f32.load_state_dict(u8.state_dict())
    pixels = np.random.default_rng(1).integers(0, 256, (4, 36), dtype=np.uint8)
    torch.testing.assert_close(u8(torch.as_tensor(pixels)), f32(torch.as_tensor(pixels / 255.0, dtype=torch.float32)))


def test_a_dict_puts_images_through_the_encoder_and_vectors_beside_it():
    space = gym.spaces.Dict({"cam": image((1, 8, 8), np.float32), "speed": gym.spaces.Box(-5, 5, (2,), np.float32),
                             "gear": gym.spaces.Discrete(3)})
    enc = encoders.encoder_for(space, {"hidden": [16]})
    assert enc.out_dim == 16 + 2 + 3 and [p.kind for p in enc.images] == ["match3"]
    obs = sb_spaces.sample_batch_of(space, 4, np.random.default_rng(0))
    rows = encoders.obs_rows(space, obs)
    assert rows.dtype == np.float32            # mixed with floats: float rows
    out = enc(torch.as_tensor(rows))
    torch.testing.assert_close(out[:, 16:], torch.as_tensor(rows[:, 64:]))   # the vectors, as they are


# A camera beside joint states, a gear and raw bytes: the robot's usual observation.
ROBOT = gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (20, 20, 1), np.uint8),
                         "joints": gym.spaces.Box(-3, 3, (3,), np.float32), "gear": gym.spaces.Discrete(3),
                         "bumpers": gym.spaces.Box(0, 255, (2,), np.uint8)})


def test_a_camera_beside_vectors_keeps_its_bytes_and_reads_as_the_flat_rows_do():
    obs = sb_spaces.sample_batch_of(ROBOT, 6, np.random.default_rng(2))
    rows = encoders.obs_rows(ROBOT, obs)
    # a byte a pixel and a raw byte, the joints and the gear's one-hot as float32 bytes
    assert rows.dtype == np.uint8 and rows.shape == (6, encoders.row_bytes(ROBOT)) == (6, 400 + 4 * 3 + 4 * 3 + 2)
    flat = flatten(ROBOT, obs)
    enc = encoders.encoder_for(ROBOT, {"hidden": [16]})
    with torch.no_grad():
        torch.testing.assert_close(enc(torch.as_tensor(rows)), enc(torch.as_tensor(flat)), rtol=0, atol=0)
    with torch.no_grad():   # the vectors reach the MLP as the flat row has them (after the image's features)
        vectors = np.concatenate([flat[:, :2], flat[:, 402:]], 1)   # gymnasium sorts the keys: bumpers first
        torch.testing.assert_close(enc(torch.as_tensor(rows))[:, 16:], torch.as_tensor(vectors), rtol=0, atol=0)
    # a checkpoint's flat float32 rows of the same observations become exactly these bytes
    state = {"data": {OBS: torch.as_tensor(flat), NEW_OBS: torch.as_tensor(flat), "rewards": torch.zeros(6)}}
    converted = encoders.replay_in_layout(ROBOT, state)["data"]
    assert torch.equal(converted[OBS], torch.as_tensor(rows)) and torch.equal(converted[NEW_OBS], converted[OBS])
    assert encoders.replay_in_layout(ROBOT, {"data": converted})["data"][OBS] is converted[OBS]   # bytes stay


def test_one_observation_of_a_camera_beside_vectors_is_acted_on():
    """A single row's float parts sit at a byte offset that is no multiple of 4 (ROBOT's 2 bumper
    bytes sort first): acting on one observation reads them as float32 all the same."""
    one = sb_spaces.sample_batch_of(ROBOT, 1, np.random.default_rng(5))
    dqn = DQNLearner(ROBOT, gym.spaces.Discrete(3), OFF)
    assert dqn.compute_actions(one, explore=False).actions.shape == (1,)
    sac = SACLearner(ROBOT, gym.spaces.Box(-1, 1, (2,), np.float32), {**OFF, "random_warmup": False})
    assert sac.compute_actions(one, explore=False).actions.shape == (1, 2)


def test_a_replay_checkpointed_with_flat_rows_loads_as_bytes_and_trains():
    learner = DQNLearner(ROBOT, gym.spaces.Discrete(3), OFF)
    batch = _rows(ROBOT, 32, np.random.default_rng(0))
    learner.add(batch)
    bytes_before = learner.replay.gather(torch.arange(32))[OBS]
    state = learner.state_dict(include_replay=True)
    state["replay"] = frame_replay.as_rows(state["replay"])   # camera frames were rows then
    for k in (OBS, NEW_OBS):   # as a checkpoint of the version that kept such rows as float32
        state["replay"]["data"][k] = torch.as_tensor(flatten(ROBOT, batch[k]))
    again = DQNLearner(ROBOT, gym.spaces.Discrete(3), OFF)
    again.load_state_dict(state)
    assert torch.equal(again.replay.gather(torch.arange(32))[OBS], bytes_before)
    assert np.isfinite(again.train()["loss"])


def test_vector_observations_keep_the_plain_mlp_and_its_initial_weights():
    box = gym.spaces.Box(-1, 1, (4,), np.float32)
    learner = DQNLearner(box, gym.spaces.Discrete(3), OFF)
    assert type(learner.q) is QNetwork
    torch.manual_seed(0)
    plain = QNetwork(4, np.array([3]), [16, 16], False)
    for (k, a), (_, b) in zip(learner.q.state_dict().items(), plain.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)
    assert encoders.obs_rows(box, np.zeros((2, 4), np.float32)).dtype == np.float32


def _rows(space, n, rng):
    from simbridge.server.sample_batch import SampleBatch
    obs = sb_spaces.sample_batch_of(space, n, rng)
    new = sb_spaces.sample_batch_of(space, n, rng)
    return SampleBatch(obs=obs, new_obs=new, actions=rng.integers(0, 3, n), rewards=rng.normal(size=n).astype(np.float32),
                       terminateds=np.zeros(n, bool), truncateds=np.zeros(n, bool), eps_id=np.zeros(n, np.int64),
                       agent_index=np.zeros(n, np.int64), t=np.arange(n), policy_version=np.zeros(n, np.int64),
                       action_logp=np.full(n, -1.1, np.float32))


@pytest.mark.parametrize("space", [CAMERA, gym.spaces.Dict({"cam": CAMERA, "left": image((1, 20, 20)),
                                                             "bytes": gym.spaces.Box(0, 255, (3,), np.uint8)}),
                                   ROBOT])
def test_dqn_keeps_uint8_in_replay_and_trains_a_cnn(space):
    learner = DQNLearner(space, gym.spaces.Discrete(3), OFF)
    learner.add(_rows(space, 32, np.random.default_rng(0)))
    rows = learner.replay.gather(torch.arange(32))
    assert rows[OBS].dtype == torch.uint8 and rows[NEW_OBS].dtype == torch.uint8
    before = [p.detach().clone() for p in learner.q.encoder.parameters()]
    metrics = learner.train()
    assert learner.updates > 0 and np.isfinite(metrics["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.q.encoder.parameters()))   # the CNN learns


def test_sac_and_ppo_train_through_their_encoders():
    sac = SACLearner(CAMERA, gym.spaces.Box(-1, 1, (2,), np.float32), {**OFF, "random_warmup": False})
    batch = _rows(CAMERA, 32, np.random.default_rng(0))
    batch["actions"] = np.random.default_rng(1).uniform(-1, 1, (32, 2)).astype(np.float32)
    sac.add(batch)
    assert sac.replay.gather(torch.arange(32))[OBS].dtype == torch.uint8
    m = sac.train()
    assert np.isfinite(m["critic_loss"]) and sac.critic.encoder is not sac.critic_target.encoder
    ppo = PPOLearner(CAMERA, gym.spaces.Discrete(3), ON)
    ppo.add(_rows(CAMERA, 16, np.random.default_rng(2)))
    assert ppo.incoming[0][OBS].dtype == np.uint8
    ppo.train()
    assert ppo.updates > 0 and ppo.iteration is None and np.isfinite(ppo.last_metrics["vf_loss"])


def test_the_memory_estimate_counts_a_camera_in_bytes_and_the_cnn_not_an_mlp_on_pixels():
    atari = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    est = DQNLearner.memory_estimate(atari, gym.spaces.Discrete(6), {"buffer_size": 1000, "replay_store": "rows"})
    assert est["transition"] == 2 * 84 * 84 * 4 + 4 * 6 + 64          # one byte a pixel, twice
    # kept as frames (the default): a stack of 4 shares 3 with the next, obs its frames with new_obs
    frames = DQNLearner.memory_estimate(atari, gym.spaces.Discrete(6), {"buffer_size": 1000, "frame_stack": 4})
    assert frames["transition"] == int((1000 * 1.25 + 16) / 1000 * 84 * 84) + 2 * 4 * 8 + 4 * 6 + 64   # ~1.27 frames
    as_floats = DQNLearner.memory_estimate(gym.spaces.Box(0, 1, (84, 84, 4), np.float32), gym.spaces.Discrete(6),
                                           {"buffer_size": 1000})
    assert as_floats["transition"] == 2 * 4 * 84 * 84 * 4 + 4 * 6 + 64
    nature = encoders.encoder_params(atari, {"hidden": [256, 256]})
    assert 500_000 < nature < 2_000_000                                   # convolutions and a dense layer
    assert est["networks"] < 6 * 4 * 84 * 84 * 4 * 256 / 4                  # far below an MLP on the pixels


def test_a_learner_says_at_start_what_its_camera_costs(caplog):
    caplog.set_level("INFO", logger="simbridge.trainer")
    DQNLearner(CAMERA, gym.spaces.Discrete(3), {**OFF, "buffer_size": 10_000})
    est = DQNLearner.memory_estimate(CAMERA, gym.spaces.Discrete(3), {**OFF, "buffer_size": 10_000})
    said = caplog.text
    assert "20x20x1 uint8 image through simple" in said and "one observation is 400 bytes (uint8 rows)" in said
    assert f"replay {est['replay'] / 2**20:.1f} MiB" in said, said


def test_uint8_pixels_cross_the_wire_as_bytes_and_reach_the_replay_as_uint8(make_server):
    """A real server on loopback whose policy is a DQN learner; a client sends uint8 frames."""
    made = {}

    def factory(pid, obs_space, act_space):
        made[pid] = DQNLearner(obs_space, act_space, OFF, device="cpu")
        return made[pid]

    runtime = BridgeRuntime(BridgeConfig(rollout_fragment_length=8), policy_factory=factory)
    server = make_server(runtime=runtime)
    frame = CAMERA.sample()
    wire = values.encode_value(CAMERA, frame, batched=False)
    assert wire.tensor.dtype == pb.UINT8 and len(wire.tensor.data) == 20 * 20 * 1   # a byte a pixel
    client = PolicyClient(server.address, CAMERA, gym.spaces.Discrete(3))
    try:
        eid = client.start_episode()
        for _ in range(12):
            action = client.get_action(eid, CAMERA.sample())
            assert 0 <= int(action) < 3
            client.log_returns(eid, 1.0)
        client.end_episode(eid, CAMERA.sample())
    finally:
        client.close()
    got = runtime.experience.get(timeout=30)
    rows = got.policy_batches["default_policy"]
    assert np.asarray(rows[OBS]).dtype == np.uint8 and np.asarray(rows[OBS]).shape[1:] == (20, 20, 1)
    learner = made["default_policy"]
    learner.add(rows)
    stored = learner.replay.gather(torch.arange(len(learner.replay)))[OBS]
    assert stored.dtype == torch.uint8 and stored.shape[1] == 400


# ---------------------------------------------------------------- export

def _acting_outputs(algo, learner, rows):
    """The torch network's output that the exported head reads, from the learner's acting copy."""
    net = learner.acting
    with torch.no_grad():
        if algo == "dqn":
            return net(rows).reshape(len(rows), -1).numpy()
        if algo == "ppo":
            return net(rows).numpy()
        return net.mlp.net(net.encoder(rows)).numpy()   # SAC: [mean, raw log_std], before the squash


MIXED = gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, (1, 12, 12), np.uint8),
                         "speed": gym.spaces.Box(-1, 1, (2,), np.float32)})


@pytest.mark.parametrize("algo, space", [("dqn", CAMERA), ("dqn", MIXED), ("ppo", CAMERA), ("sac", CAMERA)])
def test_a_cnn_policy_exports_onnx_equal_to_torch_and_acts_locally_through_onnxruntime(algo, space):
    import onnxruntime as ort
    from simbridge.client.local_policy import LocalPolicy
    if algo == "dqn":
        learner = DQNLearner(space, gym.spaces.Discrete(3), OFF)
    elif algo == "ppo":
        learner = PPOLearner(space, gym.spaces.Discrete(3), ON)
    else:
        learner = SACLearner(space, gym.spaces.Box(-2, 2, (2,), np.float32), {**OFF, "random_warmup": False})
    msg = learner.portable()
    assert not msg.layers and msg.onnx_model, "a CNN policy's portable form is its ONNX model"
    obs = sb_spaces.sample_batch_of(space, 16, np.random.default_rng(3))
    flat = flatten(space, obs)                      # what a local client feeds: float32, 0-255 pixels
    got = ort.InferenceSession(msg.onnx_model, providers=["CPUExecutionProvider"]).run(["out"], {"obs": flat})[0]
    expected = _acting_outputs(algo, learner, torch.as_tensor(encoders.obs_rows(space, obs)))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    greedy = pb.PortablePolicy()
    greedy.CopyFrom(msg)
    greedy.head.params["epsilon"] = 0.0
    greedy.head.params["deterministic"] = 1.0
    local = LocalPolicy(greedy, seed=0)
    mine, _ = local.compute_actions(obs)
    theirs = learner.compute_actions(obs, explore=False).actions
    np.testing.assert_allclose(np.asarray(mine, np.float64), np.asarray(theirs, np.float64), atol=1e-4)
    one, _ = local.act(sb_spaces.unbatch_row0(space, sb_spaces.sample_batch_of(space, 1, np.random.default_rng(4))))
    assert np.asarray(one).shape == space_shape(learner.action_space)


def space_shape(space):
    return () if isinstance(space, gym.spaces.Discrete) else space.shape


def test_local_inference_without_onnxruntime_says_which_policy_needs_it(monkeypatch):
    import sys
    from simbridge.client.local_policy import LocalPolicy, PolicyFormatError
    msg = DQNLearner(CAMERA, gym.spaces.Discrete(3), OFF).portable()
    msg.policy_id = "camera_policy"
    monkeypatch.setitem(sys.modules, "onnxruntime", None)    # as if not installed
    with pytest.raises(PolicyFormatError, match=r"policy 'camera_policy'.*convolutional encoder.*pip install onnxruntime"):
        LocalPolicy(msg)
    vector = DQNLearner(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(3), OFF).portable()
    assert vector.layers and LocalPolicy(vector).compute_actions(np.zeros((2, 4), np.float32))[0].shape == (2,)


def test_the_export_command_writes_a_cnn_policys_onnx_and_checks_it(tmp_path, capsys):
    from simbridge.trainer import cli
    from simbridge.trainer.run import checkpoint
    from simbridge.trainer.run.launch import free_port
    run = tmp_path / "trained"
    run.mkdir()
    learner = DQNLearner(CAMERA, gym.spaces.Discrete(3), OFF, device="cpu")
    learner.add(_rows(CAMERA, 32, np.random.default_rng(0)))
    learner.train(max_updates=3)
    (run / "config.toml").write_text(f'[server]\naddress = "127.0.0.1:{free_port()}"\n[run]\nlogdir = "{run}"\n'
                                     f'[policies.default_policy]\nalgorithm = "dqn"\n'
                                     f'config = {{ hidden = [16, 16], learning_starts = 0, batch_size = 8 }}\n')
    checkpoint.Checkpoints(run, keep_replay=False).save(
        {"default_policy": checkpoint.policy_entry("dqn", learner, True, False)},
        {"env_steps": 32, "agent_steps": 32, "episodes": 0, "wall_s": 1.0, "recent": [], "eps_next": 1})
    out = tmp_path / "policy.onnx"
    assert cli.main(["export", "--checkpoint", str(run), "--onnx", str(out)]) == 0
    report = capsys.readouterr().out
    assert '"ok": true' in report and '"greedy_actions_equal": 1.0' in report, report
    assert out.read_bytes() == learner.portable().onnx_model


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_byte_rows_of_a_camera_beside_vectors_update_on_the_cuda_graph_path_as_eagerly(kind):
    """The float32 parts read back from byte rows (a dtype view) inside a captured CUDA graph."""
    from simbridge.trainer.learners import capture
    from support.learners import weights

    def make(path):
        cfg = {**OFF, "update_path": path, "batch_size": 64, "updates_per_step": 4.0}
        if kind == "dqn":
            learner = DQNLearner(ROBOT, gym.spaces.Discrete(3), cfg, device="cuda")
        else:
            learner = SACLearner(ROBOT, gym.spaces.Box(-1, 1, (2,), np.float32), {**cfg, "random_warmup": False},
                                 device="cuda")
        batch = _rows(ROBOT, 256, np.random.default_rng(0))
        if kind == "sac":
            batch["actions"] = np.random.default_rng(1).uniform(-1, 1, (256, 2)).astype(np.float32)
        learner.add(batch)
        assert learner.replay.gather(torch.arange(256, device="cuda"))[OBS].dtype == torch.uint8
        return learner

    graph, eager = make("graph"), make("eager")
    for learner in (graph, eager):
        learner.train(max_updates=capture.WARMUP + 10)
    assert graph.updater.path == "graph" and graph.updates == eager.updates == capture.WARMUP + 10
    for a, b in zip(weights(graph), weights(eager)):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
