"""The `popviz` command line: summary output, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from popviz.cli.main import main
from tests.test_format import write_tiny


def test_summary_json_has_contract_facts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_tiny(tmp_path / "run")
    assert main(["summary", str(tmp_path / "run"), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["fits"] is False and facts["oom_tiles"] == 1 and facts["oom_ipus"] == [1]
    assert facts["peak_liveness_bytes"] == {"0": 600, "1": 340}
    assert [s["forward_cycles"] for s in facts["stages"]] == [1000, 1500]
    assert facts["throughput"] == 1234.5


def test_summary_text(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_tiny(tmp_path / "run")
    assert main(["summary", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "fits: NO" in out and "1 tile(s) out of memory on IPU 1" in out


def test_summary_stage_table_adds_up_to_the_step(capsys: pytest.CaptureFixture) -> None:
    """Each rank's row of the bundled measured run holds all its step: the other host
    work and the optimiser are columns too, so the parts add up to the step time."""
    import popviz

    measured = Path(__file__).resolve().parents[1] / "profiles" / "tutorial_measured_2ranks"
    assert main(["summary", str(measured)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("stage ipu"))
    assert "other" in lines[head] and "optimiser" in lines[head]
    with popviz.open(measured) as p:
        step_ns = float(p.summary["step_seconds"]) * 1e9
    for row in lines[head + 1:head + 3]:
        parts = [float(x.replace(",", "")) for x in row.split()[2:]]
        assert sum(parts) == pytest.approx(step_ns, rel=1e-4)


def test_summary_of_directory_lists_each(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_tiny(tmp_path / "d" / "training")
    write_tiny(tmp_path / "d" / "inference")
    assert main(["summary", str(tmp_path / "d"), "--json"]) == 0
    names = [f["name"] for f in json.loads(capsys.readouterr().out)]
    assert names == ["inference", "training"]
    # in text, two runs of one name are told apart by where they are
    write_tiny(tmp_path / "d" / "other" / "training")
    assert main(["summary", str(tmp_path / "d")]) == 0
    heads = [line.split("  (")[0] for line in capsys.readouterr().out.splitlines()
             if line and not line.startswith(" ")]
    assert heads == ["inference", "other/training", "training"]


@pytest.mark.parametrize("content, fragment", [
    (None, "no such file"),
    (b"not hdf5", "not an HDF5 file"),
])
def test_bad_profile_is_one_line_exit_1(tmp_path: Path, content: bytes | None,
                                        fragment: str) -> None:
    path = tmp_path / "x.h5"
    if content is not None:
        path.write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "popviz.cli.main", "summary", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and fragment in proc.stderr
    assert "Traceback" not in proc.stderr


def test_usage_errors_exit_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "popviz.cli.main", "summary"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "popviz.cli.main", "--version"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("popviz ")


def test_export_csv_round_trips_tables(tmp_path: Path) -> None:
    import pandas as pd

    import popviz

    write_tiny(tmp_path / "run")
    assert main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "csv")]) == 0
    profile = popviz.open(tmp_path / "run")
    for name in profile.table_names:
        got = pd.read_csv(tmp_path / "csv" / f"{name}.csv", keep_default_na=False)
        assert len(got) == len(profile.table(name))
        assert list(got.columns) == list(profile.table(name).columns)
    assert json.loads((tmp_path / "csv" / "meta.json").read_text())["summary"]["oom_tiles"] == 1


def test_export_replaces_an_earlier_export_only_with_force(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_tiny(tmp_path / "run")
    out = tmp_path / "csv"
    out.mkdir()
    (out / "stages.csv").write_text("mine")
    (out / "p2p.csv").write_text("an earlier export's table")
    assert main(["export", str(tmp_path / "run"), "--to", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds stages.csv" in err and "--force" in err and len(err.splitlines()) == 1
    assert (out / "stages.csv").read_text() == "mine" and not (out / "meta.json").exists()
    assert main(["export", str(tmp_path / "run"), "--to", str(out), "--force"]) == 0
    said = capsys.readouterr().out
    assert (out / "stages.csv").read_text() != "mine"
    assert "also holds 1 CSV file(s) not written now" in said and "p2p.csv" in said
    assert (out / "p2p.csv").read_text() == "an earlier export's table"  # never deleted
    assert main(["export", str(tmp_path / "run"), "--to", str(out / "p2p.csv")]) == 2
    assert "a file, not a folder" in capsys.readouterr().err


def test_export_chrome_trace_times_in_microseconds(tmp_path: Path) -> None:
    write_tiny(tmp_path / "run")
    out = tmp_path / "t.json"
    assert main(["export", str(tmp_path / "run"), "--to", str(out), "--format", "chrome"]) == 0
    events = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 4
    conv = next(e for e in events if e["name"] == "conv1" and e["args"]["microbatch"] == 1)
    # start 100 cycles at 1.33 GHz
    assert conv["ts"] == pytest.approx(100 / 1.33e9 * 1e6)
    assert conv["dur"] == pytest.approx(100 / 1.33e9 * 1e6)
    assert conv["args"]["pass"] == "F" and conv["pid"] == 0


def test_export_unknown_table_is_usage_error(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    write_tiny(tmp_path / "run")
    assert main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "o"),
                 "--tables", "nope"]) == 2
    assert "unknown table(s) nope" in capsys.readouterr().err


def test_compare_text_names_devices_by_kind(capsys: pytest.CaptureFixture) -> None:
    profiles = Path(__file__).resolve().parents[1] / "profiles"
    assert main(["compare", str(profiles / "tutorial_measured_2ranks"),
                 str(profiles / "tutorial_pipelined" / "training")]) == 0
    mixed = capsys.readouterr().out
    assert "Per device" in mixed and "Per IPU" not in mixed
    assert main(["compare", str(profiles / "rn50_pipeline"),
                 str(profiles / "rn50_recompute")]) == 0
    modelled = capsys.readouterr().out
    assert "Per IPU" in modelled and "IPU0 compute_ms" in modelled
