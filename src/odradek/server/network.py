"""Listeners and connections: the asyncio shell around the sans-I/O framing.

Seed 003, "Network Layer" and "Protocol": one connection carries requests that the broker answers in
the order they arrived. As in Kafka, a connection handles one request at a time: once a read completes a
request the connection is muted (it stops reading) until every request that read brought is answered,
so the bytes of further pipelined requests stay in the kernel, not in the broker.

One exception, where odradek goes past Kafka: a handler may answer `Later` (an acks=all Produce whose
records are appended and now wait for the followers). The connection then goes on with the requests
behind it while the answer is pending, and sends every answer in the order the requests came. At most
`MAX_PENDING_ANSWERS` answers wait per connection; past that the connection stays muted until one is
sent. A request handed over this way gives its share of the pool back at once (its bytes are no longer
held: the records are in the log), as Kafka's requests leave its request queue and memory pool when
they go to the purgatory; so waiting acknowledgements can never fill the pool and stop the followers'
fetches that would complete them. Kafka mutes the connection until the acknowledgement instead, so a
producer's next request is appended only after the followers have the previous one; here the
followers fetch several requests' records in one round, which is what lets acks=all with replicas keep
up with a producer that pipelines (librdkafka's default max.in.flight is 1,000,000; Java's is 5).

Parked requests: a request whose handler waits for something outside the broker's own work - a
long-poll Fetch for data (the purgatory), a classic JoinGroup or SyncGroup for the other members, a
coordinator's write for its followers, a transactional Produce for the transaction coordinator's
verification - is parked while it waits: it gives its count in `queued.max.requests` back, as a
request answered `Later` does, and takes it again when it resumes (its answer is work in progress
again). So the budget counts only work in progress, and idle long polls, however many and however long,
never stop the broker reading other connections (Kafka's handler threads likewise leave a delayed
request in its purgatory and take the next one). Unlike `Later`, the connection stays muted: Kafka
processes one request per connection at a time, so each connection holds at most one parked request,
and nothing behind it is handled before it is answered. Its bytes stay charged to
`queued.max.request.bytes` (they are still held). A wait parks by entering `Parked()`, which finds the
request through the context of the connection's task; anything else (a task the request started, a
caller outside a connection) parks nothing.

Reads go into buffers the connection provides (asyncio.BufferedProtocol, `protocol.framing.FrameReader`):
small requests into a per-connection scratch buffer, a large one into its own buffer, which grows with
the bytes that arrive (never allocated at its announced size before they do).

Limits (Kafka's names):
- `socket.request.max.bytes`: checked on the size prefix before anything is allocated.
- `queued.max.request.bytes` and `queued.max.requests`: one broker-wide `RequestPool` (KIP-72). A
  large request's buffer is granted by the pool once its size is known; small requests are charged
  when read; both are released when answered (the count also while the request is parked). When the
  pool is exhausted the connections that need it stop reading, and are resumed first come, first served
  as memory returns: the broker stops reading rather than allocate.
- `socket.request.receive.timeout.ms` (odradek's; Kafka has no such key): a request whose first byte
  has arrived must be complete within this time (counted while the broker is reading from that
  connection), so a sender of one byte per second is closed and what it held is released.
- `max.connections`, `max.connections.per.ip`: new connections beyond them are refused.
- `connections.max.idle.ms`: connections with no traffic are closed.

Fairness: each connection is served by its own task and yields to the loop between requests, so
connections take turns (round-robin in the loop's ready queue) and none monopolises the loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import socket
import time
from typing import Any, Awaitable, Callable

from odradek.protocol.framing import FrameReader, FrameTooLarge, coalesced, frame
from odradek.server.record_slices import inlined, native_sendfile

log = logging.getLogger("odradek.network")

MAX_PENDING_ANSWERS = 32


class Later:
    """An answer that comes after its request's turn: `answer` is awaited for it (by the connection,
    for chunks to send; by the dispatcher, for a handler's response message)."""

    __slots__ = ("answer",)

    def __init__(self, answer: Awaitable[Any]) -> None:
        self.answer = answer


# The connection whose worker task is running: set by each worker for itself (a task runs in its own copy
# of the context), read by `Parked`.
_serving: contextvars.ContextVar["Connection"] = contextvars.ContextVar("odradek_serving")


class Parked:
    """`with Parked(): await <something outside the broker's own work>`: while the block runs, the
    request being handled does not count in `queued.max.requests` (see the module's docstring). Entered
    outside a connection's request, or by a task other than the connection's own, or within another
    `Parked`, it does nothing."""

    __slots__ = ("conn",)

    def __enter__(self) -> None:
        conn = _serving.get(None)
        self.conn = conn if conn is not None and conn.park() else None

    def __exit__(self, *exc: object) -> None:
        if self.conn is not None:
            self.conn.unpark()


# handle(connection, frame) -> chunks to send (a list of buffers and record-set references), None, or
# Later(a future of such chunks)
Handler = Callable[["Connection", bytes], Awaitable["list | Later | None"]]


class RequestPool:
    """The broker-wide budget of received, unanswered requests (KIP-72): `bytes_max` bytes
    (`queued.max.request.bytes`) and `requests_max` requests in progress (`queued.max.requests`; a
    parked request or one answered `Later` is not in progress). Connections that cannot proceed wait in
    arrival order and are woken as requests are answered or park."""

    def __init__(self, bytes_max: int, requests_max: int) -> None:
        self.bytes_max = bytes_max
        self.requests_max = requests_max
        self.bytes_used = 0
        self.requests = 0
        self._waiters: dict["Connection", None] = {}     # insertion-ordered: FIFO

    @property
    def full(self) -> bool:
        return self.bytes_used >= self.bytes_max or self.requests >= self.requests_max

    def try_reserve(self, nbytes: int) -> bool:
        """Grant a large request's buffer, unless that would pass the limit (an empty pool grants any
        single request, so one request of `socket.request.max.bytes` can always be read)."""
        if self.bytes_used and self.bytes_used + nbytes > self.bytes_max:
            return False
        self.bytes_used += nbytes
        return True

    def charge(self, nbytes: int) -> None:
        """A small request already read (its bytes are here whatever the pool says)."""
        self.bytes_used += nbytes

    def add_requests(self, n: int) -> None:
        self.requests += n

    def release(self, nbytes: int, requests: int = 0) -> None:
        self.bytes_used -= nbytes
        self.requests -= requests
        assert self.bytes_used >= 0 and self.requests >= 0, (self.bytes_used, self.requests)
        while self._waiters and not self.full:
            conn = next(iter(self._waiters))
            if not conn.pool_available():
                break                     # first come, first served: the head waits for more room
            del self._waiters[conn]

    def wait(self, conn: "Connection") -> None:
        self._waiters[conn] = None

    def forget(self, conn: "Connection") -> None:
        self._waiters.pop(conn, None)


class Connection(asyncio.BufferedProtocol):
    """One client connection. Reads go straight into the buffers of a FrameReader; the connection
    stops reading while it has requests to answer ("muted") or while the pool has no room ("pool")."""

    def __init__(self, listener: "Listener") -> None:
        self.listener = listener
        self.pool = listener.pool
        self.reader = FrameReader(listener.max_request_bytes, pool=listener.pool)
        self.pending: collections.deque[bytearray] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.tcp_socket: Any = None
        self.peer: tuple = ("?", 0)
        self.worker: asyncio.Task | None = None
        self.last_active = time.monotonic()
        self.receive_started: float | None = None   # when the request being received began arriving
        self.closed = False
        self.paused_for: set[str] = set()           # "muted", "pool"
        self.handling = False                       # pending[0] is handled and counts in queued.max.requests
        # answers still to send, in request order (futures of chunks to send)
        self.answers: collections.deque[asyncio.Future] = collections.deque()
        self.answering: asyncio.Task | None = None  # sends `answers` as they complete
        self.room = asyncio.Event()                 # set when `answers` is below MAX_PENDING_ANSWERS
        self.room.set()
        self.drained = asyncio.Event()
        self.drained.set()

    # ------------------------------------------------------------------------- asyncio callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = transport.get_extra_info("peername") or ("?", 0)
        self.tcp_socket = _tcp_socket(transport)     # looked up once: uvloop builds a new object per call
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
        if frames:
            self.pending.extend(frames)
            self._pause("muted")
            if self.worker is None or self.worker.done():
                self.worker = asyncio.get_running_loop().create_task(self._work())
        if self.reader.waiting_bytes or self.pool.full:
            self._pause("pool")
            self.pool.wait(self)
        self._track_receive()

    def pool_available(self) -> bool:
        """The pool has room again (called by RequestPool.release, in arrival order); False if this
        connection still cannot proceed and keeps its place in the queue."""
        if self.closed:
            return True
        if not self.reader.retry_reserve() or self.pool.full:
            return False
        self._resume("pool")
        return True

    def _pause(self, reason: str) -> None:
        if not self.paused_for and not self.closed:
            self.transport.pause_reading()
        self.paused_for.add(reason)
        self.receive_started = None

    def _resume(self, reason: str) -> None:
        self.paused_for.discard(reason)
        if not self.paused_for and not self.closed:
            self.transport.resume_reading()
            self._track_receive()

    def _track_receive(self) -> None:
        """Start the receive deadline when a request has begun arriving while we read; stop it when
        no partial request is held."""
        if self.reader.buffered_bytes == 0 or self.paused_for:
            self.receive_started = None
        elif self.receive_started is None:
            self.receive_started = time.monotonic()

    def pause_writing(self) -> None:
        self.drained.clear()

    def resume_writing(self) -> None:
        self.drained.set()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.drained.set()
        self.listener.forget(self)
        self._release_all()
        if self.busy:
            # Not at once: right after this callback asyncio's transport fails the waiter that
            # loop.sendfile may be parked on, and raises InvalidStateError if we cancelled it first.
            asyncio.get_running_loop().call_soon(self._cancel_worker)

    def _release_all(self) -> None:
        """Give back to the pool what this connection holds: unanswered requests, a partial large one."""
        held = sum(len(f) for f in self.pending)
        n = 1 if self.handling else 0
        self.handling = False
        self.pending.clear()
        for fut in self.answers:
            fut.cancel()
        self.answers.clear()
        self.room.set()
        reserved = self.reader.reserved_bytes
        self.reader = FrameReader(0)     # drop the partial buffer; nothing more is read
        self.pool.forget(self)
        if held or n or reserved:
            self.pool.release(held + reserved, n)

    def _cancel_worker(self) -> None:
        for task in (self.worker, self.answering):
            if task is not None and not task.done():
                task.cancel()

    @property
    def busy(self) -> bool:
        """Handling a request or sending an answer."""
        return any(t is not None and not t.done() for t in (self.worker, self.answering))

    # ------------------------------------------------------------------------- parking
    def park(self) -> bool:
        """The request being handled waits for something outside the broker: give its count back
        (True), unless it is not counted (parked already, or answered) or the caller is not this
        connection's worker (a task the request started may outlive it)."""
        if not self.handling or asyncio.current_task() is not self.worker:
            return False
        self.handling = False
        self.pool.release(0, 1)
        return True

    def unpark(self) -> None:
        """The parked request goes on: it counts again (a closed connection's was already given back)."""
        if not self.closed:
            self.handling = True
            self.pool.add_requests(1)

    # ------------------------------------------------------------------------- request loop
    async def _work(self) -> None:
        _serving.set(self)
        while self.pending and not self.closed:
            f = self.pending[0]
            # queued.max.requests counts requests being handled: one per connection at most, as in
            # Kafka, whose channel stages one receive at a time; not while parked, nor once handed over
            # as Later. The rest of what one read brought (at most the scratch buffer) waits here
            # without counting.
            self.pool.add_requests(1)
            self.handling = True
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
            if self.closed:
                if isinstance(chunks, Later) and isinstance(chunks.answer, asyncio.Future):
                    chunks.answer.cancel()
                return
            if isinstance(chunks, Later) or (chunks is not None and self.answers):
                # Answered later, or answered now behind an earlier answer still pending: in order.
                self._answer_later(chunks)
                self.pending.popleft()
                self.handling = False
                self.pool.release(len(f), 1)
                if len(self.answers) >= MAX_PENDING_ANSWERS:
                    self.room.clear()
                    await self.room.wait()
                    if self.closed:
                        return
                elif self.pending:
                    await asyncio.sleep(0)          # let other connections have their turn
                continue
            if chunks is not None and not await self._send_or_abort(chunks):
                return
            if self.closed:
                return
            self.pending.popleft()
            self.handling = False
            self.pool.release(len(f), 1)
            self.last_active = time.monotonic()
            if self.pending:
                await asyncio.sleep(0)          # let other connections have their turn
        if not self.closed and len(self.answers) < MAX_PENDING_ANSWERS:
            self._resume("muted")

    async def _send_or_abort(self, chunks: list) -> bool:
        """Send a response; False if that failed and the connection was aborted."""
        try:
            await self.send(chunks)
            return True
        except (OSError, RuntimeError) as e:
            # sendfile writes to the socket itself: a peer that resets or vanishes mid-response
            # surfaces here, not in connection_lost. Half a response is on the wire; drop it all.
            log.info("closing connection from %s: sending a response failed: %r", self.peer[0], e)
            self.abort()
            return False

    def _answer_later(self, chunks: "list | Later") -> None:
        if isinstance(chunks, Later):
            fut = asyncio.ensure_future(chunks.answer)
        else:
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(chunks)
        self.answers.append(fut)
        if self.answering is None or self.answering.done():
            self.answering = asyncio.get_running_loop().create_task(self._send_answers())

    async def _send_answers(self) -> None:
        """Send the pending answers in request order as each completes; resume reading once the
        connection has room again and nothing else is being handled."""
        while self.answers and not self.closed:
            fut = self.answers[0]
            try:
                chunks = await fut
            except ConnectionClosing:
                self.close()
                return
            except asyncio.CancelledError:
                if self.closed:
                    return
                raise
            except Exception:
                log.exception("unexpected error answering a request from %s; closing", self.peer[0])
                self.close()
                return
            if chunks is not None and not self.closed and not await self._send_or_abort(chunks):
                return
            if self.closed:
                return
            self.answers.popleft()
            self.last_active = time.monotonic()
            if len(self.answers) < MAX_PENDING_ANSWERS:
                self.room.set()
                if not self.pending:
                    self._resume("muted")

    async def send(self, chunks: list) -> None:
        """Send one answer: its size prefix, then `chunks` (buffers, and record sets that send
        themselves, with sendfile where they can). An answer in several parts (a fetch's header,
        its records from the page cache, the rest of the response) is sent with the TCP socket
        corked, so the kernel sends full segments and the peer is woken once, not first for a
        header of a few dozen bytes; uncorking at the end sends what is left at once."""
        size = 0
        for c in chunks:
            size += c.size if hasattr(c, "size") and not isinstance(c, (bytes, bytearray, memoryview)) else len(c)
        t = self.transport
        parts = coalesced([frame(size), *inlined(chunks)])
        corked = self.tcp_socket if len(parts) > 1 else None
        if corked is not None:
            _cork(corked, True)
        try:
            for c in parts:
                if isinstance(c, (bytes, bytearray, memoryview)):
                    t.write(c)
                else:
                    await c.send(t, self.listener.loop, self.listener.use_sendfile)
        finally:
            if corked is not None and not t.is_closing():
                _cork(corked, False)
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


def _tcp_socket(transport: asyncio.BaseTransport) -> Any:
    """The transport's TCP socket, or None (another kind of socket, or no TCP_CORK on this OS)."""
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_CORK") or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return sock


def _cork(sock: Any, on: bool) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1 if on else 0)
    except OSError:
        pass   # the connection is gone; the write that follows (or already failed) reports it


class ConnectionClosing(Exception):
    """Raised by a handler to close the connection instead of answering (Kafka's way for acks=0
    errors and for requests it cannot parse)."""


class Listener:
    """One listening socket; owns its connections."""

    def __init__(self, handler: Handler, *, max_request_bytes: int, pool: RequestPool,
                 max_connections: int, max_connections_per_ip: int, idle_ms: int,
                 receive_timeout_ms: int = 30_000) -> None:
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.pool = pool
        self.receive_timeout_ms = receive_timeout_ms
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
        period = max(0.05, min(min(self.idle_ms, self.receive_timeout_ms) / 1000 / 4, 30.0))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            cutoff = now - self.idle_ms / 1000
            receive_cutoff = now - self.receive_timeout_ms / 1000
            for conn in list(self.connections):
                if conn.last_active < cutoff and not conn.pending and not conn.busy:
                    conn.close()
                elif conn.receive_started is not None and conn.receive_started < receive_cutoff:
                    log.warning("closing connection from %s: a request of which %d bytes have arrived was "
                                "not complete within socket.request.receive.timeout.ms=%d", conn.peer[0],
                                conn.reader.buffered_bytes, self.receive_timeout_ms)
                    conn.abort()

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
            if conn.busy:
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
            for task in (conn.worker, conn.answering):
                if task is not None and not task.done():
                    task.cancel()
                    workers.append(task)
        for w in workers:
            try:
                await w
            except (asyncio.CancelledError, Exception):
                pass
        if self.server is not None:
            await self.server.wait_closed()
