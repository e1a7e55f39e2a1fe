"""Issue 34: a symlink in the served folder must not make `popviz serve` read a file
outside it, not even to vet it at start-up. Whether the outside file was opened is
watched with inotify (IN_OPEN is reported whatever the mount's atime policy)."""

from __future__ import annotations

import ctypes
import json
import os
import struct
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from popviz.format import write_report
from tests.dash_http import find, payload
from tests.serve_util import start_serve, stop
from tooling.testing.synthetic import synthetic_report

IN_OPEN = 0x20
IN_ACCESS = 0x01
LINE = "refused: a link to a file outside the served folder (not read)"


def _opens_of(path: Path) -> Callable[[], int]:
    """A function counting the opens and reads of `path` since this call."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    if fd < 0 or libc.inotify_add_watch(fd, str(path).encode(), IN_OPEN | IN_ACCESS) < 0:
        pytest.skip(f"inotify is not available here (errno {ctypes.get_errno()})")
    seen = 0

    def count() -> int:
        nonlocal seen
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return seen
            at = 0
            while at < len(data):
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, at)
                seen, at = seen + 1, at + 16 + size

    return count


def _post(url: str, body: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=None if body is None else json.dumps(
        body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            text, status = reply.read().decode(), reply.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read().decode(), exc.code
    if body is not None and status == 200:  # re-dumped: Dash escapes '/'
        text = json.dumps(json.loads(text), ensure_ascii=False)
    return status, text


def test_links_out_of_the_served_folder_are_never_opened(tmp_path: Path) -> None:
    report = synthetic_report(num_ipus=2, events=300, steps=30, seed=1)
    outside = write_report(report, tmp_path / "outside" / "secret.h5")
    served = tmp_path / "served"
    write_report(report, served / "good" / "profile.h5")
    (served / "evil.h5").symlink_to(outside)
    (served / "linkdir").mkdir()
    (served / "linkdir" / "profile.h5").symlink_to(outside)
    (served / "alias.h5").symlink_to(served / "good" / "profile.h5")  # stays inside
    opens = _opens_of(outside)
    proc, port = start_serve(served)
    base = f"http://127.0.0.1:{port}"
    try:
        route = find(json.loads(_post(f"{base}/_dash-dependencies")[1]), "page.children")

        def page(path: str, search: str) -> str:
            return _post(f"{base}/_dash-update-component", payload(
                route, {"url.pathname": path, "url.search": search}))[1]

        deadline = time.monotonic() + 90
        while "/summary?profile=alias.h5" not in (home := page("/", "")):
            assert time.monotonic() < deadline, home[-2000:]
            time.sleep(1)  # the inside files are vetted, their facts read
        assert opens() == 0, "the file outside the served folder was opened"
        assert "/summary?profile=good%2Fprofile.h5" in home
        assert f"evil.h5: {LINE}" in home and f"linkdir/profile.h5: {LINE}" in home
        assert "outside the served directory" in page("/summary", "?profile=evil.h5")
        assert f"linkdir: {LINE}" in page("/trace", "?profile=linkdir")
        status, text = _post(f"{base}/download/csv/ops?profile=linkdir")
        assert status == 404 and LINE in text
        assert "secret" not in home and str(tmp_path) not in home
    finally:
        stop(proc)
    assert opens() == 0, "the file outside the served folder was opened"
    outside.read_bytes()
    assert opens() > 0  # the watch does see an open
