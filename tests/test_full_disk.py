"""Issue 22: a full disk (ENOSPC) while exporting or writing a profile leaves nothing behind
under a final name, no temporary file, no lock; one line on stderr and exit code 1."""

from __future__ import annotations

import builtins
import errno
import importlib.util
import io
import json
from pathlib import Path
from typing import Any

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
