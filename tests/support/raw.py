"""Hand-made requests on the generated stubs, for tests of what the server answers to exactly this
message: a unary client with errors as BridgeError, and builders of the common request parts."""
import grpc
import gymnasium as gym
import numpy as np
import pytest

from simbridge.wire import spaces as sb_spaces
from simbridge.wire import tensors
from simbridge.wire.errors import BridgeError
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc

OBS = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


class Raw:
    """Hand-made requests through the generated stubs, errors as BridgeError."""

    def __init__(self, address: str, multi_agent: bool = False):
        self.channel = grpc.insecure_channel(address)
        stub = pb_grpc.ExternalMultiAgentEnvStub if multi_agent else pb_grpc.ExternalEnvStub
        self.stub = stub(self.channel)

    def __call__(self, method: str, req):
        try:
            return getattr(self.stub, method)(req, timeout=30)
        except grpc.RpcError as e:
            raise BridgeError.from_rpc_error(e) from None

    def refused(self, method: str, req) -> BridgeError:
        with pytest.raises(BridgeError) as info:
            self(method, req)
        return info.value

    def create(self, obs=OBS, act=ACT, **kw) -> str:
        return self("CreateSession", create_request(obs, act, **kw)).session_id

    def close(self):
        self.channel.close()


def create_request(obs=OBS, act=ACT, **kw) -> pb.CreateSessionRequest:
    return pb.CreateSessionRequest(observation_space=sb_spaces.space_to_proto(obs),
                                   action_space=sb_spaces.space_to_proto(act), **kw)


def header(sid: str, seq: int = 0) -> pb.RequestHeader:
    return pb.RequestHeader(session_id=sid, seq=seq)


def rows(eids, values, agent_ids=()) -> pb.AgentRows:
    return pb.AgentRows(episode_ids=eids, agent_ids=agent_ids,
                        observations=pb.Value(tensor=tensors.to_tensor(np.asarray(values, np.float32))))
