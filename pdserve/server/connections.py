"""A deadline on a connection's request headers (slowloris).

uvicorn closes a keep-alive connection that sends nothing for `timeout_keep_alive` seconds,
but once any byte arrives it waits for the rest of the headers without a limit, and a new
connection that sends nothing is held without one: a client sending a header byte every few
seconds held a connection (and a file descriptor) for as long as it liked, and enough such
clients stop the server accepting anyone. `HeaderDeadlineProtocol` is uvicorn's h11 protocol
with one addition: from the moment a connection opens, or the first byte of a later
request arrives on a kept-alive one (idle between requests, uvicorn's keep-alive timeout
applies), its request line and headers must be complete within `HEADER_TIMEOUT_S`, else it
gets a 408 and is closed (nginx's `client_header_timeout`, 60 s by default, does the same;
20 s here). A body that stops arriving is the app's to time out
(`body.BODY_IDLE_TIMEOUT_S`). `pdserve serve` runs uvicorn with it (`uvicorn.run(...,
http=HeaderDeadlineProtocol)`).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 20.0
_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
              b"connection: close\r\ncontent-length: %d\r\n\r\n%s")
_BODY = (b'{"error":{"message":"the request headers did not arrive within %gs",'
         b'"type":"invalid_request_error","param":null,"code":null}}')


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on each request's headers."""

    header_timeout_s = HEADER_TIMEOUT_S  # a class attribute, so that a test may shorten it
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a request line and headers arrived
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _late(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            body = _BODY % self.header_timeout_s
            self.transport.write(_TIMED_OUT % (len(body), body))
            self.transport.close()
