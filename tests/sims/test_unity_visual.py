"""Visual observations: Unity package 3.x declares cameras channels-first (CHW), older
packages channels-last (HWC); both arrive as PNG (one PNG per 3 channels, concatenated,
with an optional channel mapping) or as raw floats. mlagents-envs 0.28.0 decodes PNG as HWC
only; simbridge.sims.unity.observations reads both."""
import io

import numpy as np
import pytest
from PIL import Image

import simbridge.sims.unity  # noqa: F401  (the protobuf compat hook)
from mlagents_envs.base_env import ActionSpec, BehaviorSpec, DimensionProperty, ObservationSpec, ObservationType
from mlagents_envs.communicator_objects.agent_info_pb2 import AgentInfoProto
from mlagents_envs.communicator_objects.observation_pb2 import PNG, ObservationProto
from mlagents_envs.exception import UnityObservationException
from mlagents_envs.rpc_utils import steps_from_proto
from simbridge.sims.unity.observations import CHW, HWC, ObservationDecoder, decode_png, split_pngs, visual_layout
from unity_peer.harness import Bridge, check_replay, run_connector

NONE_, TE = DimensionProperty.NONE, DimensionProperty.TRANSLATIONAL_EQUIVARIANCE


def png(hwc_uint8) -> bytes:
    out = io.BytesIO()
    Image.fromarray(hwc_uint8, "RGB").save(out, format="PNG")
    return out.getvalue()


def image(c=3, h=4, w=5, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def spec_for(shape, props) -> BehaviorSpec:
    return BehaviorSpec([ObservationSpec(tuple(shape), tuple(props), ObservationType.DEFAULT, "cam")],
                        ActionSpec(0, (2,)))


def info_with(obs: ObservationProto, agent_id=7) -> AgentInfoProto:
    info = AgentInfoProto(id=agent_id)
    info.observations.append(obs)
    return info


def test_mlagents_0_28_fails_on_a_chw_png_camera_and_the_connector_decoder_reads_it():
    hwc = image()
    obs = ObservationProto(shape=[3, 4, 5], compression_type=PNG, compressed_data=png(hwc),
                           dimension_properties=[NONE_, TE, TE])
    spec = spec_for((3, 4, 5), (NONE_, TE, TE))
    with pytest.raises(UnityObservationException, match="expected shape"):
        steps_from_proto([info_with(obs)], spec)                      # the known 0.28.0 failure
    decision, _ = ObservationDecoder("Cam", spec, "3.0.0").steps([info_with(obs)])
    want = hwc.transpose(2, 0, 1).astype(np.float32) / 255.0
    np.testing.assert_array_equal(decision.obs[0][0], want)
    assert decision.obs[0].shape == (1, 3, 4, 5) and decision.agent_id.tolist() == [7]


def test_layout_comes_from_dimension_properties_else_from_the_package_version():
    assert visual_layout([NONE_, TE, TE], "2.0.1") == CHW       # properties win over the version
    assert visual_layout([TE, TE, NONE_], "3.0.0") == HWC
    assert visual_layout([], "3.0.0-exp.1") == CHW                # Release 21 switched to CHW
    assert visual_layout([], "2.3.0-exp.3") == HWC
    assert visual_layout([0, 0, 0], None) == HWC


def test_more_than_three_channels_are_concatenated_pngs_with_a_channel_mapping():
    img = image(c=6, seed=1)
    data = png(img[:, :, :3]) + png(img[:, :, 3:])
    assert [len(p) for p in split_pngs(data)] == [len(png(img[:, :, :3])), len(png(img[:, :, 3:]))]
    # channels 0-2 averaged into output 0 (stacked grayscale), 3 and 4 kept, 5 is padding
    out = decode_png(data, (4, 5, 3), HWC, [0, 0, 0, 1, 2, -1])
    f = img.astype(np.float32) / 255.0
    np.testing.assert_allclose(out[:, :, 0], f[:, :, :3].mean(axis=2), atol=1e-6)
    np.testing.assert_array_equal(out[:, :, 1:], f[:, :, 3:5])
    # no mapping: the first C channels; CHW transposes
    chw = decode_png(data, (4, 4, 5), CHW, [])
    np.testing.assert_array_equal(chw, f[:, :, :4].transpose(2, 0, 1))


def test_a_grayscale_camera_arrives_as_rgb_and_is_averaged():
    gray = image(c=1, seed=2)
    out = decode_png(png(np.repeat(gray, 3, axis=2)), (1, 4, 5), CHW, [])
    np.testing.assert_allclose(out[0], gray[:, :, 0].astype(np.float32) / 255.0, atol=1e-6)


def test_broken_png_data_and_wrong_shapes_are_refused_with_a_reason():
    data = png(image())
    with pytest.raises(UnityObservationException, match="IEND"):
        split_pngs(data[:-20])
    with pytest.raises(UnityObservationException, match="no PNG signature"):
        split_pngs(data + b"junk")
    with pytest.raises(UnityObservationException, match="declared"):
        decode_png(data, (3, 5, 4), CHW, [])                      # height and width swapped


# ---------------------------------------------------------------- through the connector

CASES = {
    # layout, compression, channels, dimension properties sent
    "chw-png-rgb": ("chw", "png", 3, 1),        # a package 3.x camera: what 0.28.0 cannot read
    "hwc-png-rgb": ("hwc", "png", 3, 1),        # a package 2.x camera
    "chw-png-4ch-mapping": ("chw", "png", 4, 1),
    "hwc-raw-4ch": ("hwc", "none", 4, 1),
    "chw-raw-gray-no-props": ("chw", "none", 1, 0),
    "chw-png-gray-no-props": ("chw", "png", 1, 0),  # layout from package version 3.0.0
    "hwc-png-2ch-no-props": ("hwc", "png", 2, 0),   # layout from package version 2.0.1
}


@pytest.mark.parametrize("case", list(CASES))
def test_camera_observations_reach_the_policy_exactly(tmp_path, case):
    layout, compression, channels, props = CASES[case]
    bridge = Bridge(["Camera*=camera"])
    try:
        run = run_connector(bridge.address, tmp_path, args=["--max-steps", 60, "--quiet"],
                            peer_args=["--scene", "camera", "--agents", 3, "--visual-layout", layout,
                                       "--compression", compression, "--channels", channels,
                                       "--dimension-properties", props])
    finally:
        bridge.stop()
    assert run.code == 0, run.explain()
    shape = (channels, 5, 5) if layout == "chw" else (5, 5, channels)
    assert bridge.policies["camera"].observation_space.shape == shape
    assert check_replay(bridge, run.trace, "Camera?team=0", "camera") >= 30
    seen = np.concatenate(bridge.policies["camera"].seen)
    marker = seen.max(axis=(1, 2)) if layout == "hwc" else seen.max(axis=(2, 3))
    assert seen.dtype == np.uint8 and np.all(marker == 255)   # the marker column, as its byte


def test_camera_dtype_float32_keeps_floats_and_a_camera_of_floats_is_named_with_it(tmp_path):
    """--camera-dtype float32 sends a camera as floats in [0, 1], as before bytes were the default; a
    camera whose values are not 8-bit stops the connector (no traceback) naming that flag."""
    peer = ["--scene", "camera", "--agents", 2, "--visual-layout", "hwc"]
    bridge = Bridge(["Camera*=camera"])
    try:
        floats = run_connector(bridge.address, tmp_path, args=["--max-steps", 30, "--quiet", "--camera-dtype", "float32"],
                               peer_args=peer)
        seen = np.concatenate(bridge.policies["camera"].seen)
        (tmp_path / "odd").mkdir()
        odd = run_connector(bridge.address, tmp_path / "odd", args=["--max-steps", 30, "--quiet"],
                            peer_args=[*peer, "--compression", "floats"])
        (tmp_path / "odd-floats").mkdir()
        odd_as_floats = run_connector(bridge.address, tmp_path / "odd-floats",
                                      args=["--max-steps", 30, "--quiet", "--camera-dtype", "float32"],
                                      peer_args=[*peer, "--compression", "floats"])
        (tmp_path / "bytes").mkdir()   # the policy learned floats: bytes are another space
        as_bytes = run_connector(bridge.address, tmp_path / "bytes", args=["--max-steps", 30, "--quiet"], peer_args=peer)
    finally:
        bridge.stop()
    assert floats.code == 0, floats.explain()
    assert seen.dtype == np.float32 and np.all(seen.max(axis=(1, 2)) == 1.0)   # the marker column, 255/255
    assert odd.code == 3 and "Traceback" not in odd.stderr, odd.explain()
    assert "not 8-bit pixels" in odd.stderr and "--camera-dtype float32" in odd.stderr, odd.explain()
    assert odd_as_floats.code == 0, odd_as_floats.explain()
    assert as_bytes.code == 2 and "run the connector with --camera-dtype float32" in as_bytes.stderr, as_bytes.explain()
