"""Batched simulators: N slots stepped in one Step call (envrax-style auto-reset)."""
from simbridge.errors import BridgeError
import grpc


def step(runtime, session, req):
    raise BridgeError(grpc.StatusCode.UNIMPLEMENTED, "Step is not implemented yet")
