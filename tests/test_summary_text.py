"""`popviz summary` text: bottleneck, advice, fullest tile; fit unknown for a measured run;
no zero latency; durations with sensible precision."""

from __future__ import annotations

from pathlib import Path

import pytest

import popviz
from popviz.analysis.insights import insights
from popviz.cli.main import main
from popviz.reporters.summary import _duration

ROOT = Path(__file__).resolve().parents[1] / "profiles"


def _text(path: Path, capsys: pytest.CaptureFixture) -> str:
    if not path.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    assert main(["summary", str(path)]) == 0
    return capsys.readouterr().out


def test_pipelined_summary_names_bottleneck_tile_and_advice(
        capsys: pytest.CaptureFixture) -> None:
    out = _text(ROOT / "rn50_pipeline", capsys)
    found = insights(popviz.open(ROOT / "rn50_pipeline"))
    neck = found["bottleneck"]
    assert f"bottleneck: stage {neck['stage']} on IPU{neck['ipu']}, " \
        f"{neck['relative_load']:.2f}x" in out
    top = found["fullest_tiles"].iloc[0]
    assert f"fullest tile: IPU{top['ipu']} tile {top['tile']}, {top['utilisation']:.0%}" in out
    assert found["advice"][0].text in out
    assert "latency" not in out  # a training step: no single-batch latency to print


def test_measured_summary_does_not_claim_a_fit(capsys: pytest.CaptureFixture) -> None:
    out = _text(ROOT / "tutorial_measured_2ranks", capsys)
    assert "fits: unknown" in out and "fits: yes" not in out
    assert ("fullest tile" not in out and "on rank 1" in out) or "on rank 0" in out


def test_durations_keep_three_figures() -> None:
    assert _duration(2.830250625) == "2.83 ms"
    assert _duration(0.0852) == "85.2 µs"
    assert _duration(1234.4) == "1,234 ms"
