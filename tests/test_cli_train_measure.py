"""`popviz train` and `popviz measure`: Command objects over the same code as `python
train.py` and `python -m popviz.measure`."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

import popviz
import popviz.measure.__main__ as measure_main
from popviz.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["--model", "resnet", "--model-size", "18", "--image-size", "32", "--batch-size", "2",
        "--shards", "2", "--pipeline", "--pipeline-splits", "b3/0", "--plan-only", "--quiet",
        "--profile", "--profile-dir"]


def _train_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("popviz_train_shim", ROOT / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_popviz_train_writes_what_train_py_writes(tmp_path: Path) -> None:
    assert main(["train", *PLAN, str(tmp_path / "cli")]) == 0
    assert _train_script().main([*PLAN, str(tmp_path / "shim")]) == 0
    a, b = popviz.open(tmp_path / "cli"), popviz.open(tmp_path / "shim")
    assert len(a.stages) == 2
    for table in ("stages", "trace", "liveness", "ops"):
        pd.testing.assert_frame_equal(a.table(table), b.table(table))
    assert b.command_line.startswith("train.py --model resnet")
    # the command it was given, not the process's own arguments (pytest's, here)
    assert a.command_line == shlex.join(["popviz", "train", *PLAN, str(tmp_path / "cli")])


def test_popviz_train_bad_flags_give_one_line(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--model", "resnet", "--shards", "3", "--pipeline-splits",
                 "nowhere"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("popviz: error: unknown split name(s) nowhere")
    assert _train_script().main(["--image-size", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train.py: error: --image-size 4 is too small for tutorial (needs >= 16)"]


def test_popviz_measure_parses_measures_flags_and_runs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(measure_main, "run", lambda args, command: seen.append(args) or 7)
    assert main(["measure", "--ranks", "3", "--microbatches", "6"]) == 7
    assert (seen[0].ranks, seen[0].microbatches) == (3, 6)


def test_popviz_measure_help_and_errors_are_measures(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        main(["measure", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--microbatches" in out and "docs/measure.md" in out  # measure's flags, epilog
    with pytest.raises(SystemExit) as done:
        main(["measure", "--ranks", "x"])
    assert done.value.code == 2
    assert "invalid int value: 'x'" in capsys.readouterr().err


def test_help_lists_train_and_measure(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "    train " in out and "    measure " in out
