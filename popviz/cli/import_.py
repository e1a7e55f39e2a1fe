"""`popviz import TRACE... --to DIR [--memory-snapshot PICKLE]`: torch.profiler traces (one
per rank) into a measured profile."""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from popviz.argtypes import non_empty_path
from popviz.cli.command import EXIT_BAD_PROFILE, EXIT_OK, EXIT_USAGE, Command, fail
from popviz.ingest.import_dask import AUTO_MIN_CPUS, AUTO_MIN_TRACES, LOCAL, choose_scheduler

if TYPE_CHECKING:
    from popviz.ingest.import_rank import RankPart

SCHEDULER = re.compile(r"^(auto|none|local|(tcp|tls|ucx)://\S+)$")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", nargs="+", metavar="TRACE", type=non_empty_path,
                        help="Kineto / Chrome trace JSON (.json or .json.gz) written by "
                        "torch.profiler's export_chrome_trace; one per rank")
    parser.add_argument("--to", "-o", required=True, metavar="DIR", type=non_empty_path,
                        help="where the profile goes: a .h5 path, or a directory to hold "
                        "profile.h5")
    parser.add_argument("--memory-snapshot", action="append", metavar="PICKLE",
                        type=non_empty_path,
                        help="a torch.cuda.memory._snapshot() pickle (.pickle or .gz) for "
                        "the liveness table instead of the trace's memory events, and its "
                        "allocator's blocks, segments and stacks (the allocation view on "
                        "/memory); repeat for several ranks, in rank order")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="parse the ranks in N worker processes (0: one per CPU); "
                        "faster on idle cores, more memory in all (default 1: in this "
                        "process)")
    parser.add_argument("--scheduler", default="none", metavar="WHERE",
                        help="parse the ranks on a Dask cluster (the dask extra): 'local' "
                        "(one started here with --workers processes, 0 or 1: one per CPU), "
                        "or a running scheduler's address (tcp://HOST:PORT; its own workers, "
                        "which must read the traces at the same absolute paths); 'auto': "
                        "local for "
                        f"more than {AUTO_MIN_TRACES} traces on a machine of at least "
                        f"{AUTO_MIN_CPUS} CPUs when Dask is installed; 'none' (default): "
                        "here, or as --workers says (on 2 cores a local cluster is slower "
                        "than this process: docs/import.md)")
    parser.add_argument("--force", action="store_true",
                        help="replace the profile already at --to (default: refuse); "
                        "never one of the inputs, a FIFO or device, or a file not a profile")


def _said(done: int, total: int, part: RankPart) -> None:
    print(f"popviz: parsed rank {part.rank} ({done}/{total}): {part.path}", file=sys.stderr,
          flush=True)


class _Written:
    """`popviz: written rank R (i/n)` on stderr, at most once a second and for the last:
    a job of a thousand ranks writes a few a second, and a line for each would bury the
    parse lines and any warning."""

    def __init__(self, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.every_s, self.clock, self.last = every_s, clock, -math.inf

    def __call__(self, done: int, total: int, rank: int) -> None:
        now = self.clock()
        if done == total or now - self.last >= self.every_s:
            self.last = now
            print(f"popviz: written rank {rank} ({done}/{total})", file=sys.stderr,
                  flush=True)


def _run(args: argparse.Namespace) -> int:
    from popviz.format.guards import check_target, refuse_special_input
    from popviz.ingest.import_rank import DATA_ERRORS, data_error
    from popviz.ingest.importer import import_trace

    if args.workers < 0:
        return fail(f"--workers must be >= 0, got {args.workers}", EXIT_USAGE)
    if not SCHEDULER.match(args.scheduler):
        return fail(f"--scheduler must be auto, none, local or a scheduler's address "
                    f"(tcp://HOST:PORT), got {args.scheduler!r}", EXIT_USAGE)
    scheduler = choose_scheduler(args.scheduler, len(args.traces))
    workers = 0 if scheduler == LOCAL and args.workers == 1 else args.workers
    inputs = [*args.traces, *(args.memory_snapshot or [])]
    for given in inputs:  # a FIFO would block the reader: refused before anything runs
        refuse_special_input(given)
    # a FIFO, an input, a user's own file or folder: never written; a profile: with --force
    check_target(args.to, force=args.force, inputs=inputs)
    # a job's progress on a terminal (a log or a pipe gets the result or the one-line
    # error alone); on a cluster the parsed ranks are said as they always were
    progress = len(args.traces) > 1 and sys.stderr.isatty()
    try:
        path = import_trace(args.traces, args.to, memory_snapshot=args.memory_snapshot,
                            command_line=args.command_line,
                            workers=workers, scheduler=scheduler,
                            on_warning=lambda w: print(f"popviz: warning: {w}",
                                                       file=sys.stderr),
                            on_progress=_said if scheduler or progress else None,
                            on_written=_Written() if progress else None)
    except DATA_ERRORS as exc:  # a data error the importer did not name: still one line
        return fail(str(data_error(" ".join(args.traces[:4]), exc)), EXIT_BAD_PROFILE)
    print(f"imported {len(args.traces)} trace(s) into {path}")
    return EXIT_OK


COMMAND = Command(
    name="import",
    help="import torch.profiler (Kineto) traces and CUDA memory snapshots as a measured "
    "profile",
    description="Import what PyTorch already records: torch.profiler Chrome traces (CPU or "
    "CUDA; one file per rank, the rank from distributedInfo; plain or gzipped) and "
    "optionally torch.cuda.memory._snapshot() pickles, into one measured profile (ranks, "
    "ns): the trace with compute / exchange / host_io / sync / idle, stages, passes and "
    "micro-batches from torch.distributed.pipelining's PP: annotations, the ops table with "
    "each op's GPU time, transfers and liveness. A file popviz cannot use (missing, "
    "unreadable, damaged, past the bounds of docs/import.md), a repeated or missing rank "
    "is a one-line error naming it (exit 1); events whose times are not finite numbers "
    "in range are dropped with a counted warning. An existing profile at --to is kept "
    "unless --force is given; an input, a FIFO or a device is never written over. See "
    "docs/import.md.",
    add_arguments=_add_arguments,
    run=_run,
)
