"""Mutants of Kineto traces and CUDA memory snapshots, each imported by `popviz import` in a
forked worker with a time and address-space limit (tests/test_import_fuzz.py,
bench/bench_fuzz_import.py).

Sources are small slices of real recordings (`small_trace`, `small_snapshot`). Mutants:
byte damage (bit flips, bytes set to JSON's special characters, blocks cut or repeated,
truncation), hostile values put in place of a key's value (NaN, 1e308, 2**63, -1, 300
digits, deep lists, long strings, bad escapes, lone surrogates, wrong types) and gzip
wrappings (whole, cut short, with trailing bytes); snapshots get their pickles damaged
or an event's, segment's or list's values replaced. Every outcome is counted:

  ok          exit 0 and the profile opens and reads whole (popviz.open, every table)
  error       exit 1 with one `popviz: error:` line naming the file
  unclear     exit 1, but not one error line naming the file
  traceback   a traceback, or an exit status other than 0 and 1
  unreadable  exit 0 but the written profile is refused by the reader
  hang / crash  the worker ran past its time / died of a signal
and, across outcomes, `rss` (the worker's peak resident memory over 1 GiB) and `leftovers`
(anything left in the output folder after a failure, or beside the profile).
"""

from __future__ import annotations

import contextlib
import faulthandler
import gzip
import json
import os
import pickle
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from popviz.format.isolated import _limit_memory, _peak_rss, _wait, resident_now
from popviz.ingest.import_limits import read_input
from popviz.ingest.kineto import _KEY, array_end, event_starts

RSS_LIMIT = 1 << 30
OUTCOMES = ("ok", "error", "unclear", "traceback", "unreadable", "hang", "crash")
KEYS = (b'"ts"', b'"dur"', b'"name"', b'"cat"', b'"ph"', b'"args"', b'"tid"',
        b'"External id"', b'"correlation"', b'"bytes"', b'"world_size"', b'"rank"',
        b'"baseTimeNanoseconds"', b'"totalGlobalMem"', b'"Input Dims"',
        b'"Total Allocated"', b'"Concrete Inputs"', b'"stream"', b'"traceEvents"')
HOSTILE = (b"NaN", b"Infinity", b"-Infinity", b"1e308", b"-1e308", b"9223372036854775808",
           b"-9223372036854775809", b"-1", b"0", b"1" * 300, b"1e-400", b"null", b"true",
           b"[]", b"{}", b'""', b'"x"', b'"\\q"', b'"\\ud800"', b'"\\u0000"',
           b"[" * 200 + b"]" * 200, b'"' + b"y" * 100_000 + b'"', b"1000000000000",
           b"[[1e30, -5]]", b'{"a": [1, {"b": null}]}', b"-0.0", b"1.5")
SPECIAL = b'"\\{}[],:0123456789eE.-+ \x00\xff\n'


def small_trace(path: Path, out: Path, every: int = 1, limit: int = 1500) -> Path:
    """A slice of a real trace, in its own layout: every `every`-th of its events, at most
    `limit` of them, between its original top-level fields."""
    data = read_input(path, "trace file")
    begin = _KEY.search(data).end() - 1  # type: ignore[union-attr]
    end, _ = array_end(data, begin, path)
    opens = event_starts(data, begin, end, path)
    stops = np.append(opens[1:], end)
    pick = list(range(0, len(opens), every))[:limit]
    events = [data[opens[i]:stops[i]].rstrip(b" \t\r\n,") for i in pick]
    out.write_bytes(data[:begin + 1] + b"\n  " + b",\n  ".join(events) + b"\n"
                    + data[end:])
    return out


def small_snapshot(path: Path, out: Path, events: int = 400) -> Path:
    """The last `events` events of a real snapshot and its segments (as a ring buffer of
    that size would have kept them: they add up to the segments' bytes)."""
    snap = pickle.loads(read_input(path, "memory snapshot"))
    snap = {"segments": snap["segments"],
            "device_traces": [t[-events:] for t in snap["device_traces"]]}
    out.write_bytes(pickle.dumps(snap))
    return out


def _text_mutant(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice(("bit", "special", "cut", "repeat", "truncate", "value", "value",
                       "value", "escape"))
    buf = bytearray(data)
    at = rng.randrange(len(buf))
    if kind == "bit":
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == "special":
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.choice(SPECIAL)
    elif kind == "cut":
        del buf[at:at + rng.randint(1, 4096)]
    elif kind == "repeat":
        buf[at:at] = buf[at:at + rng.randint(1, 4096)] * rng.randint(1, 20)
    elif kind == "truncate":
        del buf[at:]
    elif kind == "escape":  # inside a string: a bad escape, a control character, a quote
        quote = bytes(buf).find(b'"', at)
        buf[quote + 1:quote + 1] = rng.choice((b"\\q", b"\\", b"\x01", b'\\"', b"\\u12"))
    else:
        key = rng.choice(KEYS)
        text = bytes(buf)
        hit = text.find(key, at)
        hit = hit if hit >= 0 else text.find(key)
        colon = text.find(b":", hit + len(key)) if hit >= 0 else -1
        if colon >= 0:
            start = colon + 1
            stop = start
            while stop < len(buf) and buf[stop] not in b",}\n]":
                stop += 1
            buf[start:stop] = b" " + rng.choice(HOSTILE)
            kind = f"value {key.decode()}"
    return kind, bytes(buf)


def _snapshot_mutant(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    if rng.random() < 0.4:
        kind = rng.choice(("bit", "truncate"))
        buf = bytearray(data)
        if kind == "bit":
            for _ in range(rng.randint(1, 8)):
                buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        else:
            del buf[rng.randrange(len(buf)):]
        return f"pickle {kind}", bytes(buf)
    snap = pickle.loads(data)
    values: list[Any] = [-1, -(1 << 40), 1 << 63, 10**40, float("nan"), float("inf"),
                         "x", None, [], {}, True, 1.5, [[[[]]]]]
    trace = snap["device_traces"][0]
    what = rng.choice(("size", "time_us", "action", "event", "segment", "traces", "list"))
    if what in ("size", "time_us", "action") and trace:
        event = dict(rng.choice(trace))
        event[what] = rng.choice(values)
        trace[rng.randrange(len(trace))] = event
    elif what == "event" and trace:
        trace[rng.randrange(len(trace))] = rng.choice(values)
    elif what == "segment" and snap["segments"]:
        seg = dict(snap["segments"][0], allocated_size=rng.choice(values),
                   device=rng.choice((0, -1, 1 << 70, "0")))
        snap["segments"][0] = seg
    elif what == "traces":
        snap["device_traces"] = rng.choice(values)
    else:  # lists nested 100,000 deep: written by hand (pickle.dumps would recurse)
        depth = rng.choice((10, 100_000))
        deep = b"]" * depth + b"a" * (depth - 1)
        first, second = rng.sample((b"segments", b"device_traces"), 2)
        return "snapshot deep", (b"\x80\x02}(" + _pickled_text(first) + deep
                                 + _pickled_text(second) + b"]u.")
    return f"snapshot {what}", pickle.dumps(snap)


def _pickled_text(text: bytes) -> bytes:
    return b"X" + len(text).to_bytes(4, "little") + text


def _wrap(kind: str, raw: bytes, rng: random.Random) -> tuple[str, bytes]:
    """Sometimes gzip the mutant: whole, cut short, or with bytes after it."""
    roll = rng.random()
    if roll < 0.75:
        return kind, raw
    packed = gzip.compress(raw, compresslevel=1)
    if roll < 0.9:
        return f"{kind} +gzip", packed
    if roll < 0.95:
        return f"{kind} +gzip cut", packed[:rng.randrange(len(packed))]
    return f"{kind} +gzip trailing", packed + bytes([rng.randrange(256)]) * 8


@dataclass
class Result:
    outcome: str
    message: str
    seconds: float
    peak_rss: int
    leftovers: list[str] = field(default_factory=list)


def import_isolated(args: list[str], names: list[str], out: Path, timeout_s: float,
                    memory_bytes: int) -> Result:
    """`popviz import ARGS --to OUT` in a forked worker (stderr kept, address space
    limited); then read what it wrote, in the worker too. `names`: file names the error
    line must name (any one of them)."""
    began = time.monotonic()
    with tempfile.TemporaryFile() as err_file:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            _child(args, out, memory_bytes, err_file.fileno(), read_end, write_end)
        os.close(write_end)
        status, _usage, timed_out = _wait(pid, timeout_s)
        raw = _drain(read_end)  # the worker is gone: read what it wrote, never wait
        err_file.seek(0)
        err = err_file.read().decode("utf-8", "replace")
    seconds = time.monotonic() - began
    leftovers = _leftovers(out)
    if timed_out:
        return Result("hang", f"still importing after {timeout_s:g} s", seconds, 0, leftovers)
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return Result("crash", f"worker died of {name}", seconds, 0, leftovers)
    try:
        report = json.loads(raw)
        rc, peak = int(report["rc"]), int(report["peak"])
    except (ValueError, KeyError, TypeError):
        return Result("crash", f"worker gave no report: {err[-200:]!r}", seconds, 0,
                      leftovers)
    return _classify(rc, err, report.get("unreadable", ""), names, seconds, peak, leftovers)


def _drain(fd: int) -> bytes:
    """What is in a pipe now (a worker forked by another thread may hold its write end
    open: a blocking read would wait for that worker too)."""
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _child(args: list[str], out: Path, memory_bytes: int, err_fd: int, read_end: int,
           write_end: int) -> None:
    """The forked worker: stderr to `err_fd`, the report to `write_end`; never returns."""
    report: dict[str, Any] = {}
    try:
        os.close(read_end)
        os.dup2(err_fd, 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        # the caller's sys.stderr may be a capture (pytest): write to the fds, as Python
        # sets them up for a command (backslashreplace: a lone surrogate prints)
        sys.stderr = open(2, "w", closefd=False, buffering=1,  # noqa: SIM115
                          errors="backslashreplace")
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        faulthandler.disable()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        report = _work(args, out, memory_bytes, resident_now())
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
            os.write(write_end, json.dumps(report).encode())
        os._exit(0)


def _work(args: list[str], out: Path, memory_bytes: int, base_rss: int) -> dict[str, Any]:
    from popviz.cli.main import main
    from popviz.format import reader
    from popviz.format.isolated import read_everything

    _limit_memory(memory_bytes)
    unreadable = ""
    try:
        rc = main(["import", *args, "--to", str(out)])
    except BaseException:  # what would reach the user as a traceback
        traceback.print_exc()
        rc = 99
    if rc == 0:
        try:
            with reader.open(out / "profile.h5") as profile:
                read_everything(profile)
        except Exception as exc:  # the reader refused what the import wrote
            unreadable = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    # forked: the parent's pages are resident in the worker from the start; its own peak
    # is what the import took above them
    return {"rc": rc, "peak": _peak_rss(base_rss), "unreadable": unreadable}


def _leftovers(out: Path) -> list[str]:
    if not out.exists():
        return []
    return sorted(p.name for p in out.iterdir() if p.name != "profile.h5")


def _classify(rc: int, err: str, unreadable: str, names: list[str], seconds: float,
              peak: int, leftovers: list[str]) -> Result:
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith("popviz: warning:")]
    if "Traceback" in err or rc not in (0, 1):
        return Result("traceback", f"exit {rc}: {(errors or [''])[-1][:200]}", seconds, peak,
                      leftovers)
    if rc == 0:
        outcome = "unreadable" if unreadable else "ok"
        return Result(outcome, unreadable, seconds, peak, leftovers)
    one_line = len(errors) == 1 and errors[0].startswith("popviz: error:") \
        and any(name in errors[0] for name in names)
    return Result("error" if one_line else "unclear", " | ".join(errors)[:300], seconds,
                  peak, leftovers)


@dataclass
class Campaign:
    """Counts per outcome and mutation kind; RSS and leftovers across outcomes."""

    outcomes: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    rss_over: int = 0
    leftovers: int = 0
    max_rss: int = 0
    examples: list[tuple[str, Result]] = field(default_factory=list)

    def add(self, kind: str, result: Result) -> None:
        self.outcomes[result.outcome] += 1
        self.by_kind.setdefault(kind.split(" +")[0], Counter())[result.outcome] += 1
        self.max_rss = max(self.max_rss, result.peak_rss)
        over = result.peak_rss > RSS_LIMIT
        self.rss_over += over
        self.leftovers += bool(result.leftovers)
        if (result.outcome not in ("ok", "error") or over or result.leftovers) \
                and len(self.examples) < 50:
            self.examples.append((kind, result))


def run_campaign(traces: list[Path], snapshots: list[Path], mutants: int, seed: int = 0,
                 workers: int = 2, timeout_s: float = 20.0, memory_bytes: int = 3 << 30,
                 snapshot_share: float = 0.25, batch: int = 50, keep: Path | None = None,
                 progress: Callable[[int, Campaign], None] | None = None) -> Campaign:
    """Import `mutants` seeded mutants of the traces (and, `snapshot_share` of them, of
    the snapshots beside an intact trace), each in a forked worker. Mutants are made in
    this thread a batch at a time before any worker forks (no inherited lock). `keep`:
    copy the inputs of runs that were not ok or a one-line error there, to replay them."""
    _warm()
    rng = random.Random(seed)
    texts = [p.read_bytes() for p in traces]
    pickles = [p.read_bytes() for p in snapshots]
    campaign = Campaign()
    with tempfile.TemporaryDirectory(prefix="popviz-import-fuzz-") as scratch:
        done = 0
        while done < mutants:
            jobs = []
            for k in range(done, min(done + batch, mutants)):
                jobs.append(_job(k, Path(scratch), traces, texts, pickles, snapshot_share,
                                 rng))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                results = list(pool.map(lambda job: import_isolated(
                    job[1], job[2], job[3], timeout_s, memory_bytes), jobs))
            for (kind, args, _names, _out), result in zip(jobs, results, strict=True):
                campaign.add(kind, result)
                if keep is not None and (result.outcome not in ("ok", "error")
                                         or result.leftovers):
                    keep.mkdir(parents=True, exist_ok=True)
                    for arg in args:
                        if arg.startswith(scratch):
                            shutil.copyfile(arg, keep / Path(arg).name)
            for path in Path(scratch).iterdir():
                _remove(path)
            done += len(jobs)
            if progress is not None:
                progress(done, campaign)
    return campaign


def _warm() -> None:
    """Import what a worker runs before forking any: each then starts in milliseconds."""
    from popviz.cli.main import build_parser, load_commands
    from popviz.format import reader, writer  # noqa: F401
    from popviz.ingest import import_checks, import_rank, importer  # noqa: F401

    build_parser(load_commands(), only="import")


def _job(k: int, scratch: Path, traces: list[Path], texts: list[bytes],
         pickles: list[bytes], snapshot_share: float,
         rng: random.Random) -> tuple[str, list[str], list[str], Path]:
    out = scratch / f"out{k}"
    if pickles and rng.random() < snapshot_share:
        kind, raw = _wrap(*_snapshot_mutant(rng.choice(pickles), rng), rng)
        snap = scratch / f"mutant{k}.pickle"
        snap.write_bytes(raw)
        trace = traces[0]
        return kind, [str(trace), "--memory-snapshot", str(snap)], [snap.name, trace.name], \
            out
    kind, raw = _wrap(*_text_mutant(rng.choice(texts), rng), rng)
    path = scratch / f"mutant{k}.json"
    path.write_bytes(raw)
    return kind, [str(path)], [path.name], out


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            _remove(child)
        path.rmdir()
    else:
        path.unlink()
