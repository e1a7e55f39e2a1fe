"""Issue 22: a full disk (ENOSPC) while exporting or writing a profile leaves nothing behind
under a final name, no temporary file, no lock; one line on stderr and exit code 1. Issue
34: the same on a real full disk (a small tmpfs), where libhdf5 used to segfault."""

from __future__ import annotations

import builtins
import errno
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import popviz.format.export as export_module
import popviz.format.writer as writer_module
from popviz.cli.main import main
from popviz.format import schema
from popviz.format.folder_lock import LOCK_NAME
from tests.test_format import write_tiny

ROOT = Path(__file__).resolve().parents[1]
FULL = OSError(errno.ENOSPC, "No space left on device")


class _FillsUp(io.TextIOWrapper):
    """A text file on a disk with `room` characters left in all (what fits is written
    before the error, as on a real full disk); `files` counts the files opened."""

    room = 64
    files = 0

    def write(self, text: str) -> int:
        if len(text) > _FillsUp.room:
            super().write(text[:_FillsUp.room])
            self.flush()
            _FillsUp.room = 0
            raise FULL
        _FillsUp.room -= len(text)
        return super().write(text)


def _open_on_full_disk(path: Any, mode: str = "r", **kwargs: Any) -> Any:
    if "w" not in mode:
        return builtins.open(path, mode, **kwargs)
    assert mode == "w", mode  # export writes text
    raw = builtins.open(path, "wb")  # noqa: SIM115 - closed by the wrapper
    _FillsUp.files += 1
    return _FillsUp(raw, encoding=kwargs.get("encoding") or "utf-8",
                    newline=kwargs.get("newline"))


def _one_error_line(capsys: pytest.CaptureFixture, prog: str = "popviz") -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"{prog}: error: ") and "No space left on device" in err, err
    return err


@pytest.fixture()
def profile(tmp_path: Path) -> Path:
    return write_tiny(tmp_path / "run")


def test_chrome_export_on_a_full_disk(tmp_path: Path, profile: Path,
                                      monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    out.mkdir()
    kept = out / "kept.json"
    kept.write_text('{"an": "earlier export"}')
    monkeypatch.setattr(export_module, "open", _open_on_full_disk, raising=False)
    monkeypatch.setattr(_FillsUp, "room", 64)
    assert main(["export", str(profile), "--to", str(out / "trace.json"),
                 "--format", "chrome", "--no-vet"]) == 1
    assert str(out / "trace.json") in _one_error_line(capsys)
    monkeypatch.setattr(_FillsUp, "room", 64)
    assert main(["export", str(profile), "--to", str(kept), "--format", "chrome",
                 "--no-vet", "--force"]) == 1
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["kept.json"]
    assert kept.read_text() == '{"an": "earlier export"}'  # the old one, whole
    monkeypatch.undo()
    assert main(["export", str(profile), "--to", str(kept), "--format", "chrome",
                 "--no-vet"]) == 2  # an earlier export is not replaced unasked
    assert kept.read_text() == '{"an": "earlier export"}'
    assert "--force" in capsys.readouterr().err
    assert main(["export", str(profile), "--to", str(kept), "--format", "chrome",
                 "--no-vet", "--force"]) == 0
    assert json.loads(kept.read_text())["traceEvents"]
    assert sorted(p.name for p in out.iterdir()) == ["kept.json"]


def test_csv_export_on_a_full_disk(tmp_path: Path, profile: Path,
                                   monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "csv"
    monkeypatch.setattr(export_module, "open", _open_on_full_disk, raising=False)
    monkeypatch.setattr(_FillsUp, "room", 400)  # the first tables fit, a later one not
    monkeypatch.setattr(_FillsUp, "files", 0)
    assert main(["export", str(profile), "--to", str(out), "--no-vet"]) == 1
    assert str(out) in _one_error_line(capsys)
    assert _FillsUp.files > 2
    assert list(out.iterdir()) == []  # no CSV at all, neither whole nor truncated
    monkeypatch.undo()
    assert main(["export", str(profile), "--to", str(out), "--no-vet"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert "meta.json" in names and "stages.csv" in names
    assert not any(schema.TEMP_MARKER in n for n in names)


def _fail_after_first_table(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The profile writer hits a full disk after one table is in its temporary file."""
    real = writer_module._write_table
    written: list[str] = []

    def write_table(parent: Any, name: str, *args: Any) -> None:
        if written:
            raise FULL
        real(parent, name, *args)
        parent.file.flush()
        written.append(name)

    monkeypatch.setattr(writer_module, "_write_table", write_table)
    return written


def test_profile_writer_on_a_full_disk(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    written = _fail_after_first_table(monkeypatch)
    with pytest.raises(OSError) as caught:
        write_tiny(tmp_path / "run")
    assert written and caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(tmp_path / "run" / "profile.h5")
    assert list((tmp_path / "run").iterdir()) == []


def test_train_py_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture) -> None:
    spec = importlib.util.spec_from_file_location("popviz_train_script", ROOT / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    written = _fail_after_first_table(monkeypatch)
    out = tmp_path / "profiles"
    assert train.main(["--model", "resnet", "--model-size", "18", "--image-size", "32",
                       "--batch-size", "2", "--plan-only", "--quiet", "--profile",
                       "--profile-dir", str(out)]) == 1
    assert written
    assert "profile.h5" in _one_error_line(capsys, "train.py")
    left = [p for p in out.rglob("*") if p.is_file()]
    assert left == []  # no profile, no temporary file, no .popviz-writer.lock
    assert not (out / LOCK_NAME).exists()


# Issue 34: the same on a real full disk. libhdf5 that could not write its metadata used to
# print ~550 lines from h5py's finalizers and segfault closing the file (exit 139), leaving
# its temporary file; each command runs in its own process, as a user runs it, so a
# segfault fails the test rather than the suite.
MODELLED = ROOT / "profiles" / "tutorial_pipelined" / "training" / "profile.h5"
TRACE = ROOT / "tests" / "fixtures" / "kineto_pipelining_interleaved_1rank.json.gz"


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs: room for a tiny profile (22 KB), not for the ~80-110 KB ones
    import, train.py and tune write. Skipped, with the reason, where mounting is refused."""
    where = tmp_path / "small"
    where.mkdir()
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no `mount` here: the real full-disk tests need a small tmpfs")
    done = subprocess.run([mount, "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env, check=False)


def _full_disk_line(done: subprocess.CompletedProcess[str], prog: str, target: Path) -> None:
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"{prog}: error: {target}: ") and \
        "No space left on device" in lines[0], lines[0]


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_import_on_a_real_full_disk(small_disk: Path) -> None:
    old = write_tiny(small_disk / "run")
    before = old.read_bytes()
    done = _run("-m", "popviz.cli.main", "import", TRACE, "--to", small_disk / "run",
                "--force")
    _full_disk_line(done, "popviz", old)
    assert _files(small_disk) == ["run/profile.h5"]  # no temporary file
    assert old.read_bytes() == before  # the old profile, whole
    done = _run("-m", "popviz.cli.main", "import", TRACE, "--to", small_disk / "new")
    _full_disk_line(done, "popviz", small_disk / "new" / "profile.h5")
    assert _files(small_disk) == ["run/profile.h5"]


def test_train_py_on_a_real_full_disk(small_disk: Path) -> None:
    old = write_tiny(small_disk / "training")
    before = old.read_bytes()
    done = _run("train.py", "--plan-only", "--quiet", "--profile", "--force",
                "--profile-dir", small_disk)
    _full_disk_line(done, "train.py", old)
    assert _files(small_disk) == ["training/profile.h5"]  # no temp file, no lock
    assert old.read_bytes() == before


def test_tune_write_on_a_real_full_disk(small_disk: Path, tmp_path: Path) -> None:
    old = write_tiny(small_disk / "best")
    before = old.read_bytes()
    done = _run("-m", "popviz.cli.main", "tune", MODELLED, "--no-progress",
                "--max-compiles", "2", "--write", small_disk / "best", "--force")
    _full_disk_line(done, "popviz", old)
    assert _files(small_disk) == ["best/profile.h5"]
    assert old.read_bytes() == before


def test_a_disk_that_cannot_reserve_space_fails_in_the_write(
        small_disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the file system cannot reserve space up front the plain write meets the full
    disk instead: the same OSError, the same clean-up (in this process: HDF5 never
    touches the disk, so nothing can crash it)."""
    monkeypatch.delattr(os, "posix_fallocate", raising=False)
    big = np.random.default_rng(0).integers(0, 2**31, size=(1, 64, 256), dtype=np.uint32)
    with pytest.raises(OSError) as caught:
        write_tiny(small_disk / "run", arrays={"tile_liveness": big})
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(small_disk / "run" / "profile.h5")
    assert _files(small_disk) == []
