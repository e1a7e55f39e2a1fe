"""Vet an untrusted profile in a short-lived worker process before opening it in-process.

Some damage cannot be caught by any check in the reading process: a flipped byte can make
libhdf5 crash (SIGSEGV) on an attribute read, damaged blocks can make it loop for ever
while holding h5py's global lock (no Python timeout can interrupt that), and a file can
declare sizes that grow the reader past all memory. So the server (`popviz serve`) first
opens each file in a child process under a time limit and an address-space limit
(`RLIMIT_AS`), reads every table, the trace index and every array, and only opens the file
itself when the child came back clean. A crash, hang or blow-up costs the child.

`Vetter` caches one verdict per (real path, mtime, size), vets at most `workers` files at
a time and runs one vetting per file however many threads ask for it.

Run as `python -m popviz.vet [--memory-mb N] PATH` it is the child: it prints one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MEMORY_MB = 3072  # address space, so it includes ~0.7 GB of Python, numpy, pandas
DEFAULT_WORKERS = 2
SECONDS_PER_GB = 60  # added to the time limit per GB of file
MAX_VERDICTS = 10_000  # remembered stamps; older ones are vetted again if asked for
# Test hook only: "crash:NAME,hang:NAME,memory:NAME" makes the child misbehave for files
# whose path contains NAME, so the tests exercise a real crash, hang and memory blow-up.
SIMULATE_ENV = "POPVIZ_VET_SIMULATE"
_BLOCK_STEPS = 65536  # tile_liveness steps read at a time (as the app's StepPyramid reads)


@dataclass(frozen=True)
class Verdict:
    """`ok`, or why not: `reason` is one line without the file's name."""

    ok: bool
    reason: str = ""

    def message(self, label: str) -> str:
        return f"{label}: {self.reason}"


Stamp = tuple[str, float, int]


def stamp_of(path: str | os.PathLike[str]) -> Stamp:
    real = os.path.realpath(path)
    st = os.stat(real)
    return (real, st.st_mtime, st.st_size)


def time_limit(base_s: float, size_bytes: int) -> float:
    """`base_s`, plus time for a big file to be read at all: a large legitimate profile
    must not be refused as a hang (a real hang is caught all the same, a bit later)."""
    return round(base_s + SECONDS_PER_GB * size_bytes / 1e9)


def vet(path: str | os.PathLike[str], timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB) -> Verdict:
    """Read `path` in a child process; the verdict says whether it came back clean."""
    path = os.path.realpath(path)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PYTHONFAULTHANDLER="")
    env.pop("PYTHONFAULTHANDLER")  # a crash should be a signal, not a traceback dump
    cmd = [sys.executable, "-m", "popviz.vet", "--memory-mb", str(memory_mb), path]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return Verdict(False, f"refused: reading it took longer than {timeout_s:g} s")
    if proc.returncode < 0:
        number = -proc.returncode
        try:
            name = f", {signal.Signals(number).name}"
        except ValueError:
            name = ""
        return Verdict(False, f"refused: reading it crashed a worker (signal {number}{name})")
    report = _last_json_line(out)
    if report is None:
        return Verdict(False, f"refused: the worker reading it exited with code "
                              f"{proc.returncode} and no verdict")
    if report.get("ok"):
        return Verdict(True)
    if report.get("memory"):
        return Verdict(False, f"refused: reading it needs more than {memory_mb:,} MB")
    reason = str(report.get("error") or "unreadable").replace(path, "").strip()
    return Verdict(False, reason.removeprefix(": ") or "unreadable")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.communicate()


def _last_json_line(out: bytes) -> dict | None:
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


class Vetter:
    """One verdict per file stamp, from at most `workers` child processes at a time."""

    def __init__(self, workers: int = DEFAULT_WORKERS, timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="popviz-vet")
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[Stamp, Verdict] = OrderedDict()
        self._running: dict[Stamp, Future[Verdict]] = {}
        self.vettings = 0  # child processes started (tests check single flight with it)

    def submit(self, path: str | os.PathLike[str]) -> Future[Verdict]:
        """The verdict for `path` as a future; starts one vetting if none ran or runs."""
        stamp = stamp_of(path)
        with self._lock:
            known = self._verdicts.get(stamp)
            if known is not None:
                done: Future[Verdict] = Future()
                done.set_result(known)
                return done
            running = self._running.get(stamp)
            if running is None:
                running = self._pool.submit(self._vet, stamp)
                self._running[stamp] = running
            return running

    def verdict(self, path: str | os.PathLike[str],
                wait_s: float | None = None) -> Verdict | None:
        """Wait (at most `wait_s`, or for as long as vetting takes) for the verdict; None
        if it is not in yet."""
        future = self.submit(path)
        try:
            return future.result(timeout=wait_s)
        except FutureTimeout:
            return None

    def _vet(self, stamp: Stamp) -> Verdict:
        with self._lock:
            self.vettings += 1
        try:
            verdict = vet(stamp[0], time_limit(self.timeout_s, stamp[2]), self.memory_mb)
        except OSError as exc:  # could not start a worker: say so, do not open in-process
            verdict = Verdict(False, f"refused: could not start a worker to check it "
                                     f"({exc.strerror or exc})")
        with self._lock:
            self._verdicts[stamp] = verdict
            while len(self._verdicts) > MAX_VERDICTS:
                self._verdicts.popitem(last=False)
            self._running.pop(stamp, None)
        return verdict

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# ---- the child ----
def _simulate(path: str, memory_mb: int) -> None:
    for item in os.environ.get(SIMULATE_ENV, "").split(","):
        what, _, name = item.partition(":")
        if not name or name not in path:
            continue
        if what == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif what == "hang":
            while True:
                time.sleep(3600)
        elif what == "memory":
            _hog = bytearray(memory_mb * 2 * 1024 * 1024)


def read_everything(path: str) -> None:
    """What the app will read from `path`: every table, the trace index, every array."""
    import numpy as np

    from popviz.format import open as open_profile

    with open_profile(path) as profile:
        for name in profile.table_names:
            profile.table(name)
        ipus = np.unique(profile.trace["ipu"].to_numpy()) if len(profile.trace) else []
        for ipu in ipus[:1]:
            profile.trace_for(int(ipu))  # reads the per-IPU offsets
        shape = profile.array_shape("tile_liveness")
        if len(shape) == 3:
            for ipu in range(shape[0]):
                for s0 in range(0, shape[1], _BLOCK_STEPS):
                    profile.tile_liveness(ipu, s0, s0 + _BLOCK_STEPS)


def _child(argv: list[str]) -> int:
    import argparse
    import resource

    parser = argparse.ArgumentParser(prog="python -m popviz.vet")
    parser.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB)
    parser.add_argument("path")
    args = parser.parse_args(argv)
    limit = args.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    report: dict[str, object]
    try:
        _simulate(args.path, args.memory_mb)
        read_everything(args.path)
        report = {"ok": True}
    except MemoryError:
        report = {"ok": False, "memory": True}
    except Exception as exc:  # any way the file is wrong is a verdict, not a crash
        from popviz.errors import ProfileError

        text = " ".join(str(exc).split())[:300]
        report = {"ok": False, "error": text if isinstance(exc, ProfileError)
                  else f"unreadable ({type(exc).__name__}: {text})"}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
