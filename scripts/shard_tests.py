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
    python scripts/shard_tests.py -- tests/test_cli.py  # paths given: just those, one process
    python scripts/shard_tests.py --update-durations    # also rewrite tests/durations.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
NO_TESTS = 5  # pytest's exit status when it collected nothing


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
    """Copy a shard's lines out with its prefix. Keeps reading whatever happens to the
    copy (our stdout closed, say): a shard whose pipe fills would block on its next write."""
    assert proc.stdout is not None
    for line in proc.stdout:
        text = line.rstrip("\n")
        if " passed" in text or " failed" in text or " error" in text:
            shard.summary = text.strip("= ")
        try:
            with lock:
                print(f"[{shard.index}] {text}", flush=True)
        except (OSError, ValueError):
            pass


def _stop(proc: subprocess.Popen[str], grace_s: float = 20.0) -> None:
    """Interrupt a shard as Ctrl-C would (pytest then names the test it was in and runs
    its finalizers), and kill it and what it started if it is still there after `grace_s`."""
    steps = [(signal.SIGINT, grace_s), (signal.SIGKILL, 10.0)]
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # started with Ctrl-C ignored (`trap '' INT; bash .ci/run`): the shards inherit
        # that, so a SIGINT would only cost the grace period
        steps = [(signal.SIGKILL, 10.0)]
    for sig, wait_s in steps:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            if sig == signal.SIGINT:
                os.killpg(proc.pid, signal.SIGKILL)  # what the tests left running
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def run(shards: list[Shard], pytest_args: list[str], limit_s: float, work: Path) -> None:
    """Start every shard, stream their output, stop any past `limit_s` (and every shard
    when this process is interrupted or terminated)."""
    lock = threading.Lock()
    procs: list[subprocess.Popen[str]] = []
    readers: list[threading.Thread] = []
    try:
        _start(shards, pytest_args, work, lock, procs, readers)
        deadline = time.monotonic() + limit_s
        for shard, proc in zip(shards, procs, strict=True):
            try:
                shard.returncode = proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                shard.timed_out = True
                _stop(proc)
                shard.returncode = proc.wait()
    finally:
        for proc in procs:
            if proc.poll() is None:  # interrupted: no shard outlives the run
                _stop(proc, grace_s=5.0)
        for reader in readers:
            reader.join(timeout=10)


def _start(shards: list[Shard], pytest_args: list[str], work: Path, lock: threading.Lock,
           procs: list[subprocess.Popen[str]], readers: list[threading.Thread]) -> None:
    for shard in shards:
        shard.junit = work / f"junit-{shard.index}.xml"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
               f"--basetemp={work / f'tmp-{shard.index}'}", f"--junitxml={shard.junit}",
               *pytest_args, *shard.files]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        procs.append(proc)
        reader = threading.Thread(target=_stream, args=(shard, proc, lock), daemon=True)
        reader.start()
        readers.append(reader)


def _test_file(case: ET.Element) -> str:
    """A JUnit test case's file, from its classname: tests.test_x or
    tests.browser.test_y[.Class] is tests/browser/test_y.py ("" if none)."""
    parts = [p for p in case.get("classname", "").split(".") if p]
    while parts and not parts[-1].startswith("test_"):
        parts.pop()  # a test class
    return "/".join(parts) + ".py" if parts else ""


def measured_durations(shards: list[Shard]) -> dict[str, float]:
    """Seconds per test file from the shards' JUnit reports (setup, call and teardown)."""
    out: dict[str, float] = {}
    for shard in shards:
        if shard.junit is None or not shard.junit.exists():
            continue
        for case in ET.parse(shard.junit).iter("testcase"):
            path = _test_file(case)
            if path:
                out[path] = out.get(path, 0.0) + float(case.get("time", 0.0))
    return {k: round(v, 1) for k, v in sorted(out.items())}


def failures(shards: list[Shard]) -> list[str]:
    """`[k] path::test: first line of its message` for each test a shard's JUnit report
    marks failed or errored: printed again last, where a log's tail shows it."""
    out: list[str] = []
    for shard in shards:
        if shard.junit is None or not shard.junit.exists():
            continue
        try:
            cases = list(ET.parse(shard.junit).iter("testcase"))
        except ET.ParseError:
            continue
        for case in cases:
            for bad in (*case.iter("failure"), *case.iter("error")):
                where = case.get("file") or _test_file(case)
                message = (bad.get("message") or bad.tag).strip().splitlines()
                out.append(f"[{shard.index}] {where}::{case.get('name')}: "
                           f"{message[0][:300] if message else bad.tag}")
    return out


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
    # paths among pytest's arguments: run just those, in one process
    paths = [a for a in args.pytest_args if not a.startswith("-") and
             Path(ROOT, a.split("::")[0]).exists()]
    shards = [Shard(1)] if paths else balance(suite_files(), load_durations(), args.shards)
    for s in shards:
        print(f"[{s.index}] " + (f"{len(s.files)} files, about {s.seconds:,.0f} s"
                                 if s.files else " ".join(paths)), flush=True)
    # -k / -m may leave a shard nothing to run (pytest's exit 5): not a failure then
    filtered = any(a.startswith(("-k", "-m")) for a in args.pytest_args)
    signal.signal(signal.SIGTERM, _terminated)  # stop the shards as Ctrl-C does
    work = Path(tempfile.mkdtemp(prefix="popviz-shards-"))
    started = time.monotonic()
    try:
        run(shards, args.pytest_args, args.limit, work)
        wall = time.monotonic() - started
        failed = False
        for s in shards:
            ok = s.returncode == 0 or (filtered and s.returncode == NO_TESTS)
            state = "TIMED OUT" if s.timed_out else "ok" if ok else \
                f"FAILED (exit {s.returncode})"
            failed |= s.timed_out or not ok
            print(f"== shard {s.index}: {state}: {s.summary or 'no summary'}", flush=True)
        for line in failures(shards):
            print(f"== failed {line}", flush=True)
        if args.update_durations and not failed and not paths and not filtered:
            found = measured_durations(shards)
            DURATIONS.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
            print(f"wrote {len(found)} files' seconds to {DURATIONS}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"== tests {'FAILED' if failed else 'passed'} in {wall:,.0f} s over "
          f"{len(shards)} shard(s)", flush=True)
    return 1 if failed else 0


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)

if __name__ == "__main__":
    raise SystemExit(main())
