"""Run the test suite as N plain pytest processes side by side, each over its own files.

Why not pytest-xdist: with two xdist workers a CI run once went quiet at 98% and never
said where; separate pytest processes share no controller to hang on. Each file goes to
one shard (its module fixtures are built once), balanced by the seconds each file took
(`tests/durations.json`, refreshed with --update-durations; a file not listed counts as
the median). Every shard streams its lines with a `[k]` prefix, has its own temporary
directory and a wall-clock limit, and the run fails when any shard fails, times out or
collects nothing.

    python scripts/shard_tests.py                       # 2 shards, the whole suite
    python scripts/shard_tests.py --shards 1 -- -x      # one process, args after -- to pytest
    python scripts/shard_tests.py --update-durations    # also rewrite tests/durations.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "durations.json"


@dataclass
class Shard:
    index: int
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0  # expected, from the durations
    returncode: int | None = None
    timed_out: bool = False
    summary: str = ""
    junit: Path | None = None


def suite_files(root: Path = ROOT) -> list[str]:
    """Every test file under tests/, as a path relative to the repository."""
    return sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py"))


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return {}


def balance(files: list[str], durations: dict[str, float], count: int) -> list[Shard]:
    """Longest file first onto the shard with the least expected time (LPT): within 4/3 of
    the best split. Deterministic: ties go to the lower shard and the earlier name."""
    known = [durations[f] for f in files if f in durations]
    guess = statistics.median(known) if known else 1.0
    weight = {f: durations.get(f, guess) for f in files}
    shards = [Shard(i + 1) for i in range(max(count, 1))]
    for f in sorted(files, key=lambda f: (-weight[f], f)):
        least = min(shards, key=lambda s: (s.seconds, s.index))
        least.files.append(f)
        least.seconds += weight[f]
    return [s for s in shards if s.files]


def _stream(shard: Shard, proc: subprocess.Popen[str], lock: threading.Lock) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        text = line.rstrip("\n")
        if " passed" in text or " failed" in text or " error" in text:
            shard.summary = text.strip("= ")
        with lock:
            print(f"[{shard.index}] {text}", flush=True)


def run(shards: list[Shard], pytest_args: list[str], limit_s: float) -> None:
    """Start every shard, stream their output, stop any past `limit_s`."""
    lock = threading.Lock()
    work = Path(tempfile.mkdtemp(prefix="popviz-shards-"))
    procs, readers = [], []
    for shard in shards:
        shard.junit = work / f"junit-{shard.index}.xml"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
               f"--basetemp={work / f'tmp-{shard.index}'}", f"--junitxml={shard.junit}",
               *pytest_args, *shard.files]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        reader = threading.Thread(target=_stream, args=(shard, proc, lock), daemon=True)
        reader.start()
        procs.append(proc)
        readers.append(reader)
    deadline = time.monotonic() + limit_s
    for shard, proc in zip(shards, procs, strict=True):
        try:
            shard.returncode = proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            shard.timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the shard and what it started
            shard.returncode = proc.wait()
    for reader in readers:
        reader.join(timeout=10)


def measured_durations(shards: list[Shard]) -> dict[str, float]:
    """Seconds per test file from the shards' JUnit reports (setup, call and teardown)."""
    out: dict[str, float] = {}
    for shard in shards:
        if shard.junit is None or not shard.junit.exists():
            continue
        for case in ET.parse(shard.junit).iter("testcase"):
            name = case.get("classname", "").split(".")
            # classname: tests.test_x or tests.browser.test_y[.Class]
            parts = [p for p in name if p]
            while parts and not parts[-1].startswith("test_"):
                parts.pop()
            if parts:
                path = "/".join(parts) + ".py"
                out[path] = out.get(path, 0.0) + float(case.get("time", 0.0))
    return {k: round(v, 1) for k, v in sorted(out.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=2,
                        help="pytest processes side by side (default 2; 1 = one process)")
    parser.add_argument("--limit", type=float, default=3600, metavar="SECONDS",
                        help="wall-clock limit of the whole run; a shard still running then "
                        "is killed and fails (default 3600)")
    parser.add_argument("--update-durations", action="store_true",
                        help=f"write each file's seconds to {DURATIONS.relative_to(ROOT)}")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    files = suite_files()
    shards = balance(files, load_durations(), args.shards)
    for s in shards:
        print(f"[{s.index}] {len(s.files)} files, about {s.seconds:,.0f} s", flush=True)
    started = time.monotonic()
    run(shards, args.pytest_args, args.limit)
    wall = time.monotonic() - started
    failed = False
    for s in shards:
        state = ("TIMED OUT" if s.timed_out else "ok" if s.returncode == 0
                 else f"FAILED (exit {s.returncode})")
        failed |= s.timed_out or s.returncode != 0
        print(f"== shard {s.index}: {state}: {s.summary or 'no summary'}", flush=True)
    if args.update_durations:
        found = measured_durations(shards)
        DURATIONS.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(found)} files' seconds to {DURATIONS}")
    print(f"== tests {'FAILED' if failed else 'passed'} in {wall:,.0f} s over "
          f"{len(shards)} shard(s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
