"""Serving clients that act locally: policy download and experience upload."""
from simbridge.errors import BridgeError
import grpc


def get_policy(runtime, session, req):
    raise BridgeError(grpc.StatusCode.UNIMPLEMENTED, "GetPolicy is not implemented yet")


def upload_experience(runtime, session, req):
    raise BridgeError(grpc.StatusCode.UNIMPLEMENTED, "UploadExperience is not implemented yet")
