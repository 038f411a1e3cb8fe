"""The deadline on a connection's request headers (`server/connections.py`): a client that
sends its headers a byte at a time, or nothing at all, held a connection for ever; now it
gets a 408 and is closed. A real uvicorn on 127.0.0.1 with a small app, the deadline
shortened to 1 s."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from pdserve.live.replay_client import free_port
from pdserve.server.connections import HeaderDeadlineProtocol

DEADLINE_S = 1.0


class ShortDeadline(HeaderDeadlineProtocol):
    header_timeout_s = DEADLINE_S


async def echo_body(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    """A plain ASGI app: answers 200 with the length of the body it read."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    chosen = free_port()
    server = uvicorn.Server(uvicorn.Config(echo_body, host="127.0.0.1", port=chosen,
                                           log_level="warning", http=ShortDeadline,
                                           timeout_keep_alive=5))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield chosen
    server.should_exit = True
    thread.join(30)


def _response(sock: socket.socket) -> bytes:
    """One whole response (its head, then the Content-Length of body)."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received, time.monotonic()


def test_headers_that_never_finish_get_a_408_at_the_deadline(port):
    for sent in (b"", b"GET / HTTP/1.1\r\nHo"):  # nothing at all; a head left unfinished
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            opened = time.monotonic()
            sock.sendall(sent)
            answer, closed = _until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), answer
        assert b"the request headers did not arrive within 1s" in answer
        assert DEADLINE_S - 0.05 <= closed - opened < DEADLINE_S + 3


def test_a_head_sent_a_byte_at_a_time_is_cut_at_the_deadline_not_held(port):
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        opened = time.monotonic()
        try:
            for byte in head:  # 200 bytes, 20 ms apart: 4 s, far past the deadline
                sock.sendall(bytes([byte]))
                time.sleep(0.02)
        except OSError:
            pass  # the server closed the connection: it may reset what is sent after
        answer, closed = _until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert closed - opened < DEADLINE_S + 3


def test_requests_in_time_are_served_and_the_deadline_restarts_for_the_next_one(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(2):  # keep-alive: each request's head has its own deadline
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            time.sleep(DEADLINE_S * 0.4)  # the head takes part of the deadline
            sock.sendall(b"\r\n")
            assert _response(sock).startswith(b"HTTP/1.1 200")
            time.sleep(DEADLINE_S * 0.7)  # idle (the keep-alive timeout's), then a head
        sock.sendall(b"GET / HTTP/1.1\r\nHo")  # a third head that stops
        answer, _ = _until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer


def test_a_slow_body_after_complete_headers_is_not_the_header_deadlines(port):
    """The body has its own limit in the app (`body.BODY_IDLE_TIMEOUT_S`), per byte idle,
    so a slow upload that keeps sending is not cut; the header deadline leaves it alone."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n")
        for byte in b"abcd":  # 4 x 0.4 s: past the 1 s deadline
            time.sleep(0.4)
            sock.sendall(bytes([byte]))
        answer = _response(sock)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n4"), answer
