"""/tune runs its search in the background (one job per profile, bounded), polls it, and
serves a compared plan from memory under a virtual name: nothing is written into the
served folder."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
from popviz_app import create_app, render
from popviz_app.pages import compare as compare_page
from popviz_app.pages import tune as tune_page
from popviz_app.tune_jobs import TuneJobs

from tests.dash_util import component_text as _text

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
