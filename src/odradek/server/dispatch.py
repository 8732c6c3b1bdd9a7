"""Request dispatch: one table from API key to handler (STYLE, "One module per API family").

A handler is `async def handle_<api>(ctx, request) -> response | None`, `ctx` the typed
`server.context.RequestContext` the broker's factory makes for each request; it returns the response
message (encoded here at the request's version) or None when the API sends no response (Produce with
acks=0). Partition-level failures are error codes inside the response, never exceptions.

The logger `odradek.requests.completed.<Api>` (Kafka's `kafka.request.logger`, one child per API, e.g.
`odradek.requests.completed.SyncGroup`) logs every completed request at DEBUG: API, version, correlation
id, client id, peer, time spent and the top-level error; off unless asked for.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import time
from typing import Any, Awaitable, Callable, Iterator

from odradek.protocol.api import decode_request, decode_request_charged, encode_response
from odradek.protocol.codec import DECODE_MULTIPLE, DECODE_SLACK_BYTES, worst_charge
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError, UnsupportedVersionError
from odradek.protocol.headers import API_VERSIONS_KEY, RequestHeader
from odradek.protocol.messages import api_versions
from odradek.server.context import RequestContext, Workers
from odradek.server.network import Connection, ConnectionClosing, Later

log = logging.getLogger("odradek.requests")
INLINE_DECODE_MAX_BYTES = 64 * 1024
PRODUCE_KEY = b"\x00\x00"   # the api key Produce, as the frame starts with it
request_log = logging.getLogger("odradek.requests.completed")
_request_loggers: dict[int, logging.Logger] = {}


HandlerFn = Callable[[RequestContext, Any], Awaitable[Any]]
ContextFactory = Callable[[Connection, RequestHeader], RequestContext]


class Dispatcher:
    def __init__(self, new_context: ContextFactory, handlers: dict[int, HandlerFn], workers: Workers) -> None:
        self.new_context = new_context
        self.handlers = handlers
        self.workers = workers
        self.slack = DecodeSlack(DECODE_SLACK_BYTES)

    async def __call__(self, conn: Connection, frame: bytes) -> list | Later | None:
        if len(frame) > INLINE_DECODE_MAX_BYTES and frame[:2] != PRODUCE_KEY:
            # The decode budget's slack (codec.py) is one for the broker, not one per request: a
            # large request takes what it may need before it is decoded, gives back what it did not
            # use, and the rest once answered, so requests in progress hold at most 6x their bytes
            # + DECODE_SLACK_BYTES between them.
            wanted = min(worst_charge(len(frame)), self.slack.size)
            await self.slack.take(wanted)
            held = [wanted]
            try:
                with full_collections_deferred():
                    return await self._dispatch(conn, frame, held)
            finally:
                self.slack.give(held[0])
        return await self._dispatch(conn, frame, None)

    async def _dispatch(self, conn: Connection, frame: bytes, slack: list[int] | None) -> list | Later | None:
        large = slack is not None
        try:
            if slack is not None:
                # Decoding is Python work that grows with the request (a Metadata request naming a
                # million topics): off the loop. Produce is exempt: its records are referenced, not
                # decoded, so even a 1 MiB Produce request decodes in microseconds.
                header, request, charged = await self.workers.run(decode_request_charged, frame, slack[0])
                used = min(slack[0], max(0, charged - DECODE_MULTIPLE * len(frame)))
                self.slack.give(slack[0] - used)
                slack[0] = used
            else:
                header, request = decode_request(frame)
        except UnsupportedVersionError as e:
            if e.api_key == API_VERSIONS_KEY and e.header is not None:
                return self.unsupported_api_versions(e.header)
            log.info("closing connection from %s: %s", conn.peer[0], e)
            raise ConnectionClosing() from None
        except ProtocolError as e:
            log.info("closing connection from %s: malformed request: %s", conn.peer[0], e)
            raise ConnectionClosing() from None
        handler = self.handlers.get(header.api_key)
        if handler is None:
            log.info("closing connection from %s: api key %d is not served", conn.peer[0], header.api_key)
            raise ConnectionClosing()
        rlog = _request_loggers.get(header.api_key)
        if rlog is None:
            rlog = _request_loggers[header.api_key] = request_log.getChild(
                type(request).__name__.removesuffix("Request"))
        logged = rlog.isEnabledFor(logging.DEBUG)
        started = time.monotonic() if logged else 0.0
        response = await handler(self.new_context(conn, header), request)
        if isinstance(response, Later):
            # The handler's answer comes later (network.Later): encode it then, and let the
            # connection go on meanwhile.
            return Later(asyncio.ensure_future(self._finish(conn, header, rlog, logged, started, response.answer,
                                                            large)))
        if large:
            # The answer to a large request grows with it (a Metadata answer to 400,000 names):
            # encoded on the worker pool, as the request was decoded.
            return await self.workers.run(self._encode, conn, header, rlog, logged, started, response)
        return self._encode(conn, header, rlog, logged, started, response)

    async def _finish(self, conn: Connection, header: RequestHeader, rlog: logging.Logger, logged: bool,
                      started: float, answer: Awaitable[Any], large: bool = False) -> list | None:
        response = await answer
        if large:
            return await self.workers.run(self._encode, conn, header, rlog, logged, started, response)
        return self._encode(conn, header, rlog, logged, started, response)

    @staticmethod
    def _encode(conn: Connection, header: RequestHeader, rlog: logging.Logger, logged: bool, started: float,
                response: Any) -> list | None:
        if logged:
            rlog.debug("Completed request %s v%d correlation %d from client %r at %s:%s in %.1f ms: %s",
                       rlog.name.rsplit(".", 1)[-1], header.api_version, header.correlation_id,
                       header.client_id, conn.peer[0], conn.peer[1], (time.monotonic() - started) * 1000,
                       "no response" if response is None else _error_summary(response))
        if response is None:
            return None
        return encode_response(header.api_key, header.api_version, header.correlation_id, response).chunks()

    def unsupported_api_versions(self, header: RequestHeader) -> list:
        """KIP-511: a v0 response with UNSUPPORTED_VERSION and the versions we do support."""
        body = api_versions.ApiVersionsResponse(
            error_code=ErrorCode.UNSUPPORTED_VERSION,
            api_keys=[api_versions.ApiVersion(api_key=API_VERSIONS_KEY, min_version=api_versions.MIN_VERSION,
                                              max_version=api_versions.MAX_VERSION)],
        )
        return encode_response(API_VERSIONS_KEY, 0, header.correlation_id, body).chunks()


class DecodeSlack:
    """The broker's one decode slack (codec.DECODE_SLACK_BYTES): bytes of estimated objects that
    large requests in progress may hold past 6x their size. Taken first come, first served; a request
    waits (its connection reads nothing more meanwhile) until what it asks for is free."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def take(self, n: int) -> None:
        if not self._waiters and self.free >= n:
            self.free -= n
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give(n)            # granted just as it was cancelled
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._grant()
            raise

    def give(self, n: int) -> None:
        self.free += n
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.free:
            n, waiter = self._waiters.popleft()
            if not waiter.done():
                self.free -= n
                waiter.set_result(None)


_deferrals = 0
_thresholds: tuple[int, int, int] = (0, 0, 0)
NO_FULL_COLLECTION = 1 << 30        # gen-2 threshold while deferred: no full collection is due


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """Python's full (generation 2) garbage collections deferred while a large request is decoded,
    handled, encoded and freed. Such a request makes hundreds of thousands of objects (a Metadata
    request naming 400,000 topics), none in a cycle, that refcounting frees; but while they live every
    full collection walks them all holding the GIL (0.27 s for 400,000 topics), and the growing heap
    triggers several: every other client waited that long (0.27-0.77 s measured). The young
    generations are still collected, so short-lived cycles are freed as ever; the full threshold comes
    back when the last large request in progress is done."""
    global _deferrals, _thresholds
    if _deferrals == 0:
        _thresholds = gc.get_threshold()
        gc.set_threshold(_thresholds[0], _thresholds[1], NO_FULL_COLLECTION)
    _deferrals += 1
    try:
        yield
    finally:
        _deferrals -= 1
        if _deferrals == 0:
            gc.set_threshold(*_thresholds)


def _error_summary(response: object) -> str:
    """'answered', or the response's top-level error (partition-level errors are not looked at)."""
    code = getattr(response, "error_code", 0)
    if not code:
        return "answered"
    known = ErrorCode._value2member_map_.get(code)
    return f"error {known.name}" if known is not None else f"error {code}"
