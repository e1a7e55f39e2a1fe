"""`popviz tune` as text and as JSON: the current layout and the candidates advise.tune
found, each as train.py flags and as the Python that sets it, and what each AMP step
trades (analysis.amp.amp_steps)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from popviz.reporters.table import aligned

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from popviz.advise.tune import Candidate, TuneResult

MiB = 1024 * 1024
SAME = 0.005  # ratios within 0.5% of 1 are 'about the same'


@dataclass(frozen=True)
class TuneReport:
    """What `popviz tune` found and did: the search's result, the profile's name and
    strategy, the AMP steps of its current layout, the profiles it wrote."""

    result: TuneResult
    profile: str
    name: str
    strategy: str
    amp_steps: pd.DataFrame | None = None
    written: Path | None = None
    written_now: Path | None = None


def _mcycles(values: list[int]) -> str:
    return "/".join(f"{v / 1e6:.2f}" for v in values)


def _amps(values: list[float]) -> str:
    return f"{values[0]:g}" if len(set(values)) == 1 else "/".join(f"{a:g}" for a in values)


def _fit_phrase(fits: bool, limit: float) -> str:
    word = "fits" if fits else "does NOT fit"
    return word + (f" (every tile at most {limit:.0%} full)" if limit < 1 else "")


def _row(label: str, c: Candidate, limit: float = 1.0) -> list[str]:
    from popviz.advise.tune_search import fit_words  # advise loads only when tune runs

    return [
        label, " ".join(c.splits) or "-", _amps(c.amp),
        c.recompute_words,
        c.schedule if c.num_ipus > 1 else "-",  # one device: no pipeline to schedule
        fit_words(c.fits, c.oom_tiles, limit),
        f"{c.throughput:,.0f}", f"{c.throughput_per_ipu:,.0f}",
        f"{c.throughput_ratio:.2f}x", f"{c.step_ms:,.1f}",
        f"{c.idle_fraction:.0%}", _mcycles(c.stage_cycles),
        "/".join(f"{b / MiB:.0f}" for b in c.peak_bytes),
        f"{max(c.max_tile_fill, default=0):.0%}",
    ]


def python_lines(c: Candidate, strategy: str = "pipelined") -> list[str]:
    """The layout as the Python that sets it on `popviz.Options` (what train_args says)."""
    from popviz.advise.tune_search import DEFAULT_TARGET

    target = f".set_target({json.dumps(c.target)})" if c.target != DEFAULT_TARGET else ""
    lines = [f"options = popviz.Options(){target}.set_num_ipus({c.num_ipus})"]
    if c.splits:
        lines.append(f"options.set_pipeline_splits({', '.join(map(json.dumps, c.splits))})")
    if c.num_ipus > 1 and strategy == "sharded":
        lines.append('options.strategy = "sharded"')
    elif c.num_ipus > 1 or c.splits:
        lines.append(f"options.set_schedule({json.dumps(c.schedule)})")
    if c.recomputation:
        lines.append("options.set_recomputation(True)" if c.recompute_granularity == "full"
                     else f"options.set_recomputation(True, {json.dumps(c.recompute_granularity)})")
    lines.append(f"options.set_gradient_accumulation({c.gradient_accumulation})")
    if c.gpu:  # a GPU has no AMP
        if c.gpu_precision != "as-recorded":
            lines.append(f"options.set_gpu_precision({json.dumps(c.gpu_precision)})")
        return lines
    amp = f"{c.amp[0]:g}" if len(set(c.amp)) == 1 else \
        "{" + ", ".join(f'"IPU{i}": {a:g}' for i, a in enumerate(c.amp)) + "}"
    lines.append(f"options.set_available_memory_proportion({amp})")
    return lines


def _plans(r: TuneResult, base_strategy: str) -> list[str]:
    """Every listed layout as train.py flags and as Python."""
    out = ["", "Each layout as train.py flags and as Python (popviz.Options):"]
    for label, c in [("now", r.baseline), *((f"#{i}", c) for i, c in
                                             enumerate(r.candidates, 1))]:
        out.append(f"  {label}: train.py ... {c.train_args(base_strategy)}")
        out += [f"      {line}" for line in python_lines(c, base_strategy)]
    return out


HEAD = ["", "splits", "AMP", "recomp", "schedule", "fits", "samples/s", "per IPU",
        "vs now", "step ms", "idle", "Mcycles/stage/mb", "peak MiB/IPU", "fullest tile"]
NUMERIC = set(HEAD[6:])  # right-aligned
GPU_LESS = {"AMP", "fullest tile"}  # IPU-only columns


def _gpu_words(text: str) -> str:
    """A GPU target's table and lines: GPUs, ms (Mcycles of ns), no tiles."""
    for ipu, gpu in (("Mcycles/stage/mb", "ms/stage/mb"), ("peak MiB/IPU", "peak MiB/GPU"),
                     ("per IPU", "per GPU"), ("IPU(s)", "GPU(s)"), ("IPUs", "GPUs")):
        text = text.replace(ipu, gpu)
    return text


def render_text(r: TuneResult, name: str, base_strategy: str) -> str:
    from popviz.target import get_target
    from popviz.target.gpu import GpuTarget

    gpu = isinstance(get_target(r.target), GpuTarget)
    text = _render_text(r, name, base_strategy, gpu)
    return _gpu_words(text) if gpu else text


def _render_text(r: TuneResult, name: str, base_strategy: str, gpu: bool = False) -> str:
    rows = [_row("now", r.baseline, r.max_tile_fill)]
    rows += [_row(f"#{i}", c, r.max_tile_fill) for i, c in enumerate(r.candidates, 1)]
    head = HEAD
    if gpu:  # no AMP and no tiles on a GPU: no columns of them
        keep = [i for i, h in enumerate(HEAD) if h not in GPU_LESS]
        head = [HEAD[i] for i in keep]
        rows = [[row[i] for i in keep] for row in rows]
    numeric = {i for i, h in enumerate(head) if h in NUMERIC}
    table = aligned(head, rows, right=numeric, indent="")

    b = r.baseline
    out = [f"{name}: {r.model or 'model ?'} on {r.target}, planning for "
           f"{r.num_ipus} IPU(s); {r.layouts} layouts in {r.compiles} compiles "
           f"({r.seconds:.1f} s)",
           f"now: {b.num_ipus} IPU(s)"
           + (f" x {b.replicas} replicas" if b.replicas > 1 else "")
           + f", {_fit_phrase(b.fits, r.max_tile_fill)}, {b.throughput:,.0f} samples/s "
           "(per IPU: samples/s over all IPUs of all replicas)", "", *table]
    best = r.best
    if best is not None:
        ratio = best.throughput_per_ipu_ratio
        verdict = ("faster per IPU" if ratio > 1 + SAME else "slower per IPU"
                   if ratio < 1 - SAME else "about the same per IPU")
        # a layout that fits is kept unless the search found a faster one
        keep = b.fits and best.throughput_ratio < 1 + SAME
        out += ["", ("Keep the current layout: no faster one was found; the best other, "
                     "for reference: " if keep else "Best: ")
                + f"{best.throughput_ratio:.2f}x the current throughput "
                f"({ratio:.2f}x per IPU: {verdict}), "
                f"{_fit_phrase(best.fits, r.max_tile_fill)}, "
                f"busiest stage {best.imbalance:.2f}x the mean, idle {best.idle_fraction:.0%}.",
                f"  train.py ... {best.train_args(base_strategy)}"]
        out += [f"  {line}" for line in python_lines(best, base_strategy)]
        if best.similar:
            out.append(f"  ({best.similar} other layout(s) within 0.1% of it are not listed)")
    out += _plans(r, base_strategy)
    out += [f"note: {n}" for n in r.notes]
    return "\n".join(out)


def render_amp_steps(steps: pd.DataFrame | None) -> list[str]:
    """Per IPU (rows) and AMP (columns): Mcycles | KiB of its conv / matmul ops."""
    if steps is None or steps.empty:
        return []
    amps = sorted(steps["amp"].unique().tolist())
    cells = {(int(r.ipu), float(r.amp)): f"{r.cycles / 1e6:.2f} | {r.temp_bytes / 1024:.0f}"  # type: ignore[arg-type, operator]  # pandas-stubs: a cell is any scalar
             + ("*" if r.in_force else "") for r in steps.itertuples()}
    table = [["AMP", *(f"{a:g}" for a in amps)]]
    for ipu in sorted(steps["ipu"].unique().tolist()):
        table.append([f"IPU{ipu}", *(cells.get((int(ipu), a), "") for a in amps)])
    return ["", "What each AMP step trades (the current layout's conv / matmul ops, one "
            "micro-batch): Mcycles | temporary KiB on the fullest tile; * = in force",
            *aligned(table[0], table[1:], right=range(1, len(table[0])))]


class TuneText:
    """The candidates' table, the best layout, every layout as flags and Python, the AMP
    steps, and what was written."""

    def render(self, result: TuneReport) -> str:
        text = "\n".join([render_text(result.result, result.name, result.strategy),
                          *render_amp_steps(result.amp_steps)])
        if result.written:
            text += f"\nwrote the best layout's profile: {result.written}"
        if result.written_now:
            text += f"\nwrote the current layout's profile (recompiled): {result.written_now}"
        return text


class TuneJson:
    """TuneResult.to_dict with each layout's Python, the AMP steps and what was written."""

    def render(self, result: TuneReport) -> str:
        r = result.result
        data: dict[str, Any] = r.to_dict()
        for entry, c in zip([data["baseline"], *data["candidates"]],
                            [r.baseline, *r.candidates], strict=True):
            entry["python"] = python_lines(c, result.strategy)
        data["profile"] = result.profile
        data["written"] = str(result.written) if result.written else None
        data["written_now"] = str(result.written_now) if result.written_now else None
        steps = result.amp_steps
        data["amp_steps"] = [] if steps is None else steps.to_dict("records")
        return json.dumps(data, indent=2, sort_keys=True)
