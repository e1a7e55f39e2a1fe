"""Issue 22: `import --to` keeps an existing profile unless --force; `merge` and `tune` vet
their input files in a worker first, as `summary` does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import popviz
from popviz.cli.main import main
from popviz.vet import SIMULATE_ENV
from tests.test_format import write_tiny

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "kineto_pipelining_interleaved_1rank.json.gz"
FLIPPED = ROOT / "tests" / "data" / "flipped_segv.h5"  # crashes libhdf5 once its tables are read
MODELLED = ROOT / "profiles" / "tutorial_pipelined" / "training" / "profile.h5"
CRASHED = "refused: reading it crashed a worker (signal 11, SIGSEGV)"


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("to", ["run", "run.h5"])
def test_import_keeps_an_existing_profile_without_force(
        to: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = write_tiny(tmp_path / to)
    before = target.read_bytes()
    assert main(["import", str(TRACE), "--to", str(tmp_path / to)]) == 1
    assert _one_line(capsys) == (f"popviz: error: {target}: a profile is already there; pass "
                                 "--force to replace it, or choose another --to")
    assert target.read_bytes() == before
    assert main(["import", str(TRACE), "--to", str(tmp_path / to), "--force"]) == 0
    capsys.readouterr()
    with popviz.open(target) as profile:
        assert profile.kind == "measured"


def test_import_into_a_new_place_needs_no_force(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(TRACE), "--to", str(tmp_path / "new")]) == 0
    assert (tmp_path / "new" / "profile.h5").is_file()


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A modelled profile that a vetting worker crashes on (popviz.vet's test hook); read
    in-process it is fine, so a command that skips vetting gets further and says otherwise."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(SIMULATE_ENV, "crash:hostile")
    path = tmp_path / "hostile" / "profile.h5"
    path.parent.mkdir()
    shutil.copy(MODELLED, path)
    return path


def test_tune_vets_its_profile(hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", str(hostile), "--no-progress", "--max-compiles", "2"]) == 1
    assert _one_line(capsys) == f"popviz: error: {hostile}: {CRASHED}"


def test_merge_vets_its_rank_files(hostile: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "merged"
    assert main(["merge", str(hostile), "--out", str(out)]) == 1
    assert _one_line(capsys) == f"popviz: error: {hostile}: {CRASHED}"
    assert main(["merge", str(hostile.parent), "--out", str(out)]) == 1  # found in a folder
    assert _one_line(capsys) == f"popviz: error: {hostile}: {CRASHED}"
    assert main(["merge", str(hostile), "--out", str(out), "--no-vet"]) == 1  # opened: read
    assert "a modelled profile; merge takes measured rank profiles only" in _one_line(capsys)
    assert not out.exists()


def test_merge_of_a_1_0_file_that_crashed_libhdf5_is_one_line(tmp_path: Path) -> None:
    flipped = tmp_path / "rank0" / "profile.h5"
    flipped.parent.mkdir()
    shutil.copy(FLIPPED, flipped)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "popviz.cli.main", "merge", str(tmp_path),
                           "--out", str(tmp_path / "m.h5")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and line.startswith(f"popviz: error: {flipped}: profile format "
                                                "1.0.0") and "regenerate" in line
