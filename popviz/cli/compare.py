"""`popviz compare A B [--json] [--ops]`: which of two layouts is better, why, and by how
much; `--ops` compares them op by op (cli/compare_ops.py prints it)."""

from __future__ import annotations

import argparse
import json

import pandas as pd

from popviz.analysis.compare import Comparison, format_ratio, format_value
from popviz.analysis.compare.verdict import JUDGES
from popviz.argtypes import non_empty_path
from popviz.cli.command import EXIT_OK, Command, emit
from popviz.cli.compare_ops import add_arguments as add_ops_arguments
from popviz.cli.compare_ops import render_ops
from popviz.cli.vetcache import add_no_vet_argument, check_vetted, open_vetted
from popviz.vocab import naming_from_words

CLI_IPU_METRICS = ("compute_ms", "idle_ms", "peak_bytes", "oom_tiles")


def _fit_word(fits: object) -> str:
    """A side's fit: unknown (no tiles: measured), fits, or does not fit."""
    if fits is None or fits != fits:  # None, or NaN in a DataFrame cell
        return "fit unknown"
    return "fits" if fits else "DOES NOT FIT"


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


def _rows(frame: pd.DataFrame, label: str) -> list[list[str]]:
    return [[str(r[label]), str(r["unit"]).replace("bytes", "B"),
             *(format_value(r[c], r["unit"]) for c in ("a", "b", "delta")),
             format_ratio(r["ratio"])] for _, r in frame.iterrows()]


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    line = "  ".join(h.ljust(w) if i < 2 else h.rjust(w)
                     for i, (h, w) in enumerate(zip(head, widths, strict=True)))
    out = ["  " + line]
    for r in rows:
        out.append("  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                    for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return out


def render_text(comp: Comparison) -> str:
    """The comparison as an aligned terminal table: verdict first, then the figures."""
    v = comp.verdict
    sides = comp.sides
    lines = []
    for _, s in sides.iterrows():
        lines.append(f"{s['side']}: {s['name']}  ({s['kind']}, {s['model'] or 'model ?'} on "
                     f"{s['target']} x{s['num_ipus']} x{s['replicas']} replica(s); "
                     f"{_fit_word(s['fits'])})  {s['path']}")
    ask = " Ask one with --judge total or --judge per-device." \
        if v.get("questions_differ") else ""
    lines += ["", v["headline"] + ask]
    lines += [f"  - {r}" for r in v["reasons"]]
    if v["differences"]:
        lines += ["", "Layout differences (A vs B): " + "; ".join(v["differences"])]
    head = ["", "unit", "A", "B", "B - A", "B / A"]
    # what the sides run on, as each states it (IPU, GPU or rank); a mixed pair: devices
    words = {naming_from_words(str(k), str(u)).device
             for k, u in zip(sides["device_kind"], sides["time_unit"], strict=True)}
    device = words.pop() if len(words) == 1 else "device"
    metrics = comp.metrics
    if device == "GPU":  # no tiles, and time in ns: step_ms says it; metric names say GPU
        metrics = metrics[~metrics["metric"].isin(["oom_tiles", "step_cycles"])]
        metrics = metrics.assign(metric=metrics["metric"].str.replace("ipu", "gpu"))
    lines += ["", "Metrics", *_table(["metric", *head[1:]], _rows(metrics, "metric"))]
    tps = comp.time_per_sample
    tps = tps[(tps["a"] != 0) | (tps["b"] != 0)]
    lines += ["", f"Where the {device} time per sample goes "
              f"(sums to 1e6 / throughput per {device})"]
    lines += _table(["category", *head[1:]], _rows(tps, "category"))
    ipus = comp.ipus
    if len(ipus):
        ipus = ipus[ipus["metric"].isin(CLI_IPU_METRICS)]
        if device == "GPU":
            ipus = ipus[ipus["metric"] != "oom_tiles"]
        prefix = device if device in ("IPU", "GPU") else f"{device} "
        ipus = ipus.assign(key=prefix + ipus["ipu"].astype(str) + " " + ipus["metric"])
        lines += ["", f"Per {device}",
                  *_table([f"{device.lower()} metric", *head[1:]], _rows(ipus, "key"))]
    ops = comp.op_classes.head(8)
    if len(ops):
        ops = ops.assign(key=ops["op_class"] + " " + ops["phase"])
        lines += ["", "Compute per sample by op class (largest differences)"]
        lines += _table(["op class", *head[1:]], _rows(ops, "key"))
    return "\n".join(lines)


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
        text = (json.dumps(diff.to_dict(), indent=2, sort_keys=True) if args.json
                else render_ops(diff, args.top, comp.verdict.get("terms")))
    else:
        text = (json.dumps(comp.to_dict(), indent=2, sort_keys=True) if args.json
                else render_text(comp))
    emit(text)
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
