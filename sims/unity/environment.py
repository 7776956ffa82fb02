"""mlagents_envs' UnityEnvironment, with the changes the connector needs.

  * Steps are decoded by `observations.ObservationDecoder`: both visual layouts,
    and `action_mask` left None when no agent sent one (0.28.0 always builds an
    all-allowed mask, so "this behavior uses masks" could not be told).
  * The handshake's Unity package and communication versions are kept.
  * The wait for a message from Unity polls at most every 0.5 s: 0.28.0 polls
    every timeout/10 s, and busy-loops for timeouts under 10 s. The handshake's
    second call is waited for with the same timeout (0.28.0 waits forever).
  * A com.unity.ml-agents 1.0.x player is refused at its first message: it
    blocks Python packages newer than 0.25 and would then stay silent.
  * A failed start stops the gRPC server and the player process; a close lets
    Unity receive its status-400 answer before the server stops.
  * Actions are written into the step message with one protobuf call per agent
    (0.28.0 makes four; 5 ms instead of 15 ms per step for 512 agents), the same message.
"""
import atexit
import time
from typing import Dict, Optional

import numpy as np

from simbridge.client.stopping import check_stopping
from simbridge.sims.unity import compat

compat.install()

from mlagents_envs.environment import UnityEnvironment  # noqa: E402
from mlagents_envs.communicator_objects.command_pb2 import STEP  # noqa: E402
from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto  # noqa: E402
from mlagents_envs.communicator_objects.unity_rl_input_pb2 import UnityRLInputProto  # noqa: E402
from mlagents_envs.exception import UnityEnvironmentException, UnityTimeOutException  # noqa: E402
from mlagents_envs.rpc_communicator import RpcCommunicator  # noqa: E402

from simbridge.sims.unity.observations import ObservationDecoder  # noqa: E402


class UnityPackageRefused(UnityEnvironmentException):
    def __init__(self, package_version: str):
        super().__init__(f"com.unity.ml-agents {package_version} refuses mlagents-envs 0.28.0")
        self.package_version = package_version


class _Communicator(RpcCommunicator):
    def close(self) -> None:
        """As 0.28.0's, but the server stops with a grace period: the status-400 answer to the call
        Unity holds open reaches it (Unity quits cleanly) instead of being cancelled."""
        if self.is_open:
            message = UnityMessageProto()
            message.header.status = 400
            self.unity_to_external.parent_conn.send(message)
            self.unity_to_external.parent_conn.close()
            self.server.stop(1.0).wait(2.0)
            self.is_open = False

    def initialize(self, inputs, poll_callback=None):
        conn = self.unity_to_external.parent_conn
        self.poll_for_timeout(poll_callback)
        academy = conn.recv().unity_output
        version = academy.rl_initialization_output.package_version
        if version.startswith("1.0."):
            raise UnityPackageRefused(version)  # the caller's close() answers Unity with status 400
        message = UnityMessageProto()
        message.header.status = 200
        message.unity_input.CopyFrom(inputs)
        conn.send(message)
        self.poll_for_timeout(poll_callback)
        conn.recv()  # the second call, held until the first reset()
        return academy

    def poll_for_timeout(self, poll_callback=None) -> None:
        deadline = time.monotonic() + self.timeout_wait
        conn = self.unity_to_external.parent_conn
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if conn.poll(min(0.5, left)):
                return
            # Ctrl-C: Stopped (run_cli exits 0) within the slice, not after --timeout-wait (60 s)
            # with an error that blamed the Editor.
            check_stopping(f"waiting for Unity on port {self.port}")
            if poll_callback:
                poll_callback()  # raises when the Unity process has exited
        raise UnityTimeOutException(f"no message from the Unity environment on port {self.port} within "
                                    f"{self.timeout_wait:g}s")


class BridgeUnityEnvironment(UnityEnvironment):
    def __init__(self, *args, **kwargs):
        self.unity_package_version: Optional[str] = None
        self.unity_communication_version: Optional[str] = None
        self._decoders: Dict[str, ObservationDecoder] = {}
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            if getattr(self, "_communicator", None) is not None:
                player = getattr(self, "_process", None)
                if player is not None and player.poll() is None:
                    # ended at once, as a refused player should be: _close(0) would log it as a
                    # "timed out shutting down" before the refusal's own message
                    player.kill()
                    player.wait()
                self._close(0)  # 0.28.0 leaves the server (and player) running on some failures
            # its __init__ registered _close with atexit before it failed (a taken port fails before
            # the communicator exists): at exit that would print an AttributeError's traceback
            atexit.unregister(self._close)
            raise

    @staticmethod
    def _get_communicator(worker_id, base_port, timeout_wait):
        return _Communicator(worker_id, base_port, timeout_wait)

    def _send_academy_parameters(self, init_parameters):
        out = super()._send_academy_parameters(init_parameters)
        init = out.rl_initialization_output
        self.unity_package_version = init.package_version
        self.unity_communication_version = init.communication_version
        return out

    def _decoder(self, name: str) -> ObservationDecoder:
        dec = self._decoders.get(name)
        if dec is None or dec.spec is not self._env_specs[name]:
            dec = self._decoders[name] = ObservationDecoder(name, self._env_specs[name],
                                                            self.unity_package_version)
        return dec

    def _generate_step_input(self, vector_action):
        rl_in = UnityRLInputProto()
        for name, action in vector_action.items():
            n = len(self._env_state[name][0])
            if n == 0:
                continue
            cont = np.asarray(action.continuous, np.float32).reshape(n, -1).tolist()
            disc = np.asarray(action.discrete, np.int32).reshape(n, -1).tolist()
            out = rl_in.agent_actions[name].value
            for c, d in zip(cont, disc):
                # Unity before API 1.3 reads the deprecated field: continuous values, then discrete.
                out.add(vector_actions_deprecated=c + d, continuous_actions=c, discrete_actions=d)
            rl_in.command = STEP
        rl_in.side_channel = bytes(self._side_channel_manager.generate_side_channel_messages())
        return self._wrap_unity_input(rl_in)

    def _update_state(self, output) -> None:
        for name in self._env_specs:
            infos = output.agentInfos[name].value if name in output.agentInfos else ()
            self._env_state[name] = self._decoder(name).steps(infos)
        self._side_channel_manager.process_side_channel_message(output.side_channel)
