"""Value checks shared by every call that takes them from the wire.

rewards(): the one decoder of rewards (RewardRows, Step, UploadExperience): exactly
FLOAT32 of shape (n,), every value finite. No other dtype is converted: the contract says
float32, so a FLOAT64 or integer tensor is the client's mistake to hear about.

flags(): the one decoder of done flags (terminated / truncated). Flags come in
two wire forms, a repeated bool field (one per row of a RewardRows) and a BOOL
Tensor (Step, UploadExperience); both follow the same rules:

* absent or empty: every row False;
* otherwise exactly one flag per row;
* a tensor must be BOOL of shape (n,) and hold only the bytes 0 and 1 (numpy
  would read any other byte as a "true" that is neither True nor False).

ids(): the one check of id lengths (episode ids, agent ids, client names, session ids): at most
`limit` bytes of UTF-8 each (ServerLimits.max_id_bytes), so what a client makes the server keep
per id is bounded.
"""
import math
from typing import Sequence, Union

import numpy as np

from simbridge.wire import leaf_codec, tensors
from simbridge.wire.errors import Reason, invalid_argument, invalid_value
from simbridge.wire.v1 import simbridge_pb2 as pb

_BOOL = np.dtype(bool)
_F32 = np.dtype("<f4")
# All-false flags of a repeated field, shared by every call that sends none (the common case).
_NO_FLAGS = (False,) * 4096


def flags(source: Union[None, pb.Tensor, Sequence[bool]], n: int, what: str,
          per: str = "one per row") -> Sequence[bool]:
    """n done flags from `source`: None (a tensor field left out), a BOOL tensor, or a
    repeated bool field. A tensor gives a bool array (possibly a read-only view of the
    request); a repeated field an indexable sequence of at least n bools (all-false ones may
    be longer and shared: index them, don't measure them). `what` and `per` word the errors."""
    if source is None:
        return np.zeros(n, bool)
    if isinstance(source, pb.Tensor):
        return _tensor_flags(source, n, what, per)
    if len(source) == 0:
        return _NO_FLAGS if n <= len(_NO_FLAGS) else (False,) * n
    if len(source) != n:
        raise invalid_argument(f"{what}: {len(source)} flags for {n} rows")
    return list(source)


def _tensor_flags(t: pb.Tensor, n: int, what: str, per: str) -> np.ndarray:
    data = t.data
    view = _vector(t, pb.BOOL, _BOOL, n, what, per, "BOOL", invalid_argument)
    # Two byte counts (C speed) instead of a max() over the array: this is the Step hot path.
    if data.count(b"\x00") + data.count(b"\x01") != n:
        raw = np.frombuffer(data, np.uint8)
        bad = int((raw > 1).argmax())
        raise invalid_argument(f"{what} row {bad}: byte {raw[bad]} is not a bool (0 or 1)")
    return view


def rewards(t: pb.Tensor, n: int, what: str, per: str, row: str) -> np.ndarray:
    """n rewards from a FLOAT32 tensor of shape (n,), all finite (a read-only view).
    `what` names the field, `per` what one value stands for ("one per slot") and `row` a
    format for the offending row ("Step rewards: slot {}"); all INVALID_ARGUMENT / INVALID_VALUE."""
    view = _vector(t, pb.FLOAT32, _F32, n, what, per, "float32 (FLOAT32; no other dtype is converted)",
                   invalid_value)
    if not leaf_codec.quick_all_finite(view):
        bad = ~np.isfinite(view)
        if bad.any():   # else finite values overflowed the sum
            i = int(bad.argmax())
            raise invalid_value(f"{row.format(i)}: {view[i]} is not a finite number")
    return view


def _vector(t: pb.Tensor, code: int, dtype: np.dtype, n: int, what: str, per: str, expected: str,
            error) -> np.ndarray:
    """A (n,) tensor of one dtype as a read-only view: a few field comparisons when it is right,
    else `error` naming what is wrong with it."""
    view = leaf_codec.vector_view(t, code, dtype, n)
    if view is not None:
        return view
    if t.dtype != code:
        raise error(f"{what}: dtype {tensors.dtype_name(t.dtype)}, expected {expected}")
    if tuple(t.shape) != (n,):
        raise error(f"{what}: shape {tuple(t.shape)}, expected ({n},): {per}")
    try:
        return tensors.from_tensor(t)
    except Exception as e:
        raise error(f"{what}: {getattr(e, 'message', e)}") from None


def ids(values, limit: int, what: str) -> None:
    """INVALID_ARGUMENT / ID_TOO_LONG unless every id in `values` (strs) is at most `limit` bytes
    of UTF-8. A character is at most 4 bytes, so only ids longer than limit / 4 characters are
    encoded to be measured: the common case costs one max() over their lengths."""
    if not values or max(map(len, values)) * 4 <= limit:
        return
    for v in values:
        size = len(v.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise invalid_argument(f"{what} {v[:16]!r}... is {size} bytes of UTF-8, more than the server's "
                                   f"limit of {limit} bytes (ServerLimits.max_id_bytes): use shorter ids",
                                   Reason.ID_TOO_LONG)


def finite_struct(info, what: str) -> None:
    """A google.protobuf.Struct of infos: JSON has no NaN or Infinity, so neither may it (they
    would fail later, when the info becomes a dict); INVALID_VALUE naming the key."""
    stack = [("", info)]
    while stack:
        path, msg = stack.pop()
        items = msg.fields.items() if hasattr(msg, "fields") else enumerate(msg.values)
        for key, value in items:
            kind = value.WhichOneof("kind")
            if kind == "number_value" and not math.isfinite(value.number_value):
                raise invalid_value(f"{what}: {path}{key} is {value.number_value}: infos are JSON, which has "
                                    f"no NaN or Infinity")
            if kind == "struct_value":
                stack.append((f"{path}{key}.", value.struct_value))
            elif kind == "list_value":
                stack.append((f"{path}{key}.", value.list_value))
