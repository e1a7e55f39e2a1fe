"""Where `popviz import`'s time goes on bench_import.py's traces, beside the floors any
reader of the same bytes pays here, and the budget that HTA's time sets for a 20x import.

    python bench/bench_import_floors.py                 # 4 ranks x 300k events, ~255 MB
    python bench/bench_import_floors.py --hta-seconds 13.8

Floors (best of --rounds, all ranks summed): reading the files' bytes; one numpy pass over
them (the cheapest whole-file look a vectorised reader can take); the general JSON decoders
installed here (json, and orjson / msgspec when present). popviz's phases, in one process:
parse (`kineto.read_trace`), the per-rank tables, the merge streamed into the .h5 rank by
rank (trace, ops, exchange, stages), the meta and summary, the file's finish. With
--hta-seconds (HTA's work time from bench_import.py on the same machine) it prints the
budget a 20x import would have.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_import import trace_arguments, write_traces


def _best(fn: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def floors(files: list[Path], rounds: int) -> dict[str, float]:
    raws = [f.read_bytes() for f in files]
    out = {"read the bytes": _best(lambda: [f.read_bytes() for f in files], rounds),
           "one numpy pass (count quotes)": _best(lambda: [int(np.count_nonzero(
               np.frombuffer(r, np.uint8) == 34)) for r in raws], rounds)}
    decoders = {"json.loads (stdlib)": json.loads}
    for name in ("orjson", "msgspec"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        decoders[f"{name} decode"] = mod.loads if name == "orjson" else mod.json.decode
    for label, decode in decoders.items():
        out[label] = _best(lambda d=decode: [d(r) for r in raws], max(1, rounds - 1))
    return out


def phases(files: list[Path]) -> dict[str, float]:
    from popviz.format.stream import ProfileStream
    from popviz.format.writer import MEASURED_WORDS
    from popviz.ingest import import_rank, importer
    from popviz.ingest import tables as tbl
    from popviz.ingest.import_merge import JobPlan, finished_here, merge_ranks
    from popviz.ingest.part_store import PartStore

    out: dict[str, float] = {"parse (kineto.read_trace)": 0.0}
    read_trace = import_rank.read_trace

    def timed_read(path: Path) -> object:  # the parse inside rank_part, timed apart
        t0 = time.perf_counter()
        trace = read_trace(path)
        out["parse (kineto.read_trace)"] += time.perf_counter() - t0
        return trace

    import_rank.read_trace = timed_read
    try:
        t0 = time.perf_counter()
        parts = [import_rank.rank_part(f) for f in files]
        out["per-rank tables"] = time.perf_counter() - t0 - out["parse (kineto.read_trace)"]
    finally:
        import_rank.read_trace = read_trace
    t0 = time.perf_counter()
    with PartStore() as store, tempfile.TemporaryDirectory() as tmp:
        lights = [store.put(p) for p in parts]
        plan = JobPlan.of(lights)
        meta = importer.import_meta(lights, plan.info, plan.origin, [None] * len(lights))
        args = plan.rank_args(meta, "bench")
        with ProfileStream(Path(tmp) / "p.h5", kind="measured", **MEASURED_WORDS) as stream:
            small, facts, _ = merge_ranks(plan, finished_here(plan, store, args), stream)
            out["merged tables, streamed into the .h5"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            summary = tbl.summary_of(facts, small, meta)
            out["meta and summary"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            stream.finish(meta=meta, summary=summary, tables=small, command_line="bench")
            out["finish the .h5"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    trace_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hta-seconds", type=float,
                        help="HTA's work seconds from bench_import.py on this machine")
    args = parser.parse_args(argv)
    files = write_traces(args.dir, args.ranks, args.events)
    size = sum(f.stat().st_size for f in files) / 1e6
    print(f"{args.ranks} ranks, {size:.0f} MB of JSON")
    gc.disable()  # as popviz import runs
    timed = phases(files)
    for title, rows in (("floors (any reader of these bytes)", floors(files, args.rounds)),
                        ("popviz import, by phase", timed)):
        print(f"\n{title}")
        for label, seconds in rows.items():
            print(f"  {label:48}{seconds:8.2f} s   {size / seconds:8.0f} MB/s")
    rest = sum(v for k, v in timed.items() if not k.startswith("parse"))
    print(f"  {'all but the parse':48}{rest:8.2f} s")
    if args.hta_seconds:
        budget = args.hta_seconds / 20
        print(f"\n20x HTA's {args.hta_seconds:.2f} s leaves {budget:.2f} s for the whole "
              f"import ({size / budget:.0f} MB/s of JSON, parse to .h5); all but the "
              f"parse takes {rest / budget:.1f}x that budget")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
