"""The record format the journal writes and the learner pipe sends: JSON header, raw array bytes.

A record: b"SBJ1", header length, payload length, CRC-32 of header+payload (little-endian
uint32s), a JSON header, then the payload: raw little-endian numpy bytes of the arrays the
header describes (dtype, shape; nested observations as a tree of leaf indices). No pickle: a
reader trusts nothing but JSON, dtypes without objects, and sizes it checks. A record cut short
(a kill) or damaged fails its length or CRC check. The record kinds and what the journal does
with them: trainer/run/journal.py; the learner pipe's rows records skip the CRC
(trainer/run/learner_process.py).
"""
import json
import logging
import struct
import zlib
from typing import List, Tuple

import numpy as np

log = logging.getLogger("simbridge.trainer")

MAGIC = b"SBJ1"
HEAD = struct.Struct("<4sIII")
MAX_HEADER = 1 << 20            # a reader refuses larger headers (a damaged length field)


def flatten(value, leaves: list):
    """A column (an array, or dicts/tuples of them) -> (JSON tree of leaf indices, leaves += arrays)."""
    if isinstance(value, dict):
        return {"d": {str(k): flatten(v, leaves) for k, v in value.items()}}
    if isinstance(value, tuple):
        return {"t": [flatten(v, leaves) for v in value]}
    leaves.append(np.ascontiguousarray(value))
    return len(leaves) - 1


def unflatten(spec, arrays: list):
    if isinstance(spec, int):
        return arrays[spec]
    if "d" in spec:
        return {k: unflatten(v, arrays) for k, v in spec["d"].items()}
    return tuple(unflatten(v, arrays) for v in spec["t"])


def frame(h: bytes, payload: bytes = b"") -> bytes:
    return HEAD.pack(MAGIC, len(h), len(payload), zlib.crc32(payload, zlib.crc32(h))) + h + payload


def record(h: bytes, arrays, prefix: bytes = b"", checked: bool = True) -> bytearray:
    """frame(h, the arrays' bytes one after the other), after `prefix`, each array's bytes copied
    once: tobytes, a join and the head's concatenation copied a camera's rows three times (a
    fragment of 320x240 frames: 14 MB each time, on the bridge's and the learner pipe's hot path).
    checked=False: CRC 0, for a pipe, which loses nothing (its CRC took 3 ms per 14 MB each way)."""
    views = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]
    size = sum(v.nbytes for v in views)
    crc = zlib.crc32(h) if checked else 0
    for v in views if checked else ():
        crc = zlib.crc32(v, crc)
    out = bytearray(len(prefix) + HEAD.size + len(h) + size)
    out[:len(prefix)] = prefix
    pos = len(prefix) + HEAD.size
    HEAD.pack_into(out, len(prefix), MAGIC, len(h), size, crc)
    out[pos:pos + len(h)] = h
    pos += len(h)
    for v in views:
        out[pos:pos + v.nbytes] = v.data
        pos += v.nbytes
    return out


LITTLE = np.little_endian


def little_endian(a: np.ndarray) -> np.ndarray:
    return a if a.dtype.byteorder == "<" or (a.dtype.byteorder in "=|" and LITTLE) else a.astype(a.dtype.newbyteorder("<"))


def encode(header: dict, arrays: List[np.ndarray] = ()) -> bytes:
    """One record: `header` (JSON) and `arrays` (their dtype and shape go in the header)."""
    arrays = [little_endian(np.asarray(a)) for a in arrays]
    header = dict(header, a=[[a.dtype.str, list(a.shape)] for a in arrays])
    return bytes(record(json.dumps(header, separators=(",", ":")).encode(), arrays))


def encode_rows(columns: dict, n: int, prefix: bytes = b"", checked: bool = True) -> bytearray:
    """`n` rows of a policy's columns as one rows record, after `prefix` (trainer/run/learner_process.py
    sends them to a learner process this way, unchecked: see record); object columns (infos: no
    learner reads them) are left out."""
    leaves: list = []
    cols = {}
    for k, v in columns.items():
        mark = len(leaves)
        spec = flatten(v, leaves)
        if any(a.dtype.hasobject for a in leaves[mark:]):
            del leaves[mark:]
            continue
        cols[k] = spec
    leaves = [little_endian(a) for a in leaves]
    header = {"k": "rows", "i": 0, "n": n, "cols": cols, "a": [[a.dtype.str, list(a.shape[1:])] for a in leaves]}
    return record(json.dumps(header, separators=(",", ":")).encode(), leaves, prefix, checked)


def decode_rows(data, checked: bool = True) -> Tuple[dict, int]:
    """encode_rows' (columns, n) back (from bytes or a memoryview of them: its arrays are views of
    `data`, read-only; checked as it was encoded); ValueError for anything else."""
    recs, used = decode_all(data, checked)
    if len(recs) != 1 or used != len(data) or recs[0][0].get("k") != "rows":
        raise ValueError("not one whole rows record")
    header, arrays = recs[0]
    return {k: unflatten(spec, arrays) for k, spec in header["cols"].items()}, int(header["n"])


def counters_record(env: int, agent: int, episodes: int) -> bytes:
    # Once per applied call: formatted directly (json.dumps costs several times more).
    return frame(b'{"k":"counters","env":%d,"agent":%d,"episodes":%d,"a":[]}' % (env, agent, episodes))


def decode_all(data, checked: bool = True) -> Tuple[List[Tuple[dict, List[np.ndarray]]], int]:
    """The whole records at the start of `data` (bytes, or a memoryview: nothing is copied, the
    arrays are views of it), and how many bytes they take (the rest: torn). checked=False: records
    of a pipe, whose CRC is not computed (record)."""
    data = memoryview(data).cast("B")
    out, pos = [], 0
    while pos + HEAD.size <= len(data):
        magic, hlen, plen, crc = HEAD.unpack_from(data, pos)
        end = pos + HEAD.size + hlen + plen
        if magic != MAGIC or hlen > MAX_HEADER or end > len(data):
            break
        h = data[pos + HEAD.size: pos + HEAD.size + hlen]
        payload = data[pos + HEAD.size + hlen: end]
        if checked and zlib.crc32(payload, zlib.crc32(h)) != crc:
            break
        try:
            header = json.loads(bytes(h))
            arrays, off = [], 0
            rows = [int(header["n"])] if header.get("k") == "rows" else []   # rows: trailing shapes
            for dt, shape, *own in header.pop("a"):   # own: a leaf's row count, where not "n"
                shape = [int(own[0])] + list(shape) if own and rows else rows + list(shape)
                dtype = np.dtype(dt)
                if dtype.hasobject:
                    raise ValueError("object dtype")
                size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
                arrays.append(np.frombuffer(payload, dtype, offset=off, count=size // max(dtype.itemsize, 1))
                              .reshape(shape) if size else np.zeros(shape, dtype))
                off += size
            if off != len(payload):
                raise ValueError("payload size")
        except (ValueError, TypeError, KeyError) as e:
            log.warning("journal: a record with a valid checksum does not decode (%s): dropped with the rest", e)
            break
        out.append((header, arrays))
        pos = end
    return out, pos
