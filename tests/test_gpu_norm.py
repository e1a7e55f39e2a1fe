"""Batch norm on a GPU as its kernels run it (popviz/target/gpu_norm.py): against 36 batch
norms timed kernel by kernel on an H200 (bench/data/gpu_norm_kernels_h200.json), its
mechanism, and the held-out ResNet-50 traces' norm kernels."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from popviz.target.gpu import A100_80GB, H100_SXM, H200_SXM
from popviz.target.gpu_cost import gpu_op_costs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from fit_gpu_norm import load, ops_of, table  # noqa: E402


def test_the_h200_batch_norms_within_their_measured_error() -> None:
    frame = table(load())
    err = frame.groupby(["dtype", "pass"])["error"].agg(lambda e: float(np.mean(np.abs(e))))
    before = frame.groupby(["dtype", "pass"])["roofline_error"].agg(
        lambda e: float(np.mean(np.abs(e))))
    assert len(frame) == 72
    assert (err <= 0.27).all(), err
    assert (err * 1.5 < before).all(), (err, before)  # the roofline every norm had
    # ResNet's stem (64 channels, 64 x 112 x 112), the costliest norm: fp32 within 8%, bf16
    # within 22% (its serial statistics run slower on 64 blocks than on more)
    stem = frame[frame["shape"] == "64x64x112x112"]
    assert (stem["error"].abs() <= np.log(1.22)).all(), stem
    assert (stem[stem["dtype"] == "float32"]["error"].abs() <= 0.08).all(), stem


def _one(channels: int, side: int, dtype: str = "float32", target=H200_SXM) -> float:
    case = {"batch": 64, "channels": channels, "side": side, "dtype": dtype}
    return float(gpu_op_costs(ops_of([case]).iloc[:1], target)["cycles"].iloc[0])


def test_few_channels_cannot_fill_the_bandwidth() -> None:
    # the same 51 M values: 64 channels are 64 blocks, 256 fill the GPU (H200: 467 against
    # 205 us measured; an H100's bandwidth is less, so the gap is less)
    assert _one(64, 112) > 1.8 * _one(256, 56)
    assert _one(64, 112, target=H100_SXM) > 1.3 * _one(256, 56, target=H100_SXM)
    # bf16's statistics are a block's serial work per channel: slower than cuDNN's
    assert _one(64, 112, "bfloat16") > 1.3 * _one(64, 112)
    # per SM cycle: the A100's fewer, slower SMs take longer
    assert _one(64, 112, target=A100_80GB) > _one(64, 112)


def test_only_training_batch_norms_take_the_model() -> None:
    ops = ops_of([{"batch": 64, "channels": 64, "side": 56, "dtype": "float32"}]).iloc[:1]
    plain = pd.concat([ops, ops.assign(op="aten._native_batch_norm_legit_no_training.default"),
                       ops.assign(op="aten.native_layer_norm.default")], ignore_index=True)
    c = gpu_op_costs(plain, H100_SXM)["cycles"].to_numpy()
    assert c[0] > 1.3 * c[1] and c[1] == c[2]  # running statistics: the roofline


@pytest.mark.parametrize(("name", "bound"), [("resnet50-amp-b64", 0.15),
                                             ("resnet50-b32", 0.12)])
def test_resnet_norm_kernels_against_the_h200_traces(name: str, bound: float,
                                                      tmp_path: Path) -> None:
    """Held out: the bf16 trace's norms were -73% / -69% (forward / backward) with the
    roofline, its fp32 b32 trace's -9% / -26%."""
    pytest.importorskip("transformers")
    from bench_gpu_fidelity import case_plan

    from tests.import_fixtures import imported_profile
    from tests.test_gpu_h200 import CASES
    from tooling.gpu_fit import compare_classes

    report = case_plan(CASES[name], "h200")
    trace = ROOT / "tests" / "fixtures" / f"kineto_{name}_h200.json.gz"
    for profile in imported_profile([trace], tmp_path / "p"):
        norms = compare_classes(profile.ops, report.tables["ops"]).xs("norm", level="op_class")
    assert (norms["error"].abs() <= bound).all(), norms
