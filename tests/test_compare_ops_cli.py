"""`popviz compare A B --ops`: the op-by-op table as text and JSON, and its --help."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import popviz
from popviz.analysis.compare import compare
from popviz.analysis.compare.ops import compare_ops
from popviz.cli.main import main

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
A, B = PROFILES / "tutorial_measured_2ranks", PROFILES / "tutorial_pipelined" / "training"


def _want(by: str, depth: int = 1, per: str = "auto") -> object:
    with popviz.open(A) as a, popviz.open(B) as b:
        return compare_ops(a, b, compare(a, b), by=by, depth=depth, per=per)


def test_text_lists_the_top_groups_in_order(capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", str(A), str(B), "--ops", "--by", "class", "--top", "3",
                 "--no-vet"]) == 0
    out = capsys.readouterr().out
    want = _want("class")
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("op class"))
    shown = [line.split()[0] for line in lines[head + 1: head + 1 + min(3, len(want.table))]]
    assert shown == want.table["group"].head(3).tolist()
    unit = "ms per step" if want.per == "step" else "µs per sample"
    assert f"A {unit}" in lines[head]
    if len(want.table) > 3:
        assert f"... {len(want.table) - 3} more" in out


def test_json_is_the_analysis(capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", str(A), str(B), "--ops", "--by", "pass", "--per", "sample",
                 "--json", "--no-vet"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = _want("pass", per="sample")
    assert got["by"] == "pass" and got["per"] == "sample"
    assert [r["group"] for r in got["rows"]] == want.table["group"].tolist()
    assert got["totals"]["a_seconds"] == pytest.approx(want.totals["a_seconds"])


def test_bad_depth_is_one_line(capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", str(A), str(B), "--ops", "--by", "module", "--depth", "0",
                 "--no-vet"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "module depth must be at least 1" in err


def test_help_names_the_options(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for word in ("--ops", "--by {op,class,module,pass}", "--depth N", "--top N",
                 "--per {auto,step,sample}", "per sample"):
        assert word in text
