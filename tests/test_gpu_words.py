"""A GPU plan in GPU words: the micro-batch advice of a plan that leaves its memory mostly
unused (against a re-plan at the micro-batch it names) and its silence where it does not
apply; compare and /operations without IPU words."""

from __future__ import annotations

import re
from typing import Any

import pytest

from popviz.analysis.advice import advise
from popviz.analysis.gpu_advice import micro_batch_advice
from popviz.compiler import compile
from popviz.options import Options
from tooling.gpu_programs import gpu_program


def _meta(report: Any) -> dict[str, Any]:
    return report.meta


@pytest.fixture(scope="module")
def small() -> Any:
    """ResNet-50 at micro-batch 4 on one H100: under 1% of its memory."""
    return compile(gpu_program("resnet", 50, 4, "sgd"), Options(target="h100"))


def test_a_mostly_unused_gpu_is_told_the_micro_batch_that_fits(small: Any) -> None:
    meta, stages = small.meta, small.tables["stages"]
    advice = [a for a in advise(meta, stages, small.tables["tile_memory"],
                                small.tables["ops"]) if a.topic == "micro_batch"]
    assert len(advice) == 1 and advice[0].severity == "info"
    text = advice[0].text
    assert "at micro-batch 4" in text and "--batch-size" in text
    named = int(re.search(r"about (\d+) would still fit", text).group(1))
    assert named >= 64 and named & (named - 1) == 0  # a power of two, well above 4
    # the estimate holds: re-planned at that micro-batch the GPU still fits
    bigger = compile(gpu_program("resnet", 50, 4, "sgd"),
                     Options(target="h100", micro_batch_size=named))
    assert bigger.summary["reserved_fits"] is True
    share = max(map(int, bigger.summary["max_memory_allocated"].values())) / \
        small.meta["target"]["usable_bytes"]
    assert 0.25 < share <= 1.0  # and now the memory is used


def test_no_micro_batch_advice_where_it_does_not_apply(small: Any) -> None:
    stages = small.tables["stages"]
    assert micro_batch_advice({**small.meta, "kind": "measured"}, stages) == []
    ipu = compile(gpu_program("mlp", 64, 8), Options(target="mk2"))
    assert micro_batch_advice(ipu.meta, ipu.tables["stages"]) == []
    full = dict(small.meta, target=dict(small.meta["target"], usable_bytes=int(
        stages["peak_bytes"].max() * 2)))  # half used: not "mostly unused"
    assert micro_batch_advice(full, stages) == []
    inference = dict(small.meta, options=dict(small.meta["options"], training=False))
    assert micro_batch_advice(inference, stages) == []


def test_compare_of_two_gpu_plans_speaks_of_gpus(small: Any, tmp_path: Any,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`popviz compare` of two GPU plans: GPUs, ns-free step rows, no tiles, no IPUs."""
    from popviz.cli.main import main
    from popviz.format.writer import write_report

    bigger = compile(gpu_program("resnet", 50, 4, "sgd"),
                     Options(target="h100", micro_batch_size=16))
    a, b = write_report(small, tmp_path / "a"), write_report(bigger, tmp_path / "b")
    assert main(["compare", str(a), str(b), "--no-vet"]) == 0
    text = capsys.readouterr().out
    assert "Per GPU" in text and "GPU0 compute_ms" in text and "throughput_per_gpu" in text
    assert "Where the GPU time per sample goes" in text
    assert "IPU" not in text and "tiles" not in text and "cycles" not in text


def test_the_operations_page_of_a_gpu_plan_has_no_ipu_columns(small: Any,
                                                              tmp_path: Any) -> None:
    from popviz_app import ProfileCache, render
    from popviz_app.common import AppContext

    from popviz.format.writer import write_report
    from tests.dash_util import find_components

    write_report(small, tmp_path / "plan")
    ctx = AppContext(root=tmp_path, cache=ProfileCache(tmp_path))
    page = render(ctx, "/operations", "?profile=plan/profile.h5")[1]

    headers = {c["id"]: c["name"] for t in find_components(page, "DataTable")
               for c in t.columns}
    assert headers["ipu"] == "gpu" and headers["cycles"] == "ns"
    assert not {"amp_used", "amp_ignored", "temp_bytes"} & set(headers)
    assert "host_wait_ns" in headers  # what the GPU waited for the host, per op


def test_gpu_tune_finds_the_largest_micro_batch_that_fits() -> None:
    """tune on a GPU target doubles the best layout's micro-batch while it fits: checked
    by independent compiles at the size it names and at twice that."""
    from popviz.advise.tune import tune

    program = gpu_program("resnet", 50, 4, "sgd")
    result = tune(program, Options(target="h100"), 1, max_compiles=40)
    largest = result.largest_micro_batch
    assert largest is not None and largest["now"] == 4 and largest["limit"] == "memory"
    size = largest["largest"]
    assert size > 4 and size % 4 == 0 and (size // 4) & (size // 4 - 1) == 0
    at = compile(program, Options(target="h100", micro_batch_size=size))
    over = compile(program, Options(target="h100", micro_batch_size=2 * size))
    assert at.summary["reserved_fits"] and at.summary["fits"]
    assert not (over.summary["reserved_fits"] and over.summary["fits"])
    assert largest["throughput"] == pytest.approx(at.summary["throughput"], rel=1e-6)
    assert any(f"--batch-size {size}" in n for n in result.notes)
    assert result.to_dict()["largest_micro_batch"]["largest"] == size
    ipu = tune(gpu_program("mlp", 64, 8), Options(target="mk2"), 1, max_compiles=4)
    assert ipu.largest_micro_batch is None


def test_the_trace_of_a_gpu_plan_shows_its_kernels(small: Any, tmp_path: Any) -> None:
    """A GPU plan is modelled: /trace lays its ops (kernels on the compute stream) inside
    each pass, as for an IPU plan, although its times are ns."""
    from popviz_app import ProfileCache
    from popviz_app.common import AppContext
    from popviz_app.pages import trace as trace_page

    from popviz.format.writer import write_report

    write_report(small, tmp_path / "plan")
    ctx = AppContext(root=tmp_path, cache=ProfileCache(tmp_path))
    entry = ctx.cache.get("plan/profile.h5")
    # the backward's two parts too (a zero-bubble schedule runs them apart; one stage has
    # no input gradient to send back, so its backward is all weight gradient)
    assert set(trace_page.templates(entry)) == {(0, "F"), (0, "B"), (0, "WU"), (0, "B:weight")}
    forward = small.tables["trace"].query("`pass` == 'F'").iloc[0]
    fig = trace_page.trace(ctx, entry, float(forward["start"]), float(forward["end"]))
    lanes = {d.get("name") for d in fig.to_plotly_json()["data"]}
    assert {"op: conv", "op: norm", "modules"} <= lanes


def test_a_gpu_holding_several_stages_is_advised_in_gpu_words() -> None:
    """ZBV folds four stages onto two GPUs; the busier GPU's advice names GPUs only."""
    report = compile(gpu_program("mlp", 64, 8),
                     Options(target="h100", splits=["body.1", "body.2", "body.3"],
                             num_ipus=2, gradient_accumulation=4, schedule="ZBV"))
    stages = report.tables["stages"]
    busy = stages.assign(load=stages["forward_cycles"] + stages["backward_cycles"])
    # make GPU 1's stages the heavy ones, as a bad fold would
    busy.loc[busy["ipu"] == 1, ["forward_cycles", "backward_cycles"]] *= 5
    advice = advise(report.meta, busy.drop(columns="load"), report.tables["tile_memory"],
                    report.tables["ops"])
    split = [a.text for a in advice if a.topic == "split"]
    assert split and any("GPU 1 is the bottleneck" in t for t in split), split
    assert not any("IPU" in t for t in split), split
