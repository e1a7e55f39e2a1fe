"""No blank 500s: one bad file, a bad name or a failing view is a one-line message on the
page, in the callback's response and in downloads, with paths relative to the folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import h5py
import pytest
from popviz_app import create_app
from popviz_app.pages import trace as trace_page

from popviz.format import write_report
from tests.dash_http import find, payload
from tooling.testing.synthetic import synthetic_report

GOOD = "good/profile.h5"
META42 = "meta42/profile.h5"
NUL = "a\x00b"
LONG = "x" * 5000


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("errors")
    write_report(synthetic_report(num_ipus=2, events=300, steps=30, seed=3), folder / GOOD)
    (folder / "meta42").mkdir()
    shutil.copy(folder / GOOD, folder / META42)
    with h5py.File(folder / META42, "r+") as h5:
        h5.attrs["meta"] = "42"  # valid JSON, not an object
    return folder


@pytest.fixture(scope="module")
def client(root: Path) -> Any:
    app = create_app(root, vetter=False)  # vetting has its own tests (test_vet.py)
    return app.server.test_client()


@pytest.fixture(scope="module")
def deps(client: Any) -> list[dict[str, Any]]:
    return client.get("/_dash-dependencies").get_json()


def _call(client: Any, dep: dict[str, Any], values: dict[str, Any]) -> tuple[int, str]:
    reply = client.post("/_dash-update-component", json=payload(dep, values))
    if reply.status_code != 200:
        return reply.status_code, reply.get_data(as_text=True)
    # re-dumped: Dash escapes '/' as \u002f, which would hide paths from the checks below
    return reply.status_code, json.dumps(reply.get_json(), ensure_ascii=False)


def _route(client: Any, deps: list[dict[str, Any]], path: str, search: str) -> tuple[int, str]:
    return _call(client, find(deps, "page.children"),
                 {"url.pathname": path, "url.search": search})


def test_one_profile_with_meta_42_does_not_blank_the_home_page(
        client: Any, deps: list[dict[str, Any]], root: Path) -> None:
    assert client.get("/").status_code == 200
    status, body = _route(client, deps, "/", "")
    assert status == 200
    assert "/summary?profile=good%2Fprofile.h5" in body  # the good profile is linked
    assert f"{META42}: damaged profile ('meta' is JSON int, not an object)" in body
    status, body = _call(client, find(deps, "home-list.children"), {"home-refresh.n_intervals": 1})
    assert status == 200 and "'meta' is JSON int" in body
    assert str(root) not in body


@pytest.mark.parametrize("path", ["/summary", "/trace", "/liveness", "/memory", "/stages",
                                  "/exchange", "/operations"])
def test_every_page_of_a_bad_file_or_name_is_a_message(
        client: Any, deps: list[dict[str, Any]], root: Path, path: str) -> None:
    for search, expected in ((f"?profile={META42}", "'meta' is JSON int, not an object"),
                             ("?profile=a%00b", "control characters in a profile path"),
                             (f"?profile={LONG}", "refused a profile path of 5,000 characters")):
        status, body = _route(client, deps, path, search)
        assert status == 200, (path, search, body[:300])
        assert expected in body and str(root) not in body


def test_downloads_of_bad_files_and_names_say_why(client: Any, root: Path) -> None:
    for query, expected in ((META42, "'meta' is JSON int"),
                            ("a%00b", "control characters"),
                            (LONG, "too long")):
        for url in (f"/download/csv/ops?profile={query}",
                    f"/download/html/trace?profile={query}"):
            reply = client.get(url)
            text = reply.get_data(as_text=True)
            assert reply.status_code == 404 and expected in text, (url[:60], text)
            assert len(text.splitlines()) == 1 and str(root) not in text
    assert client.get(f"/download/csv/ops?profile={GOOD}").status_code == 200


def test_callbacks_of_a_bad_file_answer_with_the_error(
        client: Any, deps: list[dict[str, Any]], root: Path) -> None:
    status, body = _call(client, find(deps, "ops-table.data", "ops-table.page_current"), {
        "ops-table.page_current": 1, "ops-table.page_size": 25, "ops-table.sort_by": [],
        "ops-table.filter_query": "", "url.search": f"?profile={META42}"})
    assert status == 200
    assert "callback-error" in body and "'meta' is JSON int" in body
    assert str(root) not in body
    # a real callback with an allow_duplicate output key works on the good file
    status, body = _call(client, find(deps, "mem-tiles.figure"),
                         {"mem-ipu.value": 1, "url.search": f"?profile={GOOD}"})
    assert status == 200 and "mem-breakdown" in body and "callback-error" not in body


def test_a_view_that_fails_after_the_profile_opened_is_a_line_not_a_500(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: Any, entry: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"boom while reading {entry.profile.path}")

    monkeypatch.setattr(trace_page, "trace", broken)
    monkeypatch.setitem(trace_page.FIGURES, "trace", broken)  # the HTML download's view
    client = create_app(root, vetter=False).server.test_client()
    deps = client.get("/_dash-dependencies").get_json()
    status, body = _route(client, deps, "/trace", f"?profile={GOOD}")
    assert status == 200
    assert f"{GOOD}: could not build this view (RuntimeError: boom while reading {GOOD})" \
        in body
    status, body = _call(client, find(deps, "trace-graph.figure", "trace-graph.relayoutData"), {
        "trace-graph.relayoutData": {"xaxis.range[0]": 0, "xaxis.range[1]": 1000},
        "url.search": f"?profile={GOOD}"})
    assert status == 200 and "callback-error" in body and "RuntimeError: boom" in body
    reply = client.get(f"/download/html/trace?profile={GOOD}")
    text = reply.get_data(as_text=True)
    assert reply.status_code == 422 and "RuntimeError: boom" in text
    assert str(root) not in body + text


@pytest.mark.parametrize(("query", "note"), [
    # a word typed in a number column's cell: DataTable sends `s=`, not `s>`
    ("{cycles} s= fast", "filter not understood, ignored: 'cycles' holds numbers; 'fast' is "
                         "not one"),
    ("{cycles} s> fast", "filter not understood, ignored: 'cycles' holds numbers; 'fast' is "
                         "not one"),
    ("{cycles} s= 0..1e15", " of "),
])
def test_the_ops_filter_answers_a_word_in_a_number_column_with_one_line(
        client: Any, deps: list[dict[str, Any]], query: str, note: str) -> None:
    status, body = _call(client, find(deps, "ops-note.children", "ops-table.filter_query"), {
        "ops-table.page_current": 0, "ops-table.page_size": 25, "ops-table.sort_by": [],
        "ops-table.filter_query": query, "url.search": f"?profile={GOOD}"})
    assert status == 200, body[:300]
    reply = json.loads(body)["response"]
    text = reply["ops-note"]["children"]
    assert note in text and "\n" not in text
    # a cell it cannot read is skipped (named in the note): the rows stay (issue 21)
    assert reply["ops-table"]["data"] and not text.startswith("0 of")
