"""`popviz tune PROFILE [--ipus N]`: which splits, AMP per IPU, recomputation and schedule
to use, each candidate with its modelled evidence (see docs/tune.md); reporters.tune prints it."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from popviz.argtypes import non_empty_path, positive_int
from popviz.cli.command import EXIT_OK, Command, UsageError, emit
from popviz.cli.vetcache import add_no_vet_argument, open_vetted
from popviz.reporters.tune import SAME, TuneJson, TuneReport, TuneText

if TYPE_CHECKING:
    from pathlib import Path

    from popviz.options import Options
    from popviz.recorder.program import Program

SCHEDULER = re.compile(r"^(none|local|(tcp|tls|ucx)://\S+)$")


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
                        help="plan for another target (mk1, mk2, bow, c600, or a GPU: h100, "
                        "h100-pcie, h200, a100, whose schedules are 1F1B, GPipe and Zero Bubble's "
                        "ZB1P and ZB2P, and with 2 stages per GPU ZBV, InterleavedZB and "
                        "Interleaved1F1B, whose recomputation may be selective (attention "
                        "cores only) and which have no AMP; default: the profile's)")
    parser.add_argument("--write", default=None, metavar="DIR", type=non_empty_path,
                        help="write the best candidate's profile to DIR (for popviz compare "
                        "and the app)")
    parser.add_argument("--write-now", default=None, metavar="DIR", type=non_empty_path,
                        help="write the current layout recompiled (the 'now' row) to DIR, to "
                        "compare like with like when the profile came from another cost model")
    parser.add_argument("--force", action="store_true",
                        help="let --write / --write-now replace a profile already there "
                        "(default: refuse before tuning); never PROFILE itself")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="fit the search's independent layouts in N worker processes "
                        "side by side (0: one per CPU; default 1: one after another here); "
                        "the result is the same, sooner on idle cores")
    parser.add_argument("--scheduler", default="none", metavar="WHERE",
                        help="fit them on a Dask cluster instead (the dask extra): 'local' "
                        "(one started here with --workers processes, 0 or 1: one per CPU) "
                        "or a running scheduler's address (tcp://HOST:PORT), whose workers "
                        "need popviz installed; 'none' (default): --workers decides")
    parser.add_argument("--json", action="store_true",
                        help="print the same facts as one JSON object")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar on stderr")
    add_no_vet_argument(parser)


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


@contextlib.contextmanager
def _executor(scheduler: str, workers: int) -> Iterator[Any]:
    """What fits layouts side by side: None (here, one after another), a pool of worker
    processes (--workers), or a Dask client (--scheduler)."""
    if scheduler != "none":
        from popviz.ingest.import_dask import dask_client

        with dask_client(scheduler, workers if workers > 1 else 0) as client:
            yield client
        return
    count = workers if workers > 0 else os.cpu_count() or 1
    if count <= 1:
        yield None
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawned: a forked child would share this process's torch threads and locks
    with ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


def _run(args: argparse.Namespace) -> int:
    from popviz.advise.tune import load_program, tune
    from popviz.analysis.amp import amp_steps

    if any(not 0 < a <= 1 for a in args.amp_steps):
        raise ValueError("--amp-steps: every value must be in (0, 1]")
    if args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}")
    if not SCHEDULER.match(args.scheduler):
        raise UsageError(f"--scheduler must be none, local or a scheduler's address "
                         f"(tcp://HOST:PORT), got {args.scheduler!r}")
    _check_writes(args)  # before minutes of tuning, not after
    with open_vetted(args.profile, vet=not args.no_vet) as profile:  # as summary does
        program, options = load_program(profile)
        stored = float((profile.summary or {}).get("throughput") or 0.0)
        steps = amp_steps(profile.ops, profile.meta, tuple(args.amp_steps))
    with _executor(args.scheduler, args.workers) as executor:
        result = tune(program, options, args.ipus, amp_ladder=tuple(args.amp_ladder),
                      top=args.top, max_compiles=args.max_compiles, target=args.target,
                      progress=not args.no_progress, max_tile_fill=args.max_tile_fill,
                      executor=executor)
    if args.target is None and stored and abs(result.baseline.throughput - stored) > \
            SAME * stored:
        result.notes.append(f"the profile stores {stored:,.0f} samples/s but its layout "
                            f"recompiles to {result.baseline.throughput:,.0f}: it was written "
                            "by another cost model version; all figures here are recompiled "
                            "(--write-now DIR writes the recompiled current layout)")
    line = args.command_line
    written = _write(program, result.best_options(options), args.write, line)
    written_now = _write(program, options.copy(target=result.target), args.write_now, line)
    report = TuneReport(result, profile=str(args.profile),
                        name=os.path.basename(os.path.normpath(args.profile)),
                        strategy=options.strategy, amp_steps=steps, written=written,
                        written_now=written_now)
    emit((TuneJson() if args.json else TuneText()).render(report))
    return EXIT_OK


COMMAND = Command(
    name="tune",
    help="advise splits, AMP per IPU, recomputation and schedule by re-planning a profile",
    description="Re-plan the program recorded in PROFILE (a modelled profile) over --ipus "
    "IPUs: balanced split points, the highest AMP per IPU that fits, with and without "
    "recomputation, Grouped and Interleaved schedules (GPU targets: 1F1B, GPipe, ZB1P and "
    "ZB2P, and 2n balanced stages on n GPUs as ZBV, InterleavedZB and Interleaved1F1B). "
    "Every candidate is compiled; the "
    "list shows fit, throughput (total and per IPU), the ratio to the current layout, "
    "step time, idle share, cycles per stage, peak memory per IPU and the fullest tile; "
    "then, per IPU, what each AMP step (--amp-steps) trades: the conv / matmul cycles and "
    "temporary memory of the current layout re-planned at that AMP. "
    "--write DIR writes the best layout's profile, --write-now DIR the current one recompiled; "
    "neither replaces a profile already there unless --force is given, nor PROFILE itself.",
    add_arguments=_add_arguments,
    run=_run,
)
