"""The asyncio shell around `ClientConnection`: a socket, futures, timers. No protocol logic here.

`BrokerConnection.connect()` opens the socket and finishes the ApiVersions handshake. `send()` waits
for an in-flight slot (`max.in.flight.requests.per.connection`), writes the request and returns a future
of its response body; `request()` awaits that future too. Every request has a deadline
(`request.timeout.ms`, or a per-call `timeout_ms`): when one passes, the connection is closed and every
request on it fails, as Kafka's clients do (responses arrive in order, so a late one cannot be skipped).

No tasks: the protocol callbacks resolve futures and timers fire as loop callbacks; the connection's
owner is whoever called `connect()`, and `close()` fails what is still in flight.
"""

from __future__ import annotations

import asyncio
import collections

from odradek.client.connection import ClientConnection, HandshakeComplete, NoCompatibleVersion
from odradek.client.errors import (
    KafkaConnectionError, KafkaTimeoutError, RequestTimedOutError, UnsupportedVersionError,
)
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.framing import coalesced


class BrokerConnection(asyncio.BufferedProtocol):
    def __init__(self, conn: ClientConnection, host: str, port: int, node_id: int,
                 request_timeout_ms: int) -> None:
        self.conn = conn
        self.host = host
        self.port = port
        self.node_id = node_id
        self.request_timeout_ms = request_timeout_ms
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.close_reason: BaseException | None = None
        self._handshake = self.loop.create_future()
        self._slot_waiters: collections.deque[asyncio.Future] = collections.deque()
        self._write_ok = asyncio.Event()
        self._write_ok.set()

    # ------------------------------------------------------------------------------------ public
    @classmethod
    async def connect(cls, host: str, port: int, *, node_id: int = -1, client_id: str | None = None,
                      request_timeout_ms: int = 30000, connect_timeout_ms: int = 10000,
                      max_in_flight_requests: int = 5, max_frame_bytes: int = 100_000_000,
                      software_name: str = "odradek-python", software_version: str = "0.1.0"
                      ) -> "BrokerConnection":
        conn = ClientConnection(client_id, max_in_flight_requests=max_in_flight_requests,
                                max_frame_bytes=max_frame_bytes, software_name=software_name,
                                software_version=software_version)
        loop = asyncio.get_running_loop()
        self = cls(conn, host, port, node_id, request_timeout_ms)
        try:
            async with asyncio.timeout(connect_timeout_ms / 1000):
                await loop.create_connection(lambda: self, host, port)
                conn.start_handshake()
                self._flush()
                await self._handshake
        except (OSError, TimeoutError, ProtocolError) as e:
            self.close(e)
            kind = "timed out" if isinstance(e, TimeoutError) else f"failed: {e}"
            raise KafkaConnectionError(f"connection to {host}:{port} {kind}") from e
        return self

    @property
    def versions(self) -> dict[int, int]:
        return self.conn.versions

    @property
    def in_flight_count(self) -> int:
        return self.conn.in_flight_count

    def can_send(self) -> bool:
        return not self.closed and self.conn.can_send() and self._write_ok.is_set()

    async def send(self, api_key: int, body, *, expect_response: bool = True,
                   timeout_ms: int | None = None) -> asyncio.Future:
        """Write a request once a slot is free; return the future of its response body."""
        while expect_response and not self.conn.can_send() and not self.closed:
            waiter = self.loop.create_future()
            self._slot_waiters.append(waiter)
            await waiter
        if not self._write_ok.is_set() and not self.closed:
            await self._write_ok.wait()
        return self.send_nowait(api_key, body, expect_response=expect_response, timeout_ms=timeout_ms)

    def send_nowait(self, api_key: int, body, *, expect_response: bool = True,
                    timeout_ms: int | None = None) -> asyncio.Future:
        """As `send`, for a caller that checked `can_send()`."""
        if self.closed:
            raise KafkaConnectionError(f"connection to {self.host}:{self.port} is closed") \
                from self.close_reason
        fut = self.loop.create_future()
        try:
            self.conn.send_request(api_key, body, token=fut, expect_response=expect_response)
        except NoCompatibleVersion as e:
            raise UnsupportedVersionError(str(e)) from None
        if expect_response:
            ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
            handle = self.loop.call_later(ms / 1000, self._expire, fut, ms)
            fut.add_done_callback(lambda _f, h=handle: h.cancel())
        else:
            fut.set_result(None)
        self._flush()
        return fut

    async def request(self, api_key: int, body, *, timeout_ms: int | None = None):
        return await (await self.send(api_key, body, timeout_ms=timeout_ms))

    def close(self, exc: BaseException | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = exc
        error = exc if isinstance(exc, KafkaConnectionError) else KafkaConnectionError(
            f"connection to {self.host}:{self.port} closed" + (f": {exc}" if exc else ""))
        for fut in self.conn.close():
            if fut is not None and not fut.done():
                fut.set_exception(error)
        if not self._handshake.done():
            self._handshake.set_exception(error)
            self._handshake.exception()  # retrieved: connect() reports it
        self._wake_slot_waiters()
        self._write_ok.set()
        if self.transport is not None:
            self.transport.abort()

    async def aclose(self) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ internals
    def _flush(self) -> None:
        chunks = self.conn.data_to_send()
        if chunks and self.transport is not None:
            # asyncio 3.11's writelines() joins everything (a copy of every large request); join only
            # the small runs, so a request is one write, not one system call per chunk.
            for c in coalesced(chunks):
                self.transport.write(c)

    def _expire(self, fut: asyncio.Future, ms: int) -> None:
        if not fut.done():
            fut.set_exception(RequestTimedOutError(f"no response from {self.host}:{self.port} in {ms} ms"))
            self.close(RequestTimedOutError(f"request to {self.host}:{self.port} timed out after {ms} ms"))

    def _wake_slot_waiters(self, count: int | None = None) -> None:
        """Wake `count` waiters for a free slot (all of them when closing)."""
        while self._slot_waiters and (count is None or count > 0):
            w = self._slot_waiters.popleft()
            if not w.done():
                w.set_result(None)
                if count is not None:
                    count -= 1

    # ------------------------------------------------------------------------------------ asyncio
    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            events = self.conn.buffer_updated(nbytes)
        except ProtocolError as e:
            self.close(e)
            return
        for ev in events:
            if isinstance(ev, HandshakeComplete):
                if not self._handshake.done():
                    self._handshake.set_result(ev)
                continue
            fut = ev.token
            if fut is not None and not fut.done():
                fut.set_result(ev.body)
        self._flush()  # a retried ApiVersions
        if self._slot_waiters and self.conn.can_send():
            self._wake_slot_waiters(self.conn.max_in_flight_requests - self.conn.in_flight_count)

    def connection_lost(self, exc) -> None:
        self.close(exc or KafkaConnectionError(f"{self.host}:{self.port} closed the connection"))

    def pause_writing(self) -> None:
        self._write_ok.clear()

    def resume_writing(self) -> None:
        self._write_ok.set()


__all__ = ["BrokerConnection", "KafkaTimeoutError"]
