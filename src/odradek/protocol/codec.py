"""Primitive types of Kafka's wire protocol, used by the generated message code.

Seed 003, "Protocol Primitive Types"; KIP-482 for the compact (flexible) forms and tagged fields.

    int8/int16/int32/int64, uint16, uint32, float64   big-endian, fixed width
    boolean                                           one byte, 0 false, anything else true
    unsigned varint                                   7 bits per byte, low group first, <= 5 bytes
    varint / varlong                                  zig-zag encoded, <= 5 / <= 10 bytes
    uuid                                              16 bytes
    string / nullable string                          int16 length (-1 null) + UTF-8
    bytes / nullable bytes / records                  int32 length (-1 null) + bytes
    compact string / bytes / records                  unsigned varint (length + 1, 0 null) + data
    array                                             int32 count (-1 null) + elements
    compact array                                     unsigned varint (count + 1, 0 null) + elements
    tagged fields                                     unsigned varint count, then per field:
                                                      unsigned varint tag (strictly ascending),
                                                      unsigned varint size, size bytes

Readers take (data, pos) where data is a memoryview (or bytes) of one whole frame and return
(value, new_pos). Every length and count is checked against the bytes that remain before anything is
allocated; every failure is a `ProtocolError`. Writers append to a `Writer`, a bytearray that can also
carry references to record sets held elsewhere (file slices), so a Fetch response is never copied
through Python.
"""

from __future__ import annotations

import contextlib
import contextvars
import struct
import uuid as _uuid
from typing import Iterator

from odradek.protocol.exceptions import ProtocolError

MAX_ARRAY_COUNT = 1_000_000      # Kafka 4.4 refuses longer arrays too

# The decode budget: what decoding one request may cost in Python objects (KAFKA-14063). A frame of n
# bytes may decode to DECODE_SLACK_BYTES + DECODE_MULTIPLE * n bytes of estimated objects: each array
# element, each string or bytes value and each unknown tagged field is charged its CPython footprint.
# The estimates are high (an element: a slotted message of five fields holding a boxed number, its
# list slot), so what a request really holds is at most its charge (tests/protocol/test_decode_budget.py
# measures it). Checking counts against the bytes that remain is not enough on its own: an empty topic
# name is two bytes on the wire and about a hundred in memory.
#
# The rule is a constant factor plus a constant, not a constant factor alone: a legal request's objects
# are a fixed multiple of its bytes, but that multiple is large for short items (a Metadata v1 request
# naming 400,000 topics "t0".."t399999" is 3.5 MB on the wire and charged 73 MB, 21x) and not much
# larger for the abusive shapes (a million empty names: 2 MB charged 176 MB, 88x). What separates them
# is size: the slack admits any request up to 56 MiB of objects whatever its shape (the legal ones
# naming a few hundred thousand items), and past it only requests charged at most 6x their bytes. With
# the frame itself a request holds at most 7x its bytes + 56 MiB, inside the abuse suite's bound of
# 8x the bytes sent + 64 MiB with room for the answer.
DECODE_MULTIPLE = 6
DECODE_SLACK_BYTES = 56 << 20
ELEMENT_COST_BYTES = 128         # a slotted message object of five fields and a boxed number, its list slot
VALUE_COST_BYTES = 48            # a str or bytes object's header, plus its length
TAG_COST_BYTES = 128             # an unknown tagged field kept as (tag, bytes)
_budget: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("odradek_decode_budget",
                                                                        default=None)


def decode_allowance(frame_bytes: int, slack: int = DECODE_SLACK_BYTES) -> int:
    """The estimated object bytes a frame of `frame_bytes` may decode to. A broker shares one
    DECODE_SLACK_BYTES among the requests in progress (server/dispatch.py), so `slack` is the part
    this request was granted."""
    return slack + DECODE_MULTIPLE * frame_bytes


def worst_charge(frame_bytes: int) -> int:
    """The most any frame of `frame_bytes` can be charged: an element per byte (an empty struct of a
    compact array), each charged an element and a value."""
    return frame_bytes * (ELEMENT_COST_BYTES + VALUE_COST_BYTES)


@contextlib.contextmanager
def decode_budget(frame_bytes: int, slack: int = DECODE_SLACK_BYTES) -> Iterator[list[int]]:
    """Bound what decoding a frame of `frame_bytes` may allocate (see `decode_allowance`); yields a
    one-element list holding what is left of the allowance."""
    left = [decode_allowance(frame_bytes, slack)]
    token = _budget.set(left)
    try:
        yield left
    finally:
        _budget.reset(token)


def _charge(cost: int) -> None:
    b = _budget.get()
    if b is not None:
        b[0] -= cost
        if b[0] < 0:
            raise ProtocolError(f"the request would decode to more than {DECODE_MULTIPLE}x its size "
                                f"+ {DECODE_SLACK_BYTES >> 20} MiB of objects")

_S_I8 = struct.Struct(">b")
_S_I16 = struct.Struct(">h")
_S_I32 = struct.Struct(">i")
_S_I64 = struct.Struct(">q")
_S_U16 = struct.Struct(">H")
_S_U32 = struct.Struct(">I")
_S_F64 = struct.Struct(">d")

u_i8 = _S_I8.unpack_from
u_i16 = _S_I16.unpack_from
u_i32 = _S_I32.unpack_from
u_i64 = _S_I64.unpack_from
u_u16 = _S_U16.unpack_from
u_u32 = _S_U32.unpack_from
u_f64 = _S_F64.unpack_from
p_i8 = _S_I8.pack
p_i16 = _S_I16.pack
p_i32 = _S_I32.pack
p_i64 = _S_I64.pack
p_u16 = _S_U16.pack
p_u32 = _S_U32.pack
p_f64 = _S_F64.pack

ZERO_UUID = _uuid.UUID(int=0)
_ZERO_UUID_BYTES = bytes(16)


class Writer(bytearray):
    """An output buffer; `refs` holds (position, record set) pairs spliced in when sent: record sets
    that are not in memory (an object with `size`, written by `send`, e.g. file slices), and record
    buffers of at least ZERO_COPY_MIN_BYTES, sent as they are instead of copied in here (copying a
    1 MiB batch into a growing request buffer was a tenth of the producer's CPU time).
    `len()` counts only the bytes held here; `size()` is the whole frame; `bytes()` joins it."""

    __slots__ = ("refs",)

    def __init__(self) -> None:
        super().__init__()
        self.refs: list = []

    def __bytes__(self) -> bytes:
        return b"".join(c if _is_buffer(c) else c.read() for c in self.chunks())

    def chunks(self) -> list:
        """The frame as a list of byte chunks and record-set references, in order."""
        if not self.refs:
            return [self]
        out: list = []
        start = 0
        view = memoryview(self)
        for pos, ref in self.refs:
            if pos > start:
                out.append(view[start:pos])
            out.append(ref)
            start = pos
        if start < len(self):
            out.append(view[start:])
        return out

    def size(self) -> int:
        return len(self) + sum(_ref_size(ref) for _, ref in self.refs)


def _ref_size(ref) -> int:
    return ref.nbytes if isinstance(ref, memoryview) else len(ref) if _is_buffer(ref) else ref.size


# Record buffers at least this big are referenced by a Writer, not copied into it.
ZERO_COPY_MIN_BYTES = 16 * 1024


class Message:
    """Base of every generated message and struct: equality and repr over the declared fields."""

    __slots__ = ()
    FIELDS: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for name in self.FIELDS:
            if getattr(self, name) != getattr(other, name):
                return False
        return self.unknown_tagged_fields == other.unknown_tagged_fields

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS)
        return f"{type(self).__name__}({inner})"

    def to_dict(self) -> dict:
        def conv(v):
            if isinstance(v, Message):
                return v.to_dict()
            if isinstance(v, list):
                return [conv(x) for x in v]
            if isinstance(v, memoryview):
                return bytes(v)
            return v
        return {n: conv(getattr(self, n)) for n in self.FIELDS}


def fail(msg: str):
    raise ProtocolError(msg)


# ---------------------------------------------------------------------------------------- varints

def r_uvarint(data, pos: int) -> tuple[int, int]:
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    value = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("unsigned varint longer than 5 bytes")


def r_varint(data, pos: int) -> tuple[int, int]:
    v, pos = r_uvarint(data, pos)
    return (v >> 1) ^ -(v & 1), pos


def r_varlong(data, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
        if shift > 63:
            raise ProtocolError("varlong longer than 10 bytes")


def w_uvarint(w: bytearray, v: int) -> None:
    if v < 0:
        raise ValueError(f"unsigned varint cannot hold {v}")
    while v >= 0x80:
        w.append((v & 0x7F) | 0x80)
        v >>= 7
    w.append(v)


def uvarint_bytes(v: int) -> bytes:
    out = bytearray()
    w_uvarint(out, v)
    return bytes(out)


def w_varint(w: bytearray, v: int) -> None:
    w_uvarint(w, ((v << 1) ^ (v >> 31)) & 0xFFFFFFFF)


def w_varlong(w: bytearray, v: int) -> None:
    w_uvarint(w, ((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF)


# ---------------------------------------------------------------------------------------- fixed

def r_bool(data, pos: int) -> tuple[bool, int]:
    return data[pos] != 0, pos + 1


def r_uuid(data, pos: int) -> tuple[_uuid.UUID, int]:
    end = pos + 16
    if end > len(data):
        raise ProtocolError("uuid truncated")
    raw = data[pos:end]
    if raw == _ZERO_UUID_BYTES:
        # The zero id ("none": every topic a Metadata request names by name) is one shared object.
        return ZERO_UUID, end
    return _uuid.UUID(int=int.from_bytes(raw, "big")), end


def w_uuid(w: bytearray, v: _uuid.UUID) -> None:
    w += v.bytes


# ---------------------------------------------------------------------------------------- strings

def _take(data, pos: int, n: int, what: str):
    end = pos + n
    if n < 0 or end > len(data):
        raise ProtocolError(f"{what} length {n} runs past the end of the frame")
    if _budget.get() is not None:
        _charge(VALUE_COST_BYTES + n)
    return data[pos:end], end


def _utf8(raw) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"string is not valid UTF-8: {e}") from None


def r_string(data, pos: int) -> tuple[str, int]:
    (n,), pos = u_i16(data, pos), pos + 2
    if n < 0:
        raise ProtocolError(f"non-nullable string has length {n}")
    raw, pos = _take(data, pos, n, "string")
    return _utf8(raw), pos


def r_nstring(data, pos: int) -> tuple[str | None, int]:
    (n,), pos = u_i16(data, pos), pos + 2
    if n == -1:
        return None, pos
    raw, pos = _take(data, pos, n, "string")
    return _utf8(raw), pos


def r_cstring(data, pos: int) -> tuple[str, int]:
    n, pos = r_uvarint(data, pos)
    if n == 0:
        raise ProtocolError("non-nullable compact string is null")
    raw, pos = _take(data, pos, n - 1, "compact string")
    return _utf8(raw), pos


def r_cnstring(data, pos: int) -> tuple[str | None, int]:
    n, pos = r_uvarint(data, pos)
    if n == 0:
        return None, pos
    raw, pos = _take(data, pos, n - 1, "compact string")
    return _utf8(raw), pos


def w_string(w: bytearray, s: str) -> None:
    raw = s.encode()
    if len(raw) > 0x7FFF:
        raise ValueError("string longer than 32767 bytes")
    w += p_i16(len(raw))
    w += raw


def w_nstring(w: bytearray, s: str | None) -> None:
    if s is None:
        w += b"\xff\xff"
    else:
        w_string(w, s)


def w_cstring(w: bytearray, s: str) -> None:
    raw = s.encode()
    w_uvarint(w, len(raw) + 1)
    w += raw


def w_cnstring(w: bytearray, s: str | None) -> None:
    if s is None:
        w.append(0)
    else:
        w_cstring(w, s)


# ---------------------------------------------------------------------------------------- bytes

def r_bytes(data, pos: int) -> tuple[bytes, int]:
    (n,), pos = u_i32(data, pos), pos + 4
    if n < 0:
        raise ProtocolError(f"non-nullable bytes have length {n}")
    raw, pos = _take(data, pos, n, "bytes")
    return bytes(raw), pos


def r_nbytes(data, pos: int) -> tuple[bytes | None, int]:
    (n,), pos = u_i32(data, pos), pos + 4
    if n == -1:
        return None, pos
    raw, pos = _take(data, pos, n, "bytes")
    return bytes(raw), pos


def r_cbytes(data, pos: int) -> tuple[bytes, int]:
    n, pos = r_uvarint(data, pos)
    if n == 0:
        raise ProtocolError("non-nullable compact bytes are null")
    raw, pos = _take(data, pos, n - 1, "compact bytes")
    return bytes(raw), pos


def r_cnbytes(data, pos: int) -> tuple[bytes | None, int]:
    n, pos = r_uvarint(data, pos)
    if n == 0:
        return None, pos
    raw, pos = _take(data, pos, n - 1, "compact bytes")
    return bytes(raw), pos


def w_bytes(w: bytearray, b) -> None:
    w += p_i32(len(b))
    w += b


def w_nbytes(w: bytearray, b) -> None:
    if b is None:
        w += b"\xff\xff\xff\xff"
    else:
        w_bytes(w, b)


def w_cbytes(w: bytearray, b) -> None:
    w_uvarint(w, len(b) + 1)
    w += b


def w_cnbytes(w: bytearray, b) -> None:
    if b is None:
        w.append(0)
    else:
        w_cbytes(w, b)


# ---------------------------------------------------------------------------------------- records
# A records field decodes to a memoryview over the frame (no copy). When encoding it may be bytes-like,
# or any object with a `size` attribute (a file slice or a list of them): the Writer then records a
# reference at the current position and the transport sends the object's bytes there.

def r_records(data, pos: int):
    (n,), pos = u_i32(data, pos), pos + 4
    if n == -1:
        return None, pos
    return _take(data, pos, n, "records")


def r_crecords(data, pos: int):
    n, pos = r_uvarint(data, pos)
    if n == 0:
        return None, pos
    return _take(data, pos, n - 1, "compact records")


def _is_buffer(v) -> bool:
    return isinstance(v, (bytes, bytearray, memoryview))


def w_records(w: Writer, v) -> None:
    if v is None:
        w += b"\xff\xff\xff\xff"
    elif _is_buffer(v):
        n = v.nbytes if isinstance(v, memoryview) else len(v)
        w += p_i32(n)
        if n >= ZERO_COPY_MIN_BYTES:
            w.refs.append((len(w), v))
        else:
            w += v
    else:
        w += p_i32(v.size)
        w.refs.append((len(w), v))


def w_crecords(w: Writer, v) -> None:
    if v is None:
        w.append(0)
    elif _is_buffer(v):
        n = v.nbytes if isinstance(v, memoryview) else len(v)
        w_uvarint(w, n + 1)
        if n >= ZERO_COPY_MIN_BYTES:
            w.refs.append((len(w), v))
        else:
            w += v
    else:
        w_uvarint(w, v.size + 1)
        w.refs.append((len(w), v))


# ---------------------------------------------------------------------------------------- arrays

def r_count(data, pos: int) -> tuple[int, int]:
    """A classic array count; -1 is null. Checked against the bytes that remain."""
    (n,), pos = u_i32(data, pos), pos + 4
    if n < -1 or n > len(data) - pos:
        raise ProtocolError(f"array count {n} exceeds the {len(data) - pos} bytes that remain")
    if n > MAX_ARRAY_COUNT:
        raise ProtocolError(f"array count {n} exceeds the limit of {MAX_ARRAY_COUNT} elements")
    if n > 0 and _budget.get() is not None:
        _charge(n * ELEMENT_COST_BYTES)
    return n, pos


def r_ccount(data, pos: int) -> tuple[int, int]:
    """A compact array count (stored as count + 1); -1 is null."""
    n, pos = r_uvarint(data, pos)
    n -= 1
    if n > len(data) - pos:
        raise ProtocolError(f"array count {n} exceeds the {len(data) - pos} bytes that remain")
    if n > MAX_ARRAY_COUNT:
        raise ProtocolError(f"array count {n} exceeds the limit of {MAX_ARRAY_COUNT} elements")
    if n > 0 and _budget.get() is not None:
        _charge(n * ELEMENT_COST_BYTES)
    return n, pos


# ---------------------------------------------------------------------------------------- tags

def r_tag_header(data, pos: int) -> tuple[int, int]:
    n, pos = r_uvarint(data, pos)
    if n > len(data) - pos:
        raise ProtocolError(f"tagged field count {n} exceeds the bytes that remain")
    if n > 0 and _budget.get() is not None:
        _charge(n * TAG_COST_BYTES)
    return n, pos


def r_tag(data, pos: int, last_tag: int) -> tuple[int, int, int]:
    """One tagged field's (tag, size, pos); tags must strictly ascend and fit the frame."""
    tag, pos = r_uvarint(data, pos)
    if tag <= last_tag:
        raise ProtocolError(f"tagged field {tag} follows {last_tag}: tags must strictly ascend")
    size, pos = r_uvarint(data, pos)
    if size > len(data) - pos:
        raise ProtocolError(f"tagged field {tag} size {size} runs past the end of the frame")
    return tag, size, pos


def check_tag_end(tag: int, pos: int, expected: int) -> None:
    if pos != expected:
        raise ProtocolError(f"tagged field {tag} declared a size that does not match its contents")


def w_tagged(w: bytearray, fields: list) -> None:
    """Write (tag, encoded bytes) pairs, already sorted by tag."""
    w_uvarint(w, len(fields))
    for tag, raw in fields:
        w_uvarint(w, tag)
        w_uvarint(w, len(raw))
        w += raw
