"""Whole requests and responses: header plus body, for any API key and version.

This is the protocol's front door for both the broker and the client. Frames here are without the
4-byte size prefix (framing belongs to the connection). Decoding never raises anything but
`ProtocolError` (or its subclass `UnsupportedVersionError`, which carries the parsed header so the
broker can answer UNSUPPORTED_VERSION).

ApiVersions fallback (KIP-511): a client may send ApiVersions at a version newer than the broker knows.
The broker cannot parse that body, so it reads only the header and answers with a v0 response carrying
UNSUPPORTED_VERSION and its supported ranges; the client then retries with a version from that list.
"""

from __future__ import annotations

import struct
from types import ModuleType

from odradek.protocol.codec import DECODE_SLACK_BYTES, Writer, decode_allowance, decode_budget
from odradek.protocol.exceptions import ProtocolError, UnsupportedVersionError
from odradek.protocol.headers import (
    API_VERSIONS_KEY, RequestHeader, decode_request_header, decode_response_header,
    encode_request_header, encode_response_header, peek_request, request_header_version,
    response_header_version,
)
from odradek.protocol.messages import APIS, RECORDS

__all__ = [
    "APIS", "RECORDS", "RequestHeader", "api", "is_flexible", "decode_request", "decode_request_charged",
    "encode_request",
    "decode_response", "encode_response", "decode_record", "encode_record",
]


def api(api_key: int) -> ModuleType:
    try:
        return APIS[api_key]
    except KeyError:
        raise ProtocolError(f"unknown api key {api_key}") from None


def is_flexible(module: ModuleType, version: int) -> bool:
    return module.FLEXIBLE_MIN_VERSION is not None and version >= module.FLEXIBLE_MIN_VERSION


def _guard(fn, *args):
    try:
        return fn(*args)
    except ProtocolError:
        raise
    except (struct.error, IndexError, ValueError, TypeError, OverflowError, MemoryError) as e:
        raise ProtocolError(f"malformed frame: {e}") from None


def decode_request(frame, slack: int = DECODE_SLACK_BYTES) -> tuple[RequestHeader, object]:
    """Parse a request frame into its header and body message, within the decode budget (codec.py)
    with `slack` over the frame's multiple."""
    header, body, _ = decode_request_charged(frame, slack)
    return header, body


def decode_request_charged(frame, slack: int = DECODE_SLACK_BYTES) -> tuple[RequestHeader, object, int]:
    """`decode_request`, and what the decoding was charged (estimated object bytes)."""
    data = memoryview(frame)
    api_key, api_version, correlation_id = peek_request(data)
    try:
        module = APIS[api_key]      # a plain dict lookup once the module is loaded (APIS.get is Python)
    except KeyError:
        module = None
    if module is None or not (module.MIN_VERSION <= api_version <= module.MAX_VERSION):
        header = RequestHeader(api_key, api_version, correlation_id)
        if api_key == API_VERSIONS_KEY:
            # Newer ApiVersions requests are flexible; read the client id if it is there.
            try:
                header, _ = _guard(decode_request_header, data, 2 if api_version >= 3 else 1)
            except ProtocolError:
                pass
        raise UnsupportedVersionError(api_key, api_version, header)
    flexible = is_flexible(module, api_version)
    with decode_budget(len(data), slack) as left:
        header, pos = _guard(decode_request_header, data, request_header_version(api_key, api_version, flexible))
        body, end = _guard(module.REQUEST_DECODERS[api_version], data, pos)
    # Bytes after the body are ignored, as Apache Kafka ignores them: librdkafka 2.16's Metadata v13
    # request carries three (docs/compat-notes.md). The count is kept for tests and debugging.
    header.trailing_bytes = len(data) - end
    return header, body, decode_allowance(len(data), slack) - left[0]


def encode_request(header: RequestHeader, body) -> Writer:
    module = api(header.api_key)
    v = header.api_version
    if not (module.MIN_VERSION <= v <= module.MAX_VERSION):
        raise UnsupportedVersionError(header.api_key, v)
    w = Writer()
    encode_request_header(w, header, request_header_version(header.api_key, v, is_flexible(module, v)))
    module.REQUEST_ENCODERS[v](w, body)
    return w


def encode_response(api_key: int, api_version: int, correlation_id: int, body) -> Writer:
    module = api(api_key)
    w = Writer()
    encode_response_header(w, correlation_id, response_header_version(api_key, is_flexible(module, api_version)))
    module.RESPONSE_ENCODERS[api_version](w, body)
    return w


def decode_response(api_key: int, api_version: int, frame) -> tuple[int, object]:
    """(correlation_id, body) of a response frame to a request of the given key and version."""
    data = memoryview(frame)
    module = api(api_key)
    if not (module.MIN_VERSION <= api_version <= module.MAX_VERSION):
        raise UnsupportedVersionError(api_key, api_version)
    correlation_id, pos = _guard(
        decode_response_header, data, response_header_version(api_key, is_flexible(module, api_version)))
    body, end = _guard(module.RESPONSE_DECODERS[api_version], data, pos)
    if end != len(data):
        raise ProtocolError(f"{len(data) - end} bytes left over after {module.NAME} v{api_version} response")
    return correlation_id, body


def encode_record(name: str, version: int, message) -> bytes:
    """An internal-topic key or value: int16 version, then the message at that version."""
    module = RECORDS[name]
    w = Writer()
    w += struct.pack(">h", version)
    module.RECORD_ENCODERS[version](w, message)
    return bytes(w)


def decode_record(name: str, data) -> tuple[int, object]:
    module = RECORDS[name]
    data = memoryview(data)
    if len(data) < 2:
        raise ProtocolError(f"{name} record truncated")
    version = struct.unpack_from(">h", data, 0)[0]
    if not (module.MIN_VERSION <= version <= module.MAX_VERSION):
        raise UnsupportedVersionError(-1, version)
    message, _ = _guard(module.RECORD_DECODERS[version], data, 2)
    return version, message
