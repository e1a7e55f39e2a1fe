"""Semantic mutants of all four profile kinds against ONE long-lived `popviz serve` (issue 34).

    .venv/bin/python bench/bench_fuzz_serve.py [--mutants 500] [--seed 0] [--requests 6]

Makes one small profile of each kind (modelled IPU, modelled GPU, measured, imported:
tests/value_mutants.py), then --mutants well-formed files whose values are hostile: a
random numeric column of a random table set to 10^9, 10^18, 2^31, -1, -10^9 or NaN (every
row, or one row), or one string of the string table made 2 MB or 30 MB long. All go in one
folder served by one `popviz serve`; each mutant is asked for its stages CSV (a refusal
answers it in one line, counted by reason), and a mutant that is read is asked for
--requests pages, page callbacks and downloads drawn from tests/serve_pages.py. Two
client threads. Prints tries, refusals by reason, requests served, errors (5xx, a
callback error, a download that failed to build (422), no answer within 120 s), the
slowest request, the server's peak RSS (sampled every 0.2 s) and whether it still
answers `/` at the end.
Targets (issue 34): 0 errors, the server alive, its peak RSS under 1 GB.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.serve_pages import Outcome, requests_for, visit  # noqa: E402
from tests.serve_util import start_serve, stop  # noqa: E402
from tests.value_mutants import KINDS, file_name, make_sources, write_mutant  # noqa: E402
from tooling.testing.semantic import Mutation, numeric_columns  # noqa: E402

VALUES = (10**9, 10**18, 2**31, -1, -(10**9), float("nan"))
STRINGS = (2 << 20, 30 << 20)
REASONS = (("string table", "string too long"), ("text cells refer", "text budget"),
           ("is not a", "past a bound"), ("is not plausible", "past a bound"),
           ("must be", "below its least"), ("NaN", "NaN / infinite"),
           ("whole number", "a fraction"), ("negative value", "negative"),
           ("damaged", "damaged (other)"))


def reason_of(line: str) -> str:
    return next((name for key, name in REASONS if key in line), "other: " + line[-60:])


def make_mutants(sources: dict[str, Path], folder: Path, count: int,
                 rng: random.Random) -> list[tuple[str, str]]:
    """(file name, label) of `count` mutants written under `folder`."""
    columns = {kind: numeric_columns(path) for kind, path in sources.items()}
    out = []
    for k in range(count):
        kind = rng.choice(KINDS)
        if rng.random() < 0.06:
            mutation = Mutation("strings", "", rng.choice(STRINGS))
        else:
            table, column = rng.choice(columns[kind])
            mutation = Mutation(table, column, rng.choice(VALUES),
                                None if rng.random() < 0.6 else 0)
        name = f"{k:04d}-{file_name(kind, mutation)}"
        write_mutant(sources[kind], mutation, folder / name)
        out.append((name, f"{kind}: {mutation.label}"))
    return out


class Peak(threading.Thread):
    """The server's resident memory, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, False

    def run(self) -> None:
        while not self.done:
            try:
                with open(f"/proc/{self.pid}/status") as handle:
                    for line in handle:
                        if line.startswith("VmRSS:"):
                            self.peak = max(self.peak, int(line.split()[1]) * 1024)
            except OSError:
                return
            time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=6,
                        help="requests drawn per mutant that is read")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="popviz-fuzz-serve-") as scratch:
        began = time.monotonic()
        sources = make_sources(Path(scratch) / "sources")
        served = Path(scratch) / "served"
        mutants = make_mutants(sources, served, args.mutants, rng)
        print(f"{len(mutants)} mutants written in {time.monotonic() - began:.0f} s",
              flush=True)
        proc, port = start_serve(served, "--vet-timeout", "30")
        peak = Peak(proc.pid)
        peak.start()
        refusals: Counter[str] = Counter()
        served_ok, errors, samples = 0, 0, []
        slowest = Outcome("", 0, "", 0.0)
        lock = threading.Lock()
        deps = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/_dash-dependencies", timeout=60).read())
        names = [w for w, _, _ in requests_for("x", deps)]

        def one(item: tuple[str, str]) -> None:
            nonlocal served_ok, errors, slowest
            name, label = item
            pick = random.Random(name).sample(names, args.requests)
            first = visit(port, name, deps, timeout_s=120, only=["csv stages"])
            refused = first[0].status == 404
            rest = [] if refused else visit(port, name, deps, timeout_s=120, only=pick)
            with lock:
                if refused:
                    refusals[reason_of(first[0].line)] += 1
                for o in first + rest:
                    if o.failed or o.status == 422:  # 422: a view that failed to build
                        errors += 1
                        if len(samples) < 12:
                            samples.append(f"{label} | {o.what}: {o.status} "
                                           f"{(o.callback_error or o.line)[:160]}")
                    elif not refused:
                        served_ok += 1
                    if o.seconds > slowest.seconds:
                        slowest = o
                        slowest.what = f"{label} | {o.what}"

        run_began = time.monotonic()
        try:
            with ThreadPoolExecutor(max_workers=2) as pool:
                for k, _ in enumerate(pool.map(one, mutants), start=1):
                    if k % 50 == 0:
                        print(f"  {k} mutants, {time.monotonic() - run_began:.0f} s, "
                              f"peak RSS {peak.peak / 2**20:,.0f} MiB", flush=True)
            try:
                alive = urllib.request.urlopen(f"http://127.0.0.1:{port}/",
                                               timeout=30).status == 200
            except OSError:
                alive = False
            alive = alive and proc.poll() is None
        finally:
            peak.done = True
            out, err = stop(proc)
        seconds = time.monotonic() - run_began
    tracebacks = (out + err).count("Traceback")
    print(f"\nsemantic mutants against one popviz serve ({seconds:.0f} s, seed {args.seed})")
    print(f"  tries                  {len(mutants):6,}")
    print(f"  refused (one line)     {sum(refusals.values()):6,}")
    for reason, n in refusals.most_common():
        print(f"    {reason:22} {n:6,}")
    print(f"  read and served        {len(mutants) - sum(refusals.values()):6,}")
    print(f"  requests answered      {served_ok:6,}")
    print(f"  errors                 {errors:6,}")
    print(f"  slowest request        {slowest.seconds:6.1f} s  ({slowest.what[:90]})")
    print(f"  server peak RSS        {peak.peak / 2**20:6,.0f} MiB")
    print(f"  server survived        {'yes' if alive else 'NO'}")
    print(f"  tracebacks in its log  {tracebacks:6,}")
    for line in samples:
        print("   ", line)
    ok = alive and errors == 0 and peak.peak < 1 << 30
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
