"""Many threads on a cold server (issue: a fresh `popviz serve` stopped answering when
fifty clients built the same profiles' pages at once)."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest
from popviz_app import create_app, render
from popviz_app.cache import Entry
from popviz_app.pages.compare import body as compare_body

from popviz.format import write_report
from tooling.testing.synthetic import synthetic_report

PAGES = ("/summary", "/trace", "/liveness", "/memory", "/stages", "/exchange", "/operations")


def _run_threads(target: Any, n: int, timeout_s: float) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # reported below, with the thread's index
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    stuck = [t for t in threads if t.is_alive()]
    assert not stuck, f"{len(stuck)} of {n} threads still running after {timeout_s} s"
    return errors


def test_a_build_may_ask_for_another_key_of_its_entry() -> None:
    entry = Entry(profile=None, rel="p")

    def outer() -> int:
        return entry.get("inner", lambda: 2) * 10

    result: list[int] = []
    _run_threads(lambda _: result.append(entry.get("outer", outer)), 1, 5)
    assert result == [20]


def test_each_key_is_built_once_while_other_keys_build_in_parallel() -> None:
    entry = Entry(profile=None, rel="p")
    builds: dict[str, int] = {}
    slow_started, release = threading.Event(), threading.Event()

    def slow() -> str:
        builds["slow"] = builds.get("slow", 0) + 1
        slow_started.set()
        assert release.wait(5)
        return "slow"

    def fast() -> str:
        builds["fast"] = builds.get("fast", 0) + 1
        return "fast"

    def work(i: int) -> None:
        if i < 4:
            assert entry.get("slow", slow) == "slow"
        else:
            assert slow_started.wait(5)
            assert entry.get("fast", fast) == "fast"  # not held up by the slow build
            if i == 7:
                release.set()

    assert not _run_threads(work, 8, 10)
    assert builds == {"slow": 1, "fast": 1}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cold")
    for i in range(4):
        write_report(synthetic_report(num_ipus=2, events=2000, steps=120, seed=i),
                     root / f"run{i}" / "profile.h5")
    return root


def test_a_cold_server_survives_many_threads_building_every_page(served: Path) -> None:
    app = create_app(served, cache_size=3)  # fewer entries than profiles: evictions too
    ctx = app.popviz_context
    rels = [f"run{i}/profile.h5" for i in range(4)]
    calls = app.popviz_callbacks

    def work(i: int) -> None:
        rnd = random.Random(i)
        for _ in range(4):
            rel = rnd.choice(rels)
            choice = rnd.randrange(4)
            if choice == 0:
                compare_body(ctx, rel, rnd.choice(rels))
            elif choice == 1:
                calls["trace.zoom"]({"xaxis.range[0]": 0, "xaxis.range[1]": 5e5},
                                    f"?profile={rel}")
            elif choice == 2:
                calls["liveness.heat"](rnd.randrange(2), None, f"?profile={rel}")
            else:
                render(ctx, rnd.choice(PAGES), f"?profile={rel}")
        ctx.cache.listing()

    errors = _run_threads(work, 16, 120)  # 64 builds over 4 profiles, 3 cache entries
    assert not errors, errors[:3]
    assert "Liveness" in str(render(ctx, "/liveness", f"?profile={rels[0]}"))


def test_comparisons_do_not_pile_up_as_the_other_profile_is_evicted(served: Path) -> None:
    """B is evicted and reopened as other profiles are viewed; A keeps one comparison with
    it (keyed by B's file stamp), not one per reopening (the bench's RSS grew with them)."""
    app = create_app(served, cache_size=3, vetter=False)
    ctx = app.popviz_context
    a, b, c, d = (f"run{i}/profile.h5" for i in range(4))
    for _ in range(3):
        compare_body(ctx, a, b)
        ctx.cache.get(a)
        ctx.cache.get(c)
        ctx.cache.get(d)  # evicts b, the least recently used
    entry_a = ctx.cache.get(a)
    assert [k for k in entry_a.derived if k[0] == "compare"] == [
        ("compare", b, ctx.cache.get(b).stamp, None)]  # None: both questions (no judge)
