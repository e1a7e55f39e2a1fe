"""/tune runs its search in the background (one job per profile, bounded), polls it, and
serves a compared plan from memory under a virtual name: nothing is written into the
served folder."""

from __future__ import annotations

import math
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from popviz_app import create_app, render
from popviz_app.pages import compare as compare_page
from popviz_app.pages import tune as tune_page
from popviz_app.tune_jobs import FULL, TuneJob, TuneJobs

from tests.dash_util import component_text as _text
from tests.dash_util import find_components

ROOT = Path(__file__).resolve().parent.parent / "profiles"
REL = "tutorial_pipelined/training/profile.h5"


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_jobs_one_per_profile_and_bounded() -> None:
    jobs = TuneJobs(max_running=1, max_queued=2)
    gate = threading.Event()
    first = jobs.start("a", 4, lambda: gate.wait(5) and "A")
    again = jobs.start("a", 8, lambda: "other budget")  # same profile: the running one
    assert again is first
    jobs.start("b", 4, lambda: "B")
    with pytest.raises(RuntimeError, match="already waiting"):
        jobs.start("c", 4, lambda: "C")
    assert first.state in ("queued", "running") and "s" in first.progress()
    gate.set()
    deadline = time.monotonic() + 10
    while jobs.get("b", 4).state != "done" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.result == "A" and jobs.get("b", 4).result == "B"
    failed = TuneJobs().start("d", 2, lambda: (_ for _ in ()).throw(ValueError("bad plan")))
    for _ in range(100):
        if failed.state == "error":
            break
        time.sleep(0.02)
    assert failed.error == "bad plan"


def test_tune_page_runs_in_background_and_compares_from_memory(tmp_path: Path) -> None:
    if not (ROOT / REL).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    shutil.copytree(ROOT / "tutorial_pipelined", tmp_path / "tutorial_pipelined")
    before = _files(tmp_path)
    app = create_app(tmp_path)
    ctx = app.popviz_context
    entry = ctx.cache.get(REL)
    assert "Press Run tune" in _text(render(ctx, "/tune", f"?profile={REL}")[1])
    t0 = time.monotonic()
    job = ctx.tune_jobs.start(REL, 4, lambda: tune_page.run_tune(entry.profile,
                                                                 max_compiles=4))
    assert time.monotonic() - t0 < 0.5  # the request does not wait for the search
    shown, done = tune_page.poll(ctx, entry, 4)
    if not done:
        assert "Compiling up to 4 plans" in _text(shown[0]) or "Waiting" in _text(shown[0])
    deadline = time.monotonic() + 120
    while job.state not in ("done", "error") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job.state == "done", job.error
    shown, done = tune_page.poll(ctx, entry, 4)
    assert done and "compiles" in _text(shown[0])
    go = tune_page.link_to_compare(ctx, REL, 1, 4)
    assert go.href.startswith("/compare?profile=%40tune%2F")
    plan_rel = tune_page._plan_rel(entry, 4, 1)
    a, b = compare_page.pair_of(go.href.split("/compare", 1)[1])
    assert (a, b) == (plan_rel, REL)
    shown = compare_page.body(ctx, a, b)
    text = " ".join(_text(x) for x in shown)
    assert "error" not in str(shown[0]) and "samples/s" in text
    plan = ctx.cache.get(plan_rel).profile
    assert plan.summary["throughput"] == pytest.approx(job.result.candidates[0].throughput)
    assert _files(tmp_path) == before  # nothing written into the served folder


def _wait(job: Any, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while job.state not in ("done", "error") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.state == "done", job.error


def test_jobs_and_plan_names_are_keyed_by_the_ceiling() -> None:
    jobs = TuneJobs()
    full = jobs.start("a", 4, lambda: "at 100")
    _wait(full)
    capped = jobs.start("a", 4, lambda: "at 60", 60)
    assert capped is not full and (full.fill, capped.fill) == (100, 60)
    _wait(capped)
    assert jobs.get("a", 4).result == "at 100" and jobs.get("a", 4, 60).result == "at 60"
    assert jobs.get("a", 4, 50) is None and jobs.get("a", 8, 60) is None
    assert jobs.start("a", 4, lambda: "again", 60) is capped  # kept: not searched again
    running = TuneJob("a", 4, 60, state="running", started_at=time.monotonic())
    assert "every tile at most 60% full" in running.progress()
    assert "at most" not in TuneJob("a", 4, state="running").progress()
    entry = SimpleNamespace(rel="run/profile.h5")
    # a 100 % plan keeps the name plans always had; a ceiling is part of the name
    assert tune_page._plan_rel(entry, 4, 1) == "@tune/run/profile.h5/budget4/plan1"
    assert tune_page._plan_rel(entry, 4, 1, 60) == "@tune/run/profile.h5/budget4/fill60/plan1"
    assert len({tune_page._plan_rel(entry, 4, 1, f) for f in (100, 60, 59)}) == 3


def test_the_fill_input_is_a_whole_percent_or_no_ceiling() -> None:
    assert [tune_page._fill(v) for v in (60, "60", 59.6, 1, 100)] == [60, 60, 60, 1, 100]
    for bad in (None, "", "abc", 0, 0.5, 101, -5, float("nan"), float("inf"), [60]):
        assert tune_page._fill(bad) == 100, bad


def _table(shown: list[Any]) -> list[dict]:
    return next(c for c in shown if getattr(c, "id", None) == "tune-plans").data


def test_a_run_at_a_ceiling_shows_it_and_compares_its_own_plan(tmp_path: Path) -> None:
    if not (ROOT / REL).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    shutil.copytree(ROOT / "tutorial_pipelined", tmp_path / "tutorial_pipelined")
    ctx = create_app(tmp_path).popviz_context
    entry = ctx.cache.get(REL)
    profile = entry.profile
    full = ctx.tune_jobs.start(REL, 3, lambda: tune_page.run_tune(profile, max_compiles=3))
    _wait(full)
    # the smallest whole percent the current layout fits under: a ceiling that bites
    fill = math.ceil(max(full.result.baseline.max_tile_fill) * 100)
    assert fill < 100
    capped = ctx.tune_jobs.start(REL, 3, lambda: tune_page.run_tune(
        profile, max_compiles=3, max_tile_fill=fill / 100), fill)
    _wait(capped)
    assert capped is not full and capped.result.max_tile_fill == fill / 100
    shown, done = tune_page.poll(ctx, entry, 3, fill)
    text = " ".join(_text(x) for x in shown)
    assert done and f"fits = every tile at most {fill}% full" in text
    assert "every tile at most" not in " ".join(_text(x) for x in tune_page.poll(
        ctx, entry, 3)[0])
    plans = [full.result.baseline, *capped.result.candidates]
    for row, c in zip(_table(shown), plans, strict=True):
        assert (row["fits"] == "yes") == (max(c.max_tile_fill) <= fill / 100), row
    buttons = next(c for c in shown if getattr(c, "id", None) == "tune-links").children[1:]
    assert buttons[0].id == {"type": "tune-compare", "rank": 1, "budget": 3, "fill": fill}
    # each run's plan #1 is served under its own name, compiled from its own result
    go = tune_page.link_to_compare(ctx, REL, 1, 3, fill)
    plan_rel, other = compare_page.pair_of(go.href.split("/compare", 1)[1])
    assert plan_rel == tune_page._plan_rel(entry, 3, 1, fill) and other == REL
    assert f"/fill{fill}/" in plan_rel
    served = ctx.cache.get(plan_rel).profile
    assert served.summary["throughput"] == pytest.approx(capped.result.candidates[0].throughput)
    assert tune_page.link_to_compare(ctx, REL, 1, 3).href != go.href
    # a reload shows the run last asked for again, its budget and fill in the inputs
    page = render(ctx, "/tune", f"?profile={REL}")[1]
    inputs = {c.id: c.value for c in find_components(page, "Input")}
    assert (inputs["tune-budget"], inputs["tune-fill"]) == (3, fill)
    store = next(c for c in find_components(page, "Store") if c.id == "tune-job")
    assert store.data == {"budget": 3, "fill": fill}
    assert f"fits = every tile at most {fill}% full" in _text(page)
    assert ctx.tune_jobs.start(REL, 3, lambda: "kept", FULL) is full  # asked for again
    page = render(ctx, "/tune", f"?profile={REL}")[1]
    assert {c.id: c.value for c in find_components(page, "Input")}["tune-fill"] == FULL
    assert "every tile at most" not in _text(page)
    assert "Run tune first" in _text(tune_page.link_to_compare(ctx, REL, 1, 3, fill - 1))


def test_a_search_that_found_no_other_layout_says_so() -> None:
    """A run whose budget found nothing besides the current layout says so and what to do;
    its table holds the current layout alone, which read like an empty result."""
    found = SimpleNamespace(candidates=[], layouts=0, compiles=3, seconds=1.24, num_ipus=4,
                            target="mk2")
    head = tune_page._head(found, gpu=False)
    assert head.startswith("No layout besides the current one came out of 3 compiles")
    assert "4 IPUs on mk2" in head and "raise the compile budget" in head
    found.candidates, found.layouts, found.num_ipus = ["plan"], 7, 1
    head = tune_page._head(found, gpu=True)
    assert head.startswith("7 layouts in 3 compiles (1.2 s) for 1 GPU on mk2.")
