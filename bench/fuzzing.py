"""Fuzzed simbridge inputs, the generic half: hostile values for every field of every message.

One set of generators serves tests/server/test_fuzz.py (hypothesis draws the
choices, so failures shrink) and bench/fuzz.py (a seeded random.Random draws
them, no shrinking, thousands of messages). Every choice goes through a `Draw`
(integer, boolean, choice, raw) so both drive exactly the same code.

`Gen.message(cls)` fills every field of a message from its descriptor with
hostile values (ids of every length, seqs near 2**64, enum values out of range,
tensors of random dtype, shape and byte length, up to 70 dimensions, random
space trees); `Gen.mutate` replaces a few fields of a message anywhere in it.
bench/fuzzcases.py builds on these: near-valid requests for the fuzzer's real
sessions (a correct request with a few fields replaced, so the fuzz reaches
deep code instead of bouncing off the first check), stream sequences, and
random or damaged bytes.
"""
from __future__ import annotations

import random
from typing import List, Optional, Sequence

import numpy as np
from google.protobuf import descriptor as _d
from google.protobuf import struct_pb2

from simbridge.wire.v1 import simbridge_pb2 as pb

OBS_SHAPE = (4,)          # the CartPole spaces every fuzz session declares
N_SLOTS = 4
AGENTS = ("a0", "a1")
DTYPE_SIZES = {1: 4, 2: 8, 3: 2, 4: 1, 5: 2, 6: 4, 7: 8, 8: 1, 9: 2, 10: 4, 11: 8, 12: 1}
NP_DTYPES = {1: "<f4", 2: "<f8", 3: "<f2", 4: "i1", 5: "<i2", 6: "<i4", 7: "<i8", 8: "u1", 9: "<u2",
             10: "<u4", 11: "<u8", 12: "u1"}
INTERESTING_INTS = (0, 1, 2, 3, 4, -1, 255, 256, 65536, 2**31 - 1, -2**31, 2**62, -2**63, 2**63 - 1)
MAX_BYTES = 4096          # random byte strings; `raw_big` sends up to 256 KiB now and then

SERVICES = {"single": "simbridge.v1.ExternalEnv", "multi": "simbridge.v1.ExternalMultiAgentEnv"}
UNARY = {  # method -> (request class, response class, runtime kind)
    "CreateSession": (pb.CreateSessionRequest, pb.CreateSessionResponse, "create_session"),
    "StartEpisode": (pb.StartEpisodeRequest, pb.StartEpisodeResponse, "start_episode"),
    "GetAction": (pb.GetActionRequest, pb.GetActionResponse, "get_action"),
    "LogAction": (pb.LogActionRequest, pb.LogActionResponse, "log_action"),
    "LogReturns": (pb.LogReturnsRequest, pb.LogReturnsResponse, "log_returns"),
    "EndEpisode": (pb.EndEpisodeRequest, pb.EndEpisodeResponse, "end_episode"),
    "CloseSession": (pb.CloseSessionRequest, pb.CloseSessionResponse, "close_session"),
    "Step": (pb.StepRequest, pb.StepResponse, "step"),
    "GetPolicy": (pb.GetPolicyRequest, pb.GetPolicyResponse, "get_policy"),
    "UploadExperience": (pb.UploadExperienceRequest, pb.UploadExperienceResponse, "upload_experience"),
}
SINGLE_ONLY = ("Step", "GetPolicy", "UploadExperience")
STREAM_KINDS = ("create_session", "start_episode", "get_action", "log_action", "log_returns", "end_episode",
                "close_session", "step")


def rpcs() -> List[tuple]:
    """Every (service, method) the server offers, the Streams included."""
    out = []
    for svc in ("single", "multi"):
        out += [(svc, m) for m in UNARY if svc == "single" or m not in SINGLE_ONLY]
        out.append((svc, "Stream"))
    return out


# ---------------------------------------------------------------- draws


class RandomDraw:
    """The bench's Draw: a seeded random.Random."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def boolean(self, p: float = 0.5) -> bool:
        return self.rng.random() < p

    def choice(self, seq: Sequence):
        return seq[self.rng.randrange(len(seq))]

    def raw(self, max_size: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_size))


# ---------------------------------------------------------------- session context


class Ctx:
    """What a near-valid request may refer to: a session (id, service, slots) and its episodes."""

    def __init__(self, sid: str, multi: bool, slots: int = 0, episodes: Sequence[str] = ("e0", "e1"),
                 others: Sequence[str] = ()):
        self.sid, self.multi, self.slots = sid, multi, slots
        self.episodes = list(episodes)
        self.others = list(others)   # ids of the fuzzer's other sessions (the other service's too)


class Gen:
    def __init__(self, draw, ctx: Ctx):
        self.d = draw
        self.ctx = ctx

    # -------------------------------------------------------------- scalars

    def text(self) -> str:
        d = self.d
        k = d.integer(0, 9)
        if k == 0:
            return ""
        if k == 1:
            return "x" * d.choice((255, 256, 257, 1024, 65536))   # around and past max_id_bytes
        if k == 2:
            return d.choice(("__all__", "é" * 200, "\x00", "e0\n", "a0", " ", "\ud7ff"))
        if k == 3:
            return d.raw(32).decode("utf-8", "replace")
        if k in (4, 5) and self.ctx.episodes:
            return d.choice(self.ctx.episodes)
        if k == 6:
            return d.choice(AGENTS)
        return "f%d" % d.integer(0, 2**20)

    def int_(self, lo: int = -2**63, hi: int = 2**63 - 1) -> int:
        v = self.d.choice(INTERESTING_INTS) if self.d.boolean(0.7) else self.d.integer(-1000, 1000)
        return min(max(v, lo), hi)

    def seq(self) -> int:
        d = self.d
        return d.choice((0, 0, 0, 1, 2, 3, d.integer(0, 300), 2**63, 2**64 - 1))

    def float_(self) -> float:
        return self.d.choice((0.0, 1.0, -1.5, 1e308, -1e-310, float("nan"), float("inf"), float("-inf")))

    # -------------------------------------------------------------- tensors, values, spaces

    def tensor(self, dtype: Optional[int] = None, shape: Optional[tuple] = None, valid_p: float = 0.0) -> pb.Tensor:
        """A Tensor. With probability valid_p each of dtype/shape/data is the given, valid one."""
        d = self.d
        t = pb.Tensor()
        t.dtype = dtype if dtype is not None and d.boolean(valid_p) else d.choice((*range(13), 13, 99, -1))
        if shape is not None and d.boolean(valid_p):
            t.shape.extend(shape)
        else:
            if d.boolean(0.08):   # numpy stops at 64 dimensions; ones keep the data length right
                t.shape.extend([1] * d.integer(60, 70))
            else:
                t.shape.extend(d.choice((0, 1, 1, 2, 3, 4, 5, -1, 2**31, 2**62)) if d.boolean(0.2)
                               else d.integer(0, 5) for _ in range(d.integer(0, 4)))
        n = int(np.prod([max(s, 0) for s in t.shape], dtype=np.float64))
        size = DTYPE_SIZES.get(t.dtype)
        if size and n * size <= MAX_BYTES * 16 and d.boolean(0.5 + valid_p / 2):
            t.data = self._content(t.dtype, n)
        else:
            t.data = d.raw(64)
        return t

    def _content(self, dtype: int, n: int) -> bytes:
        rng = np.random.default_rng(self.d.integer(0, 2**32 - 1))
        mode = self.d.choice(("small", "small", "small", "zeros", "nan", "inf", "bytes"))
        if mode == "bytes":
            return rng.bytes(n * DTYPE_SIZES[dtype])
        arr = np.zeros(n, NP_DTYPES[dtype])
        if mode != "zeros":
            arr[:] = rng.integers(0, 2, n) if dtype in (4, 8, 12) else rng.uniform(-1, 2, n)
        if mode in ("nan", "inf") and n and dtype in (1, 2, 3):
            arr[rng.integers(0, n)] = np.nan if mode == "nan" else np.inf
        return arr.tobytes()

    def value(self, dtype: Optional[int] = None, shape: Optional[tuple] = None, valid_p: float = 0.0,
              depth: int = 0) -> pb.Value:
        d = self.d
        v = pb.Value()
        k = 0 if depth > 2 or d.boolean(0.8) else d.integer(1, 3)
        if k == 0:
            v.tensor.CopyFrom(self.tensor(dtype, shape, valid_p))
        elif k == 1:
            for _ in range(d.integer(0, 3)):
                v.dict.items[self.text()].CopyFrom(self.value(dtype, shape, valid_p, depth + 1))
        elif k == 2:
            for _ in range(d.integer(0, 3)):
                v.tuple.items.add().CopyFrom(self.value(dtype, shape, valid_p, depth + 1))
        return v   # k == 3: an empty Value (no kind)

    def space(self, depth: int = 0) -> pb.Space:
        d = self.d
        s = pb.Space()
        k = d.integer(0, 6 if depth < 3 else 4)
        if k == 0:
            if d.boolean():   # a well-formed box of a telling size (SPACE_TOO_LARGE, numpy's 64 dims)
                shape = d.choice(((1,), (4,), (0,), (1000,), (100_000,), (1000, 1000), (1,) * 64, (1,) * 65))
                n = int(np.prod(shape))
                low = np.zeros(min(n, 100_000), np.float32)
                s.box.low.CopyFrom(pb.Tensor(dtype=1, shape=shape, data=low.tobytes()))
                s.box.high.CopyFrom(pb.Tensor(dtype=1, shape=shape, data=(low + 1).tobytes()))
            else:
                s.box.low.CopyFrom(self.tensor())
                s.box.high.CopyFrom(self.tensor())
        elif k == 1:
            s.discrete.n = self.int_()
            s.discrete.start = self.int_()
        elif k == 2:
            s.multi_discrete.nvec.CopyFrom(self.tensor(7, (2,), 0.5))
            if d.boolean():
                s.multi_discrete.start.CopyFrom(self.tensor(7, (2,), 0.5))
        elif k == 3:
            s.multi_binary.shape.extend(self.int_() if d.boolean(0.3) else d.integer(0, 4)
                                        for _ in range(d.integer(60, 70) if d.boolean(0.1) else d.integer(0, 3)))
        elif k == 5:
            s.dict.SetInParent()
            for _ in range(d.integer(0, 3)):
                s.dict.spaces.add(name=self.text()).space.CopyFrom(self.space(depth + 1))
        elif k == 6:
            s.tuple.SetInParent()
            for _ in range(d.integer(0, 3)):
                s.tuple.spaces.add().CopyFrom(self.space(depth + 1))
        return s   # k == 4: an empty Space (no kind)

    def struct(self) -> struct_pb2.Struct:
        s = struct_pb2.Struct()
        for _ in range(self.d.integer(0, 2)):
            s.fields[self.text()].number_value = self.float_()
        return s

    # -------------------------------------------------------------- generic messages

    def header(self) -> pb.RequestHeader:
        d = self.d
        c = self.ctx
        sid = d.choice((c.sid, c.sid, c.sid, "", self.text(), *(c.others[:3] or [""])))
        return pb.RequestHeader(session_id=sid, seq=self.seq())

    def message(self, cls, depth: int = 0):
        """Any message of `cls`, every field drawn from its descriptor."""
        special = _SPECIAL.get(cls.DESCRIPTOR.full_name)
        if special is not None:
            return special(self)
        msg = cls()
        for f in cls.DESCRIPTOR.fields:
            if f.containing_oneof is not None and msg.WhichOneof(f.containing_oneof.name):
                continue   # one member per oneof
            if not self.d.boolean(0.6 if depth == 0 else 0.4):
                continue
            self._fill(msg, f, depth)
        return msg

    def _fill(self, msg, f, depth: int) -> None:
        if _is_map(f):
            key_f, val_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            for _ in range(self.d.integer(0, 2)):
                key = self._scalar(key_f)
                if val_f.type == _d.FieldDescriptor.TYPE_MESSAGE:
                    getattr(msg, f.name)[key].CopyFrom(self._sub(val_f, depth))
                else:
                    getattr(msg, f.name)[key] = self._scalar(val_f)
        elif f.is_repeated:
            field = getattr(msg, f.name)
            for _ in range(self.d.integer(0, 3 if depth < 2 else 1)):
                if f.type == _d.FieldDescriptor.TYPE_MESSAGE:
                    field.add().CopyFrom(self._sub(f, depth))
                else:
                    field.append(self._scalar(f))
        elif f.type == _d.FieldDescriptor.TYPE_MESSAGE:
            getattr(msg, f.name).CopyFrom(self._sub(f, depth))
        else:
            setattr(msg, f.name, self._scalar(f))

    def _sub(self, f, depth: int):
        cls = pb.__dict__.get(f.message_type.name) if f.message_type.file.package == "simbridge.v1" else None
        if depth > 3 and cls is not None and cls.DESCRIPTOR.full_name not in _SPECIAL:
            return cls()
        if cls is None:
            return self.struct() if f.message_type.full_name == "google.protobuf.Struct" else _empty(f)
        return self.message(cls, depth + 1)

    def _scalar(self, f):
        T = _d.FieldDescriptor
        t = f.type
        if t == T.TYPE_STRING:
            return self.text()
        if t == T.TYPE_BYTES:
            return self.d.raw(64)
        if t == T.TYPE_BOOL:
            return self.d.boolean()
        if t in (T.TYPE_DOUBLE, T.TYPE_FLOAT):
            return self.float_()
        if t == T.TYPE_ENUM:
            return self.d.choice((*(v.number for v in f.enum_type.values), 99, -1))
        if t in (T.TYPE_UINT64, T.TYPE_FIXED64):
            return self.seq() if f.name == "seq" else self.int_(0, 2**64 - 1)
        if t in (T.TYPE_UINT32, T.TYPE_FIXED32):
            return self.int_(0, 2**32 - 1)
        if t in (T.TYPE_INT32, T.TYPE_SINT32, T.TYPE_SFIXED32):
            return self.int_(-2**31, 2**31 - 1)
        return self.int_()

    # -------------------------------------------------------------- mutation

    def mutate(self, msg, times: int) -> None:
        """Replace `times` fields anywhere in `msg` (set or not) by generic values, or clear them."""
        for _ in range(times):
            spots = list(_spots(msg))
            owner, f = self.d.choice(spots)
            if self.d.boolean(0.2):
                owner.ClearField(f.name)
            else:
                owner.ClearField(f.name)
                self._fill(owner, f, 2)


def _is_map(f) -> bool:
    return (f.type == _d.FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry)


def _empty(f):
    from google.protobuf import message_factory
    return message_factory.GetMessageClass(f.message_type)()


def _spots(msg, depth: int = 0):
    """(owner message, field) for every field of msg and of its set sub-messages."""
    for f in msg.DESCRIPTOR.fields:
        yield msg, f
        if depth > 4 or f.type != _d.FieldDescriptor.TYPE_MESSAGE or _is_map(f):
            continue
        if f.is_repeated:
            for sub in getattr(msg, f.name):
                yield from _spots(sub, depth + 1)
        elif msg.HasField(f.name):
            yield from _spots(getattr(msg, f.name), depth + 1)


_SPECIAL = {
    "simbridge.v1.Tensor": lambda g: g.tensor(),
    "simbridge.v1.Value": lambda g: g.value(),
    "simbridge.v1.Space": lambda g: g.space(),
    "simbridge.v1.RequestHeader": lambda g: g.header(),
}
