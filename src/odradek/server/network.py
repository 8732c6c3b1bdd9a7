"""Listeners and connections: the asyncio shell around the sans-I/O framing.

Seed 003, "Network Layer" and "Protocol": one connection carries requests that the broker answers in
the order they arrived. As in Kafka, a connection's requests are handled one at a time (the client may
pipeline; the next request waits in a bounded queue), so responses are always in request order.

Reads go into buffers the connection provides (asyncio.BufferedProtocol, `protocol.framing.FrameReader`):
small requests into a per-connection scratch buffer, a large one straight into a buffer of its announced
size, allocated (as Kafka does) once that size has passed `socket.request.max.bytes`.

Limits (Kafka's names): `socket.request.max.bytes` checked on the size prefix before any allocation;
`queued.max.request.bytes` bounds the bytes a connection may have received but not yet handled (reading
pauses above it); `max.connections` and `max.connections.per.ip` refuse new connections beyond them;
`connections.max.idle.ms` closes connections with no traffic.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Awaitable, Callable

from odradek.protocol.framing import FrameReader, FrameTooLarge, frame
from odradek.server.record_slices import native_sendfile

log = logging.getLogger("odradek.network")

# handle(connection, frame) -> chunks to send (a list of buffers and record-set references), or None
Handler = Callable[["Connection", bytes], Awaitable[list | None]]


class Connection(asyncio.BufferedProtocol):
    """One client connection. Reads go straight into the buffers of a FrameReader (a large request is
    read into its own buffer, no copies in Python)."""

    def __init__(self, listener: "Listener") -> None:
        self.listener = listener
        self.reader = FrameReader(listener.max_request_bytes)
        self.pending: collections.deque[bytes] = collections.deque()
        self.pending_bytes = 0
        self.transport: asyncio.Transport | None = None
        self.peer: tuple = ("?", 0)
        self.worker: asyncio.Task | None = None
        self.last_active = time.monotonic()
        self.closed = False
        self.reading_paused = False
        self.drained = asyncio.Event()
        self.drained.set()

    # ------------------------------------------------------------------------- asyncio callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = transport.get_extra_info("peername") or ("?", 0)
        if not self.listener.admit(self):
            transport.abort()
            self.closed = True

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        try:
            frames = self.reader.buffer_updated(nbytes)
        except FrameTooLarge as e:
            log.warning("closing connection from %s: %s", self.peer[0], e)
            self.close()
            return
        if not frames:
            return
        for f in frames:
            self.pending.append(f)
            self.pending_bytes += len(f)
        if self.pending_bytes > self.listener.queued_max_request_bytes and not self.reading_paused:
            self.transport.pause_reading()
            self.reading_paused = True
        if self.worker is None or self.worker.done():
            self.worker = asyncio.get_running_loop().create_task(self._work())

    def pause_writing(self) -> None:
        self.drained.clear()

    def resume_writing(self) -> None:
        self.drained.set()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.drained.set()
        self.listener.forget(self)
        if self.worker is not None and not self.worker.done():
            # Not at once: right after this callback asyncio's transport fails the waiter that
            # loop.sendfile may be parked on, and raises InvalidStateError if we cancelled it first.
            asyncio.get_running_loop().call_soon(self._cancel_worker)

    def _cancel_worker(self) -> None:
        if self.worker is not None and not self.worker.done():
            self.worker.cancel()

    # ------------------------------------------------------------------------- request loop
    async def _work(self) -> None:
        while self.pending and not self.closed:
            f = self.pending.popleft()
            self.pending_bytes -= len(f)
            if self.reading_paused and self.pending_bytes <= self.listener.queued_max_request_bytes // 2:
                self.transport.resume_reading()
                self.reading_paused = False
            try:
                chunks = await self.listener.handler(self, f)
            except ConnectionClosing:
                self.close()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("unexpected error handling a request from %s; closing", self.peer[0])
                self.close()
                return
            if chunks is not None and not self.closed:
                try:
                    await self.send(chunks)
                except (OSError, RuntimeError) as e:
                    # sendfile writes to the socket itself: a peer that resets or vanishes mid-response
                    # surfaces here, not in connection_lost. Half a response is on the wire; drop it all.
                    log.info("closing connection from %s: sending a response failed: %r", self.peer[0], e)
                    self.abort()
                    return
            self.last_active = time.monotonic()

    async def send(self, chunks: list) -> None:
        size = 0
        for c in chunks:
            size += c.size if hasattr(c, "size") and not isinstance(c, (bytes, bytearray, memoryview)) else len(c)
        t = self.transport
        t.write(frame(size))
        for c in chunks:
            if isinstance(c, (bytes, bytearray, memoryview)):
                t.write(c)
            else:
                await c.send(t, self.listener.loop, self.listener.use_sendfile)
        if not self.drained.is_set():
            await self.drained.wait()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def abort(self) -> None:
        """Close at once, discarding anything buffered (the connection is broken)."""
        self.closed = True
        if self.transport is not None:
            # CPython 3.11: while loop.sendfile runs, the transport keeps the (already resolved)
            # "buffer empty" waiter, and losing the connection then sets an exception on it:
            # InvalidStateError. Forget a resolved waiter first; sendfile's own cleanup resets it too.
            waiter = getattr(self.transport, "_empty_waiter", None)
            if waiter is not None and waiter.done():
                self.transport._empty_waiter = None
            self.transport.abort()


class ConnectionClosing(Exception):
    """Raised by a handler to close the connection instead of answering (Kafka's way for acks=0
    errors and for requests it cannot parse)."""


class Listener:
    """One listening socket; owns its connections."""

    def __init__(self, handler: Handler, *, max_request_bytes: int, queued_max_request_bytes: int,
                 max_connections: int, max_connections_per_ip: int, idle_ms: int) -> None:
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.queued_max_request_bytes = max(queued_max_request_bytes, max_request_bytes)
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.idle_ms = idle_ms
        self.connections: set[Connection] = set()
        self.per_ip: collections.Counter = collections.Counter()
        self.server: asyncio.base_events.Server | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.use_sendfile = False
        self._reaper: asyncio.Task | None = None

    def admit(self, conn: Connection) -> bool:
        ip = conn.peer[0]
        if len(self.connections) >= self.max_connections:
            log.warning("refusing connection from %s: max.connections=%d reached", ip, self.max_connections)
            return False
        if self.per_ip[ip] >= self.max_connections_per_ip:
            log.warning("refusing connection from %s: max.connections.per.ip=%d reached",
                        ip, self.max_connections_per_ip)
            return False
        self.connections.add(conn)
        self.per_ip[ip] += 1
        return True

    def forget(self, conn: Connection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            ip = conn.peer[0]
            self.per_ip[ip] -= 1
            if self.per_ip[ip] <= 0:
                del self.per_ip[ip]

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.use_sendfile = native_sendfile(loop)
        self.server = await loop.create_server(lambda: Connection(self), host or None, port,
                                               reuse_address=True, backlog=1024)
        self._reaper = loop.create_task(self._reap_idle())
        return self.server.sockets[0].getsockname()[1]

    async def _reap_idle(self) -> None:
        period = max(0.05, min(self.idle_ms / 1000 / 4, 30.0))
        while True:
            await asyncio.sleep(period)
            cutoff = time.monotonic() - self.idle_ms / 1000
            for conn in list(self.connections):
                if conn.last_active < cutoff and not conn.pending and (conn.worker is None or conn.worker.done()):
                    conn.close()

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
        if self._reaper is not None:
            self._reaper.cancel()
            try:
                await self._reaper
            except asyncio.CancelledError:
                pass
        busy = []
        for conn in list(self.connections):
            if conn.worker is not None and not conn.worker.done():
                # A busy connection may be stuck writing to a client that does not read: drop it.
                conn.abort()
                busy.append(conn)
            else:
                conn.close()
        # Let the transports report their loss first (see connection_lost): a worker cancelled
        # before that leaves asyncio's sendfile waiter cancelled, and the transport's own
        # connection-lost callback then fails on it with InvalidStateError (CPython 3.11).
        await asyncio.sleep(0)
        workers = []
        for conn in busy:
            if not conn.worker.done():
                conn.worker.cancel()
                workers.append(conn.worker)
        for w in workers:
            try:
                await w
            except (asyncio.CancelledError, Exception):
                pass
        if self.server is not None:
            await self.server.wait_closed()
