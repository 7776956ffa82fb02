"""The fuzzer's judge: sends raw bytes (identity serializers: the bytes go as they are) on
unary calls and streams, with a deadline, and tallies what came back: the status-code histogram,
`internal` (INTERNAL or UNKNOWN status, or a StreamResponse.error with INTERNAL), `hangs` (our
deadline passed), `bad_answers` (an OK answer that is not the call's response: undecodable, or a
stream answer of another kind or count), `crashes` (the server process died). `fuzz_one` draws
one input and hands it to the judge; the server, the witness and the sessions it runs against
are the rig's (bench/fuzzrig.py).
"""
from __future__ import annotations

import collections
import re
from typing import Dict, List, Optional

import grpc
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from bench.fuzzing import SERVICES, UNARY
from bench.fuzzrig import CHANNEL_OPTIONS, Pool, ServerProcess
from simbridge.wire.v1 import simbridge_pb2 as pb

INTERNAL_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
EXAMPLES_PER_CAUSE = 3


def describe(msg_or_bytes, limit: int = 600) -> str:
    """A short, readable account of an input: text format for a message (runs of equal shape entries
    collapsed, long strings and tensor data cut), length and hex for bytes."""
    if isinstance(msg_or_bytes, (bytes, bytearray)):
        return f"{len(msg_or_bytes)} bytes: {bytes(msg_or_bytes[:24]).hex()}{'...' if len(msg_or_bytes) > 24 else ''}"
    text = text_format.MessageToString(msg_or_bytes, as_one_line=True, print_unknown_fields=True)
    text = re.sub(r'"((?:[^"\\]|\\.){0,24})((?:[^"\\]|\\.)*)"',
                  lambda m: f'"{m.group(1)}{"..." if m.group(2) else ""}"', text)
    text = re.sub(r"(shape: (-?\d+) )(?:shape: \2 ){2,}",
                  lambda m: f"shape: {m.group(2)} x{m.group(0).count('shape:')} ", text)
    return text if len(text) <= limit else text[:limit] + "..."


def cause_of(message: str) -> str:
    """The server's message with numbers and quoted values blanked, to group examples by cause."""
    m = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message or "")
    return re.sub(r"\d+", "#", m)[:160]


class Judge:
    """Sends fuzzed inputs and tallies every answer against the invariants."""

    def __init__(self, server: Optional[ServerProcess], address: str, unary_deadline_s: float = 10.0,
                 stream_deadline_s: float = 20.0):
        self.server, self.address = server, address
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.unary_deadline_s, self.stream_deadline_s = unary_deadline_s, stream_deadline_s
        self.calls = collections.Counter()     # per RPC ("single.GetAction", "multi.Stream", ...)
        self.sent = collections.Counter()      # messages per RPC (a stream's requests each count)
        self.codes = collections.Counter()     # status names, stream answers' errors included
        self.internal = 0
        self.hangs = 0
        self.bad_answers = 0
        self.crashed = False
        # what -> cause (the message, numbers and quoted values blanked) -> count, RPCs, a few inputs
        self.examples: Dict[str, Dict[str, dict]] = {"internal": {}, "hangs": {}, "bad_answers": {}}
        self.violations: List[str] = []        # one line each, for a test's assertion message

    def close(self) -> None:
        self.channel.close()

    def _note(self, what: str, rpc: str, desc: str, message: str) -> None:
        setattr(self, what, getattr(self, what) + 1)
        group = self.examples[what].setdefault(cause_of(message), {"count": 0, "rpcs": {}, "examples": []})
        group["count"] += 1
        group["rpcs"][rpc] = group["rpcs"].get(rpc, 0) + 1
        if len(group["examples"]) < EXAMPLES_PER_CAUSE:
            group["examples"].append({"rpc": rpc, "input": desc, "message": (message or "")[:400]})
        self.violations.append(f"{what}: {rpc} <- {desc[:200]} -> {(message or '')[:200]}")

    def _status(self, rpc: str, desc: str, code: grpc.StatusCode, message: str) -> None:
        self.codes[code.name] += 1
        if code in INTERNAL_CODES:
            self._note("internal", rpc, desc, f"{code.name}: {message}")
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            self._note("hangs", rpc, desc, message)
        elif code == grpc.StatusCode.UNAVAILABLE and self.server is not None and not self.server.alive():
            self.crashed = True
            self.violations.append(f"crash: the server exited ({self.server.proc.returncode}) after {rpc} <- {desc}")

    def unary(self, svc: str, method: str, data: bytes, desc: str) -> Optional[bytes]:
        rpc = f"{svc}.{method}"
        self.calls[rpc] += 1
        self.sent[rpc] += 1
        fn = self.channel.unary_unary(f"/{SERVICES[svc]}/{method}", request_serializer=None,
                                      response_deserializer=None)
        try:
            answer = fn(data, timeout=self.unary_deadline_s)
        except grpc.RpcError as e:
            self._status(rpc, desc, e.code(), e.details() or "")
            return None
        self.codes["OK"] += 1
        try:
            UNARY[method][1].FromString(answer)
        except DecodeError as e:
            self._note("bad_answers", rpc, desc, f"OK carrying {len(answer)} bytes that are no "
                                                 f"{UNARY[method][1].__name__}: {e}")
        return answer

    def stream(self, svc: str, kinds: List[Optional[str]], payloads: List[bytes], desc: str) -> int:
        """One stream carrying `payloads`; checks one answer per request, in order, of the request's
        kind or an error. Returns the number of answers."""
        rpc = f"{svc}.Stream"
        self.calls[rpc] += 1
        self.sent[rpc] += len(payloads)
        fn = self.channel.stream_stream(f"/{SERVICES[svc]}/Stream", request_serializer=None,
                                        response_deserializer=None)
        answers = 0
        try:
            for raw in fn(iter(payloads), timeout=self.stream_deadline_s):
                kind = kinds[answers] if answers < len(kinds) else "?"
                answers += 1
                try:
                    resp = pb.StreamResponse.FromString(raw)
                except DecodeError as e:
                    self._note("bad_answers", rpc, desc, f"answer {answers} is no StreamResponse: {e}")
                    continue
                if resp.HasField("error"):
                    code = _CODES.get(resp.error.code, grpc.StatusCode.UNKNOWN)
                    self._status(rpc, f"[{answers}: {kind}] {desc}", code, resp.error.message)
                    continue
                self.codes["OK"] += 1
                if kind != "?" and resp.WhichOneof("payload") != kind:   # "?": raw bytes, kind unknown
                    self._note("bad_answers", rpc, desc, f"answer {answers} to a {kind} request carries "
                                                         f"{resp.WhichOneof('payload')}")
        except grpc.RpcError as e:
            self._status(rpc, desc, e.code(), e.details() or "")
            return answers
        closed = [i for i, k in enumerate(kinds[:answers]) if k == "close_session"]
        if answers > len(kinds) or (answers < len(kinds) and not closed):
            self._note("bad_answers", rpc, desc, f"{answers} answers to {len(kinds)} requests")
        return answers

    def summary(self) -> dict:
        return {"messages": sum(self.sent.values()), "messages_per_rpc": dict(sorted(self.sent.items())),
                "calls_per_rpc": dict(sorted(self.calls.items())),
                "crashes": int(self.crashed), "hangs": self.hangs, "internal": self.internal,
                "bad_answers": self.bad_answers, "status_codes": dict(self.codes.most_common()),
                "examples": {k: v for k, v in self.examples.items() if v}}


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def fuzz_one(judge: Judge, pool: Pool, draw, svc: str, method: str, raw: bool) -> None:
    """One fuzzed call of `svc`.`method` (a whole stream for "Stream"): raw bytes or typed messages."""
    from bench.fuzzcases import raw_bytes, stream_ctx, stream_requests, typed_request
    from bench.fuzzing import Gen
    if method == "Stream":
        ctx = pool.ctx_for(svc, method, draw.integer(0, 3))
        g = Gen(draw, stream_ctx(svc == "multi", others=[ctx.sid, *ctx.others]))
        if raw:
            payloads = [raw_bytes(g, "Stream") for _ in range(draw.integer(1, 4))]
            kinds = ["?"] * len(payloads)
            judge.stream(svc, kinds, payloads, " | ".join(describe(p, 80) for p in payloads))
        else:
            kinds, reqs = stream_requests(g)
            judge.stream(svc, kinds, [r.SerializeToString() for r in reqs],
                         " | ".join(describe(r, 120) for r in reqs))
        return
    g = Gen(draw, pool.ctx_for(svc, method, draw.integer(0, 3)))
    if raw:
        data = raw_bytes(g, method)
        judge.unary(svc, method, data, describe(data))
    else:
        msg = typed_request(g, method)
        judge.unary(svc, method, msg.SerializeToString(), describe(msg))
