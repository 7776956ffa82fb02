"""Exit 0 when the simbridge server at ADDRESS (default 127.0.0.1:50051) reports SERVING.

The trainer image's HEALTHCHECK: compose starts the simulators once the trainer answers,
instead of letting them race its startup (torch import, checkpoint load).
"""
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main() -> int:
    address = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
        except grpc.RpcError as e:
            print(f"{address}: {e.code().name}", file=sys.stderr)
            return 1
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
