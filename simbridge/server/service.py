"""gRPC transport for the bridge: ExternalEnv, ExternalMultiAgentEnv and health.

Both services share one runtime. Unary calls map a BridgeError to the call's
status; the Stream answers each request with one response, in order, with the
error in the response's google.rpc.Status and the stream left open (as in
dm_env_rpc). Unexpected exceptions become INTERNAL for that request only.

Before a call reaches the runtime: the token check (security.TokenInterceptor),
the caller's identity (security.py: whose sessions, whose limits), admission
(admission.CallGate: RESOURCE_EXHAUSTED beyond the caps, never a queue), and
decoding: the handlers are built here from the proto's service descriptors with
a deserializer that never raises, so bytes that are not the call's message are
an INVALID_ARGUMENT / UNDECODABLE answer (counted, and logged once a minute per
client) instead of gRPC's own INTERNAL and a traceback each.
"""
import logging
import threading
from concurrent import futures
from typing import Optional

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from simbridge.server.admission import CallGate, NoticeLog
from simbridge.server.binding import address_in_use, bind, in_use_message  # noqa: F401 (the CLIs' import)
from simbridge.server.runtime import BridgeConfig, BridgeRuntime
from simbridge.server.security import LoadedSecurity, ServerSecurity, auth_failed, peer_host
from simbridge.wire.addresses import address_problem, grpc_address, is_shm, is_unix, shm_handover_path
from simbridge.wire.errors import BridgeError, Reason, failed_precondition, invalid_argument
from simbridge.wire.v1 import simbridge_pb2 as pb

log = logging.getLogger("simbridge")

# RPC name -> the runtime's name for the call (the Stream carries the same names in its oneof)
_UNARY_CALLS = {
    "CreateSession": "create_session",
    "StartEpisode": "start_episode",
    "GetAction": "get_action",
    "LogAction": "log_action",
    "LogReturns": "log_returns",
    "EndEpisode": "end_episode",
    "CloseSession": "close_session",
    "Step": "step",
    "GetPolicy": "get_policy",
    "UploadExperience": "upload_experience",
}
_STREAM_CALLS = frozenset(_UNARY_CALLS.values()) - {"create_session", "get_policy", "upload_experience"}


class Undecodable:
    """What the deserializer hands over for bytes that are not the call's message."""
    __slots__ = ("size", "error")

    def __init__(self, size: int, error: str):
        self.size = size
        self.error = error


def _tolerant(parse):
    def deserialize(data: bytes):
        try:
            return parse(data)
        except Exception as e:   # DecodeError, and whatever else the parser says of hostile bytes
            return Undecodable(len(data), str(e) or type(e).__name__)
    return deserialize


class _Servicer:
    """Both services' calls; `multi_agent` selects the semantics."""

    def __init__(self, runtime: BridgeRuntime, multi_agent: bool, security: LoadedSecurity,
                 gate: CallGate, notices: NoticeLog, ready: threading.Event, stopping: threading.Event,
                 waited: threading.Event):
        self.ready, self.stopping, self.waited = ready, stopping, waited   # BridgeServer's
        self.runtime = runtime
        self.multi_agent = multi_agent
        self.security = security
        self.gate = gate
        self.notices = notices

    def _identity(self, context) -> str:
        return self.security.identity(context)

    def _admit(self, context) -> str:
        """The caller's identity, its call admitted by the gate (the caller must `gate.leave`
        it), or the call aborted with TOO_MANY_CALLS."""
        client = self._identity(context)
        try:
            self.gate.enter(client)
        except BridgeError as e:
            self._refuse(e)
            e.abort(context)
        if not self.ready.is_set():
            self._wait_until_serving(client, context)
        return client

    def _wait_until_serving(self, client: str, context) -> None:
        """A call that came while the server is bound but not serving yet (a trainer still loading
        its learners: BridgeServer.start(serving=False)) waits until it serves; UNAVAILABLE, which
        clients retry, when the server stops instead."""
        if not self.waited.is_set():
            self.waited.set()
            log.info("a simulator connected before the trainer is ready: its calls wait until it serves")
        self.ready.wait()
        if self.stopping.is_set():
            self.gate.leave(client)
            BridgeError(grpc.StatusCode.UNAVAILABLE, "the server stopped before it served").abort(context)

    def _refuse(self, e: BridgeError) -> None:
        self.runtime.metrics.note_error(e)

    def _undecodable(self, client: str, method: str, req: Undecodable) -> BridgeError:
        self.notices.note(client, "undecodable requests", f"{req.size} bytes on {method} ({req.error})")
        return invalid_argument(f"the request is not a valid {method} message ({req.error}): check that the "
                                f"client's generated code matches proto/simbridge/v1/simbridge.proto",
                                Reason.UNDECODABLE)

    def unary(self, method: str):
        def behavior(request, context):
            client = self._admit(context)
            try:
                if isinstance(request, Undecodable):
                    raise self._undecodable(client, method, request)
                if method == "create_session":
                    return self.runtime.create_session(request, self.multi_agent, client=client)
                return self.runtime.handle(method, request, self.multi_agent, client=client)
            except BridgeError as e:
                self._refuse(e)
                e.abort(context)
            except Exception as e:  # keep serving everyone else
                log.exception("internal error in %s", method)
                self.runtime.metrics.errors["INTERNAL"] += 1
                _internal(method, e).abort(context)
            finally:
                self.gate.leave(client)
        return behavior

    def stream(self, request_iterator, context):
        client = self._admit(context)
        try:
            yield from self._serve_stream(request_iterator, client)
        finally:
            self.gate.leave(client)

    def _serve_stream(self, request_iterator, client: str):
        session = None
        try:
            for req in request_iterator:
                resp, kind, session = self.answer(req, client, session)
                yield resp
                if session is not None and session.pending is not None:
                    # The answer is on its way: apply the call's bookkeeping while the simulator
                    # steps, instead of before answering (runtime.settle).
                    self.settle(session)
                if kind == "close_session" and not resp.HasField("error"):
                    session = None
                    return
        finally:
            if session is not None:
                self.settle(session)
                self.runtime.detach_stream(session)

    def answer(self, req, client: str, session, where: str = "stream"):
        """One request of a stream (the gRPC stream's, or a shared-memory channel's `where` =
        "channel", whose session is always open) -> (response, its kind, the session now: the
        one a create_session opened, else `session`). A refusal is carried in response.error."""
        resp = pb.StreamResponse()
        kind = None
        try:
            if isinstance(req, Undecodable):
                raise self._undecodable(client, "stream", req)
            kind = req.WhichOneof("payload")
            if kind == "create_session":
                if session is not None:
                    raise failed_precondition(f"this {where} already has a session: open a new {where}",
                                              Reason.WRONG_SESSION_KIND)
                out = self.runtime.create_session(req.create_session, self.multi_agent, client=client)
                session = self.runtime.session(out.session_id, self.multi_agent)
                self.runtime.attach_stream(session)
            elif kind in _STREAM_CALLS:
                if session is None:
                    raise failed_precondition(f"send create_session first on this {where}", Reason.WRONG_SESSION_KIND)
                out = self.runtime.handle(kind, getattr(req, kind), self.multi_agent, bound=session, client=client)
            else:
                raise invalid_argument("empty stream request")
            getattr(resp, kind).CopyFrom(out)
        except BridgeError as e:
            self._refuse(e)
            resp.error.CopyFrom(e.to_status())
        except Exception as e:
            log.exception("internal error in %s %s", where, kind)
            self.runtime.metrics.errors["INTERNAL"] += 1
            resp.error.CopyFrom(_internal(kind or "stream", e).to_status())
        return resp, kind, session

    def settle(self, session) -> None:
        try:
            self.runtime.settle(session)
        except Exception:   # validated before it was answered: this is a bug, not bad input
            log.exception("applying an answered call's bookkeeping failed inside the server")
            self.runtime.metrics.errors["INTERNAL"] += 1

    def handler(self, service: str) -> grpc.GenericRpcHandler:
        """The service's method handlers, built from its descriptor."""
        methods = {}
        for m in pb.DESCRIPTOR.services_by_name[service].methods:
            parse = _tolerant(getattr(pb, m.input_type.name).FromString)
            serialize = getattr(pb, m.output_type.name).SerializeToString
            if m.name == "Stream":
                methods[m.name] = grpc.stream_stream_rpc_method_handler(
                    self.stream, request_deserializer=parse, response_serializer=serialize)
            else:
                methods[m.name] = grpc.unary_unary_rpc_method_handler(
                    self.unary(_UNARY_CALLS[m.name]), request_deserializer=parse,
                    response_serializer=serialize)
        return grpc.method_handlers_generic_handler(f"{pb.DESCRIPTOR.package}.{service}", methods)


def _internal(method: str, e: Exception) -> BridgeError:
    return BridgeError(grpc.StatusCode.INTERNAL, f"{method} failed inside the server: {e!r}",
                       Reason.SERVER_FAILURE)


HANDLERS_WAIT_S = 5.0   # what a stop waits for handlers still running (each returns within ms once cancelled)

_HEALTH_SERVICES = ("", "simbridge.v1.ExternalEnv", "simbridge.v1.ExternalMultiAgentEnv")


class BridgeServer:
    """A running bridge: gRPC server + runtime + session reaper.

    Binds to loopback unless told otherwise: exposing it is the user's choice, and beyond
    loopback it takes TLS and authentication, or `ServerSecurity(insecure=True)`
    (security.py). `address`: HOST:PORT, or unix:PATH for a Unix socket on this machine,
    created owner-only (binding.py). Raises SecurityConfigError for settings that cannot work,
    RuntimeError (in words naming the fix) when the address cannot be bound.
    """

    def __init__(self, runtime: Optional[BridgeRuntime] = None, address: str = "127.0.0.1:0",
                 reap_interval_s: float = 1.0, security: Optional[ServerSecurity] = None):
        self.runtime = runtime or BridgeRuntime(BridgeConfig())
        c = self.runtime.config
        given, address = address, grpc_address(address)   # shm+unix:PATH: gRPC on unix:PATH (shm_server.py)
        self.security = (security or ServerSecurity()).load(address)
        self.notices = NoticeLog(log)
        gate = CallGate(c.max_concurrent_calls, c.max_calls_per_client)
        self.gate = gate
        interceptors = self.security.interceptors()
        for i in interceptors:
            i.on_refused = self._token_refused
        self._server = grpc.server(
            # More threads than admitted calls: an admitted call never waits for a thread.
            futures.ThreadPoolExecutor(max_workers=c.max_concurrent_calls + 32, thread_name_prefix="simbridge-rpc"),
            interceptors=interceptors,
            # gRPC's own backstop above the gate (health checks and refusals take threads too).
            maximum_concurrent_rpcs=c.max_concurrent_calls + 16,
            options=[("grpc.max_receive_message_length", c.max_message_bytes),
                     ("grpc.max_send_message_length", c.max_message_bytes),
                     ("grpc.max_concurrent_streams", c.max_calls_per_connection),
                     # gRPC binds with SO_REUSEPORT by default: a second server on a busy port
                     # would start and silently share it. Refuse the port instead.
                     ("grpc.so_reuseport", 0),
                     # Notice dead simulators: ping idle connections.
                     ("grpc.keepalive_time_ms", 10_000),
                     ("grpc.keepalive_timeout_ms", 5_000),
                     ("grpc.keepalive_permit_without_calls", 1),
                     ("grpc.http2.min_ping_interval_without_data_ms", 5_000)])
        self._servicers = {}
        self._ready, self._stop, waited = threading.Event(), threading.Event(), threading.Event()
        for service, multi_agent in (("ExternalEnv", False), ("ExternalMultiAgentEnv", True)):
            servicer = self._servicers[multi_agent] = _Servicer(self.runtime, multi_agent, self.security, gate,
                                                                self.notices, self._ready, self._stop, waited)
            self._server.add_generic_rpc_handlers((servicer.handler(service),))
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        problem = address_problem(given)   # as given: a shm+unix: path leaves room for its PATH.shm
        if problem:
            raise RuntimeError(problem)
        if self.security.tls:
            self.port = bind(address, lambda a: self._server.add_secure_port(a, self.security.credentials))
        else:
            self.port = bind(address, self._server.add_insecure_port)
        # What clients dial: a Unix socket's address as given, a TCP one with the port bound.
        self.address = given if is_unix(address) else f"{address.rsplit(':', 1)[0]}:{self.port}"
        self._shm = None
        if is_shm(given):
            from simbridge.server.shm_server import ShmListener
            self._shm = ShmListener(self.runtime, shm_handover_path(given), self._servicers,
                                    _tolerant(pb.StreamRequest.FromString))
        self._reaper = threading.Thread(target=self._reap_loop, args=(reap_interval_s,),
                                        name="simbridge-reaper", daemon=True)

    def _token_refused(self, context) -> None:
        self.runtime.metrics.note_error(auth_failed())
        self.notices.note("host:" + peer_host(context.peer()), "calls without a valid token", context.peer())

    def start(self, serving: bool = True) -> "BridgeServer":
        """serving=False: listen, answer health NOT_SERVING, and hold every call until `serve()`
        (a trainer binds its port before it loads torch and its learners)."""
        self.runtime.experience.reopen()
        self._server.start()
        if self._shm is not None:
            self._shm.start()
        self._reaper.start()
        if serving:
            self.serve()
        else:
            for svc in _HEALTH_SERVICES:
                self.health.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
        return self

    def serve(self) -> None:
        """Serve the calls held since start(serving=False), and every call from now on."""
        for svc in _HEALTH_SERVICES:
            self.health.set(svc, health_pb2.HealthCheckResponse.SERVING)
        self._ready.set()
        log.info("simbridge serving on %s", self.address)

    def _reap_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.runtime.reap()
            except Exception:
                log.exception("session reaper failed")

    def stop(self, grace: Optional[float] = 1.0) -> None:
        self._stop.set()
        self._ready.set()   # held calls go (refused: the server is stopping)
        self.health.enter_graceful_shutdown()
        if self._shm is not None:
            self._shm.stop()
        self._server.stop(grace).wait()
        # A stream's last settle may still wait on a full experience queue that nobody drains
        # now (a bare server): it keeps its batch aside instead of holding its thread forever,
        # which would also hold the process at exit (concurrent.futures joins its workers).
        self.runtime.experience.close()
        # gRPC's stop cancels the calls but returns while their handlers still run: one could
        # commit a step after the owner's final counts (a trainer's last checkpoint). Wait for them.
        left = self.gate.close(HANDLERS_WAIT_S)
        if left:
            log.warning("%d call(s) still running %.0f s after the server stopped: steps they commit now "
                        "miss the final counts", left, HANDLERS_WAIT_S)
        if self._shm is not None:
            self._shm.join()

    def abort(self) -> None:
        """Out at once (a second Ctrl-C): every call cancelled now and intake closed, waiting for
        nothing. A call left running, its stream alive, would hold the process at exit, where
        concurrent.futures joins the handlers' threads."""
        self._stop.set()
        self._ready.set()
        self._server.stop(None)   # cancels every call now (also after a stop with grace)
        self.runtime.experience.close()
        if self._shm is not None:
            self._shm.stop()

    def wait(self) -> None:
        self._server.wait_for_termination()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
