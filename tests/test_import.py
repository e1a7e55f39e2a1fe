"""popviz import: real H100 recordings (tests/fixtures, from ../shared/fixtures/gpu) and
multi-rank gloo pipelines these tests run themselves, checked against the raw JSON / pickle
read independently here with json and gzip."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import popviz
from popviz.analysis.balance import profile_stages
from popviz.cli.main import main
from popviz.compiler import compile as compile_program
from popviz.ingest import kineto, kineto_fast
from popviz.ingest.import_rank import RankPart
from popviz.ingest.import_schedule import schedule_seen
from popviz.ingest.kineto_events import Labeller
from popviz.ingest.kineto_ops import op_classes
from popviz.metrics import rank_time
from popviz.options import Options
from popviz.recorder.steps import record_program
from tests.import_fixtures import PIPELINE, RESNET, SNAPSHOT, snapshot_inside_trace
from tests.import_fixtures import trace_events as _events
from tests.kineto_runs import FEATURES, MICRO_BATCH, MICROBATCHES, make_traces

WORLD = 3


def _union(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -np.inf
    for s, e in sorted(intervals):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    return make_traces(tmp_path_factory.mktemp("runs"), world=WORLD)


@pytest.fixture(scope="module")
def imported(runs: dict[str, list[Path]], tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Any]:
    out = {}
    for name, files in runs.items():
        path = popviz.import_trace(files, tmp_path_factory.mktemp(name))
        out[name] = popviz.open(path)
    yield out
    for p in out.values():
        p.close()


# ---- the real GPU recordings ----
def test_resnet_kernels_are_compute_and_gaps_idle(resnet: Any) -> None:
    events = _events(RESNET)
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset")]
    trace = resnet.trace
    assert resnet.kind == "measured" and set(trace["ipu"]) == {0}
    assert (trace["kind"] == "compute").sum() == sum(e["cat"] == "kernel" for e in gpu)
    assert (trace["kind"] == "exchange").sum() == sum(e["cat"] == "gpu_memset" for e in gpu)
    # idle (+ sync) is the GPU's span minus the union of its activity, from the raw JSON
    span = max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)
    idle_us = span - _union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    gaps = trace[trace["kind"] == "idle"]
    assert float((gaps["end"] - gaps["start"]).sum()) / 1e3 == pytest.approx(idle_us, rel=1e-3)
    assert (trace["kind"] == "sync").sum() == 1  # the one cudaDeviceSynchronize
    assert set(trace["pass"]) >= {"F", "B", "WU"}  # autograd spans, Optimizer.step


def test_resnet_ops_carry_their_kernels_gpu_time_and_shapes(resnet: Any) -> None:
    events = _events(RESNET)
    conv_ids = {e["args"]["External id"] for e in events
                if e.get("cat") == "cpu_op" and e["name"] == "aten::cudnn_convolution"}
    want = sum(e["dur"] for e in events if e.get("cat") in ("kernel", "gpu_memset")
               and e["args"].get("External id") in conv_ids)
    ops = resnet.ops
    conv = ops[ops["op"] == "aten::cudnn_convolution"]
    assert len(conv) == len(conv_ids)
    assert conv["gpu_ns"].sum() / 1e3 == pytest.approx(want, rel=1e-4)
    assert (conv["op_class"] == "conv").all()
    first = json.loads(conv.sort_values("start")["shapes"].iloc[0])
    assert first[0] == [64, 3, 224, 224]  # batch 64, 224² images
    # every kernel belongs to one op: the ops' GPU time is the kernels' time, once
    all_kernels = sum(e["dur"] for e in events if e.get("cat") in ("kernel", "gpu_memset"))
    assert ops["gpu_ns"].sum() / 1e3 == pytest.approx(all_kernels, rel=1e-3)


def test_op_classes_from_aten_names() -> None:
    names = pd.Series(["aten::native_batch_norm", "aten::layer_norm", "aten::normal_",
                       "aten::cudnn_convolution", "aten::addmm", "aten::mul"])
    assert op_classes(names).tolist() == ["norm", "norm", "elementwise", "conv", "matmul",
                                          "elementwise"]
    # a CPU rank's backward compute is the autograd engine's spans: the class of the op
    # each differentiates (they were all "other": 48% of the tutorial run's compute)
    nodes = pd.Series(["autograd::engine::evaluate_function: ConvolutionBackward0",
                       "AddmmBackward0", "NativeBatchNormBackward0",
                       "MaxPool2DWithIndicesBackward0", "ReluBackward0", "TBackward0",
                       "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"])
    assert op_classes(nodes).tolist() == ["conv", "matmul", "norm", "reduction",
                                          "elementwise", "data_movement", "other"]


def test_a_kernel_is_in_the_pass_of_the_op_that_launched_it(resnet: Any) -> None:
    """Per launching op and pass, the GPU time of the trace's events is the ops table's:
    a kernel takes its op's stage, pass and micro-batch. CUTLASS kernels launched with
    cuLaunchKernel (no runtime call) were labelled by their own start, when the host was
    already in the optimiser or the next forward: convolution_backward showed 0.2 ms of
    F and 0.2 ms of WU on /trace, none on /operations."""
    tr, ops = resnet.trace, resnet.ops
    ev = tr[(tr["host_op"].astype(str) != "") & ~tr["kind"].isin(["idle", "sync"])]
    traced = (ev["end"] - ev["start"]).groupby(
        [ev["host_op"].astype(str), ev["pass"].astype(str)]).sum()
    table = ops.groupby([ops["op"].astype(str), ops["pass"].astype(str)])["gpu_ns"].sum()
    both = pd.concat({"trace": traced, "ops": table}, axis=1).fillna(0)
    both = both[(both["trace"] > 0) | (both["ops"] > 0)]
    assert len(both) > 20
    assert both["trace"].to_numpy() == pytest.approx(both["ops"].to_numpy(), abs=1)
    assert set(both.loc["aten::convolution_backward"].index) == {"B"}


def test_an_ops_cycles_are_the_compute_the_trace_counts(resnet: Any) -> None:
    """An op's cycles and kernels are its compute kernels, as the trace counts compute:
    memsets and copies are exchange there, and /operations' F and B totals (12,094,515 /
    23,781,795 ns) were 0.3% over /trace's and /stages' compute (12,063,150 /
    23,746,112), convolution_backward 318 kernels where the trace has 295."""
    tr, ops = resnet.trace, resnet.ops
    compute = tr[tr["kind"] == "compute"]
    traced = (compute["end"] - compute["start"]).groupby(compute["pass"].astype(str)).sum()
    table = ops.groupby(ops["pass"].astype(str))["cycles"].sum()
    assert table.reindex(traced.index).tolist() == traced.tolist()
    counted = compute.groupby(compute["host_op"].astype(str)).size()
    kernels = ops.groupby(ops["op"].astype(str))["kernels"].sum()
    assert kernels[kernels > 0].sort_index().to_dict() == counted[
        counted.index != ""].sort_index().to_dict()
    assert int(kernels["aten::convolution_backward"]) == 295


def test_compare_counts_an_imported_ops_calls_not_its_kernels(resnet: Any) -> None:
    """/compare's op by op 'calls per step' of an imported run: its ops' calls (53
    convolution_backward), not the kernels they launched (it read 318)."""
    from popviz.analysis.compare import compare
    from popviz.analysis.compare.ops import op_records

    records = op_records(resnet, compare(resnet, resnet), "A")
    calls = records.groupby("op")["count"].sum()
    ops = resnet.ops[resnet.ops["kernels"] > 0]
    want = ops.groupby(ops["op"].astype(str).str.replace("aten::", "")).size()
    assert calls["convolution_backward"] == pytest.approx(53)
    assert calls.reindex(want.index).to_numpy() == pytest.approx(want.to_numpy())


def test_stages_of_one_rank_move_nothing_between_devices(pipeline: Any) -> None:
    """The interleaved run's two stages share its one rank: their copies are internal,
    and /compare read them as 128 KiB of rank-to-rank traffic."""
    from popviz.analysis.compare import compare

    ex = pipeline.exchange
    assert len(ex) and (ex["src"].astype(str) == ex["dst"].astype(str)).all()
    assert ex["bytes"].sum() > 0
    metrics = compare(pipeline, pipeline).metrics.set_index("metric")
    assert metrics.loc["inter_ipu_bytes", "a"] == 0


def test_a_verdict_does_not_call_two_models_the_same_work(resnet: Any) -> None:
    """Asked for total throughput, the verdict said the ResNet-50 import 'does the same
    work in less time' than the tutorial run, above its own note that they need not run
    the same model. Two models' samples are not the same work; one model's are."""
    from popviz.analysis.compare import compare

    bundled = Path(__file__).resolve().parents[1] / "profiles" / "tutorial_measured_2ranks"
    with popviz.open(bundled / "profile.h5") as other:
        text = compare(resnet, other, "total").verdict["headline"]
    assert "same work" not in text and "has the higher total throughput" in text
    same = compare(resnet, resnet, "total").verdict["headline"]  # one model: the same work
    assert same.startswith("A and B do the same work in about the same time")


def test_time_zero_is_the_first_event_memory_included(pipeline: Any) -> None:
    """The interleaved run's first [memory] event comes before its first kept span: it sat
    at -234,832 ns, and /memory's axis began there. Time 0 is now the first event of any
    kind, so nothing is before it."""
    live = pipeline.liveness
    assert live["time"].min() == 0
    assert min(pipeline.trace["start"].min(), pipeline.ops["start"].min()) >= 0


def test_an_import_moves_data_where_the_recorder_does() -> None:
    """The same train step recorded (popviz.record's classes, from torch's op schemas) and
    traced by torch.profiler (an import's classes, from the names alone): an op is data
    movement in both or in neither (aten::empty was elementwise on an import)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))

    def step(m: torch.nn.Module, o: torch.optim.Optimizer, x: torch.Tensor,
             y: torch.Tensor) -> None:
        o.zero_grad(set_to_none=True)
        h = torch.cat([m(x), torch.zeros(4, 2)], 1)
        torch.nn.functional.cross_entropy(h[:, :10], y).backward()
        o.step()

    program = record_program(step, model, opt, x, y, model=model, mode="plan")
    ops = compile_program(program, Options(target="mk2")).tables["ops"]
    recorded = dict(zip(ops["op"].astype(str).str.split(".").str[1],
                        ops["op_class"].astype(str), strict=True))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step(model, opt, x, y)
    names = sorted({e.name for e in prof.events() if e.name.startswith("aten::")
                    and e.name[len("aten::"):] in recorded})
    imported = dict(zip(names, op_classes(pd.Series(names)), strict=True))
    moved = {n for n in names if recorded[n[len("aten::"):]] == "data_movement"}
    assert {"aten::empty", "aten::cat", "aten::zeros", "aten::view"} <= moved
    assert {n for n, c in imported.items() if c == "data_movement"} == moved


def test_resnet_liveness_from_the_traces_memory_events(resnet: Any) -> None:
    events = [e for e in _events(RESNET) if e.get("name") == "[memory]"
              and e["args"].get("Device Type") == 1]
    allocated = [e["args"]["Total Allocated"] for e in events]
    live = resnet.liveness
    total = live["always_live_bytes"] + live["not_always_live_bytes"]
    assert len(live) == len(events)
    assert int(total.max()) == max(allocated)
    assert int(live["always_live_bytes"].iloc[0]) == min(allocated)


def test_an_idle_gap_is_in_the_pass_of_the_work_that_ends_it(resnet: Any) -> None:
    """The GPU idles waiting for the work that ends the gap: the gap takes that work's
    pass. It took the host's pass at the gap's own time, and the host runs ahead of the
    GPU: gaps between backward kernels read WU, as the host was in the optimiser."""
    tr = resnet.trace
    busy = tr[~tr["kind"].isin(["idle", "sync"])].sort_values("start", kind="stable")
    idle = tr[tr["kind"] == "idle"]
    first = busy.drop_duplicates("start").set_index("start")["pass"].astype(str)
    ending = first.reindex(idle["end"].to_numpy())
    assert len(idle) > 500 and ending.notna().all()
    assert (idle["pass"].astype(str).to_numpy() == ending.to_numpy()).all()
    kernels = busy[busy["pass"] == "B"]  # gaps inside the backward are backward
    inner = idle[(idle["start"] > kernels["start"].min()) & (idle["end"] < kernels["end"].max())]
    assert set(inner["pass"]) == {"B"}


def test_what_a_backward_frees_as_it_returns_is_backward(resnet: Any) -> None:
    """Memory events after the last autograd function and before Optimizer.step (the loss
    and its gradient freed as `backward()` returns) are B, not F: a step's liveness reads
    F, then B, then WU, once each (it read F, B, F, WU)."""
    events = sorted((e for e in _events(RESNET) if e.get("name") == "[memory]"
                     and e["args"].get("Device Type") == 1), key=lambda e: e["ts"])
    spans = _events(RESNET)
    backward_end = max(e["ts"] + e["dur"] for e in spans if str(e.get("name", "")).startswith(
        "autograd::engine::evaluate_function"))
    step = min(e["ts"] for e in spans if str(e.get("name", "")).startswith("Optimizer.step"))
    tail = [i for i, e in enumerate(events) if backward_end <= e["ts"] < step]
    live = resnet.liveness.sort_values("time", kind="stable").reset_index(drop=True)
    assert tail and len(live) == len(events)
    assert set(live.loc[tail, "pass"]) == {"B"}
    runs = live["pass"][live["pass"] != live["pass"].shift()].tolist()
    assert runs == ["F", "B", "WU"]


def test_a_forward_between_two_backwards_stays_forward() -> None:
    """Only the gap up to an optimiser step is the backward's tail. Schedule1F1B writes no
    annotations: the next micro-batch's forward runs between two backwards, then the
    optimiser; that forward stays F, what comes after the last backward is B, and what
    follows the optimiser (the next step, zero_grad) F again."""
    spans = pd.DataFrame(
        [("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 10, 20),
         ("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 40, 50),
         ("user_annotation", "Optimizer.step#SGD.step", 70, 80)],
        columns=["cat", "name", "start", "end"])
    _, passes, _ = Labeller(spans, rank=0).label(np.array([5, 15, 30, 45, 60, 75, 90]))
    assert passes.tolist() == ["F", "B", "F", "B", "B", "WU", "F"]
    no_step = Labeller(spans.iloc[:2], rank=0)  # no optimiser: nothing says a tail ends
    assert no_step.label(np.array([30, 60]))[1].tolist() == ["F", "F"]


def test_memory_snapshot_gives_the_liveness(tmp_path: Path) -> None:
    snap = pickle.loads(gzip.decompress(SNAPSHOT.read_bytes()))
    events = [e for e in snap["device_traces"][0]
              if e["action"] in ("alloc", "free_completed")]
    level = np.cumsum([e["size"] if e["action"] == "alloc" else -e["size"] for e in events])
    final = sum(s["allocated_size"] for s in snap["segments"])
    level = level - level[-1] + final  # ends where the segments say memory stood
    # taken in the trace's run (its times moved inside the trace): the curve is the
    # snapshot's (a snapshot of another run is not used: test_import_views)
    path = popviz.import_trace([RESNET], tmp_path / "p",
                               memory_snapshot=snapshot_inside_trace(tmp_path))
    with popviz.open(path) as p:
        live = p.liveness
    total = (live["always_live_bytes"] + live["not_always_live_bytes"]).to_numpy()
    assert len(live) == len(events)
    np.testing.assert_array_equal(total, level)
    assert int(live["always_live_bytes"].iloc[0]) == int(level.min())


def test_snapshot_pickle_that_names_code_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]], "x": Path(".")}))
    with pytest.raises(popviz.ProfileError, match="plain data only"):
        popviz.import_trace([RESNET], tmp_path / "out", memory_snapshot=evil)


def test_pipelining_annotations_give_stage_pass_and_microbatch(pipeline: Any) -> None:
    events = _events(PIPELINE)
    base_ns = json.loads(gzip.decompress(PIPELINE.read_bytes()))["baseTimeNanoseconds"]
    trace = pipeline.trace
    assert sorted(pipeline.stages["stage"]) == [0, 1]
    assert set(pipeline.stages["ipu"]) == {0}
    # kernels inside the GPU-side span of PP:{s}F{m} are labelled s, F, m
    for ann in (e for e in events if e.get("cat") == "gpu_user_annotation"
                and e["name"][4:5] == "F"):
        s, m = int(ann["name"][3]), int(ann["name"][5:])
        lo, hi = ann["ts"] * 1e3, (ann["ts"] + ann["dur"]) * 1e3
        kernels = [e for e in events if e.get("cat") == "kernel"
                   and lo <= e["ts"] * 1e3 < hi]
        # the profile's clock: ns since baseTimeNanoseconds, minus the origin it names
        shift = base_ns - pipeline.meta["measure"]["origin_ns"]
        got = trace[(trace["kind"] == "compute")
                    & trace["start"].between(lo + shift - 1, hi + shift)]
        assert len(got) >= len(kernels) > 0
        assert set(got["stage"]) == {s} and set(got["pass"]) == {"F"}, ann["name"]
        assert set(got["microbatch"]) == {m}
    copies = pipeline.exchange
    n_copies = sum(e.get("cat") == "gpu_memcpy" for e in events)
    assert len(copies) == n_copies and set(copies["kind"]) == {"internal"}
    assert (copies["bytes"] == 32768).all()  # 8 x 1024 fp32 activations per micro-batch


def test_schedule_and_micro_batch_size_from_the_trace(pipeline: Any, resnet: Any) -> None:
    # the fixtures' README: ScheduleInterleaved1F1B, 2 stages on one rank, 4 micro-batches
    # of a batch of 32; ResNet-50 at batch 64 without pipelining
    opts = pipeline.meta["options"]
    assert (opts["schedule"], opts["micro_batch_size"], opts["microbatches"]) == \
        ("Interleaved1F1B", 8, 4)
    assert pipeline.summary["samples_per_step"] == 32
    opts = resnet.meta["options"]
    assert (opts["schedule"], opts["micro_batch_size"]) == (None, 64)


def test_interleaved_stages_on_one_rank_each_get_their_own_kernels(pipeline: Any) -> None:
    # the raw JSON: a kernel (or copy) belongs to the stage whose PP:{stage}... annotation
    # spans its launch (cuda_runtime, by correlation id; backward launches come from the
    # autograd thread, so any thread)
    events = _events(PIPELINE)
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in
                e.get("args", {})}
    anns = [e for e in events if e.get("cat") == "user_annotation"
            and e["name"].startswith("PP:")]
    busy = {0: 0.0, 1: 0.0}
    for k in (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")):
        at = launches.get(k["args"].get("correlation"))
        owner = [int(a["name"][3]) for a in anns if at is not None
                 and a["ts"] <= at <= a["ts"] + a["dur"]]
        if owner:
            busy[owner[0]] += k["dur"] * 1e3
    stages = profile_stages(pipeline).set_index("stage")
    got = stages[["forward_cycles", "backward_cycles", "recompute_cycles",
                  "optimiser_cycles", "exchange_cycles"]].sum(axis=1)
    assert busy[0] != pytest.approx(busy[1], rel=0.05)  # the stages do differ
    for s in (0, 1):
        assert got[s] == pytest.approx(busy[s], rel=1e-6), s
    # the rank's columns still add up to its step, idle counted once
    cols = ["forward_cycles", "backward_cycles", "recompute_cycles", "optimiser_cycles",
            "exchange_cycles", "idle_cycles", "other_cycles"]
    step = rank_time(pipeline.trace)["step_time"].iloc[0]
    assert stages[cols].to_numpy().sum() == pytest.approx(step, rel=1e-9)


def test_schedule_family_from_the_order_of_actions() -> None:
    def part(actions: list[str], stages: list[int]) -> RankPart:
        return RankPart(path=Path("x"), meta={}, rank=0, world_size=1, backend="",
                        base_ns=0, first_ns=0, stages=stages, actions=actions)

    gpipe = ["Forward 0", "Forward 1", "Backward 0", "Backward 1"]
    assert schedule_seen([part(gpipe, [0]), part(gpipe, [1])]) == "GPipe"
    last = ["PP:1F0", "PP:1B0", "PP:1F1", "PP:1B1"]
    assert schedule_seen([part(["PP:0F0", "PP:0F1", "PP:0B0", "PP:0B1"], [0]),
                          part(last, [1])]) == "1F1B"
    looped = ["PP:0F0", "PP:0F1", "PP:2F0", "PP:2F1", "PP:2B0", "PP:2B1", "PP:0B0", "PP:0B1"]
    assert schedule_seen([part(looped, [0, 2])]) == "LoopedBFS"
    assert schedule_seen([part(["PP:0F0", "PP:0I0", "PP:0W0"], [0])]) is None  # split B
    # torch's zero-bubble orders (`test_zero_bubble_torch.py` checks them against
    # torch's own code), written as its PP: annotations with I for an input gradient
    from popviz.compiler.schedule_zb import interleaved_zb_orders, zbv_orders

    def ranks(orders: list[list[Any]], stages: list[list[int]]) -> list[RankPart]:
        return [RankPart(path=Path("x"), meta={}, rank=r, world_size=2, backend="",
                         base_ns=0, first_ns=0, stages=s,
                         actions=[f"PP:{a.stage}{'I' if a.pass_ == 'B' else a.pass_}"
                                  f"{a.microbatch}" for a in o])
                for r, (o, s) in enumerate(zip(orders, stages, strict=True))]

    zbv = zbv_orders(2, 4)
    assert schedule_seen(ranks(zbv, [[0, 3], [1, 2]])) == "ZBV"
    assert schedule_seen(ranks(interleaved_zb_orders(2, 2, 4), [[0, 2], [1, 3]])) == \
        "InterleavedZB"
    swapped = [zbv[0][:3] + zbv[0][4:5] + zbv[0][3:4] + zbv[0][5:], zbv[1]]
    assert schedule_seen(ranks(swapped, [[0, 3], [1, 2]])) is None  # not torch's order
    assert schedule_seen([part([], [0]), part([], [1])]) is None  # Schedule1F1B


# ---- several ranks, made here ----
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_ranks_stages_and_transfers_of_a_gloo_pipeline(imported: dict[str, Any],
                                                       schedule: str) -> None:
    _check_gloo_pipeline(imported[schedule], WORLD, schedule)


@pytest.mark.parametrize("world", [2, 4])
def test_pipelines_of_two_and_four_ranks(world: int, tmp_path: Path) -> None:
    for schedule, files in make_traces(tmp_path / "runs", world=world).items():
        with popviz.open(popviz.import_trace(files, tmp_path / schedule)) as p:
            _check_gloo_pipeline(p, world, schedule)


def _check_gloo_pipeline(p: Any, world: int, schedule: str) -> None:
    """One Linear stage per gloo rank, MICROBATCHES micro-batches: what the import gives."""
    assert p.meta["ranks"] == list(range(world))
    # GPipe numbers its micro-batches (Forward i / Backward i); Schedule1F1B writes nothing
    # the schedule or the micro-batch size could be read from: unknown, not guessed
    opts = p.meta["options"]
    assert (opts["schedule"], opts["micro_batch_size"]) == \
        (("GPipe", MICRO_BATCH) if schedule == "GPipe" else (None, None))
    assert sorted(p.stages["stage"]) == list(range(world))
    # CPU ranks: no device memory to hold the run against, so fit stays unknown
    assert p.meta["measure"]["device_memory_bytes"] == {} and p.summary["fits"] is None
    assert p.meta["warnings"] == []
    ex = p.exchange
    # activations flow down the pipeline, gradients back, one per micro-batch and link
    links = world - 1
    assert len(ex) == 2 * links * MICROBATCHES
    acts = ex[ex["kind"] == "activation"]
    grads = ex[ex["kind"] == "gradient"]
    assert ((acts["dst"].astype(int) - acts["src"].astype(int)) == 1).all()
    assert ((grads["src"].astype(int) - grads["dst"].astype(int)) == 1).all()
    assert (ex["bytes"] == MICRO_BATCH * FEATURES * 4).all()
    for (src, dst), link in acts.groupby(["src", "dst"]):
        assert sorted(link["microbatch"]) == list(range(MICROBATCHES)), (src, dst)
    # clocks aligned: a transfer ends after its data was posted (start = both posted)
    assert (ex["end"] >= ex["start"]).all()
    # micro-batch m reaches the last stage after it left the first
    first = acts[acts["src"].astype(int) == 0].set_index("microbatch")["start"]
    last = acts[acts["dst"].astype(int) == world - 1].set_index("microbatch")["end"]
    assert (last.sort_index() > first.sort_index()).all()
    # every rank's time adds up to the step: the metrics core's partition
    times = rank_time(p.trace)
    parts = times.drop(columns=["step_time", "steps"]).sum(axis=1)
    assert np.allclose(parts, times["step_time"])


def test_gpipe_compute_is_labelled_by_its_annotations(imported: dict[str, Any]) -> None:
    comp = imported["GPipe"].trace
    comp = comp[comp["kind"] == "compute"]
    for rank in range(WORLD):
        mine = comp[comp["ipu"] == rank]
        assert set(mine["stage"]) == {rank}
        for ps in ("F", "B"):
            got = set(mine.loc[mine["pass"] == ps, "microbatch"]) - {-1}
            assert got == set(range(MICROBATCHES)), (rank, ps)


def test_microbatches_without_annotations_follow_the_transfers(
        runs: dict[str, list[Path]], imported: dict[str, Any], tmp_path: Path) -> None:
    # GPipe's traces without their Forward i / Backward i annotations (as Schedule1F1B
    # writes them): the micro-batches inferred from the transfers are the annotated ones
    stripped = []
    for f in runs["GPipe"]:
        doc = json.loads(f.read_bytes())
        doc["traceEvents"] = [e for e in doc["traceEvents"]
                              if not (e.get("cat") == "user_annotation"
                                      and e.get("name", "").split(" ")[0]
                                      in ("Forward", "Backward"))]
        stripped.append(tmp_path / f.name)
        stripped[-1].write_text(json.dumps(doc))
    with popviz.open(popviz.import_trace(stripped, tmp_path / "bare")) as bare:
        b = bare.trace[bare.trace["kind"] == "compute"].reset_index(drop=True)
        b_origin = bare.meta["measure"]["origin_ns"]
    a = imported["GPipe"].trace
    a_origin = imported["GPipe"].meta["measure"]["origin_ns"]
    a = a[a["kind"] == "compute"].reset_index(drop=True)
    # time 0 is the earliest kept event of any rank, which can be a stripped "Forward 0"
    # (a rank waiting on its recv opens it first): the same times on the epoch clock
    assert (a["start"] + a_origin == b["start"] + b_origin).all()
    same = (a["microbatch"] >= 0) & (a["pass"] == b["pass"])
    assert same.mean() > 0.9
    assert (a.loc[same, "microbatch"] == b.loc[same, "microbatch"]).all()
    one = imported["1F1B"].trace
    one = one[(one["kind"] == "compute") & one["pass"].isin(["F", "B"])]
    for (rank, ps), rows in one.groupby(["ipu", "pass"]):
        assert set(rows["microbatch"]) - {-1} == set(range(MICROBATCHES)), (rank, ps)


def test_worker_processes_give_the_same_profile(runs: dict[str, list[Path]],
                                               imported: dict[str, Any],
                                               tmp_path: Path) -> None:
    # files in reverse order, parsed in 2 worker processes: same tables as in-process
    path = popviz.import_trace(runs["GPipe"][::-1], tmp_path, workers=2)
    with popviz.open(path) as p:
        one = imported["GPipe"]
        for name in ("trace", "stages", "exchange", "ops", "liveness"):
            pd.testing.assert_frame_equal(getattr(p, name), getattr(one, name))
        assert p.meta["options"] == one.meta["options"]


def test_gzip_and_plain_import_the_same(runs: dict[str, list[Path]], tmp_path: Path) -> None:
    files = runs["GPipe"]
    zipped = []
    for f in files:
        z = tmp_path / (f.name + ".gz")
        z.write_bytes(gzip.compress(f.read_bytes()))
        zipped.append(z)
    a = popviz.import_trace(files, tmp_path / "a")
    b = popviz.import_trace(list(reversed(zipped)), tmp_path / "b")
    with popviz.open(a) as pa, popviz.open(b) as pb:
        pd.testing.assert_frame_equal(pa.trace, pb.trace)
        pd.testing.assert_frame_equal(pa.exchange, pb.exchange)


def test_chunked_parsing_equals_one_json_load(runs: dict[str, list[Path]],
                                              monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    # an event whose args hold `},{` in a string and a list of objects: cuts land there
    path = tmp_path / "tricky.json"
    doc = json.loads(runs["1F1B"][1].read_bytes())
    doc["traceEvents"].insert(5, {"ph": "X", "cat": "cpu_op", "name": "x},{y", "pid": 1,
                                  "tid": 1, "ts": doc["traceEvents"][9]["ts"], "dur": 1.0,
                                  "args": {"l": [{"a": 1}, {"b": 2}], "s": "}, {"}})
    path.write_text(json.dumps(doc, indent=1))
    whole = kineto.read_trace(path)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 700)
    sliced = kineto.read_trace(path)
    pd.testing.assert_frame_equal(whole.spans, sliced.spans)
    assert whole.meta == sliced.meta and "x},{y" in set(sliced.spans["name"].astype(str))
    raw = [e for e in doc["traceEvents"] if e.get("ph") == "X"
           and e.get("cat") in kineto.KEEP_CATS]
    assert len(sliced.spans) == len(raw)


@pytest.mark.parametrize("which", ["resnet", "pipeline", "gloo"])
def test_vectorised_reader_equals_the_json_decoder(which: str,
                                                   runs: dict[str, list[Path]]) -> None:
    path = {"resnet": RESNET, "pipeline": PIPELINE, "gloo": runs["GPipe"][1]}[which]
    fast = kineto.read_trace(path)
    data = kineto.read_bytes(path)
    spans, memory, top = kineto.read_general(data, path)
    assert fast.meta == top and len(fast.spans) == len(spans) > 0
    # the vectorised reader itself, not its fallback, takes torch.profiler's files
    begin = kineto._KEY.search(data).end() - 1
    vec_spans, vec_memory = kineto_fast.fast_frames(
        data, begin, kineto.array_end(data, begin, path)[0])
    pd.testing.assert_frame_equal(vec_spans, fast.spans)
    pd.testing.assert_frame_equal(vec_memory, fast.memory)
    for col in spans.columns:
        a, b = fast.spans[col], spans[col]
        if col in ("start", "end"):  # exact digits vs float µs x 1000: 1 ns apart at most
            assert np.abs(a.to_numpy() - b.to_numpy()).max() <= 1, col
        elif col == "dims":  # text (fast) or lists (json): the same shapes
            assert [json.loads(x) if isinstance(x, str) else x for x in a] == list(b)
        elif col == "launch":  # tuples (kernels) and None: NaN fields compare by repr
            assert [repr(x) for x in a] == [repr(x) for x in b]
            assert sum(x is not None for x in a) == (fast.spans["cat"] == "kernel").sum()
        elif col not in ("types", "concrete"):  # the fast reader keeps them for p2p only
            assert (a.astype(str).to_numpy() == b.astype(str).to_numpy()).all(), col
    for col in memory.columns:
        assert np.abs(fast.memory[col].to_numpy() - memory[col].to_numpy()).max() <= 1


# ---- errors: one line, naming the file ----
def test_bad_inputs_are_named_in_one_line(runs: dict[str, list[Path]], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    files = runs["GPipe"]
    cut = tmp_path / "cut.json"
    cut.write_bytes(files[1].read_bytes()[:5000])
    # cut just after an event: what follows its last list reads like the top level's end
    text = files[1].read_bytes()
    after = tmp_path / "after_event.json"
    dims = text.index(b'"Input Dims"', 3000)
    after.write_bytes(text[:text.index(b"}", dims) + 1])
    cases = {
        "missing": ([files[0], tmp_path / "nope.json", files[2]], "nope.json: no such"),
        "cut": ([files[0], cut, files[2]], "cut.json: not valid JSON"),
        "after": ([files[0], after, files[2]], "after_event.json: not valid JSON"),
        "twice": ([files[0], files[0], files[1], files[2]], "rank 0 given twice"),
        "gap": ([files[0], files[2]], r"rank\(s\) 1 of 3 missing"),
    }
    for name, (paths, why) in cases.items():
        with pytest.raises(popviz.ProfileError, match=why):
            popviz.import_trace(paths, tmp_path / name)
        assert not (tmp_path / name / "profile.h5").exists()
    assert main(["import", str(files[0]), str(cut), "--to", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cut.json" in err


# ---- compare treats an import like a measured run ----
def test_compare_an_imported_run_with_a_modelled_plan(pipeline: Any,
                                                      imported: dict[str, Any]) -> None:
    modelled = Path(__file__).resolve().parents[1] / "profiles" / "tutorial_pipelined" \
        / "training" / "profile.h5"
    if not modelled.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    with popviz.open(modelled) as plan:
        comp = popviz.compare(plan, pipeline)
        assert list(comp.sides["kind"]) == ["modelled", "measured"]
        tps = comp.time_per_sample.set_index("category")
        assert tps.loc["idle", "b"] > 0 and tps.loc["forward", "b"] > 0
    both = popviz.compare(imported["GPipe"], imported["1F1B"])
    assert set(both.time_per_sample["category"]) >= {"forward", "backward", "exchange"}
