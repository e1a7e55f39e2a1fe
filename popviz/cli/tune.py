"""`popviz tune PROFILE [--ipus N]`: which splits, AMP per IPU, recomputation and schedule
to use, each candidate with its modelled evidence (see docs/tune.md)."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from popviz.argtypes import non_empty_path, positive_int
from popviz.cli.command import EXIT_OK, Command, UsageError, emit
from popviz.cli.vetcache import add_no_vet_argument, open_vetted

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from popviz.advise.tune import Candidate, TuneResult
    from popviz.options import Options
    from popviz.recorder.program import Program

MiB = 1024 * 1024
SAME = 0.005  # ratios within 0.5% of 1 are 'about the same'


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from popviz.advise.tune import AMP_LADDER, DEFAULT_MAX_COMPILES
    from popviz.analysis.amp import AMP_STEPS

    parser.add_argument("profile", type=non_empty_path,
                        help="a modelled profile (.h5 file or its directory)")
    parser.add_argument("--ipus", "--gpus", dest="ipus", type=int, default=None, metavar="N",
                        help="IPUs (or GPUs, on a GPU target) per replica to plan for "
                        "(default: the profile's); 1 = recomputation checkpoints on one")
    parser.add_argument("--amp-ladder", type=float, nargs="+", default=list(AMP_LADDER),
                        metavar="P", help="AMP values tried per IPU, highest that fits wins "
                        f"(default: {' '.join(f'{a:g}' for a in AMP_LADDER)})")
    parser.add_argument("--amp-steps", type=float, nargs="+", default=list(AMP_STEPS),
                        metavar="P", help="AMP values whose conv / matmul cycles and "
                        "temporary memory are listed per IPU for the current layout "
                        f"(default: {' '.join(f'{a:g}' for a in AMP_STEPS)})")
    parser.add_argument("--top", type=positive_int, default=5, metavar="K",
                        help="candidates to list (default 5)")
    parser.add_argument("--max-compiles", type=int, default=DEFAULT_MAX_COMPILES, metavar="M",
                        help=f"compile budget of the search (default {DEFAULT_MAX_COMPILES})")
    parser.add_argument("--max-tile-fill", type=float, default=1.0, metavar="F",
                        help="count a layout as fitting only when no tile is fuller than F "
                        "of its memory (0 < F <= 1; default 1). Below 1 every IPU keeps "
                        "headroom, as experts balance memory across IPUs; the current "
                        "layout is judged the same way")
    parser.add_argument("--target", default=None,
                        help="plan for another target (mk1, mk2, bow, or a GPU: h100, "
                        "h100-pcie, h200, a100, whose schedules are 1F1B, GPipe and Zero Bubble's "
                        "ZB1P and ZB2P, whose recomputation may be selective (attention cores "
                        "only) and which have no AMP; default: the profile's)")
    parser.add_argument("--write", default=None, metavar="DIR", type=non_empty_path,
                        help="write the best candidate's profile to DIR (for popviz compare "
                        "and the app)")
    parser.add_argument("--write-now", default=None, metavar="DIR", type=non_empty_path,
                        help="write the current layout recompiled (the 'now' row) to DIR, to "
                        "compare like with like when the profile came from another cost model")
    parser.add_argument("--force", action="store_true",
                        help="let --write / --write-now replace a profile already there "
                        "(default: refuse before tuning); never PROFILE itself")
    parser.add_argument("--json", action="store_true",
                        help="print the same facts as one JSON object")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar on stderr")
    add_no_vet_argument(parser)


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
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    numeric = {i for i, h in enumerate(head) if h in NUMERIC}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    b = r.baseline
    out = [f"{name}: {r.model or 'model ?'} on {r.target}, planning for "
           f"{r.num_ipus} IPU(s); {r.layouts} layouts in {r.compiles} compiles "
           f"({r.seconds:.1f} s)",
           f"now: {b.num_ipus} IPU(s)"
           + (f" x {b.replicas} replicas" if b.replicas > 1 else "")
           + f", {_fit_phrase(b.fits, r.max_tile_fill)}, {b.throughput:,.0f} samples/s "
           "(per IPU: samples/s over all IPUs of all replicas)", "", line(head)]
    out += [line(row) for row in rows]
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
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["", "What each AMP step trades (the current layout's conv / matmul ops, one "
            "micro-batch): Mcycles | temporary KiB on the fullest tile; * = in force"] + \
        ["  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                          enumerate(zip(row, widths, strict=True))) for row in table]


def _write(program: Program, options: Options, where: str | None, line: str) -> Path | None:
    if not where:
        return None
    from popviz.compiler import compile as compile_program
    from popviz.format.writer import write_report

    return write_report(compile_program(program, options), where, command_line=line)


def _check_writes(args: argparse.Namespace) -> None:
    """--write / --write-now: never over PROFILE, each other, a FIFO or a user's file; over
    an earlier profile only with --force."""
    from popviz.format.guards import check_target, same_target

    targets = [(flag, where) for flag, where in (("--write", args.write),
                                                 ("--write-now", args.write_now)) if where]
    for flag, where in targets:
        check_target(where, force=args.force, inputs=[args.profile], flag=flag)
    if len(targets) == 2 and same_target(args.write, args.write_now):
        raise UsageError(f"--write and --write-now both name {args.write}: the second "
                         "profile would replace the first; give two places")


def _run(args: argparse.Namespace) -> int:
    from popviz.advise.tune import load_program, tune
    from popviz.analysis.amp import amp_steps

    if any(not 0 < a <= 1 for a in args.amp_steps):
        raise ValueError("--amp-steps: every value must be in (0, 1]")
    _check_writes(args)  # before minutes of tuning, not after
    with open_vetted(args.profile, vet=not args.no_vet) as profile:  # as summary does
        program, options = load_program(profile)
        stored = float((profile.summary or {}).get("throughput") or 0.0)
        steps = amp_steps(profile.ops, profile.meta, tuple(args.amp_steps))
    result = tune(program, options, args.ipus, amp_ladder=tuple(args.amp_ladder),
                  top=args.top, max_compiles=args.max_compiles, target=args.target,
                  progress=not args.no_progress, max_tile_fill=args.max_tile_fill)
    if args.target is None and stored and abs(result.baseline.throughput - stored) > \
            SAME * stored:
        result.notes.append(f"the profile stores {stored:,.0f} samples/s but its layout "
                            f"recompiles to {result.baseline.throughput:,.0f}: it was written "
                            "by another cost model version; all figures here are recompiled "
                            "(--write-now DIR writes the recompiled current layout)")
    line = args.command_line
    written = _write(program, result.best_options(options), args.write, line)
    written_now = _write(program, options.copy(target=result.target), args.write_now, line)
    name = os.path.basename(os.path.normpath(args.profile))
    if args.json:
        data = result.to_dict()
        for entry, c in zip([data["baseline"], *data["candidates"]],
                            [result.baseline, *result.candidates], strict=True):
            entry["python"] = python_lines(c, options.strategy)
        data["profile"] = str(args.profile)
        data["written"] = str(written) if written else None
        data["written_now"] = str(written_now) if written_now else None
        data["amp_steps"] = [] if steps is None else steps.to_dict("records")
        text = json.dumps(data, indent=2, sort_keys=True)
    else:
        text = "\n".join([render_text(result, name, options.strategy),
                          *render_amp_steps(steps)])
        if written:
            text += f"\nwrote the best layout's profile: {written}"
        if written_now:
            text += f"\nwrote the current layout's profile (recompiled): {written_now}"
    emit(text)
    return EXIT_OK


COMMAND = Command(
    name="tune",
    help="advise splits, AMP per IPU, recomputation and schedule by re-planning a profile",
    description="Re-plan the program recorded in PROFILE (a modelled profile) over --ipus "
    "IPUs: balanced split points, the highest AMP per IPU that fits, with and without "
    "recomputation, Grouped and Interleaved schedules (GPU targets: 1F1B, GPipe, ZB1P and "
    "ZB2P). Every candidate is compiled; the "
    "list shows fit, throughput (total and per IPU), the ratio to the current layout, "
    "step time, idle share, cycles per stage, peak memory per IPU and the fullest tile; "
    "then, per IPU, what each AMP step (--amp-steps) trades: the conv / matmul cycles and "
    "temporary memory of the current layout re-planned at that AMP. "
    "--write DIR writes the best layout's profile, --write-now DIR the current one recompiled; "
    "neither replaces a profile already there unless --force is given, nor PROFILE itself.",
    add_arguments=_add_arguments,
    run=_run,
)
