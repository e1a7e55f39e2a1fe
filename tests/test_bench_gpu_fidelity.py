"""bench/bench_gpu_fidelity.py: its prediction half on a tiny model (no GPU needed), and its
measured half, which skips visibly without CUDA."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bench_util import BENCH_DIR, load_bench

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_bench("bench_gpu_fidelity")


def test_predictions_without_a_gpu(bench: Any, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--models", "mlp", "--batches", "8", "64", "--target", "a100"]) == 0
    out = capsys.readouterr().out
    assert "target a100" in out and "needs a GPU" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("mlp ")]
    assert [int(r[1]) for r in rows] == [8, 64]
    step = [float(r[2]) for r in rows]
    alloc = [float(r[7]) for r in rows]  # "needs a GPU" is three words, then "-"
    # a small MLP step is host-bound (the GPU waits for eager PyTorch to issue kernels):
    # 8x the batch costs no more time until the GPU is the slower
    assert 0 < step[0] <= step[1] and 0 < alloc[0] <= alloc[1]
    assert re.search(r"largest batch mlp: predicted (at least )?\d+, found needs a GPU", out)


def test_predict_one_row(bench: Any) -> None:
    small = bench.predict("mlp", 8, "h100")
    assert small.fits and small.allocated <= small.reserved


def test_measured_table_from_the_stored_h200_runs(bench: Any, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """--measured plans each case of a gpu_runs.py file; here two cheap ones of the H200
    file, so the table's columns are checked against the file's own figures."""
    import json

    doc = json.loads((BENCH_DIR / "data" / "gpu_measured_h200.json").read_text())
    doc["cases"] = [c for c in doc["cases"] if c["name"] in ("resnet50-b32",
                                                             "zb1.5b-4layers-fp16-sdpa-b6")]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    assert bench.main(["--measured", str(path)]) == 0
    out = capsys.readouterr().out
    assert "measured on NVIDIA H200" in out and "planned on the h200 target" in out
    rn = next(line.split() for line in out.splitlines() if line.startswith("resnet50-b32"))
    assert float(rn[2]) == round(doc["cases"][0]["step_ms"], 1)
    assert rn[8].endswith("%")  # alloc error
    zb = next(line.split() for line in out.splitlines() if line.startswith("zb1.5b"))
    assert zb[1] == "-" and zb[3] == "-"  # passes only: no optimiser ran
    with pytest.raises(SystemExit):
        bench.main(["--measured", str(tmp_path / "missing.json")])


def test_bad_model_is_one_line(bench: Any) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--models", "nope"])


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: the measured half of bench_gpu_fidelity.py")
def test_measured_half_on_a_gpu(bench: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--models", "mlp", "--batches", "64", "--no-largest"]) == 0
    out = capsys.readouterr().out
    assert "needs a GPU" not in out and "mean |error|" in out
