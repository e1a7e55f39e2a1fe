"""Issue 22, slow clients: sockets trickling header bytes must not lock out other requests
(slow-loris). `popviz.cli.serve_guard` on a tiny WSGI app with short limits (deadlines,
caps, keep-alive), then the real `popviz serve` under 200 trickling sockets. Loopback only."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waitress import wasyncore

from popviz.cli.serve_guard import Limits, create_server
from popviz.format import write_report
from tests.serve_util import start_serve, stop
from tooling.testing.synthetic import synthetic_report

LIMITS = Limits(header_s=1.0, body_s=2.5, per_address=4, unfinished=6)
HEAD = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def _ok_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    environ["wsgi.input"].read(length)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


@pytest.fixture
def port() -> Iterator[int]:
    server = create_server(_ok_app, limits=LIMITS, host="127.0.0.1", port=0, threads=2,
                           cleanup_interval=1, channel_timeout=120)
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            wasyncore.loop(timeout=0.05, map=server._map, count=1)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield server.effective_port
    finally:
        done.set()
        thread.join(5)
        server.task_dispatcher.shutdown()
        wasyncore.close_all(server._map)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _ask(sock: socket.socket) -> bytes:
    """One keep-alive GET on `sock`; its reply (status line to body)."""
    sock.sendall(HEAD + b"\r\n")
    reply = b""
    while not reply.endswith(b"ok"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        reply += chunk
    return reply


def _closed_after(sock: socket.socket, trickle: bytes, every_s: float = 0.25,
                  limit_s: float = 10) -> float:
    """Send `trickle` a byte at a time until the server closes `sock`; seconds taken."""
    began = time.monotonic()
    sock.settimeout(every_s)
    for byte in trickle * 1000:
        if time.monotonic() - began > limit_s:
            break
        try:
            sock.send(bytes([byte]))
            if sock.recv(100) == b"":
                return time.monotonic() - began
        except TimeoutError:
            continue
        except OSError:  # reset or broken pipe: closed by the server
            return time.monotonic() - began
    return float("inf")


def test_a_trickled_header_is_cut_at_its_deadline(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(HEAD)
        took = _closed_after(sock, b"X-Slow: a\r\n")
    assert LIMITS.header_s <= took < LIMITS.header_s + 2.5
    with _connect(port) as sock:
        assert _ask(sock).startswith(b"HTTP/1.1 200")


def test_a_trickled_body_is_cut_at_the_body_deadline_not_the_header_one(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 500\r\n\r\n")
        took = _closed_after(sock, b"x")
    assert LIMITS.body_s <= took < LIMITS.body_s + 2.5


def test_keep_alive_requests_restart_the_clock(port: int) -> None:
    with _connect(port) as sock:
        began = time.monotonic()
        while time.monotonic() - began < 3 * LIMITS.header_s:
            assert _ask(sock).startswith(b"HTTP/1.1 200")
            time.sleep(0.4)
        # idle past the deadline: closed like any stalled request
        sock.settimeout(LIMITS.header_s + 3)
        assert sock.recv(10) == b""


def test_a_newcomer_past_the_per_address_cap_closes_the_longest_waiting(port: int) -> None:
    idle = [_connect(port) for _ in range(LIMITS.per_address)]
    try:
        time.sleep(0.3)
        with _connect(port) as sock:
            assert _ask(sock).startswith(b"HTTP/1.1 200")
        idle[0].settimeout(2)
        assert idle[0].recv(10) == b""  # the oldest gave its slot to the newcomer
        idle[-1].sendall(HEAD + b"\r\n")  # the newest still works
        idle[-1].settimeout(5)
        assert idle[-1].recv(100).startswith(b"HTTP/1.1 200")
    finally:
        for sock in idle:
            sock.close()


# ---- the real server ----

SLOW_SOCKETS = 200
TRICKLE_S = 16


def _trickle(port: int, stop_at: float, counts: dict[str, int]) -> None:
    """Hold SLOW_SOCKETS connections, each sending one header byte a second; a socket the
    server closes is opened again (the attacker does not give up)."""
    socks: list[socket.socket | None] = [None] * SLOW_SOCKETS
    try:
        while time.monotonic() < stop_at:
            for i, sock in enumerate(socks):
                try:
                    if sock is None:
                        sock = socks[i] = socket.create_connection(("127.0.0.1", port),
                                                                   timeout=1)
                        sock.sendall(HEAD)
                        counts["opened"] += 1
                    else:
                        sock.send(b"X")
                except OSError:
                    if sock is not None:
                        sock.close()
                        counts["cut"] += 1
                    socks[i] = None
            time.sleep(1)
    finally:
        for sock in socks:
            if sock is not None:
                sock.close()


def test_200_slow_sockets_do_not_lock_out_a_normal_request(tmp_path: Path) -> None:
    write_report(synthetic_report(num_ipus=2, events=300, steps=30, seed=5),
                 tmp_path / "run" / "profile.h5")
    proc, port = start_serve(tmp_path)
    counts = {"opened": 0, "cut": 0}
    try:
        began = time.monotonic()
        attacker = threading.Thread(target=_trickle, args=(port, began + TRICKLE_S, counts))
        attacker.start()
        times = []
        try:
            time.sleep(3)  # all the slow sockets are open and trickling
            while time.monotonic() - began < TRICKLE_S - 2:
                start = time.monotonic()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_dash-dependencies",
                                            timeout=8) as reply:
                    assert reply.status == 200
                times.append(time.monotonic() - start)
                time.sleep(2)
        finally:
            attacker.join(TRICKLE_S + 30)
    finally:
        stop(proc)
    assert counts["opened"] >= SLOW_SOCKETS
    assert counts["cut"] > 0  # evicted or timed out: the server did close trickling sockets
    assert len(times) >= 3 and max(times) < 4, times
