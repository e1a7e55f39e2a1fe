"""Fuzz `popviz import`: thousands of seeded mutants of real traces and memory snapshots.

    .venv/bin/python bench/bench_fuzz_import.py [--mutants 3000] [--seed 0] [--workers 2]

Sources: slices of the H100 fixtures in tests/fixtures (the pipelining trace, every 3rd of
its first events; the ResNet-50 trace, every 40th; the last 400 events of the ResNet-50
snapshot), as tooling.import_fuzz makes them. Each mutant (byte damage, hostile
values in place of a key's value, gzip wrappings; for snapshots damaged pickles and
replaced values) is imported by `popviz import` in a forked worker with a time limit and
an address-space limit, and a profile it writes is then read whole.

Prints counts per outcome (ok / one-line error / unclear message / traceback / unreadable
profile / hang / crash), workers over 1 GiB resident, runs that left files behind, counts
per mutation kind and the first cases that were not ok or a one-line error. Target: 0 of
everything but ok and error. Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tooling/: the repository's test and bench tools

from tooling import import_fuzz  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def sources(folder: Path) -> tuple[list[Path], list[Path]]:
    traces = [
        import_fuzz.small_trace(FIXTURES / "kineto_pipelining_interleaved_1rank.json.gz",
                                folder / "pipeline.json", every=3, limit=800),
        import_fuzz.small_trace(FIXTURES / "kineto_resnet50_b64.json.gz",
                                folder / "resnet.json", every=40, limit=800),
    ]
    snapshots = [import_fuzz.small_snapshot(FIXTURES / "memsnap_resnet50_b32.pickle.gz",
                                            folder / "snapshot.pickle")]
    return traces, snapshots


def report(campaign: import_fuzz.Campaign, mutants: int, seconds: float) -> None:
    print(f"\n{mutants:,} mutants in {seconds:.0f} s ({seconds / mutants * 1000:.0f} ms each)")
    labels = {"ok": "ok", "error": "one-line error", "unclear": "unclear message",
              "traceback": "traceback", "unreadable": "unreadable profile",
              "hang": "hang", "crash": "crash"}
    for outcome in import_fuzz.OUTCOMES:
        print(f"  {labels[outcome]:20} {campaign.outcomes[outcome]:6,}")
    print(f"  {'RSS over 1 GiB':20} {campaign.rss_over:6,}")
    print(f"  {'leftovers':20} {campaign.leftovers:6,}")
    print(f"  worker peak RSS {campaign.max_rss / 2**20:,.0f} MiB")
    print("by mutation kind:")
    for kind, counts in sorted(campaign.by_kind.items()):
        print(f"  {kind:28} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if campaign.examples:
        print("not ok or a one-line error (first 20):")
        for kind, result in campaign.examples[:20]:
            print(f"  {result.outcome:10} {kind:28} {result.message[:150]} "
                  f"{result.leftovers or ''}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per import")
    parser.add_argument("--memory-gb", type=float, default=3.0,
                        help="address space a worker may add while importing")
    parser.add_argument("--keep", type=Path, help="copy mutants that were not ok or a "
                        "one-line error here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-fuzz-import-") as scratch:
        traces, snapshots = sources(Path(scratch))
        print("sources: " + ", ".join(f"{p.name} ({p.stat().st_size / 1024:.0f} KiB)"
                                      for p in [*traces, *snapshots]))
        began = time.monotonic()
        campaign = import_fuzz.run_campaign(
            traces, snapshots, args.mutants, seed=args.seed, workers=args.workers,
            timeout_s=args.timeout, memory_bytes=int(args.memory_gb * 2**30), batch=100,
            keep=args.keep,
            progress=lambda done, c: print(f"  {done:,} mutants: {dict(c.outcomes)}",
                                           flush=True))
        report(campaign, args.mutants, time.monotonic() - began)
    bad = sum(campaign.outcomes[o] for o in import_fuzz.OUTCOMES if o not in ("ok", "error"))
    return 1 if bad or campaign.rss_over or campaign.leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
