"""decode(encode(m)) == m for every message of every schema at every version (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odradek.protocol.codec import Writer
from odradek.protocol.generator import SCHEMA_DIR
from odradek.protocol.messages import APIS, RECORDS
from odradek.protocol.schema import load_all
from tests.protocol.strategies import struct_strategy

SCHEMAS = load_all(SCHEMA_DIR)


def _cases():
    for schema in SCHEMAS:
        module = APIS[schema.api_key] if schema.kind == "api" else RECORDS[schema.name]
        for message in schema.messages:
            role = message.name[len(schema.name):].upper() or "RECORD"
            for v in range(schema.versions.low, schema.versions.high + 1):
                yield pytest.param(module, message, role, v, id=f"{message.name}-v{v}")


@pytest.mark.parametrize("module,message,role,version", list(_cases()))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_roundtrip(module, message, role, version, data):
    flexible = module.FLEXIBLE_MIN_VERSION is not None and version >= module.FLEXIBLE_MIN_VERSION
    value = data.draw(struct_strategy(message.struct, version, flexible, module))
    w = Writer()
    getattr(module, f"{role}_ENCODERS")[version](w, value)
    frame = bytes(w)
    decoded, end = getattr(module, f"{role}_DECODERS")[version](memoryview(frame), 0)
    assert end == len(frame)
    assert decoded == value
    again = Writer()
    getattr(module, f"{role}_ENCODERS")[version](again, decoded)
    assert bytes(again) == frame
