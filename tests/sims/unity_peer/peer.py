"""A stand-in for a Unity player built with com.unity.ml-agents, seen from Python.

Started the way mlagents_envs.UnityEnvironment starts a build (through the
launcher `unity_peer.x86_64` next to this file):

    unity_peer.x86_64 --mlagents-port 5005 [-nographics -batchmode] [-logFile F] [peer options]

It plays the Unity side of the ML-Agents wire protocol (communication API
1.5.0; the same messages com.unity.ml-agents 1.9 to 3.0 send):

  * Unity is the gRPC client: it dials localhost:<port> and calls
    UnityToExternalProto/Exchange; Python answers every call.
  * Handshake, two calls: (1) rl_initialization_output with the academy's
    name, versions and capabilities -> Python's rl_initialization_input (seed,
    versions, num_areas); (2) an empty message, answered by Python's first
    RESET (with side channels: engine configuration, environment parameters).
  * Then one call per decision step: agentInfos per behavior (a terminal
    agent's done info is followed by a fresh decision info for the same id,
    as Unity 3.x keeps ids across episodes), brain_parameters once per
    behavior in the first message that carries one of its agents; the reply's
    actions are applied by position to the non-done agents of that message.
    A step with no agent asking for a decision is simulated without a call.
  * Any reply whose status is not 200 ends the player, as Application.Quit.

With --trace FILE it writes what it sent and received as JSON lines, for tests.
"""
import argparse
import io
import json
import os
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from simbridge.sims.unity import compat  # noqa: E402

compat.install()

from mlagents_envs.communicator_objects import unity_to_external_pb2_grpc  # noqa: E402
from mlagents_envs.communicator_objects.agent_info_pb2 import AgentInfoProto  # noqa: E402
from mlagents_envs.communicator_objects.brain_parameters_pb2 import ActionSpecProto, BrainParametersProto  # noqa: E402
from mlagents_envs.communicator_objects.capabilities_pb2 import UnityRLCapabilitiesProto  # noqa: E402
from mlagents_envs.communicator_objects.command_pb2 import QUIT, RESET  # noqa: E402
from mlagents_envs.communicator_objects.observation_pb2 import NONE as RAW, PNG, ObservationProto  # noqa: E402
from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto  # noqa: E402

from scenes import SCENES  # noqa: E402

ENGINE_CHANNEL = uuid.UUID("e951342c-4f7e-11ea-b238-784f4387d1f7")
PARAMS_CHANNEL = uuid.UUID("534c891e-810f-11ea-a9d0-822485860400")
STATS_CHANNEL = uuid.UUID("a1d8f7b7-cec8-50f9-b78b-d3e165a78520")


# ---------------------------------------------------------------- side channels

def split_side_channels(data: bytes):
    """[16-byte UUID (bytes_le) | int32 LE length | payload]*"""
    pos = 0
    while pos < len(data):
        cid = uuid.UUID(bytes_le=bytes(data[pos:pos + 16]))
        (n,) = struct.unpack_from("<i", data, pos + 16)
        yield cid, bytes(data[pos + 20:pos + 20 + n])
        pos += 20 + n


def read_engine_config(payload: bytes, into: dict) -> None:
    (kind,) = struct.unpack_from("<i", payload, 0)
    if kind == 0:
        into["width"], into["height"] = struct.unpack_from("<ii", payload, 4)
    elif kind == 1:
        into["quality_level"] = struct.unpack_from("<i", payload, 4)[0]
    elif kind == 2:
        into["time_scale"] = struct.unpack_from("<f", payload, 4)[0]
    elif kind == 3:
        into["target_frame_rate"] = struct.unpack_from("<i", payload, 4)[0]
    elif kind == 4:
        into["capture_frame_rate"] = struct.unpack_from("<i", payload, 4)[0]


def read_env_param(payload: bytes, into: dict) -> None:
    (n,) = struct.unpack_from("<i", payload, 0)
    key = payload[4:4 + n].decode("ascii")
    kind, value = struct.unpack_from("<if", payload, 4 + n)
    if kind == 0:  # FLOAT; samplers are not used by these scenes
        into[key] = value


def stats_message(key: str, value: float) -> bytes:
    k = key.encode("ascii")
    payload = struct.pack("<i", len(k)) + k + struct.pack("<fi", value, 1)  # MOST_RECENT
    return STATS_CHANNEL.bytes_le + struct.pack("<i", len(payload)) + payload


# ---------------------------------------------------------------- observations

def png_bytes(hwc: np.ndarray, mapping: bool) -> Tuple[bytes, List[int]]:
    """uint8 (H, W, C) -> concatenated RGB PNGs, 3 channels each (zero padded), and the mapping."""
    h, w, c = hwc.shape
    if c == 1:  # a grayscale camera: gray in R, G and B, no mapping (the reader averages)
        hwc = np.repeat(hwc, 3, axis=2)
    pad = (-hwc.shape[2]) % 3
    if pad:
        hwc = np.concatenate([hwc, np.zeros((h, w, pad), np.uint8)], axis=2)
    out = io.BytesIO()
    for k in range(0, hwc.shape[2], 3):
        Image.fromarray(np.ascontiguousarray(hwc[:, :, k:k + 3]), "RGB").save(out, format="PNG")
    channel_map = list(range(c)) + [-1] * pad if (mapping and c not in (1, 3)) else []
    return out.getvalue(), channel_map


class Peer:
    def __init__(self, opts):
        self.opts = opts
        self.trace = open(opts.trace.format(port=opts.mlagents_port), "a") if opts.trace else None
        self.rng = np.random.default_rng(opts.seed)
        self.scenes = []
        self.sent_brains = set()
        self.pending: Dict[str, List[int]] = {}     # behavior -> agent indices asked to decide, in order
        self.last_action: Dict[str, Dict[int, tuple]] = {}
        self.engine: dict = {}
        self.env_params: dict = {}
        self.steps = 0
        self.violations = 0

    def log(self, **record) -> None:
        if self.trace:
            self.trace.write(json.dumps(record) + "\n")
            self.trace.flush()

    # ------------------------------------------------------------ scenes

    def build_scenes(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed if self.opts.seed is None else self.opts.seed)
        self.scenes = [SCENES[name](self.opts.agents, self.rng, self.opts) for name in self.opts.scene.split(",")]
        for sc in self.scenes:
            if self.opts.max_step is not None:
                sc.max_step = self.opts.max_step
        self.reset_all()

    def behavior(self, sc) -> str:
        return f"{sc.behavior}?team=0"

    def reset_all(self) -> None:
        for sc in self.scenes:
            for i in range(sc.n):
                sc.reset(i)
            self.last_action[self.behavior(sc)] = {}
        self.acc = {(id(sc), i): [0.0, 0.0] for sc in self.scenes for i in range(sc.n)}

    def agent_uid(self, sc, i: int) -> int:
        """Unity's agent id (m_EpisodeId: stable across episodes); distinct over scenes."""
        return 1000 * (self.scenes.index(sc) + 1) + i

    def decides(self, sc, i: int) -> bool:
        period = 1 + (i % self.opts.decision_period)
        return int(sc.t[i]) % period == 0

    # ------------------------------------------------------------ messages

    def observation_protos(self, sc, i: int) -> List[ObservationProto]:
        out = []
        for spec, value in zip(sc.obs_specs, sc.observe(i)):
            p = ObservationProto(shape=list(spec.shape), dimension_properties=spec.dim_props)
            if spec.visual and self.opts.compression == "png":
                hwc = sc.image_hwc(i)
                data, mapping = png_bytes(hwc, self.opts.channel_mapping)
                p.compression_type = PNG
                p.compressed_data = data
                p.compressed_channel_mapping.extend(mapping)
            else:
                p.compression_type = RAW
                if spec.visual and self.opts.compression == "floats":   # a camera of floats: not 8-bit pixels
                    value = np.asarray(value, np.float32) + np.float32(0.5 / 255)
                p.float_data.data.extend(np.asarray(value, np.float32).ravel().tolist())
            out.append(p)
        return out

    def agent_info(self, sc, i: int, reward: float, group_reward: float, done: bool, max_step: bool) -> AgentInfoProto:
        info = AgentInfoProto(reward=reward, done=done, max_step_reached=max_step, id=self.agent_uid(sc, i),
                              group_id=sc.group_id(i), group_reward=group_reward)
        info.observations.extend(self.observation_protos(sc, i))
        mask = None if done else sc.mask(i)
        if mask is not None:
            info.action_mask.extend(mask)
        return info

    def traced(self, sc, i, info) -> dict:
        rec = {"id": info.id, "done": info.done, "max_step": info.max_step_reached, "reward": info.reward,
               "group_id": info.group_id, "group_reward": info.group_reward,
               "obs": [np.asarray(o, np.float32).tolist() for o in sc.observe(i)]}
        if len(info.action_mask):
            rec["mask"] = list(info.action_mask)
        return rec

    def brain(self, sc) -> BrainParametersProto:
        spec = ActionSpecProto(num_continuous_actions=sc.continuous, num_discrete_actions=len(sc.branches),
                               discrete_branch_sizes=list(sc.branches))
        return BrainParametersProto(brain_name=self.behavior(sc), is_training=True, action_spec=spec)

    def output_message(self, ended: Dict[int, dict]) -> UnityMessageProto:
        """The next decision step: per agent, its done info (with the fresh decision that follows
        it when the agent restarted), or its decision when it asks for one."""
        msg = UnityMessageProto()
        msg.header.status = 200
        out = msg.unity_output
        record = {}
        for sc in self.scenes:
            name = self.behavior(sc)
            infos, rows = [], []
            self.pending[name] = []
            for i in range(sc.n):
                done = ended.get(id(sc), {}).get(i)
                if done is not None:
                    infos.append(done[0])
                    rows.append(done[1])
                if self.decides(sc, i):
                    r, g = self.acc[(id(sc), i)]
                    self.acc[(id(sc), i)] = [0.0, 0.0]
                    info = self.agent_info(sc, i, r, g, False, False)
                    infos.append(info)
                    rows.append(self.traced(sc, i, info))
                    self.pending[name].append(i)
            if infos:
                out.rl_output.agentInfos[name].value.extend(infos)
                if name not in self.sent_brains:
                    out.rl_initialization_output.brain_parameters.append(self.brain(sc))
                    self.sent_brains.add(name)
            record[name] = rows
        if self.opts.stats_every and self.steps % self.opts.stats_every == 0:
            out.rl_output.side_channel = stats_message("Peer/steps", float(self.steps))
        self.log(kind="sent", step=self.steps, behaviors=record)
        return msg

    # ------------------------------------------------------------ simulation

    def apply(self, rl_input) -> Dict[int, dict]:
        """Apply the actions of the reply, then tick until some agent asks for a decision."""
        got = {}
        for sc in self.scenes:
            name = self.behavior(sc)
            todo = self.pending.get(name, [])
            actions = list(rl_input.agent_actions[name].value) if name in rl_input.agent_actions else []
            if actions and len(actions) != len(todo):
                raise RuntimeError(f"{name}: {len(actions)} actions for {len(todo)} agents that asked")
            rec = []
            for i, a in zip(todo, actions):
                cont = np.asarray(a.continuous_actions, np.float32)
                disc = np.asarray(a.discrete_actions, np.int64)
                if len(cont) != sc.continuous or len(disc) != len(sc.branches):
                    raise RuntimeError(f"{name}: action of agent {i} has {len(cont)} continuous and {len(disc)} "
                                       f"discrete values; expected {sc.continuous} and {len(sc.branches)}")
                self.last_action[name][i] = (cont, disc)
                m = sc.mask(i)
                violation = bool(m) and any(m[off + int(d)] for off, d in zip(np.cumsum((0,) + sc.branches[:-1]), disc))
                self.violations += violation
                rec.append({"id": self.agent_uid(sc, i), "c": cont.tolist(), "d": disc.tolist(), "masked": violation})
            got[name] = rec
        self.log(kind="received", step=self.steps, actions=got)
        while True:
            ended = self.tick()
            self.steps += 1
            if ended or any(self.decides(sc, i) for sc in self.scenes for i in range(sc.n)):
                return ended

    def tick(self) -> Dict[int, dict]:
        ended: Dict[int, dict] = {}
        for sc in self.scenes:
            name = self.behavior(sc)
            for i in range(sc.n):
                cont, disc = self.last_action[name].get(i, (np.zeros(sc.continuous, np.float32),
                                                            np.zeros(len(sc.branches), np.int64)))
                reward, terminal = sc.act(i, cont, disc)
                sc.t[i] += 1
                group_r = sc.group_reward(i)
                acc = self.acc[(id(sc), i)]
                acc[0] += reward
                acc[1] += group_r
                group_done = sc.group_end(i)
                interrupted = bool(sc.max_step and sc.t[i] >= sc.max_step and not terminal and not group_done)
                if terminal or group_done or interrupted:
                    info = self.agent_info(sc, i, acc[0], acc[1], True, interrupted)
                    ended.setdefault(id(sc), {})[i] = (info, self.traced(sc, i, info))
                    self.acc[(id(sc), i)] = [0.0, 0.0]
                    sc.reset(i)
                    self.last_action[name].pop(i, None)
        return ended

    # ------------------------------------------------------------ the session

    def read_input(self, unity_input) -> int:
        rl = unity_input.rl_input
        for cid, payload in split_side_channels(rl.side_channel):
            if cid == ENGINE_CHANNEL:
                read_engine_config(payload, self.engine)
            elif cid == PARAMS_CHANNEL:
                read_env_param(payload, self.env_params)
        if rl.side_channel:
            self.log(kind="side_channels", engine=self.engine, env_params=self.env_params)
        return rl.command

    def run(self, port: int) -> int:
        channel = grpc.insecure_channel(f"localhost:{port}")
        grpc.channel_ready_future(channel).result(timeout=self.opts.connect_timeout)
        stub = unity_to_external_pb2_grpc.UnityToExternalProtoStub(channel)
        hello = UnityMessageProto()
        hello.header.status = 200
        init = hello.unity_output.rl_initialization_output
        init.name = "AcademySingleton"
        init.communication_version = self.opts.api
        init.package_version = self.opts.package_version
        init.capabilities.CopyFrom(UnityRLCapabilitiesProto(
            baseRLCapabilities=True, concatenatedPngObservations=True, compressedChannelMapping=True,
            hybridActions=True, trainingAnalytics=True, variableLengthObservation=True, multiAgentGroups=True))
        reply = stub.Exchange(hello)
        py = reply.unity_input.rl_initialization_input
        self.log(kind="init", status=reply.header.status, seed=py.seed, communication_version=py.communication_version,
                 package_version=py.package_version, num_areas=py.num_areas)
        if reply.header.status != 200:
            return 0
        if py.communication_version.split(".")[0] != self.opts.api.split(".")[0]:
            print(f"peer: Python speaks API {py.communication_version}, this player {self.opts.api}: quitting",
                  flush=True)
            return 1
        if self.opts.package_version.startswith("1.0.") and _version(py.package_version) > (0, 25, 999):
            # com.unity.ml-agents 1.0.x blocks Python packages newer than 0.25.x.
            print(f"peer: Python package {py.package_version} is not supported by this 1.0.x player", flush=True)
            return 1
        self.build_scenes(py.seed)
        reply = stub.Exchange(self._empty())  # held by Python until its first reset()
        if reply.header.status != 200:
            return 0
        command = self.read_input(reply.unity_input)
        self.log(kind="command", command=int(command))
        ended: Dict[int, dict] = {}
        while True:
            if self.opts.quit_after and self.steps >= self.opts.quit_after:
                self.log(kind="quit", reason="quit_after", step=self.steps)
                bye = UnityMessageProto()
                bye.header.status = 400  # what Unity sends when the player quits
                try:
                    stub.Exchange(bye, timeout=5)
                except grpc.RpcError:
                    pass
                return 0
            reply = stub.Exchange(self.output_message(ended))
            if reply.header.status != 200:
                self.log(kind="quit", reason=f"status {reply.header.status}", step=self.steps,
                         violations=self.violations)
                return 0
            command = self.read_input(reply.unity_input)
            if command == QUIT:
                self.log(kind="quit", reason="QUIT", step=self.steps)
                return 0
            if command == RESET:
                self.log(kind="command", command=int(command))
                self.reset_all()
                ended = {}
                continue
            ended = self.apply(reply.unity_input.rl_input)
            if self.opts.step_delay:
                time.sleep(self.opts.step_delay)

    @staticmethod
    def _empty() -> UnityMessageProto:
        m = UnityMessageProto()
        m.header.status = 200
        return m


def _version(text: str) -> tuple:
    try:
        return tuple(int(x) for x in text.split(".")[:3])
    except ValueError:
        return (0,)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="unity_peer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    # What UnityEnvironment passes to a build.
    p.add_argument("--mlagents-port", type=int, default=None)
    p.add_argument("-nographics", action="store_true")
    p.add_argument("-batchmode", action="store_true")
    p.add_argument("-logFile", "-logfile", dest="log_file", default=None)
    # The scene.
    p.add_argument("--scene", default="ball", help=f"comma-separated, one behavior each: {sorted(SCENES)}")
    p.add_argument("--agents", type=int, default=4, help="agents per scene")
    p.add_argument("--max-step", type=int, default=None, help="override the scenes' max step (0: none)")
    p.add_argument("--decision-period", type=int, default=1,
                   help="agent i decides every 1 + i %% K steps (K=1: every agent every step)")
    p.add_argument("--visual-layout", choices=["chw", "hwc"], default="chw")
    p.add_argument("--compression", choices=["png", "none", "floats"], default="png",
                   help="cameras as PNG, raw 8-bit values (k/255), or raw floats between those levels")
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--channel-mapping", type=int, default=1, help="send a channel mapping for 2 or >3 channels")
    p.add_argument("--dimension-properties", type=int, default=1, help="0: send none (as old builds)")
    # The player.
    p.add_argument("--api", default="1.5.0", help="communication API version to report")
    p.add_argument("--package-version", default=None, help="default: 3.0.0 (chw) or 2.0.1 (hwc)")
    p.add_argument("--seed", type=int, default=None, help="override the seed Python sends")
    p.add_argument("--quit-after", type=int, default=0, help="quit (status 400) after N steps")
    p.add_argument("--never-connect", action="store_true", help="start, but never dial Python")
    p.add_argument("--stats-every", type=int, default=0, help="a stats side-channel message every N steps")
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--connect-timeout", type=float, default=30.0)
    p.add_argument("--trace", default=os.environ.get("UNITY_PEER_TRACE"),
                   help="JSON lines of what went each way; {port} is replaced by the port")
    opts, unknown = p.parse_known_args(argv)
    if opts.package_version is None:
        opts.package_version = "3.0.0" if opts.visual_layout == "chw" else "2.0.1"
    return opts, unknown


def main(argv=None) -> int:
    opts, unknown = parse_args(sys.argv[1:] if argv is None else argv)
    if opts.log_file and opts.log_file != "-":
        log = open(opts.log_file, "a", buffering=1)
        sys.stdout = sys.stderr = log
    print(f"peer: pid {os.getpid()} args {sys.argv[1:]} (ignored: {unknown})", flush=True)
    if opts.mlagents_port is None:
        print("peer: no --mlagents-port: a player without it runs inference only; nothing to do", flush=True)
        return 0
    if opts.never_connect:
        time.sleep(3600)
        return 0
    peer = Peer(opts)
    try:
        return peer.run(opts.mlagents_port)
    except grpc.RpcError as e:
        print(f"peer: Python side went away: {e.code()}", flush=True)
        peer.log(kind="quit", reason=f"rpc {e.code()}", step=peer.steps)
        return 0
    except grpc.FutureTimeoutError:
        print("peer: nothing listens on the port", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
