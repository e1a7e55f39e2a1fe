"""The CLI vets a profile in a worker before opening it: a file that crashes libhdf5 is one
line and exit code 1, not a segfault; the verdict is cached on disk per file stamp."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from popviz.cli import vetcache
from popviz.cli.main import main
from popviz.format import write_report
from popviz.vet import stamp_of
from tooling.testing.synthetic import synthetic_report

# popviz.open succeeds on it, then reading its tables kills the process with SIGSEGV.
FLIPPED = Path(__file__).parent / "data" / "flipped_segv.h5"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli_vet") / "good.h5"
    write_report(synthetic_report(num_ipus=2, events=300, steps=30, seed=3), path)
    return path


def popviz_cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    return subprocess.run([sys.executable, "-m", "popviz.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["summary", "export", "compare"])
def test_a_1_0_file_that_crashed_libhdf5_is_one_line_and_exit_1(
        command: str, good: Path, tmp_path: Path) -> None:
    flipped = tmp_path / "flipped.h5"
    shutil.copy(FLIPPED, flipped)
    args = {"summary": ["summary", str(flipped)],
            "export": ["export", str(flipped), "--to", str(tmp_path / "out")],
            "compare": ["compare", str(good), str(flipped)]}[command]
    for _ in range(2):  # the second run answers from the cached verdict
        proc = popviz_cli(*args, cache=tmp_path / "cache")
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr
        assert lines[0].startswith(f"popviz: error: {flipped}: profile format 1.0.0")
    assert not (tmp_path / "out").exists()
    # --no-vet opens it in-process: it used to kill the command (signal 11); refused by
    # its version first, it is one line now
    if command == "summary":
        proc = popviz_cli("summary", "--no-vet", str(flipped), cache=tmp_path / "cache")
        assert proc.returncode == 1 and "regenerate" in proc.stderr, proc.stderr


def test_a_good_profile_is_vetted_once_then_answered_from_the_cache(
        good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls: list[str] = []
    real_vet = vetcache.vetting.vet_or_refuse

    def counting(path: str, timeout_s: float, memory_mb: int) -> object:
        calls.append(path)
        return real_vet(path, timeout_s, memory_mb)

    monkeypatch.setattr(vetcache.vetting, "vet_or_refuse", counting)
    assert main(["summary", str(good)]) == 0
    first = capsys.readouterr().out
    assert calls == [os.path.realpath(good)]
    cached = vetcache.verdict_file(stamp_of(good))
    assert cached.parent == tmp_path / "popviz" and cached.is_file()
    assert main(["summary", str(good)]) == 0
    assert calls == [os.path.realpath(good)]  # no second worker
    assert capsys.readouterr().out == first
    os.utime(good, ns=(1, 1))  # a changed file is a new stamp: vetted again
    assert main(["summary", str(good)]) == 0
    assert len(calls) == 2


def test_no_vet_and_an_unwritable_cache_folder(
        good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def no_worker(*_args: object) -> object:
        raise AssertionError("--no-vet must not start a worker")

    monkeypatch.setattr(vetcache.vetting, "vet_or_refuse", no_worker)
    assert main(["summary", "--no-vet", str(good)]) == 0
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert main(["summary", str(good)]) == 0  # vetted, just not remembered
    assert not (tmp_path / "cache").exists()
