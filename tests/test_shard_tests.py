"""scripts/shard_tests.py, the runner `make test` uses: files balanced over shards by
their recorded seconds, a failing or silent shard failing the run, seconds per file read
back from JUnit reports."""

from __future__ import annotations

import importlib.util
import signal
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shards() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shard_tests", ROOT / "scripts/shard_tests.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["shard_tests"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_longest_file_first_onto_the_lightest_shard(shards: ModuleType) -> None:
    durations = {"a": 100.0, "b": 60.0, "c": 50.0, "d": 40.0, "e": 10.0}
    out = shards.balance(sorted(durations), durations, 2)
    # by hand: a -> 1 (100); b -> 2 (60); c -> 2 (110); d -> 1 (140); e -> 2 (120)
    assert [s.files for s in out] == [["a", "d"], ["b", "c", "e"]]
    assert [s.seconds for s in out] == [140.0, 120.0]
    # an unknown file weighs the median of the known; more shards than files: no empties
    out = shards.balance(["a", "new"], {"a": 5.0}, 3)
    assert [(s.files, s.seconds) for s in out] == [(["a"], 5.0), (["new"], 5.0)]


def test_every_test_file_is_in_one_shard(shards: ModuleType) -> None:
    files = shards.suite_files()
    assert "tests/test_shard_tests.py" in files and "tests/browser/test_app_browser.py" in files
    out = shards.balance(files, shards.load_durations(), 2)
    placed = [f for s in out for f in s.files]
    assert sorted(placed) == files and len(placed) == len(set(placed))


def test_a_failing_shard_fails_the_run_and_says_which(shards: ModuleType, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    ok, bad = tmp_path / "test_ok.py", tmp_path / "test_bad.py"
    ok.write_text("def test_ok():\n    assert True\n")
    bad.write_text("def test_bad():\n    assert 1 == 2\n")
    out = [shards.Shard(1, [str(ok)]), shards.Shard(2, [str(bad)])]
    shards.run(out, ["-q"], limit_s=120, work=tmp_path / "work")
    assert [s.returncode for s in out] == [0, 1]
    assert "1 passed" in out[0].summary and "1 failed" in out[1].summary
    assert "[2] " in capsys.readouterr().out
    times = shards.measured_durations(out)
    # JUnit names the files from pytest's root (here a folder above tmp_path)
    assert sorted(Path(name).name for name in times) == ["test_bad.py", "test_ok.py"]
    # the failed test is named again at the end, with its message, where a log's tail shows it
    (line,) = shards.failures(out)
    assert line.startswith("[2] ") and "test_bad" in line and "assert 1 == 2" in line


def test_a_shard_past_the_limit_is_killed(shards: ModuleType, tmp_path: Path) -> None:
    slow = tmp_path / "test_slow.py"
    slow.write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    out = [shards.Shard(1, [str(slow)])]
    started = time.monotonic()
    shards.run(out, ["-q", "-p", "no:timeout"], limit_s=3, work=tmp_path / "work")
    assert out[0].timed_out and out[0].returncode != 0
    assert time.monotonic() - started < 30


def test_a_shard_is_killed_at_once_when_ctrl_c_is_ignored(shards: ModuleType,
                                                          tmp_path: Path) -> None:
    """Started as `trap '' INT; bash .ci/run`, the shards ignore SIGINT too: a timed-out
    one is killed without waiting out the grace period for an interrupt it cannot see."""
    slow = tmp_path / "test_slow.py"
    slow.write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    out = [shards.Shard(1, [str(slow)])]
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        started = time.monotonic()
        shards.run(out, ["-q", "-p", "no:timeout"], limit_s=3, work=tmp_path / "work")
        took = time.monotonic() - started
    finally:
        signal.signal(signal.SIGINT, before)
    assert out[0].timed_out and out[0].returncode == -signal.SIGKILL
    assert took < 15, took  # 3 s limit, no 20 s grace


def test_seconds_per_file_from_junit(shards: ModuleType, tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.test_x" name="test_a" time="1.5"/>'
        '<testcase classname="tests.test_x" name="test_b" time="2.0"/>'
        '<testcase classname="tests.browser.test_y.TestPage" name="test_c" time="4.25"/>'
        '</testsuite></testsuites>')
    shard = shards.Shard(1, junit=report)
    assert shards.measured_durations([shard]) == {"tests/browser/test_y.py": 4.2,
                                                   "tests/test_x.py": 3.5}
