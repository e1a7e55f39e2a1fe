"""Vet an untrusted profile in a short-lived worker process before opening it in-process.

Some damage cannot be caught by any check in the reading process: a flipped byte can make
libhdf5 crash (SIGSEGV) on an attribute read, damaged blocks can make it loop for ever
while holding h5py's global lock, and a file can declare sizes that grow the reader past
all memory. So `popviz serve` (and the CLI, see popviz.cli.vetcache) first reads each file
fully in a worker (`popviz.format.isolated.read_isolated`, spawn mode) and only opens it
itself when the worker came back clean. A crash, hang or blow-up costs the worker.

What is vet's own: the one-line refusals (without the file's name: the caller names it
relative to what it serves), a time limit scaled with the file's size, and `Vetter`, which
caches one verdict per file stamp (real path, device, inode, size, mtime and ctime: the
ctime and inode are what user space cannot set back, so a file copied over a vetted one with
its old mtime and size is a new stamp), vets at most `workers` files at a time and runs one
vetting per file however many threads ask for it. `same_file` lets the opener check that the
file it opened is the one that was vetted.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, NamedTuple

from popviz.errors import ProfileError
from popviz.format.isolated import read_isolated

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MEMORY_MB = 3072  # how far the worker may grow while reading
DEFAULT_WORKERS = 2
SECONDS_PER_GB = 60  # added to the time limit per GB of file
MAX_VERDICTS = 10_000  # remembered stamps; older ones are vetted again if asked for
# Test hook only: "crash:NAME,hang:NAME,memory:NAME" makes the worker misbehave for files
# whose path contains NAME, so the tests exercise a real crash, hang and memory blow-up.
SIMULATE_ENV = "POPVIZ_VET_SIMULATE"
_SIMULATE_PROBE = "popviz.vet:_simulate_probe"


@dataclass(frozen=True)
class Verdict:
    """`ok`, or why not: `reason` is one line without the file's name."""

    ok: bool
    reason: str = ""

    def message(self, label: str) -> str:
        return f"{label}: {self.reason}"


class Stamp(NamedTuple):
    """A file as it is now. `os.utime` can set mtime back, and a copy can match the size,
    but a replaced file has another inode and any change moves ctime, which only the
    kernel sets: the verdict of one stamp never vouches for other bytes."""

    path: str  # real path
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int


def stamp_of(path: str | os.PathLike[str]) -> Stamp:
    real = os.path.realpath(path)
    return stamp_from(real, os.stat(real))


def stamp_from(path: str | os.PathLike[str], st: os.stat_result) -> Stamp:
    """The stamp of `path` from a stat already taken (no second system call)."""
    return Stamp(str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def same_file(stamp: Stamp, opened: os.stat_result) -> bool:
    """Whether `opened` (an `os.fstat` of the file actually opened) is the file `stamp`
    was vetted as: not replaced and not changed since."""
    return stamp_from(stamp.path, opened) == stamp


def file_check(stamp: Stamp, label: str) -> Callable[[os.stat_result], None]:
    """For `popviz.open(..., check_file=)`: refuse a file that is not the one vetted."""

    def check(opened: os.stat_result) -> None:
        if not same_file(stamp, opened):
            raise ProfileError(f"{label}: changed or replaced while it was being checked; "
                               "try again")

    return check


def time_limit(base_s: float, size_bytes: int) -> float:
    """`base_s`, plus time for a big file to be read at all: a large legitimate profile
    must not be refused as a hang (a real hang is caught all the same, a bit later)."""
    return round(base_s + SECONDS_PER_GB * size_bytes / 1e9)


def vet(path: str | os.PathLike[str], timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB) -> Verdict:
    """Read `path` fully in a worker process; the verdict says whether it came back clean."""
    path = os.path.realpath(path)
    probe = _SIMULATE_PROBE if os.environ.get(SIMULATE_ENV) else None
    result = read_isolated(path, timeout_s=timeout_s, memory_bytes=memory_mb << 20,
                           probe=probe, start="spawn")
    if result.outcome == "ok":
        return Verdict(True)
    if result.outcome == "hang":
        return Verdict(False, f"refused: reading it took longer than {timeout_s:g} s")
    if result.outcome == "memory":
        return Verdict(False, f"refused: reading it needs more than {memory_mb:,} MB")
    if result.outcome == "crash":
        if result.signal is None:
            return Verdict(False, f"refused: the {result.message}")
        return Verdict(False, "refused: reading it crashed a worker "
                              f"(signal {result.signal}{_signal_name(result.signal)})")
    message = result.message.replace(path, "").strip().removeprefix(": ")
    if result.outcome == "error":  # not a ProfileError: a reader bug, still a refusal
        return Verdict(False, f"unreadable ({message})")
    return Verdict(False, message or "unreadable")


def _signal_name(number: int) -> str:
    try:
        return f", {signal.Signals(number).name}"
    except ValueError:
        return ""


def _simulate_probe(profile: Any) -> None:
    """The worker's side of SIMULATE_ENV (run after the file was read)."""
    path = str(profile.path)
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
            import resource

            if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
                raise MemoryError("simulated")  # never fill an unlimited machine
            blocks = [bytearray(256 << 20) for _ in range(256)]  # 64 GiB: past the limit
            del blocks


class Vetter:
    """One verdict per file stamp, from at most `workers` worker processes at a time."""

    def __init__(self, workers: int = DEFAULT_WORKERS, timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="popviz-vet")
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[Stamp, Verdict] = OrderedDict()
        self._running: dict[Stamp, Future[Verdict]] = {}
        self.vettings = 0  # worker processes started (tests check single flight with it)

    def submit(self, path: str | os.PathLike[str]) -> Future[Verdict]:
        """The verdict for `path` as a future; starts one vetting if none ran or runs."""
        return self._submit(stamp_of(path))

    def _submit(self, stamp: Stamp) -> Future[Verdict]:
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
        return self.vetted(path, wait_s)[1]

    def vetted(self, path: str | os.PathLike[str],
               wait_s: float | None = None) -> tuple[Stamp, Verdict | None]:
        """`verdict`, with the stamp it holds for: open the file, then check with
        `same_file` that what was opened is what was vetted."""
        stamp = stamp_of(path)
        future = self._submit(stamp)
        try:
            return stamp, future.result(timeout=wait_s)
        except FutureTimeout:
            return stamp, None

    def _vet(self, stamp: Stamp) -> Verdict:
        with self._lock:
            self.vettings += 1
        verdict = vet_or_refuse(stamp.path, time_limit(self.timeout_s, stamp.size),
                                self.memory_mb)
        with self._lock:
            self._verdicts[stamp] = verdict
            while len(self._verdicts) > MAX_VERDICTS:
                self._verdicts.popitem(last=False)
            self._running.pop(stamp, None)
        return verdict

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def vet_or_refuse(path: str, timeout_s: float, memory_mb: int) -> Verdict:
    """`vet`, with a worker that could not be started as a refusal (never opened
    in-process)."""
    try:
        return vet(path, timeout_s, memory_mb)
    except OSError as exc:
        return Verdict(False, f"refused: could not start a worker to check it "
                              f"({exc.strerror or exc})")
