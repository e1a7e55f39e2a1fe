"""read_isolated: a crash, a hang or a blow-up in the worker is a verdict, not the caller's
problem; a good file is ok and a bad one is the reader's ProfileError."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from popviz.format.isolated import OUTCOMES, read_isolated
from tests.test_format import write_tiny


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("isolated") / "run")


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_good_file_is_ok(good: Path, start: str) -> None:
    verdict = read_isolated(good, timeout_s=60, start=start,
                            probe="popviz.analysis.facts:profile_facts")
    assert verdict.outcome == "ok" and verdict.ok, verdict
    assert 10 << 20 < verdict.max_rss_bytes < 1 << 30


def test_a_forked_reader_reports_its_own_peak_not_its_parents(good: Path) -> None:
    # a fork is resident in its parent's pages from the start: a parent holding 1.2 GB
    # (a long test session, a fuzzer) made every reader 'over 1 GiB' in CI
    code = textwrap.dedent(f"""
        import numpy as np
        from popviz.format.isolated import read_isolated
        held = np.ones(150_000_000)  # 1.2 GB, touched
        verdict = read_isolated({str(good)!r}, timeout_s=60, start="fork")
        print(verdict.outcome, verdict.max_rss_bytes)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out[0] == "ok" and 0 < int(out[1]) < 300 << 20, out


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_bad_file_is_the_readers_profile_error(tmp_path: Path, start: str) -> None:
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not hdf5" * 100)
    verdict = read_isolated(bad, timeout_s=60, start=start)
    assert verdict.outcome == "profile_error"
    assert verdict.message == f"{bad}: not an HDF5 file, so not a popviz profile"


def test_segfault_is_a_crash(good: Path) -> None:
    verdict = read_isolated(good, timeout_s=30, probe="tests.isolated_probes:segfault",
                            start="fork")
    assert verdict.outcome == "crash" and verdict.signal == signal.SIGSEGV


def test_endless_loop_is_a_hang_and_killed_on_time(good: Path) -> None:
    began = time.monotonic()
    verdict = read_isolated(good, timeout_s=3, probe="tests.isolated_probes:loop_forever",
                            start="fork")
    assert verdict.outcome == "hang"
    assert 3 <= time.monotonic() - began < 15


def test_allocation_past_the_limit_is_memory(good: Path) -> None:
    verdict = read_isolated(good, timeout_s=60, memory_bytes=512 << 20,
                            probe="tests.isolated_probes:allocate", start="fork")
    assert verdict.outcome == "memory", verdict


def test_other_exceptions_are_errors_with_their_type(good: Path) -> None:
    verdict = read_isolated(good, timeout_s=60, probe="tests.isolated_probes:raise_type_error",
                            start="fork")
    assert verdict.outcome == "error"
    assert verdict.message == "TypeError: a bug, not a bad file"
    assert set(OUTCOMES) >= {verdict.outcome}
