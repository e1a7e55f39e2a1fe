"""Memory and time the reader needs for big profiles (the figures in docs/limits.md).

    .venv/bin/python bench/bench_read.py [--events 1000000 3000000] [--steps 20000]

For each size, writes a synthetic profile (EVENTS trace events over 4 IPUs, STEPS liveness
steps, 1472 tiles x STEPS of per-tile liveness on IPU0), then in a fresh process measures
the resident memory (peak RSS) after imports, after `popviz.open`, after reading the
trace table, after every table, and after one IPU's tile-liveness slice, and the time of
each step. Prints the file size and the memory per million trace events.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tooling/: the repository's test and bench tools

from popviz.format import write_report  # noqa: E402
from tooling.testing.synthetic import synthetic_report  # noqa: E402

MEASURE = r"""
import json, sys, time
def rss():  # peak resident memory of this process image (ru_maxrss would carry the parent's)
    with open("/proc/self/status") as handle:
        return next(int(l.split()[1]) * 1024 for l in handle if l.startswith("VmHWM:"))
import popviz
marks = {"imports": (rss(), 0.0)}
t = time.perf_counter()
p = popviz.open(sys.argv[1])
marks["open"] = (rss(), time.perf_counter() - t)
t = time.perf_counter()
trace = p.trace
marks["trace"] = (rss(), time.perf_counter() - t)
t = time.perf_counter()
for name in p.table_names:
    p.table(name)
marks["all tables"] = (rss(), time.perf_counter() - t)
t = time.perf_counter()
live = p.tile_liveness(0)
marks["tile_liveness IPU0"] = (rss(), time.perf_counter() - t)
print(json.dumps({"rows": len(trace), "live": list(live.shape), "marks": marks}))
"""


def measure(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000, 3_000_000])
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-read-") as scratch:
        for events in args.events:
            began = time.perf_counter()
            report = synthetic_report(num_ipus=4, events=events, steps=args.steps,
                                      tile_liveness_ipus=1)
            path = write_report(report, Path(scratch, f"e{events}"))
            made = time.perf_counter() - began
            result = measure(path)
            marks = result["marks"]
            base = marks["imports"][0]
            print(f"\n{result['rows']:,} trace events, tile_liveness IPU0 {result['live']}: "
                  f"file {path.stat().st_size / 2**20:.1f} MiB (made in {made:.0f} s)")
            for name, (rss, seconds) in marks.items():
                print(f"  {name:20} peak RSS {rss / 2**20:8.0f} MiB "
                      f"(+{(rss - base) / 2**20:6.0f})  {seconds:6.2f} s")
            trace_mb = (marks["trace"][0] - marks["open"][0]) / 2**20
            rows.append((result["rows"], trace_mb, (marks["all tables"][0] - base) / 2**20))
    print("\nmemory per million trace events:")
    for n, trace_mb, all_mb in rows:
        print(f"  {n:>10,} events: trace table {trace_mb / (n / 1e6):.0f} MiB per million; "
              f"every table {all_mb / (n / 1e6):.0f} MiB per million")
    return 0


if __name__ == "__main__":
    sys.exit(main())
