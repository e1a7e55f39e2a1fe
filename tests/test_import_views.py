"""popviz import as users see it: the CLI, the summary (a GPU's fit against its device
memory, warnings), every app page and compare, on the real H100 recordings."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.analysis.facts import profile_facts
from popviz.cli.main import main
from popviz.metrics import device_capacities, device_fit, device_fits
from tests.import_fixtures import (
    PIPELINE,
    RESNET,
    SNAPSHOT,
    snapshot_inside_trace,
    snapshot_with_times,
    trace_events,
    trace_json,
)


def test_cli_import_writes_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(PIPELINE), "--to", str(tmp_path / "p")]) == 0
    assert "imported 1 trace(s)" in capsys.readouterr().out
    assert main(["summary", "--json", str(tmp_path / "p")]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["kind"] == "measured" and facts["ranks"] == [0]


# ---- the app and compare treat an import like a measured run ----
def test_pages_of_an_imported_profile_load_and_speak_ranks(pipeline: Any, resnet: Any,
                                                          tmp_path: Path) -> None:
    from popviz_app import ProfileCache, render
    from popviz_app.common import AppContext

    from tests.dash_util import component_text

    for name, p in (("pp", pipeline), ("rn", resnet)):
        (tmp_path / name).mkdir()
        shutil.copy(p.path, tmp_path / name / "profile.h5")
    ctx = AppContext(root=tmp_path, cache=ProfileCache(tmp_path))
    for name in ("pp", "rn"):
        query = f"?profile={name}/profile.h5"
        for page in ("/summary", "/trace", "/liveness", "/memory", "/stages", "/exchange",
                     "/operations"):
            text = component_text(render(ctx, page, query)[1])
            assert "Traceback" not in text and "cannot" not in text.lower(), (name, page)
        summary = component_text(render(ctx, "/summary", query)[1])
        assert "per rank" in summary and " ns (" in summary
    # one rank: no bottleneck or bubble cards (they compare devices)
    pp = component_text(render(ctx, "/summary", "?profile=pp/profile.h5")[1])
    assert "bubbles" not in pp and "bottleneck" not in pp


def test_exchange_page_of_an_import_lists_the_traces_exchange_time(resnet: Any,
                                                                  tmp_path: Path) -> None:
    """The trace counts the H100's memsets as exchange: /exchange lists them with the same
    time as the stage table's exchange, not 'no exchange' (issue 21)."""
    from popviz_app import ProfileCache, render
    from popviz_app.common import AppContext

    from popviz.analysis.balance import profile_stages
    from tests.dash_util import component_text

    (tmp_path / "rn").mkdir()
    shutil.copy(resnet.path, tmp_path / "rn" / "profile.h5")
    ctx = AppContext(root=tmp_path, cache=ProfileCache(tmp_path))
    body = render(ctx, "/exchange", "?profile=rn/profile.h5")[1]
    assert "No transfers between ranks" in component_text(body)
    todo, rows = [body], None
    while todo:
        node = todo.pop()
        if getattr(node, "id", None) == "exchange-trace":
            rows = node.data
        kids = getattr(node, "children", None)
        todo += kids if isinstance(kids, list) else [kids] if kids is not None and \
            not isinstance(kids, (str, int, float)) else []
    assert rows and any("Memset" in r["op"] for r in rows)
    assert sum(r["ns"] for r in rows) == pytest.approx(
        float(profile_stages(resnet)["exchange_cycles"].sum()))


def test_compare_a_modelled_run_with_an_imported_gpu_trace(resnet: Any) -> None:
    from popviz.figures.compare import liveness_compare_figure
    modelled = Path(__file__).resolve().parents[1] / "profiles" / "rn50_pipeline"
    if not modelled.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    with popviz.open(modelled) as plan:
        comp = popviz.compare(plan, resnet)
    v = comp.verdict
    words = v["terms"] + v["differences"] + v["reasons"] + [v["headline"]]
    # a value the import does not know reads "unknown", never an empty string
    assert "precision 16.32 vs unknown" in v["terms"]
    assert any(d.startswith("schedule: ") and d.endswith(" vs unknown")
               for d in v["differences"])
    assert not any(" vs ;" in w or " vs ." in w or w.endswith(" vs ") for w in words)
    # the import's model name is its file's: no claim of a different model
    assert not any("different models" in w for w in words)
    assert any("kineto_resnet50_b64 is its trace file's name" in w for w in v["reasons"])
    # units speak each side's devices
    units = comp.metrics.set_index("metric")["unit"]
    assert units["throughput_per_ipu"] == "samples/s per IPU (A) / rank (B)"
    assert "rank" in units["ipu_us_per_sample"] and "rank" in comp.time_per_sample["unit"][0]
    # B's peak is a share of its GPU's memory, A's of an IPU's; each capacity line says whose
    gpu = trace_json(RESNET)["deviceProperties"][0]["totalGlobalMem"]
    peak = comp.metrics.set_index("metric").loc["peak_bytes_max", "b"]
    assert f"({peak / gpu:.0%} of its device memory)" in " ".join(v["reasons"])
    assert any(r.startswith("peak memory") and "of an IPU)" in r for r in v["reasons"])
    fig = liveness_compare_figure(comp)
    lines = [a.text for a in fig.layout.annotations if "capacity" in a.text or "memory" in a.text]
    assert lines == ["A IPU capacity"]  # B's 79 GiB is far above every curve: not drawn
    # peak per device: A's IPUs keep their capacity marks, B's is off the scale, said so
    from popviz.figures.compare import ipu_memory_compare_figure
    mem = ipu_memory_compare_figure(comp)
    marks = next(d for d in mem.data if d.name == "capacity")
    ipu = comp.sides.set_index("side").loc["A", "ipu_capacity_bytes"]
    assert [y for y in marks.y if y == y] == [ipu / 2**20] * 4  # one per IPU of A, none for B
    assert f"(B's capacity {gpu / 2**20:,.0f} MiB is off the scale)" in mem.layout.title.text


def test_no_capacity_line_across_a_cpu_rank() -> None:
    from popviz.figures.compare import liveness_compare_figure
    root = Path(__file__).resolve().parents[1] / "profiles"
    if not (root / "tutorial_measured_2ranks").exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    with popviz.open(root / "tutorial_pipelined" / "training" / "profile.h5") as plan, \
            popviz.open(root / "tutorial_measured_2ranks") as cpu:
        fig = liveness_compare_figure(popviz.compare(plan, cpu))
    assert not [s for s in fig.layout.shapes if s.y0 == s.y1]  # no horizontal line
    assert "B has none" in fig.layout.title.text


# ---- a GPU's fit: its peak against its device memory ----
def test_a_gpu_import_fits_its_device_memory(resnet: Any, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    memory = trace_json(RESNET)["deviceProperties"][0]["totalGlobalMem"]
    peak = max(e["args"]["Total Allocated"] for e in trace_events(RESNET)
               if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1)
    assert resnet.meta["measure"]["device_memory_bytes"] == {"0": memory}
    facts = profile_facts(resnet)
    assert facts["fits"] is True and resnet.summary["fits"] is True
    assert facts["device_memory"] == [{"ipu": 0, "peak_bytes": peak, "capacity_bytes": memory,
                                       "utilisation": pytest.approx(peak / memory)}]
    assert main(["summary", "--no-vet", str(resnet.path)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line == (f"  fits: yes  (rank 0 peak {peak / 2**30:.1f} GiB of "
                    f"{memory / 2**30:.1f} GiB device memory, {peak / memory:.1%})")


def test_summary_card_of_a_gpu_import_names_its_memory(resnet: Any, tmp_path: Path) -> None:
    from popviz_app import ProfileCache, render
    from popviz_app.common import AppContext

    from tests.dash_util import component_text

    (tmp_path / "rn").mkdir()
    shutil.copy(resnet.path, tmp_path / "rn" / "profile.h5")
    ctx = AppContext(root=tmp_path, cache=ProfileCache(tmp_path))
    text = component_text(render(ctx, "/summary", "?profile=rn/profile.h5")[1])
    memory = trace_json(RESNET)["deviceProperties"][0]["totalGlobalMem"]
    peak = int(resnet.summary["peak_liveness_bytes"]["0"])
    assert f"fits · peak {peak / 2**30:.1f} GiB of {memory / 2**30:.1f} GiB " \
        f"({peak / memory:.0%})" in text


def test_device_fit_of_the_metrics_core() -> None:
    live = pd.DataFrame({"ipu": [0, 0, 1], "always_live_bytes": [10, 10, 5],
                         "not_always_live_bytes": [0, 30, 1]})
    assert device_fits(live, {}) is None
    assert device_fits(live, {0: 40, 1: 6}) is True  # a peak equal to the memory fits
    assert device_fits(live, {0: 39, 1: 6}) is False
    # rank 2 has no liveness: nothing says how full it was, so it is left out
    rows = device_fit(live, {0: 80, 2: 8})
    assert rows.to_dict("list") == {"ipu": [0], "peak_bytes": [40], "capacity_bytes": [80],
                                    "utilisation": [0.5]}
    assert device_fits(live, {2: 8}) is None
    # the capacities come from an untrusted file: only positive whole numbers count
    hostile = {"0": "lots", "1": -5, "x": 3, "2": 10, "3": float("inf"), "4": float("nan"),
               "5": True, "6": 1.5, "7": 8.0e10, "8": None, "9": [1]}
    assert device_capacities({"measure": {"device_memory_bytes": hostile}}) == \
        {2: 10, 7: 80_000_000_000}
    for meta in ({"measure": {"device_memory_bytes": [1, 2]}}, {"measure": "x"},
                 {"measure": [1]}, {"measure": None}, [], None):
        assert device_capacities(meta) == {}


def _edited(tmp_path: Path, name: str, edit: Any, source: Path = RESNET) -> Path:
    """A copy of a fixture trace with `edit` applied to its parsed JSON."""
    doc = trace_json(source)
    edit(doc)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def test_no_device_memory_fit_without_the_gpus_memory_events(tmp_path: Path) -> None:
    def drop_memory(doc: dict) -> None:
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]

    def host_only(doc: dict) -> None:
        for e in doc["traceEvents"]:
            if e.get("name") == "[memory]":
                e["args"]["Device Type"] = 0
    for name, edit in (("bare", drop_memory), ("host", host_only)):
        with popviz.open(popviz.import_trace(_edited(tmp_path, name, edit),
                                             tmp_path / name)) as p:
            # the GPU's memory is known, but not how full it was: fit stays unknown
            assert p.meta["measure"]["device_memory_bytes"] == {}, name
            assert p.summary["fits"] is None and profile_facts(p)["device_memory"] == []


def test_a_gpu_over_its_memory_reads_no_everywhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from popviz_app import ProfileCache, render
    from popviz_app.common import AppContext

    from tests.dash_util import component_text

    def small_gpu(doc: dict) -> None:
        doc["deviceProperties"][0]["totalGlobalMem"] = 2**30  # 1 GiB

    (tmp_path / "root").mkdir()
    path = popviz.import_trace(_edited(tmp_path, "small", small_gpu), tmp_path / "root" / "s")
    with popviz.open(path) as p:
        peak = int(p.summary["peak_liveness_bytes"]["0"])
        assert p.summary["fits"] is False
    assert main(["summary", "--no-vet", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        f"  fits: NO  (rank 0 peak {peak / 2**30:.1f} GiB of 1.0 GiB device memory, "
        f"{peak / 2**30:.1%})")
    ctx = AppContext(root=tmp_path / "root", cache=ProfileCache(tmp_path / "root"))
    text = component_text(render(ctx, "/summary", "?profile=s/profile.h5")[1])
    assert f"OVER DEVICE MEMORY · peak {peak / 2**30:.1f} GiB of 1.0 GiB" in text


def test_ranks_on_gpus_of_different_memory_keep_their_own(tmp_path: Path) -> None:
    sizes = {0: 80 * 2**30, 1: 40 * 2**30}

    def rank(r: int) -> Any:
        def edit(doc: dict) -> None:
            doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r,
                                      "world_size": 2}
            doc["deviceProperties"][0]["totalGlobalMem"] = sizes[r]
        return edit
    files = [_edited(tmp_path, f"rank{r}", rank(r), PIPELINE) for r in sizes]
    with popviz.open(popviz.import_trace(files, tmp_path / "two")) as p:
        assert device_capacities(p.meta) == sizes
        rows = device_fit(p.liveness, device_capacities(p.meta)).set_index("ipu")
        assert rows["capacity_bytes"].to_dict() == sizes
        comp = popviz.compare(p, p)
    head = comp.ipus[comp.ipus["metric"] == "headroom_bytes"].set_index("ipu")["a"]
    peaks = comp.ipus[comp.ipus["metric"] == "peak_bytes"].set_index("ipu")["a"]
    for r, size in sizes.items():  # each rank's headroom is against its own GPU
        assert head[r] == pytest.approx(size - peaks[r])


# ---- a memory snapshot that does not belong to the trace ----
def test_a_snapshot_of_another_run_is_not_used_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(RESNET), "--memory-snapshot", str(SNAPSHOT),
                 "--to", str(tmp_path / "p")]) == 0
    out = capsys.readouterr()
    warnings = out.err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith(
        "popviz: warning: memory snapshot memsnap_resnet50_b32.pickle.gz (rank 0): none of")
    assert warnings[0].endswith("It is not used: the trace's own memory events are shown")
    # the run's memory is the trace's own (issue 21: the batch-32 snapshot's 2.9 GiB used
    # to headline this batch-64 run): the same liveness as an import without the snapshot
    assert main(["import", str(RESNET), "--to", str(tmp_path / "alone")]) == 0
    capsys.readouterr()
    with popviz.open(tmp_path / "p") as with_snap, popviz.open(tmp_path / "alone") as alone:
        pd.testing.assert_frame_equal(with_snap.liveness, alone.liveness)
        peak = with_snap.liveness["not_always_live_bytes"].max() \
            + with_snap.liveness["always_live_bytes"].max()
        assert peak > 5 * 2**30  # the trace's 5.6 GiB, not the snapshot's 2.9 GiB
    # how far after the trace, from the raw files: the trace's last end, the first event
    trace = trace_json(RESNET)
    base_us = trace["baseTimeNanoseconds"] / 1e3
    end_us = max(e["ts"] + e.get("dur", 0) for e in trace["traceEvents"]
                 if isinstance(e.get("pid"), int) and e.get("ph") == "X")
    snap = pickle.loads(gzip.decompress(SNAPSHOT.read_bytes()))
    first_us = min(e["time_us"] for e in snap["device_traces"][0]
                   if e["action"] in ("alloc", "free_completed"))
    assert f"starts {(first_us - base_us - end_us) / 1e6:,.1f} s after the trace ends" \
        in warnings[0]
    assert main(["summary", "--no-vet", str(tmp_path / "p")]) == 0
    text = capsys.readouterr().out
    assert "  warning: memory snapshot memsnap_resnet50_b32.pickle.gz" in text
    assert main(["summary", "--json", "--no-vet", str(tmp_path / "p")]) == 0
    assert len(json.loads(capsys.readouterr().out)["warnings"]) == 1
    # and the Summary page lists it above the advice
    from popviz_app import ProfileCache, render
    from popviz_app.common import AppContext

    from tests.dash_util import component_text

    ctx = AppContext(root=tmp_path, cache=ProfileCache(tmp_path))
    page = component_text(render(ctx, "/summary", "?profile=p/profile.h5")[1])
    assert "Warnings" in page and warnings[0].removeprefix("popviz: warning: ") in page


def test_a_snapshot_inside_the_trace_or_without_times(tmp_path: Path) -> None:
    inside = snapshot_inside_trace(tmp_path)
    with popviz.open(popviz.import_trace([RESNET], tmp_path / "in",
                                         memory_snapshot=inside)) as p:
        assert p.meta["warnings"] == []
        assert (p.liveness["phase"] != "other").any()  # placed on the trace: phases
    untimed = snapshot_with_times(tmp_path, np.zeros(2025))
    with popviz.open(popviz.import_trace([RESNET], tmp_path / "zero",
                                         memory_snapshot=untimed)) as p:
        assert p.meta["warnings"] == ["memory snapshot snap.pickle (rank 0) records no event "
                                      "times: its curve cannot be placed on the trace's "
                                      "clock, so it has no phases"]


def test_chrome_export_of_an_import_names_each_kernels_host_op(resnet: Any) -> None:
    """Each exported kernel carries the cpu_op of its External id in the raw JSON."""
    from collections import Counter

    from popviz.format.export import chrome_trace

    raw = trace_events(RESNET)
    name_of = {e["args"]["External id"]: e["name"] for e in raw
               if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    want = Counter((e["name"], name_of[e["args"]["External id"]]) for e in raw
                   if e.get("cat") == "kernel" and "nccl" not in e["name"].lower())
    got = Counter((e["name"], e["args"].get("host_op"))
                  for e in chrome_trace(resnet)["traceEvents"] if e.get("cat") == "compute")
    assert got == want


def test_chrome_export_of_an_import_keeps_host_threads_and_launch_arrows(resnet: Any) -> None:
    """Perfetto gets the host thread lanes (every host slice, on its thread) and one flow
    arrow per launch whose kernel is in the trace, from the runtime call to the kernel."""
    from popviz.format.export import HOST_TID0, chrome_trace

    events = chrome_trace(resnet)["traceEvents"]
    slices = resnet.table("host_slices")
    host = [e for e in events if e.get("ph") == "X" and e.get("tid", 0) >= HOST_TID0]
    assert len(host) == len(slices) > 0
    names = {e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name" and e["tid"] >= HOST_TID0}
    assert names == {f"host {t}" for t in slices["thread"].unique()}
    starts = {(e["ph"], e["id"]): e for e in events if e.get("ph") in ("s", "f")}
    flows = {i for ph, i in starts if ph == "s"}
    assert flows == {i for ph, i in starts if ph == "f"} and flows
    trace = resnet.trace
    launched = set(zip(slices.loc[slices["correlation"] >= 0, "ipu"],
                       slices.loc[slices["correlation"] >= 0, "correlation"]))
    kernels = trace[trace["correlation"] > 0]
    want = {(int(r) << 32) | int(c) for r, c in zip(kernels["ipu"], kernels["correlation"])
            if (r, c) in launched}
    assert flows == want
    scale = 1e-3  # an import's clock is ns
    first = kernels.iloc[0]
    f = starts[("f", (int(first["ipu"]) << 32) | int(first["correlation"]))]
    assert f["ts"] == pytest.approx(float(first["start"]) * scale)
    s_ev = starts[("s", f["id"])]
    call = slices[(slices["correlation"] == first["correlation"])
                  & (slices["ipu"] == first["ipu"])].iloc[0]
    assert s_ev["ts"] == pytest.approx(float(call["start"]) * scale)
    assert call["cat"] in ("cuda_runtime", "cuda_driver")


def test_warnings_of_an_untrusted_file_are_plain_text() -> None:
    from popviz.analysis.facts import profile_warnings

    meta = {"warnings": ["red \x1b[31mtext\x07", 5, None, "c" * 600]}
    assert profile_warnings(meta) == ["red  [31mtext ", "c" * 500]
    assert profile_warnings({"warnings": "not a list"}) == []
    assert profile_warnings({"warnings": ["w"] * 50}, limit=3) == ["w"] * 3


def test_grouped_ops_of_an_import_have_self_and_inclusive_time(resnet: Any,
                                                               tmp_path: Path) -> None:
    """/operations grouped by class on the H100 import: host and GPU time, each self and
    inclusive; GPU self adds up to the kernels' time in the ops table (issue 21)."""
    from popviz_app import create_app

    from tests.dash_util import component_text, find_components

    (tmp_path / "rn").mkdir()
    shutil.copy(resnet.path, tmp_path / "rn" / "profile.h5")
    app: Any = create_app(tmp_path)
    grouped = app.popviz_callbacks["operations.grouped"]("op_class", "", "?profile=rn/profile.h5")
    table = find_components(grouped, "DataTable")[0]
    assert "inclusive ones do not across rows" in component_text(grouped)
    names = [c["name"] for c in table.columns]
    assert {"host self ns", "host inclusive ns", "GPU self ns", "GPU inclusive ns",
            "share"} <= set(names), names
    rows = table.data
    assert sum(r["GPU self ns"] for r in rows) == pytest.approx(float(resnet.ops["cycles"].sum()))
    assert all(r["host self ns"] <= r["host inclusive ns"] for r in rows)
    assert all(r["GPU self ns"] <= r["GPU inclusive ns"] + 1e-6 for r in rows)
    # by pass, every op of a pass under another of it counted once: the pass's own time
    by_pass = find_components(app.popviz_callbacks["operations.grouped"](
        "pass", "", "?profile=rn/profile.h5"), "DataTable")[0].data
    assert sum(r["GPU inclusive ns"] for r in by_pass) == pytest.approx(
        float(resnet.ops["cycles"].sum()))
    assert sum(r["host inclusive ns"] for r in by_pass) <= float(
        resnet.ops["end"].max() - resnet.ops["start"].min())
