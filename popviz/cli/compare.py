"""`popviz compare A B [--json] [--ops]`: which of two layouts is better, why, and by how
much; `--ops` compares them op by op (cli/compare_ops.py: its flags). reporters.compare
prints both."""

from __future__ import annotations

import argparse

from popviz.analysis.compare.verdict import JUDGES
from popviz.argtypes import non_empty_path
from popviz.cli.command import EXIT_OK, Command, emit
from popviz.cli.compare_ops import add_arguments as add_ops_arguments
from popviz.cli.vetcache import add_no_vet_argument, check_vetted, open_vetted
from popviz.reporters.compare import CompareJson, CompareText, OpsJson, OpsText


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", type=non_empty_path,
                        help="first profile (.h5 file or its directory)")
    parser.add_argument("b", metavar="B", type=non_empty_path,
                        help="second profile (.h5 file or its directory)")
    parser.add_argument("--json", action="store_true",
                        help="print the same facts as one JSON object (with --ops: the op "
                        "table)")
    parser.add_argument("--judge", choices=JUDGES, default=None,
                        help="when A and B run on different numbers of devices, the question "
                        "the verdict answers: total (the same work in less time: samples/s "
                        "of the whole job) or per-device (the same devices doing more: "
                        "samples/s per IPU or GPU); default: both answers, and a winner "
                        "only when they agree")
    add_ops_arguments(parser)
    add_no_vet_argument(parser)


def _run(args: argparse.Namespace) -> int:
    from popviz.api import compare

    if not args.no_vet:
        check_vetted(args.a, args.b)  # both before either is opened
    with open_vetted(args.a, vet=not args.no_vet) as a, \
            open_vetted(args.b, vet=not args.no_vet) as b:
        comp = compare(a, b, args.judge)
        if args.ops:
            from popviz.analysis.compare.ops import compare_ops

            diff = compare_ops(a, b, comp, by=args.by, depth=args.depth, per=args.per)
    if args.ops:
        ops_reporter = OpsJson() if args.json else OpsText(args.top, comp.verdict.get("terms"))
        emit(ops_reporter.render(diff))
    else:
        emit((CompareJson() if args.json else CompareText()).render(comp))
    return EXIT_OK


COMMAND = Command(
    name="compare",
    help="compare two profiles: which layout is faster per IPU, which fits, and why",
    description="Compare profile A with profile B (e.g. a 4-IPU pipeline against one IPU "
    "with recomputation and more replicas): throughput per IPU and in total, step time, "
    "where the IPU time per sample goes, peak memory and headroom, OOM tiles, exchange, "
    "stash, per-IPU and per-op-class differences, and a verdict. Every delta is B - A. "
    "--json prints the same facts as JSON. --ops compares op by op instead (like HTA's "
    "trace diff): time, calls and memory per op type, op class, module (--depth) or pass "
    "(--by), per step or per sample (--per), largest difference first (--top rows).",
    add_arguments=_add_arguments,
    run=_run,
)
