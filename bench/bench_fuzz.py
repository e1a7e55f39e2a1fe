"""Fuzz the profile reader: thousands of mutants plus hand-made hostile files.

    .venv/bin/python bench/bench_fuzz.py [--mutants 5000] [--profiles profiles] [--seed 0]

Sources: every profile under --profiles as it is (format 1.1) and rewritten by this
popviz (format 1.1). Each mutant (byte flips aimed mostly at HDF5 metadata, 4-byte flips,
zeroed / swapped blocks, truncation, attribute tampering) is read in a forked worker with
a time limit and an address-space limit (popviz.format.isolated): popviz.open, every
table, each IPU's trace, tile-liveness slices and the summary facts. Then hand-made hostile
files (external storage, external link, virtual dataset and soft links pointing at a
secret outside the folder, huge declared sizes, nested JSON, ...) must each be refused
with a ProfileError, and the secret's access time must not change (nothing read it).

Prints counts per outcome, per mutation kind, the worst cases and the workers' peak RSS.
Target: 0 hangs, 0 crashes reaching the caller (a crash is a dead worker, counted), 0
reads outside the folder, 0 exceptions but ProfileError, no worker over 1 GB RSS.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tooling/: the repository's test and bench tools

import h5py  # noqa: E402
import numpy as np  # noqa: E402

import popviz  # noqa: E402
import popviz.analysis.facts  # loaded before forking: workers start warm  # noqa: E402
from popviz.format import schema  # noqa: E402
from popviz.format.isolated import read_isolated  # noqa: E402
from popviz.format.writer import write_profile  # noqa: E402
from tooling.testing.fuzz import ATTRIBUTE_MUTANTS, Campaign, run_campaign  # noqa: E402

PROBE = "popviz.analysis.facts:profile_facts"
SECRET = b"root:x:0:0:SECRET-MARKER:/root:/bin/bash\n" * 64
OLD = 946_684_800  # 2000-01-01: an access time that any read moves (relatime)


def rewrite(path: Path, out: Path) -> Path:
    """The same profile written by this popviz (format 1.1)."""
    with popviz.open(path) as profile:
        tables = {name: profile.table(name) for name in profile.table_names}
        arrays = {}
        with h5py.File(path) as h5:
            for name in h5.get("arrays", {}):
                arrays[name] = h5["arrays"][name][()]
        return write_profile(out, meta=profile.meta, tables=tables, arrays=arrays,
                             summary=profile.summary, kind=profile.kind,
                             command_line=profile.command_line)


def _add_column(h5: h5py.File, make: Callable[[h5py.Group, str, int], h5py.Dataset]) -> None:
    group = h5["tables/ops"]
    rows = int(group.attrs["n_rows"])
    data = make(group, "evil", rows)
    data.attrs["encoding"] = "numeric"
    order = [c.decode() if isinstance(c, bytes) else str(c)
             for c in group.attrs["column-order"]]
    group.attrs["column-order"] = np.array([*order, "evil"], dtype=object)


def hostile_makers(secret: Path, secret_h5: Path) -> dict[str, Callable[[h5py.File], None]]:
    def external_storage(h5: h5py.File) -> None:
        _add_column(h5, lambda g, n, rows: g.create_dataset(
            n, shape=(rows,), dtype="u1", external=[(str(secret), 0, h5py.h5f.UNLIMITED)]))

    def external_link(h5: h5py.File) -> None:
        del h5["tables/ops/op"]
        h5["tables/ops/op"] = h5py.ExternalLink(str(secret_h5), "/data")

    def virtual(h5: h5py.File) -> None:
        rows = int(h5["tables/ops"].attrs["n_rows"])
        layout = h5py.VirtualLayout(shape=(rows,), dtype="u1")
        layout[:] = h5py.VirtualSource(str(secret_h5), "/data", shape=(rows,))
        _add_column(h5, lambda g, n, _: g.create_virtual_dataset(n, layout, fillvalue=0))

    def soft_link(h5: h5py.File) -> None:
        del h5["tables/ops/op"]
        h5["tables/ops/op"] = h5py.SoftLink("/tables/trace/op")

    def soft_loop(h5: h5py.File) -> None:
        h5["tables/a"] = h5py.SoftLink("/tables/b")
        h5["tables/b"] = h5py.SoftLink("/tables/a")

    makers: dict[str, Callable[[h5py.File], None]] = {
        "external storage": external_storage, "external link": external_link,
        "virtual dataset": virtual, "soft link": soft_link, "soft link loop": soft_loop,
    }
    for name, tamper in ATTRIBUTE_MUTANTS.items():
        makers[name] = lambda h5, tamper=tamper: tamper(h5, random.Random(0))
    return makers


def _secret_files(folder: Path) -> tuple[Path, Path]:
    secret = folder / "passwd"
    secret.write_bytes(SECRET)
    secret_h5 = folder / "secret.h5"
    with h5py.File(secret_h5, "w") as h5:
        h5["data"] = np.frombuffer(SECRET, dtype=np.uint8)
    for path in (secret, secret_h5):
        os.utime(path, (OLD, time.time()))
    return secret, secret_h5


def _atime_detects_reads(folder: Path) -> bool:
    probe = folder / "probe"
    probe.write_bytes(b"x" * 100)
    os.utime(probe, (OLD, time.time()))
    subprocess.run([sys.executable, "-c", f"open({str(probe)!r}, 'rb').read()"], check=True)
    return probe.stat().st_atime > OLD + 1


def run_hostile(source: Path, work: Path, outside: Path) -> tuple[Counter[str], list[str]]:
    secret, secret_h5 = _secret_files(outside)
    counts: Counter[str] = Counter()
    lines = []
    for name, make in hostile_makers(secret, secret_h5).items():
        path = work / f"hostile-{name.replace(' ', '_').replace('=', '')}.h5"
        shutil.copyfile(source, path)
        with h5py.File(path, "a") as h5:
            make(h5)
        verdict = read_isolated(path, timeout_s=10, memory_bytes=1_500_000_000, probe=PROBE,
                                start="fork")
        counts[verdict.outcome] += 1
        lines.append(f"  {name:20} {verdict.outcome:14} {verdict.message[len(str(path)):][:90]}")
    for path in (secret, secret_h5):
        if path.stat().st_atime > OLD + 1:
            counts["read outside DIR"] += 1
            lines.append(f"  READ OUTSIDE DIR: {path} was read")
    return counts, lines


def report(campaign: Campaign, seconds: float, mutants: int) -> None:
    print(f"\n{mutants:,} mutants in {seconds:.0f} s ({seconds / mutants * 1000:.0f} ms each)")
    for outcome in ("ok", "profile_error", "error", "memory", "crash", "hang"):
        print(f"  {outcome:14} {campaign.outcomes[outcome]:6,}")
    print(f"  worker peak RSS {campaign.max_rss_bytes / 2**20:,.0f} MiB")
    print("by source format:")
    for label, pattern in (("bundled", "profiles"), ("rewritten", "v11_")):
        total: Counter[str] = Counter()
        for source, counts in campaign.by_source.items():
            if pattern in source:
                total.update(counts)
        print(f"  {label:24} " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
    print("by mutation kind:")
    for kind, counts in sorted(campaign.by_kind.items()):
        print(f"  {kind:24} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if campaign.examples:
        print("not ok or ProfileError (first 20):")
        for label, kind, verdict in campaign.examples[:20]:
            print(f"  {verdict.outcome:6} {kind:22} {label}: {verdict.message[:120]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=int, default=5000)
    parser.add_argument("--profiles", type=Path, default=Path("profiles"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per read")
    parser.add_argument("--memory-gb", type=float, default=1.5,
                        help="address space a worker may add while reading")
    parser.add_argument("--keep", type=Path, help="copy crashing / hanging mutants here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-fuzz-") as scratch:
        work, outside = Path(scratch, "served"), Path(scratch, "outside")
        work.mkdir()
        outside.mkdir()
        bundled = popviz.discover(args.profiles)
        sources = list(bundled)
        for k, path in enumerate(bundled):
            sources.append(rewrite(path, work / f"v11_{k}.h5"))
        print(f"sources: {len(bundled)} bundled profiles + their "
              f"{schema.FORMAT_VERSION} rewrites (HDF5 libver {schema.HDF5_LIBVER}) "
              f"({sum(p.stat().st_size for p in sources) / 2**20:.1f} MiB)")

        detects = _atime_detects_reads(outside)
        counts, lines = run_hostile(sources[-1], work, outside)
        print(f"hand-made hostile files: {dict(counts)} (reads outside DIR "
              f"{'detected by access time' if detects else 'NOT detectable here (noatime)'})")
        print("\n".join(lines))

        began = time.monotonic()
        campaign = run_campaign(sources, args.mutants, seed=args.seed, workers=args.workers,
                                timeout_s=args.timeout,
                                memory_bytes=int(args.memory_gb * 2**30), probe=PROBE,
                                keep=args.keep, progress=lambda done, c: print(
                                    f"  {done:,} mutants: {dict(c.outcomes)}", flush=True))
        report(campaign, time.monotonic() - began, args.mutants)
    bad = campaign.outcomes["error"] + campaign.outcomes["memory"] \
        + counts["read outside DIR"] + sum(v for k, v in counts.items()
                                           if k not in ("profile_error",))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
