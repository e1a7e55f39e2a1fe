"""bench/bench_import_scale.py prints its table: every mode at every size, and the ratios
(run here on two tiny jobs; the bench's own sizes are 16, 64 and 512 ranks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_util import load_bench

pytest.importorskip("distributed", reason="the dask extra (in the test extra)")


def test_the_bench_prints_each_mode_and_the_ratios(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    bench = load_bench("bench_import_scale")
    assert bench.main(["--ranks", "2", "3", "--events", "400", "--repeat", "2",
                       "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if "|" in line and line[:5].strip()
            .isdigit()]
    assert {(r[0], r[1]) for r in rows} >= {(n, m) for n in ("2", "3")
                                              for m in ("here", "pool-2", "dask-1", "dask-2")}
    assert all(float(r[3]) > 0 and float(r[6]) > 0 for r in rows)
    assert out.count("(runs: ") == 4  # each cluster size twice, at each job size
    phases = [line for line in out.splitlines() if " dask-" in line]
    assert len(phases) == 4 and all("[start " in line and ", finish " in line
                                    for line in phases)
    assert "3 ranks: 2 workers" in out and "client peak, 3 ranks / 2 ranks (dask-2)" in out
