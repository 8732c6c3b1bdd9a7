"""The client side of one broker connection, sans I/O: requests in, bytes out; bytes in, responses out.

Like h11's connection it never touches a socket, a clock or a task: the asyncio shell (`network`) feeds
it received bytes and writes what it hands back. It owns

- framing: the int32 size prefix on the way out, `FrameReader` (size checked before allocation,
  `max_frame_bytes`) on the way in;
- correlation ids: one per request, increasing, wrapping at 2^31;
- pipelining: up to `max_in_flight_requests` requests await their responses, which a broker sends in
  request order on a connection (seed 004, "Network"), so the first in flight is always the one the
  next frame answers; a mismatched correlation id is a `ProtocolError` and ends the connection;
- version negotiation (KIP-35, KIP-511): the first request is ApiVersions at our newest version; a
  broker that does not know it answers with a v0 body carrying UNSUPPORTED_VERSION and its own range
  for ApiVersions, and we retry once at the newest version both know. Afterwards every API gets the
  highest version inside both ranges (`version_for`), and the request header version follows from it
  (`odradek.protocol.headers`).

States (the whole table):

    state       event                                   next        output
    NEW         start_handshake()                       HANDSHAKE   ApiVersions request
    HANDSHAKE   ApiVersions answer, error 0             READY       HandshakeComplete
    HANDSHAKE   UNSUPPORTED_VERSION and a usable range  HANDSHAKE   ApiVersions request (lower version)
    HANDSHAKE   any other error                         CLOSED      raises HandshakeError
    READY       send_request()                          READY       request bytes
    READY       a response frame                        READY       Response
    any         close(), or a ProtocolError raised       CLOSED      in-flight tokens from close()

Requests that expect no response (Produce with acks=0) are written and forgotten, as Kafka's clients do.
"""

from __future__ import annotations

import collections
import enum
import struct
from dataclasses import dataclass
from typing import Any

from odradek.protocol.api import APIS, RequestHeader, decode_response, encode_request
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.framing import FrameReader, frame
from odradek.protocol.messages import API_VERSION_RANGES, api_versions

API_VERSIONS_KEY = 18

# Versions this client knows how to fill in and read, where narrower than the protocol package's:
# Produce v3+ and Fetch v4+ carry v2 record batches; Produce v13 and Fetch v13 name topics by id,
# which the producer and consumer do not do yet. AddPartitionsToTxn v4+ is for brokers only (KIP-890).
CLIENT_VERSION_LIMITS: dict[int, tuple[int, int]] = {0: (3, 12), 1: (4, 12), 24: (0, 3)}

_CORRELATION = struct.Struct(">i")


def client_versions() -> dict[int, tuple[int, int]]:
    """api_key -> (min, max) this client speaks."""
    out = {}
    for key, (lowest, highest) in API_VERSION_RANGES.items():    # imports no message module
        low, high = CLIENT_VERSION_LIMITS.get(key, (lowest, highest))
        out[key] = (max(low, lowest), min(high, highest))
    return out


def negotiate(ours: dict[int, tuple[int, int]], theirs: dict[int, tuple[int, int]]) -> dict[int, int]:
    """api_key -> the highest version inside both ranges, for the APIs both sides speak."""
    out = {}
    for key, (their_min, their_max) in theirs.items():
        if key not in ours:
            continue
        our_min, our_max = ours[key]
        top = min(our_max, their_max)
        if top >= max(our_min, their_min):
            out[key] = top
    return out


class State(enum.Enum):
    NEW = "new"
    HANDSHAKE = "handshake"
    READY = "ready"
    CLOSED = "closed"


class HandshakeError(ProtocolError):
    """ApiVersions failed; the connection cannot be used."""


class NoCompatibleVersion(ProtocolError):
    def __init__(self, api_key: int, broker_range: tuple[int, int] | None) -> None:
        name = APIS[api_key].NAME if api_key in APIS else str(api_key)
        super().__init__(f"the broker speaks no version of {name} that this client speaks "
                         f"(broker: {broker_range}, client: {client_versions().get(api_key)})")
        self.api_key = api_key


@dataclass(slots=True)
class Response:
    """A decoded response and the token its request was sent with."""
    token: Any
    api_key: int
    api_version: int
    body: Any


@dataclass(slots=True)
class HandshakeComplete:
    versions: dict[int, int]           # api_key -> negotiated version
    broker_ranges: dict[int, tuple[int, int]]


@dataclass(slots=True)
class _InFlight:
    correlation_id: int
    api_key: int
    api_version: int
    token: Any


class ClientConnection:
    """One connection's protocol state. Not thread-safe; one owner feeds it."""

    def __init__(self, client_id: str | None = "odradek-python", *, max_in_flight_requests: int = 5,
                 max_frame_bytes: int = 100_000_000, software_name: str = "odradek-python",
                 software_version: str = "0.1.0", supported: dict | None = None) -> None:
        assert max_in_flight_requests > 0
        self.client_id = client_id
        self.max_in_flight_requests = max_in_flight_requests
        self.software_name = software_name
        self.software_version = software_version
        self.supported = supported if supported is not None else client_versions()
        self.state = State.NEW
        self.versions: dict[int, int] = {}
        self.broker_ranges: dict[int, tuple[int, int]] = {}
        self._reader = FrameReader(max_frame_bytes)
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._out: list = []
        self._next_correlation_id = 0
        self._api_versions_version = self.supported[API_VERSIONS_KEY][1]
        self._api_versions_retried = False

    # ------------------------------------------------------------------------------------ queries
    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    def can_send(self) -> bool:
        return self.state is State.READY and len(self._in_flight) < self.max_in_flight_requests

    def version_for(self, api_key: int) -> int:
        v = self.versions.get(api_key)
        if v is None:
            raise NoCompatibleVersion(api_key, self.broker_ranges.get(api_key))
        return v

    def data_to_send(self) -> list:
        """Byte chunks to write, in order; the connection forgets them."""
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------------------------------ events in
    def start_handshake(self) -> None:
        if self.state is not State.NEW:
            raise ProtocolError(f"handshake in state {self.state.value}")
        self.state = State.HANDSHAKE
        self._send_api_versions()

    def send_request(self, api_key: int, body, *, token: Any = None, expect_response: bool = True,
                     version: int | None = None) -> int:
        """Queue a request; return its correlation id. `token` comes back with its Response."""
        if self.state is not State.READY:
            raise ProtocolError(f"cannot send in state {self.state.value}")
        if expect_response and len(self._in_flight) >= self.max_in_flight_requests:
            raise ProtocolError(f"already {len(self._in_flight)} requests in flight")
        if version is None:
            version = self.version_for(api_key)
        return self._send(api_key, version, body, token, expect_response)

    def receive_data(self, data) -> list:
        """Feed received bytes; return the Response and HandshakeComplete events they finish."""
        if self.state is State.CLOSED:
            return []
        return self._on_frames(lambda: self._reader.feed(data))

    def get_buffer(self) -> memoryview:
        """Where the next bytes read from the socket go (asyncio.BufferedProtocol): a large response
        is read straight into its own buffer."""
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> list:
        """`nbytes` were read into the last get_buffer(); the Response and HandshakeComplete events
        they finish."""
        if self.state is State.CLOSED:
            return []
        return self._on_frames(lambda: self._reader.buffer_updated(nbytes))

    def _on_frames(self, frames) -> list:
        try:
            events = []
            for f in frames():
                event = self._on_frame(f)
                if event is not None:
                    events.append(event)
            return events
        except ProtocolError:
            self.state = State.CLOSED
            raise

    def close(self) -> list:
        """Close; return the tokens of requests that will never be answered, oldest first."""
        self.state = State.CLOSED
        tokens = [r.token for r in self._in_flight]
        self._in_flight.clear()
        self._out = []
        return tokens

    # ------------------------------------------------------------------------------------ internals
    def _send(self, api_key: int, version: int, body, token, expect_response: bool) -> int:
        cid = self._next_correlation_id
        self._next_correlation_id = (cid + 1) & 0x7FFFFFFF
        w = encode_request(RequestHeader(api_key, version, cid, self.client_id), body)
        if w.refs:   # large record batches: written from the producer's buffers, not copied
            self._out.append(frame(w.size()))
            self._out.extend(w.chunks())
        else:
            self._out.append(frame(len(w)))
            self._out.append(w)
        if expect_response:
            self._in_flight.append(_InFlight(cid, api_key, version, token))
        return cid

    def _send_api_versions(self) -> None:
        body = api_versions.ApiVersionsRequest(client_software_name=self.software_name,
                                               client_software_version=self.software_version)
        self._send(API_VERSIONS_KEY, self._api_versions_version, body, None, True)

    def _on_frame(self, f):
        if not self._in_flight:
            raise ProtocolError("a response arrived with no request in flight")
        head = self._in_flight[0]
        if len(f) < 4:
            raise ProtocolError("response shorter than its correlation id")
        cid = _CORRELATION.unpack_from(f, 0)[0]
        if cid != head.correlation_id:
            raise ProtocolError(f"response correlation id {cid}, expected {head.correlation_id}")
        self._in_flight.popleft()
        if head.api_key == API_VERSIONS_KEY and self.state is State.HANDSHAKE:
            return self._on_api_versions(f, head.api_version)
        _, body = decode_response(head.api_key, head.api_version, f)
        return Response(head.token, head.api_key, head.api_version, body)

    def _on_api_versions(self, f, version: int):
        body = _decode_api_versions(f, version)
        ranges = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
        if body.error_code == ErrorCode.UNSUPPORTED_VERSION and not self._api_versions_retried:
            theirs = ranges.get(API_VERSIONS_KEY, (0, 0))
            ours = self.supported[API_VERSIONS_KEY]
            top = min(ours[1], theirs[1])
            if top < max(ours[0], theirs[0]) or top >= version:
                raise HandshakeError(f"no usable ApiVersions version (broker {theirs}, client {ours})")
            self._api_versions_retried = True
            self._api_versions_version = top
            self._send_api_versions()
            return None
        if body.error_code != 0:
            raise HandshakeError(f"ApiVersions failed with error code {body.error_code}")
        self.broker_ranges = ranges
        self.versions = negotiate(self.supported, ranges)
        self.state = State.READY
        return HandshakeComplete(dict(self.versions), dict(ranges))


def _decode_api_versions(f, version: int):
    """Decode at the requested version, unless the error code (the first body field in every version)
    says UNSUPPORTED_VERSION: then the broker wrote a v0 body (KIP-511), whatever we asked for."""
    if len(f) >= 6 and struct.unpack_from(">h", f, 4)[0] == ErrorCode.UNSUPPORTED_VERSION:
        version = 0
    _, body = decode_response(API_VERSIONS_KEY, version, f)
    return body
