"""Hypothesis strategies for any message at any version, built from the schema model itself."""

from __future__ import annotations

import uuid

from hypothesis import strategies as st

from odradek.protocol.schema import Field, Struct

_INT_RANGES = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint16": (0, (1 << 16) - 1),
    "uint32": (0, (1 << 32) - 1),
}

_text = st.text(max_size=12)
_blob = st.binary(max_size=24)


def _scalar(f: Field, v: int, flexible: bool, module):
    t = f.type
    if f.struct is not None:
        return struct_strategy(f.struct, v, flexible, module)
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        return st.integers(lo, hi)
    if t == "float64":
        return st.floats(allow_nan=False)
    if t == "bool":
        return st.booleans()
    if t == "uuid":
        return st.builds(uuid.UUID, int=st.integers(0, (1 << 128) - 1))
    if t == "string":
        return _text
    if t in ("bytes", "records"):
        return _blob
    raise AssertionError(t)


def field_strategy(f: Field, v: int, flexible: bool, module):
    base = _scalar(f, v, flexible, module)
    if f.is_array:
        base = st.lists(base, max_size=3)
    if f.nullable_in(v):
        base = st.one_of(st.none(), base)
    return base


def struct_strategy(s: Struct, v: int, flexible: bool, module):
    cls = getattr(module, s.name)
    kwargs = {}
    for f in s.fields:
        if not f.present(v) or (f.tag is not None and not flexible):
            continue
        kwargs[f.name] = field_strategy(f, v, flexible, module)
    return st.builds(cls, **kwargs)
