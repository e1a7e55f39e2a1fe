"""A page whose profile is still being vetted says so, then shows itself without a reload
(issue 22): its own `popviz serve` with a queue of files whose vetting hangs and a
wanted file whose vetting takes 4 s, longer than the 2 s a request waits."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from popviz.format import write_report
from popviz.vet import SIMULATE_ENV
from tests.serve_util import start_serve
from tests.test_serve_vetting import stop_with_workers
from tooling.testing.synthetic import synthetic_report

pytestmark = pytest.mark.browser


def test_a_page_being_checked_polls_until_it_shows(
        browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write_report(synthetic_report(num_ipus=2, events=300, steps=30, seed=1),
                         tmp_path / "a-slow-0" / "profile.h5")
    for name in ("a-slow-1", "a-slow-2", "z-want"):
        (tmp_path / name).mkdir()
        # copies, not hard links: one file's links share one vetting (popviz.vet)
        shutil.copyfile(first, tmp_path / name / "profile.h5")
    monkeypatch.setenv(SIMULATE_ENV, "hang:slow,slow:want")
    proc, port = start_serve(tmp_path, "--vet-timeout", "30")
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    try:
        page.goto(f"http://127.0.0.1:{port}/summary?profile=z-want/profile.h5")
        page.wait_for_selector(".message.info", timeout=30_000)
        assert "being checked" in page.inner_text(".message.info")
        url = page.url
        page.wait_for_selector("text=z-want/profile.h5 · ", timeout=60_000)  # the title
        assert page.url == url and page.locator(".message.info").count() == 0
    finally:
        page.close()
        stop_with_workers(proc)
