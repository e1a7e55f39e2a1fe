"""Issue 34: one slow or memory-hungry page cannot lock or kill `popviz serve`. The test
hook POPVIZ_SERVE_SIMULATE makes one profile's page spin for ever or allocate gigabytes;
more such requests than the server has threads must each end in one line while `/` and
another profile's page keep answering, and the server lives on with bounded memory."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from popviz_app import SIMULATE_ENV

from popviz.cli.main import main
from popviz.cli.serve_budget import FairDispatcher, Share, _Queued, callback_profile
from popviz.errors import RequestStopped
from popviz.format import write_report
from tests.dash_http import find, payload
from tests.serve_util import start_serve, stop
from tooling.testing.synthetic import synthetic_report

THREADS = 4  # Share.of(4): 2 threads build views, 1 of them for one profile


def _folder(root: Path, names: list[str]) -> None:
    first = write_report(synthetic_report(num_ipus=2, events=300, steps=30, seed=1),
                         root / "original.h5")
    for name in names:
        (root / name).mkdir()
        os.link(first, root / name / "profile.h5")
    first.unlink()


def _post(url: str, body: dict[str, Any] | None = None,
          timeout: float = 60) -> tuple[float, int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            text, status = reply.read().decode(), reply.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read().decode(), exc.code
    if body is not None and status == 200:  # re-dumped: Dash escapes '/'
        text = json.dumps(json.loads(text), ensure_ascii=False)
    return time.monotonic() - began, status, text


def _status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


class Server:
    def __init__(self, root: Path, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.route = find(json.loads(_post(f"{self.base}/_dash-dependencies")[2]),
                          "page.children")
        # vetted before the clock starts: a download does not run the page hook
        deadline = time.monotonic() + 90
        for folder in sorted(p.name for p in root.iterdir()):
            while _post(f"{self.base}/download/csv/stages?profile={folder}/profile.h5"
                        )[1] != 200:
                assert time.monotonic() < deadline, f"{folder} never vetted"
                time.sleep(0.5)

    def page(self, rel: str, path: str = "/summary",
             timeout: float = 60) -> tuple[float, int, str]:
        return _post(f"{self.base}/_dash-update-component", payload(self.route, {
            "url.pathname": path, "url.search": f"?profile={rel}"}), timeout)


def test_pages_that_spin_are_stopped_and_others_keep_answering(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _folder(tmp_path, ["spin", "calm"])
    monkeypatch.setenv(SIMULATE_ENV, "spin:spin/")
    proc, port = start_serve(tmp_path, "--threads", str(THREADS), "--request-timeout", "2")
    try:
        server = Server(tmp_path, port)
        # calm/ opened once first: its profile is then in the cache, so building its page
        # under the 2 s budget is not a race with a cold open on a busy machine
        assert server.page("calm/profile.h5")[1] == 200
        with ThreadPoolExecutor(2 * THREADS) as pool:
            # twice as many spinning pages as the server has threads
            spinning = [pool.submit(server.page, "spin/profile.h5", "/liveness", 40)
                        for _ in range(2 * THREADS - 1)]
            time.sleep(1)  # they hold every thread a view may use for spin/
            home = _post(f"{server.base}/")
            calm = server.page("calm/profile.h5")
            spun = [f.result() for f in spinning]
        assert home[1] == 200 and home[0] < 3, home[:2]
        assert calm[1] == 200 and "calm/profile.h5 · " in calm[2] and calm[0] < 10, calm[:2]
        for took, status, text in spun:  # each stopped after 2 s, one at a time (1 thread)
            assert status == 200 and took < 30, (took, status)
            assert "spin/profile.h5: building this view took longer than 2 s and was " \
                   "stopped (popviz serve --request-timeout)" in text
        # alive afterwards, the stopped threads free again
        assert server.page("calm/profile.h5", "/stages")[1] == 200
        assert _post(f"{server.base}/")[0] < 3
    finally:
        out, _ = stop(proc)
    assert "Traceback" not in out


def test_a_page_that_allocates_gigabytes_is_one_line_and_memory_stays_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _folder(tmp_path, ["grab", "calm"])
    monkeypatch.setenv(SIMULATE_ENV, "grab:grab/")  # 3 GiB, unless refused
    proc, port = start_serve(tmp_path, "--memory-mb", "1024")
    try:
        server = Server(tmp_path, port)
        with ThreadPoolExecutor(3) as pool:
            grabs = [pool.submit(server.page, "grab/profile.h5") for _ in range(2)]
            calm = server.page("calm/profile.h5")
            grabbed = [f.result() for f in grabs]
        for _took, status, text in grabbed:
            assert status == 200
            assert "grab/profile.h5: building this view needed more memory than the " \
                   "server may use and was stopped (popviz serve --memory-mb)" in text
        assert calm[1] == 200, calm  # served, whether before, between or after the grabs
        assert server.page("calm/profile.h5", "/memory")[1] == 200  # alive afterwards
        assert _status_mb(proc.pid, "VmHWM") < 1200  # never past the cap
        assert _status_mb(proc.pid, "VmRSS") < 800  # and handed back
    finally:
        out, _ = stop(proc)
    assert "Traceback" not in out


@pytest.mark.parametrize("flags", [
    ["--vet-timeout", "nan"], ["--vet-timeout", "inf"], ["--vet-timeout", "0"],
    ["--request-timeout", "nan"], ["--request-timeout", "-1"], ["--memory-mb", "100"],
    ["--vet-memory-mb", "-5"],
])
def test_non_finite_or_non_positive_serve_numbers_are_refused_in_one_line(
        tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"popviz: error: {flags[0]} ") and "\n" not in err


def test_a_profile_past_its_share_waits_while_others_and_light_requests_go_first() -> None:
    dispatcher = FairDispatcher(Share.of(6))  # 4 heavy threads, 2 per profile
    assert (dispatcher.share.heavy, dispatcher.share.per_profile) == (4, 2)
    dispatcher.heavy_running, dispatcher.running["a"] = 2, 2
    queue = [_Queued(n, p) for n, p in enumerate(["a", "a", None, "b", "a"])]
    dispatcher.queue.extend(queue)
    picked = [dispatcher._next() for _ in range(3)]
    assert [q.task for q in picked if q] == [2, 3]  # light, then b; a's wait
    assert picked[2] is None
    dispatcher.running["a"] = 1
    assert (q := dispatcher._next()) is not None and q.task == 0


def test_the_profile_of_a_callback_comes_from_its_page_url() -> None:
    body = {"output": "x.children", "inputs": [{"id": "a", "property": "b", "value": 1}],
            "state": [{"id": "url", "property": "search", "value": "?profile=r/p.h5&t0=1"}]}
    assert callback_profile(json.dumps(body).encode()) == "r/p.h5"
    assert callback_profile(b"[1, 2") == "" and callback_profile(b"[]") == ""


@pytest.mark.parametrize("budget", [RequestStopped(2.0), MemoryError()])
def test_a_budget_spent_outside_a_callback_is_a_503_with_one_line(
        tmp_path: Path, budget: BaseException) -> None:
    from popviz_app import create_app

    app = create_app(tmp_path, vetter=False)

    @app.server.route("/spent")
    def spent() -> str:  # as if stopped while Dash serialised its answer
        raise budget

    reply = app.server.test_client().get("/spent")
    text = reply.get_data(as_text=True)
    assert reply.status_code == 503 and text.count("\n") == 1
    assert ("took longer than 2 s and was stopped" in text if isinstance(
        budget, RequestStopped) else "needed more memory than the server may use" in text)
