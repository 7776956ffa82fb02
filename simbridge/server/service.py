"""gRPC transport for the bridge: ExternalEnv, ExternalMultiAgentEnv and health.

Both services share one runtime. Unary calls map a BridgeError to the call's
status; the Stream answers each request with one response, in order, with the
error in the response's google.rpc.Status and the stream left open (as in
dm_env_rpc). Unexpected exceptions become INTERNAL for that request only.
"""
import logging
import threading
from concurrent import futures
from typing import Optional

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from simbridge.wire.errors import BridgeError, Reason, failed_precondition, invalid_argument
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.wire.v1 import simbridge_pb2 as pb
from simbridge.wire.v1 import simbridge_pb2_grpc as pb_grpc

log = logging.getLogger("simbridge")

# StreamRequest payload field -> (runtime method, StreamResponse field)
_STREAM_CALLS = {
    "start_episode": "start_episode",
    "get_action": "get_action",
    "log_action": "log_action",
    "log_returns": "log_returns",
    "end_episode": "end_episode",
    "close_session": "close_session",
    "step": "step",
}


class _Servicer:
    """Shared implementation of both services; `multi_agent` selects the semantics."""

    def __init__(self, runtime: BridgeRuntime, multi_agent: bool):
        self.runtime = runtime
        self.multi_agent = multi_agent

    def _unary(self, method, request, context):
        try:
            if method == "create_session":
                return self.runtime.create_session(request, self.multi_agent)
            return self.runtime.handle(method, request, self.multi_agent)
        except BridgeError as e:
            self.runtime.metrics.note_error(e)
            e.abort(context)
        except Exception as e:  # keep serving everyone else
            log.exception("internal error in %s", method)
            self.runtime.metrics.errors["INTERNAL"] += 1
            _internal(method, e).abort(context)

    def CreateSession(self, request, context):
        return self._unary("create_session", request, context)

    def StartEpisode(self, request, context):
        return self._unary("start_episode", request, context)

    def GetAction(self, request, context):
        return self._unary("get_action", request, context)

    def LogAction(self, request, context):
        return self._unary("log_action", request, context)

    def LogReturns(self, request, context):
        return self._unary("log_returns", request, context)

    def EndEpisode(self, request, context):
        return self._unary("end_episode", request, context)

    def CloseSession(self, request, context):
        return self._unary("close_session", request, context)

    def Step(self, request, context):
        return self._unary("step", request, context)

    def GetPolicy(self, request, context):
        return self._unary("get_policy", request, context)

    def UploadExperience(self, request, context):
        return self._unary("upload_experience", request, context)

    def Stream(self, request_iterator, context):
        session = None
        try:
            for req in request_iterator:
                kind = req.WhichOneof("payload")
                resp = pb.StreamResponse()
                try:
                    if kind == "create_session":
                        if session is not None:
                            raise failed_precondition("this stream already has a session: open a new stream",
                                                  Reason.WRONG_SESSION_KIND)
                        out = self.runtime.create_session(req.create_session, self.multi_agent)
                        session = self.runtime.session(out.session_id, self.multi_agent)
                        self.runtime.attach_stream(session)
                    elif kind in _STREAM_CALLS:
                        if session is None:
                            raise failed_precondition("send create_session first on this stream",
                                                  Reason.WRONG_SESSION_KIND)
                        out = self.runtime.handle(kind, getattr(req, kind), self.multi_agent, bound=session)
                    else:
                        raise invalid_argument("empty stream request")
                    getattr(resp, kind).CopyFrom(out)
                except BridgeError as e:
                    self.runtime.metrics.note_error(e)
                    resp.error.CopyFrom(e.to_status())
                except Exception as e:
                    log.exception("internal error in stream %s", kind)
                    self.runtime.metrics.errors["INTERNAL"] += 1
                    resp.error.CopyFrom(_internal(kind, e).to_status())
                yield resp
                if session is not None and session.pending is not None:
                    # The answer is on its way: apply the call's bookkeeping while the simulator
                    # steps, instead of before answering (runtime.settle).
                    self._settle(session)
                if kind == "close_session" and not resp.HasField("error"):
                    session = None
                    return
        finally:
            if session is not None:
                self._settle(session)
                self.runtime.detach_stream(session)

    def _settle(self, session) -> None:
        try:
            self.runtime.settle(session)
        except Exception:   # validated before it was answered: this is a bug, not bad input
            log.exception("applying an answered call's bookkeeping failed inside the server")
            self.runtime.metrics.errors["INTERNAL"] += 1


def _internal(method: str, e: Exception) -> BridgeError:
    return BridgeError(grpc.StatusCode.INTERNAL, f"{method} failed inside the server: {e!r}",
                       Reason.SERVER_FAILURE)


class _ExternalEnv(_Servicer, pb_grpc.ExternalEnvServicer):
    pass


class _ExternalMultiAgentEnv(_Servicer, pb_grpc.ExternalMultiAgentEnvServicer):
    pass


class BridgeServer:
    """A running bridge: gRPC server + runtime + session reaper.

    Binds to loopback unless told otherwise: exposing it is the user's choice.
    """

    def __init__(self, runtime: Optional[BridgeRuntime] = None, address: str = "127.0.0.1:0",
                 max_workers: int = 256, reap_interval_s: float = 1.0):
        self.runtime = runtime or BridgeRuntime(BridgeConfig())
        limit = self.runtime.config.max_message_bytes
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="simbridge-rpc"),
            options=[("grpc.max_receive_message_length", limit),
                     ("grpc.max_send_message_length", limit),
                     # gRPC binds with SO_REUSEPORT by default: a second server on a busy port
                     # would start and silently share it. Refuse the port instead.
                     ("grpc.so_reuseport", 0),
                     # Notice dead simulators: ping idle connections.
                     ("grpc.keepalive_time_ms", 10_000),
                     ("grpc.keepalive_timeout_ms", 5_000),
                     ("grpc.keepalive_permit_without_calls", 1),
                     ("grpc.http2.min_ping_interval_without_data_ms", 5_000)])
        pb_grpc.add_ExternalEnvServicer_to_server(_ExternalEnv(self.runtime, False), self._server)
        pb_grpc.add_ExternalMultiAgentEnvServicer_to_server(_ExternalMultiAgentEnv(self.runtime, True),
                                                              self._server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError:   # grpcio raises on a port in use (no SO_REUSEPORT, see above)
            self.port = 0
        if self.port == 0:
            raise RuntimeError(f"could not bind {address}: is another server using that port?")
        host = address.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, args=(reap_interval_s,),
                                        name="simbridge-reaper", daemon=True)

    def start(self) -> "BridgeServer":
        self._server.start()
        for svc in ("", "simbridge.wire.v1.ExternalEnv", "simbridge.wire.v1.ExternalMultiAgentEnv"):
            self.health.set(svc, health_pb2.HealthCheckResponse.SERVING)
        self._reaper.start()
        log.info("simbridge serving on %s", self.address)
        return self

    def _reap_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.runtime.reap()
            except Exception:
                log.exception("session reaper failed")

    def stop(self, grace: Optional[float] = 1.0) -> None:
        self._stop.set()
        self.health.enter_graceful_shutdown()
        self._server.stop(grace).wait()

    def wait(self) -> None:
        self._server.wait_for_termination()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
