"""`popviz serve` in production: waitress, Host checks, the access token off loopback; and
`popviz summary` starting without torch."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from popviz_app import access, create_app

from popviz.format import write_report
from tests.dash_http import find, payload
from tests.serve_util import start_serve, stop
from tooling.testing.synthetic import synthetic_report

REPO = Path(__file__).resolve().parents[1]
GOOD = "run/profile.h5"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("serve")
    write_report(synthetic_report(num_ipus=2, events=300, steps=30, seed=5), folder / GOOD)
    return folder


def test_summary_does_not_import_torch(root: Path) -> None:
    code = ("import sys; from popviz.cli.main import main; "
            f"assert main(['summary', {str(root / GOOD)!r}]) == 0; "
            "print('torch loaded' if 'torch' in sys.modules else 'no torch')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("no torch")


def _guarded_client(root: Path, token: str | None) -> Any:
    app = create_app(root, vetter=False)
    access.install(app.server, "0.0.0.0", token, ["popviz.example"])
    return app.server.test_client()


def test_host_header_must_name_this_server(root: Path) -> None:
    client = _guarded_client(root, None)
    for host, status in (("localhost:8050", 200), ("127.0.0.1:8050", 200),
                         ("[::1]:8050", 200), ("popviz.example:8050", 200),
                         ("evil.example", 400), ("evil.example:8050", 400)):
        reply = client.get("/", headers={"Host": host})
        assert reply.status_code == status, host
    assert "--allow-host" in client.get("/", headers={"Host": "evil.example"}).get_data(
        as_text=True)


def test_token_guards_pages_callbacks_and_downloads(root: Path) -> None:
    client = _guarded_client(root, "s3cret")
    deps_url, csv_url = "/_dash-dependencies", f"/download/csv/ops?profile={GOOD}"
    for url in ("/", "/summary", deps_url, csv_url, "/?token=wrong"):
        assert client.get(url).status_code == 401, url
    body = {"output": "page.children", "outputs": {"id": "page", "property": "children"},
            "inputs": [], "changedPropIds": []}
    assert client.post("/_dash-update-component", json=body).status_code == 401
    # the header is enough for scripts
    assert client.get(csv_url, headers={access.HEADER: "s3cret"}).status_code == 200
    # ?token= once: a cookie, and a redirect to the same page without the token
    first = client.get(f"/summary?profile={GOOD}&token=s3cret")
    assert first.status_code == 303
    assert first.headers["Location"].endswith("/summary?profile=run%2Fprofile.h5")
    assert "popviz_token=s3cret" in first.headers["Set-Cookie"]
    assert "HttpOnly" in first.headers["Set-Cookie"]
    assert client.get("/summary").status_code == 200  # the cookie now rides along
    deps = client.get(deps_url).get_json()
    reply = client.post("/_dash-update-component", json=payload(
        find(deps, "page.children"), {"url.pathname": "/summary",
                                      "url.search": f"?profile={GOOD}"}))
    assert reply.status_code == 200
    assert f"{GOOD} · " in json.dumps(reply.get_json(), ensure_ascii=False)  # the page title
    assert client.get(csv_url).status_code == 200


def _get(url: str, **headers: str) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode(), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def test_serve_runs_on_waitress_with_limits(root: Path) -> None:
    proc, port = start_serve(root)
    try:
        status, _, headers = _get(f"http://127.0.0.1:{port}/")
        assert status == 200 and headers.get("Server") == "popviz"  # waitress' ident
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /_dash-update-component HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 2097152\r\n"
                         b"\r\n" + b"x" * 1024)
            head = sock.recv(200).decode("latin-1")
        assert head.startswith("HTTP/1.1 413")  # request body over the limit, refused
        assert _get(f"http://127.0.0.1:{port}/", Host="evil.example")[0] == 400
    finally:
        out, _ = stop(proc)
    assert f"http://127.0.0.1:{port}/ " in out and "token" not in out


def test_serve_off_loopback_warns_and_requires_a_generated_token(root: Path) -> None:
    proc, port = start_serve(root, "--host", "0.0.0.0")
    try:
        time.sleep(0.5)
        assert _get(f"http://127.0.0.1:{port}/")[0] == 401
    finally:
        out, err = stop(proc)
    assert "warning: listening on 0.0.0.0, not loopback" in err
    token = out.split("?token=")[1].split()[0]
    assert len(token) >= 24


def _post(port: int, body: bytes, kind: str = "application/json") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/_dash-update-component",
                                     data=body, headers={"Content-Type": kind})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_malformed_callback_bodies_get_a_400_with_one_line(root: Path) -> None:
    proc, port = start_serve(root)
    try:
        deps = json.loads(_get(f"http://127.0.0.1:{port}/_dash-dependencies")[1])
        good = payload(find(deps, "page.children"), {"url.pathname": "/", "url.search": ""})
        cases: list[tuple[bytes, str, str]] = [
            (b"{not json", "application/json", "not JSON (JSONDecodeError)"),
            (b"\xff\xfe{", "application/json", "not JSON (UnicodeDecodeError)"),
            (b"[" * 100_000 + b"]" * 100_000, "application/json", "not JSON (RecursionError)"),
            (b'{"output": "page.children"}', "text/plain", "Content-Type: application/json"),
            (b"[]", "application/json", "a JSON object, not array"),
            (b"null", "application/json", "a JSON object, not null"),
            (b"{}", "application/json", "names its 'output'"),
            (json.dumps({**good, "output": "nope.children"}).encode(), "application/json",
             "no callback outputs 'nope.children'"),
            (json.dumps({**good, "outputs": "x"}).encode(), "application/json",
             "'outputs' must be a list of"),
            (json.dumps({**good, "inputs": good["inputs"][:1]}).encode(), "application/json",
             "'inputs' must be a list of"),
            (json.dumps({**good, "inputs": [1] * len(good["inputs"])}).encode(),
             "application/json", "inputs[0]: number, not an object"),
            (json.dumps({**good, "state": "x"}).encode(), "application/json",
             "'state' must be a list of 0"),
            (json.dumps({**good, "changedPropIds": 5}).encode(), "application/json",
             "'changedPropIds' must be a list of strings"),
        ]
        for body, kind, expected in cases:
            status, text = _post(port, body, kind)
            assert status == 400 and expected in text, (body[:60], status, text[:200])
            assert text.startswith("popviz: ") and len(text.strip().splitlines()) == 1
        status, text = _post(port, json.dumps(good).encode())  # the real one still works
        assert status == 200 and "profile-table" in text
    finally:
        out, err = stop(proc)
    assert "Traceback" not in out + err
