"""A live `popviz serve` on a free loopback port, and Debian's Chromium driven by Playwright."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serve_util import start_serve, stop

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
BROKEN = "broken/truncated.h5"


def _profiles_dir(tmp: Path) -> Path:
    """A copy of profiles/ (or synthetic profiles while it is empty) plus a broken file."""
    served = tmp / "served"
    source = ROOT / "profiles"
    if any(source.rglob("*.h5")):
        shutil.copytree(source, served, ignore=shutil.ignore_patterns("*.tmp*"))
    else:
        from popviz.format import write_report
        from tooling.testing.synthetic import synthetic_report

        write_report(synthetic_report(oom_ipu=1, model="synthetic-oom"),
                     served / "pipeline_oom" / "profile.h5")
        write_report(synthetic_report(num_ipus=2, target="mk1", seed=3, recomputation=True,
                                      model="synthetic-fits"),
                     served / "run" / "training" / "profile.h5")
    broken = served / BROKEN
    broken.parent.mkdir(parents=True, exist_ok=True)
    good = next(served.rglob("*.h5")).read_bytes()
    broken.write_bytes(good[: len(good) // 3])  # a real HDF5 header, cut short
    return served


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _profiles_dir(tmp_path_factory.mktemp("browser"))


@pytest.fixture(scope="session")
def base_url(served: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`popviz serve` itself (waitress with its 1 MiB body limit, vetting workers), not an
    in-process werkzeug server that accepts any request: a callback whose request is too
    big must fail here as it does for users (issue 21)."""
    yield from serving(served, tmp_path_factory)


def serving(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`popviz serve folder` for a fixture: its URL while the fixture lives, its log in a
    temporary folder."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    with log_path.open("w") as log:
        proc, port = start_serve(folder, log=log)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(proc)


@pytest.fixture(scope="session")
def browser_context(browser: Any) -> Iterator[Any]:
    """One context for the whole session, so Plotly's bundle downloads once."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        yield context
    finally:
        context.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        # CI must not pass without its browser tests: missing Chromium fails, unless the
        # skip is asked for by name
        if os.environ.get("POPVIZ_SKIP_BROWSER") == "1":
            pytest.skip(f"{CHROMIUM} is not installed (POPVIZ_SKIP_BROWSER=1)")
        pytest.fail(f"{CHROMIUM} is not installed: `make system-deps` installs it (or set "
                    "POPVIZ_SKIP_BROWSER=1 to skip the browser tests knowingly)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
