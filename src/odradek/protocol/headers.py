"""Request and response headers, and the rules that pick their versions.

Seed 003, "Protocol": "Headers". KIP-482 adds the flexible header versions.

    Request header v0   api_key int16, api_version int16, correlation_id int32
    Request header v1   v0 + client_id nullable string (classic int16 length even in v2)
    Request header v2   v1 + tagged fields
    Response header v0  correlation_id int32
    Response header v1  v0 + tagged fields

A request uses header v2 when its API version is flexible, else v1 (v0 only for ControlledShutdown v0).
A response uses header v1 when its API version is flexible, except ApiVersions, whose response header
is always v0: a client that does not yet know which versions the broker speaks must still be able to
read the correlation id and the error code.
"""

from __future__ import annotations

from dataclasses import dataclass

from odradek.protocol.codec import (
    p_i16, p_i32, r_nstring, r_tag, r_tag_header, u_i16, u_i32, w_nstring, w_tagged,
)
from odradek.protocol.exceptions import ProtocolError

API_VERSIONS_KEY = 18
CONTROLLED_SHUTDOWN_KEY = 7


@dataclass
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None
    unknown_tagged_fields: list | None = None
    trailing_bytes: int = 0  # bytes after the body, which Kafka ignores


def peek_request(data) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame, before deciding how to parse it."""
    if len(data) < 8:
        raise ProtocolError(f"request header truncated: {len(data)} bytes")
    return u_i16(data, 0)[0], u_i16(data, 2)[0], u_i32(data, 4)[0]


def decode_request_header(data, header_version: int) -> tuple[RequestHeader, int]:
    api_key, api_version, correlation_id = peek_request(data)
    pos = 8
    header = RequestHeader(api_key, api_version, correlation_id)
    if header_version >= 1:
        header.client_id, pos = r_nstring(data, pos)
    if header_version >= 2:
        n, pos = r_tag_header(data, pos)
        last = -1
        unknown = []
        for _ in range(n):
            tag, size, pos = r_tag(data, pos, last)
            last = tag
            unknown.append((tag, bytes(data[pos:pos + size])))
            pos += size
        header.unknown_tagged_fields = unknown or None
    return header, pos


def encode_request_header(w: bytearray, header: RequestHeader, header_version: int) -> None:
    w += p_i16(header.api_key)
    w += p_i16(header.api_version)
    w += p_i32(header.correlation_id)
    if header_version >= 1:
        w_nstring(w, header.client_id)
    if header_version >= 2:
        w_tagged(w, sorted(header.unknown_tagged_fields or ()))


def decode_response_header(data, header_version: int) -> tuple[int, int]:
    """(correlation_id, position of the body)."""
    if len(data) < 4:
        raise ProtocolError("response header truncated")
    correlation_id = u_i32(data, 0)[0]
    pos = 4
    if header_version >= 1:
        n, pos = r_tag_header(data, pos)
        last = -1
        for _ in range(n):
            tag, size, pos = r_tag(data, pos, last)
            last = tag
            pos += size
    return correlation_id, pos


def encode_response_header(w: bytearray, correlation_id: int, header_version: int) -> None:
    w += p_i32(correlation_id)
    if header_version >= 1:
        w.append(0)


def request_header_version(api_key: int, api_version: int, flexible: bool) -> int:
    if flexible:
        return 2
    if api_key == CONTROLLED_SHUTDOWN_KEY and api_version == 0:
        return 0
    return 1


def response_header_version(api_key: int, flexible: bool) -> int:
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if flexible else 0
