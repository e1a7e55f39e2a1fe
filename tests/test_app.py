"""The Dash app without a browser: path safety, the profile cache, page layouts and the
callback functions called directly, downloads, and `popviz serve` argument errors."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from dash.exceptions import PreventUpdate
from popviz_app import PathRefused, ProfileCache, create_app, render, resolve_profile
from popviz_app.pages import PAGES

from popviz.cli.main import main
from popviz.format import ReportProfile, write_report
from tests.dash_util import component_text as _text
from tooling.testing.synthetic import synthetic_report

GOOD = "run/training/profile.h5"
OOM = "oom/profile.h5"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("served")
    write_report(synthetic_report(num_ipus=2, events=3000, steps=200, seed=2), root / GOOD)
    write_report(synthetic_report(oom_ipu=1, events=3000, steps=200), root / OOM)
    (root / "broken.h5").write_bytes(b"\x89HDF\r\n\x1a\n but cut short")
    return root


@pytest.fixture(scope="module")
def app(served: Path) -> Any:
    return create_app(served)


def _find(component: Any, kind: str) -> list[Any]:
    """Every component of a Dash type name below `component`."""
    found = [component] if type(component).__name__ == kind else []
    children = getattr(component, "children", None)
    if isinstance(children, (list, tuple)):
        for child in children:
            found += _find(child, kind)
    elif children is not None and not isinstance(children, (str, int, float)):
        found += _find(children, kind)
    return found




def test_resolve_profile_refuses_paths_outside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "p.h5").write_bytes(b"x")
    outside = tmp_path / "secret.h5"
    outside.write_bytes(b"x")
    os.symlink(outside, root / "link.h5")
    os.symlink(root / "a" / "p.h5", root / "inside.h5")
    assert resolve_profile(root, "a/p.h5") == (root / "a" / "p.h5").resolve()
    assert resolve_profile(root, "inside.h5") == (root / "a" / "p.h5").resolve()
    for rel, why in (("../secret.h5", "outside"), ("a/../../secret.h5", "outside"),
                     ("link.h5", "outside"), (str(outside), "relative"),
                     ("missing.h5", "no profile"), ("", "no profile chosen")):
        with pytest.raises(PathRefused, match=why):
            resolve_profile(root, rel)


def test_cache_is_a_bounded_lru_that_reopens_rewritten_files(served: Path) -> None:
    opened: list[Path] = []
    report = synthetic_report()

    def opener(path: Path) -> ReportProfile:
        opened.append(path)
        return ReportProfile(report, path.stem, path)

    cache = ProfileCache(served, capacity=1, opener=opener)
    first = cache.get(GOOD)
    assert cache.get(GOOD) is first and len(opened) == 1
    cache.get(OOM)
    assert len(cache) == 1
    assert cache.get(GOOD) is not first and len(opened) == 3  # evicted, so reopened
    path = served / GOOD
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    cache.get(GOOD)
    assert len(opened) == 4


def test_listing_shows_broken_files_and_picks_up_new_ones(served: Path, tmp_path: Path) -> None:
    cache = ProfileCache(served)
    rows = {r["profile"]: r for r in cache.listing()}
    assert rows["broken.h5"]["error"].startswith("broken.h5: ")  # no server path shown
    assert rows[OOM]["fits"] == "OOM (7 tiles)" and rows[GOOD]["fits"] == "fits"
    assert rows[GOOD]["run"] == "training" and rows[GOOD]["ipus"] == 2
    write_report(synthetic_report(num_ipus=1, events=200, steps=20), served / "new" / "p.h5")
    try:
        assert "new/p.h5" in {r["profile"] for r in cache.listing()}
    finally:
        (served / "new" / "p.h5").unlink()


def test_create_app_needs_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such directory"):
        create_app(tmp_path / "nope")


@pytest.mark.parametrize("page", [p for p in PAGES if p.NEEDS_PROFILE], ids=lambda p: p.PATH)
def test_every_page_renders_with_data(app: Any, page: Any) -> None:
    for rel in (GOOD, OOM):
        nav, body = render(app.popviz_context, page.PATH, f"?profile={rel}")
        assert _find(body, "Div") and not [d for d in _find(body, "Div")
                                            if getattr(d, "className", "") == "message error"]
        graphs = _find(body, "Graph")
        assert len(graphs) >= len(page.FIGURES) - 1  # tile_liveness may share one graph
        for g in graphs:
            assert len(g.figure.data) > 0, f"{page.PATH} {g.id} of {rel} is empty"
        links = [a.href for a in _find(nav, "Link")]
        assert f"{page.PATH}?profile={rel.replace('/', '%2F')}" in links


def test_render_refuses_escapes_and_lists_broken_files(app: Any) -> None:
    ctx = app.popviz_context
    for search, why in (("?profile=../../etc/passwd", "outside"),
                        ("?profile=/etc/passwd", "relative"),
                        ("?profile=broken.h5", "broken.h5"), ("", "no profile chosen")):
        assert why in _text(render(ctx, "/summary", search)[1])
    assert "No page /nope" in _text(render(ctx, "/nope", "")[1])
    home = _text(render(ctx, "/", "")[1])
    assert "broken.h5" in home and OOM in home


def test_summary_says_what_does_not_fit(app: Any) -> None:
    text = _text(render(app.popviz_context, "/summary", f"?profile={OOM}")[1])
    assert "OUT OF MEMORY · 7 tiles (IPU1: 7)" in text
    assert "lower availableMemoryProportion on IPU1" in text


def test_trace_zoom_callback_switches_level_of_detail(app: Any) -> None:
    zoom = app.popviz_callbacks["trace.zoom"]
    search = f"?profile={GOOD}"
    fig, status, window, stats, _links = zoom({"xaxis.range[0]": 0, "xaxis.range[1]": 2000},
                                              search)
    assert fig.layout.meta["mode"] == "events" and "every event drawn" in status
    assert window == {"range": [0, 2000], "how": "Shown window"}
    assert _text(stats[0]).startswith("Shown window: 0 to 2,000 cycles")
    fig, status, window, stats, links = zoom({"xaxis.autorange": True}, search)
    assert fig.layout.meta["mode"] == "buckets"
    # the statistics and links come with the figure, of the window it draws; a cleared
    # box selection brings back the same ones
    lo, hi = fig.layout.meta["range"]
    assert window["range"] == [lo, hi] and hi - lo > 2000
    head = _text(stats[0])
    assert head.startswith(f"Shown window: {lo:,.0f} to {hi:,.0f} cycles")
    assert _text(app.popviz_callbacks["trace.stats"](None, window, search)[0]) == head
    assert _text(app.popviz_callbacks["trace.follow"](None, window, search)) == _text(links)
    with pytest.raises(PreventUpdate):
        zoom({"autosize": True}, search)
    with pytest.raises(PathRefused):
        zoom({"xaxis.autorange": True}, "?profile=../x")


def test_liveness_callbacks(app: Any) -> None:
    cb = app.popviz_callbacks
    search = f"?profile={OOM}"
    # each IPU's panel has its own x-axis: a zoom on the second (IPU1) moves only it
    fig, held = cb["liveness.zoom_to"]({"xaxis2.range": [50, 80]}, search)
    assert list(fig.layout.xaxis2.range) == [50, 80] and held == {"1": [50, 80]}
    assert list(fig.layout.xaxis.range) != [50, 80]
    xs = [x for d in fig.data if d.name == "always-live" and d.xaxis == "x2" for x in d.x]
    assert min(xs) >= 49 and max(xs) <= 81
    # the heat map follows the panel's steps and the clicked IPU
    heat = cb["liveness.heat"](1, None, search, held)
    assert "IPU1" in heat.layout.title.text
    *_, picked = cb["liveness.click_at"](
        {"points": [{"x": 60, "customdata": ["op", "f", 1, 1]}]}, search)
    assert picked == 1
    head, box = cb["liveness.click"]({"points": [{"x": 100, "customdata": ["op", "f", 1, 1]}]},
                                     search)
    assert head.startswith("IPU1, step 100:")
    rows = _find(box, "DataTable")[0].data
    assert rows and all(r["first_step"] <= 100 <= r["last_step"] for r in rows)
    heat = cb["liveness.heat"](1, None, search)
    assert heat.data[0].z is not None and "IPU1" in heat.layout.title.text


def test_memory_callbacks(app: Any) -> None:
    cb = app.popviz_callbacks
    search = f"?profile={OOM}"
    tiles, tmap, _breakdown = cb["memory.pick_ipu"](2, search)
    assert "IPU2" in tiles.layout.title.text and "IPU2" in tmap.layout.title.text
    parts = cb["memory.pick_tile"]({"points": [{"x": 738}]}, None, 1, search)
    text = " ".join(_text(p) for p in parts)
    assert "Out of memory by" in text
    graph = _find(parts[0], "Graph")[0] if _find(parts[0], "Graph") else parts[0]
    assert "IPU1 tile 738" in graph.figure.layout.title.text
    parts = cb["memory.pick_tile"](None, {"points": [{"x": 2, "y": 1}]}, 0, search)
    assert "IPU0 tile 66" in parts[0].figure.layout.title.text


def test_operations_callback_filters_sorts_and_pages(app: Any) -> None:
    refresh = app.popviz_callbacks["operations.refresh"]
    search = f"?profile={OOM}"
    rows, pages, note = refresh(0, 10, [{"column_id": "cycles", "direction": "desc"}],
                                "{op_class} contains conv", search)
    assert len(rows) == 10 and all(r["op_class"] == "conv" for r in rows)
    assert [r["cycles"] for r in rows] == sorted((r["cycles"] for r in rows), reverse=True)
    total = int(note.split(" of ")[0].replace(",", ""))
    assert pages == -(-total // 10)
    rows, pages, note = refresh(0, 10, [], "{nope} = 3", search)
    # a cell it cannot read is named and skipped: the rows stay (issue 21)
    assert len(rows) == 10 and "filter not understood, ignored: no column 'nope'" in note


def test_downloads(app: Any) -> None:
    client = app.server.test_client()
    r = client.get(f"/download/csv/stages?profile={OOM}")
    assert r.status_code == 200 and "attachment" in r.headers["Content-Disposition"]
    frame = pd.read_csv(io.StringIO(r.get_data(as_text=True)))
    assert frame["forward_cycles"].tolist() == app.popviz_context.cache.get(OOM).profile.stages[
        "forward_cycles"].tolist()
    r = client.get(f"/download/html/trace?profile={OOM}")
    assert r.status_code == 200 and b"Plotly.newPlot" in r.data
    for page in PAGES:  # every figure a page offers downloads as a working HTML file
        for view in page.FIGURES:
            r = client.get(f"/download/html/{view}?profile={OOM}")
            if view == "exchange_stages":  # offered for measured jobs only: says it is empty
                assert r.status_code == 200 and b"No transfers between stages" in r.data
                continue
            assert r.status_code == 200 and re.search(rb'newPlot\([^,]+,\s*\[\{', r.data), view
    assert client.get("/download/csv/stages?profile=../../etc/passwd").status_code == 404
    assert client.get(f"/download/html/nope?profile={OOM}").status_code == 404
    assert client.get(f"/download/csv/nope?profile={OOM}").status_code == 404


def test_serve_reports_a_missing_directory(tmp_path: Path, capsys: Any) -> None:
    assert main(["serve", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such directory" in err[0]


def test_pages_explain_tables_a_measured_profile_lacks(tmp_path: Path) -> None:
    from popviz_app.common import AppContext

    report = synthetic_report(num_ipus=2, events=400, steps=20)
    for name in ("tile_memory", "liveness", "exchange", "oom", "variables"):
        report.tables[name] = report.tables[name].iloc[0:0]
    report.meta["kind"] = "measured"
    (tmp_path / "m.h5").write_bytes(b"stand-in; the opener below never reads it")
    cache = ProfileCache(tmp_path, opener=lambda p: ReportProfile(report, "m", str(p)))
    ctx = AppContext(root=tmp_path, cache=cache)
    texts = {p.PATH: _text(render(ctx, p.PATH, "?profile=m.h5")[1]) for p in PAGES}
    assert "no per-tile memory" in texts["/memory"]
    assert "no liveness report" in texts["/liveness"]
    # no transfers, but the trace's exchange events are listed, not denied (issue 21)
    assert "No transfers between ranks" in texts["/exchange"]
    assert "Exchange events in the trace" in texts["/exchange"]
    assert "unknown (a measured run records no per-tile memory)" in texts["/summary"]
    assert "fullest tiles" not in texts["/summary"]
    trace = _find(render(ctx, "/trace", "?profile=m.h5")[1], "Graph")[0].figure
    assert trace.layout.xaxis.title.text == "time (ns)"
    assert [t.split(" · ")[0] for t in trace.layout.yaxis.ticktext
            if " · " in t] == ["rank 0", "rank 1"]  # one lane group per rank


def test_a_static_table_shows_cells_as_the_sortable_table_does() -> None:
    from app.common import static_table

    frame = pd.DataFrame({"ipu": [1003, 2], "cycles": [1234567, 0], "share": [0.12345, 1.5],
                          "microbatch": [-1, 3], "fits": [True, False],
                          "op": ["aten.convolution_backward.default", "add"]})
    tab = static_table("t", frame)
    head = [th.children for th in tab.children[0].children.children]
    assert head[0] == "ipu"  # the profile's words for a column (an IPU profile: as is)
    rows = [[td.children for td in tr.children] for tr in tab.children[1].children]
    assert rows == [["1003", "1,234,567", "0.1235", "", "yes",
                     "aten.convolution_backward.default"],
                    ["2", "0", "1.5", "3", "no", "add"]]
    # each cell names its column as a DataTable's does; a long text keeps a tooltip
    cell = tab.children[1].children[0].children[5]
    assert cell.to_plotly_json()["props"]["data-dash-column"] == "op"
    assert cell.title == "aten.convolution_backward.default"


def test_shares_read_as_percent_and_sort_as_numbers() -> None:
    """A column of shares (busy_fraction, a tune plan's fullest tile) reads as the cards
    say it, 75.0%, in both tables, and stays a number: /tune's shares were text ("9 %"),
    which sorted "100 %" before "9 %"."""
    from app.common import static_table, table

    frame = pd.DataFrame({"stage": [0, 1], "busy_fraction": [0.75, 0.0625],
                          "fullest_tile": [1.0, 0.09], "load": [0.75, 1.25]})
    columns = {c["id"]: c for c in table("t", frame).columns}
    assert columns["busy_fraction"]["type"] == "numeric"
    assert columns["busy_fraction"]["format"]["specifier"] == ".1%"
    assert columns["fullest_tile"]["format"]["specifier"] == ".1%"
    assert columns["load"]["format"]["specifier"] == ",.4~f"  # a ratio, not a share
    rows = [[td.children for td in tr.children]
            for tr in static_table("s", frame).children[1].children]
    assert rows == [["0", "75.0%", "100.0%", "0.75"], ["1", "6.2%", "9.0%", "1.25"]]
