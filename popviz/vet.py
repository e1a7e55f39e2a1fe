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
its old mtime and size is a new stamp; hard links of one file, the same bytes, share their
verdict), vets at most `workers` queued files at a time (and
one more a request waits on, ahead of the queue) and runs one vetting per file however many
threads ask for it. `same_file` lets the opener check that the
file it opened is the one that was vetted.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from popviz.errors import ProfileError
from popviz.format.isolated import read_isolated

if TYPE_CHECKING:
    from popviz.format.reader import FileProfile

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MEMORY_MB = 3072  # how far the worker may grow while reading
DEFAULT_WORKERS = 2
SECONDS_PER_GB = 60  # added to the time limit per GB of file
MAX_VERDICTS = 10_000  # remembered stamps; older ones are vetted again if asked for
# Test hook only: "crash:NAME,hang:NAME,memory:NAME" makes the worker misbehave for files
# whose path contains NAME, so the tests exercise a real crash, hang and memory blow-up;
# "slow:NAME" makes it take SLOW_S more seconds, then pass (a page must poll for it).
SIMULATE_ENV = "POPVIZ_VET_SIMULATE"
_SIMULATE_PROBE = "popviz.vet:_simulate_probe"
SLOW_S = 4.0


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


def content_key(stamp: Stamp) -> tuple[int, ...]:
    """What identifies the bytes (device, inode, size, mtime, ctime), whatever the path:
    every hard link of a file shares its verdict (a verdict never names the file)."""
    return tuple(stamp[1:])


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
    if result.outcome == "interrupted":  # Ctrl-C: no verdict at all, never cached
        raise KeyboardInterrupt
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


def _simulate_probe(profile: FileProfile) -> None:
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
        elif what == "slow":
            time.sleep(SLOW_S)
        elif what == "memory":
            import resource

            if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
                raise MemoryError("simulated")  # never fill an unlimited machine
            blocks = [bytearray(256 << 20) for _ in range(256)]  # 64 GiB: past the limit
            del blocks


class Vetter:
    """One verdict per file stamp, from at most `workers` worker processes at a time for
    the queue, plus one kept for files a request waits on.

    Two lanes: `submit` (start-up, listings) queues a file behind the others; `vetted` /
    `verdict` (a request waits on it) puts it in the urgent lane, ahead of the whole
    queue, and moves it there if it was queued already. The urgent lane has a worker of
    its own, so a requested file starts at once even while the queue's workers are busy
    (say, each on a file that hangs until its time limit)."""

    def __init__(self, workers: int = DEFAULT_WORKERS, timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # keyed by the bytes' identity (content_key): hard links of one file vet once
        self._verdicts: OrderedDict[tuple[int, ...], Verdict] = OrderedDict()
        self._running: dict[tuple[int, ...], Future[Verdict]] = {}  # queued or being vetted
        self._lanes: dict[bool, deque[Stamp]] = {True: deque(), False: deque()}
        self._closed = False
        self._workers = workers
        self._started = False  # the threads start with the first file
        self.vettings = 0  # worker processes started (tests check single flight with it)

    def submit(self, path: str | os.PathLike[str], urgent: bool = False) -> Future[Verdict]:
        """The verdict for `path` as a future; queues one vetting if none ran or runs."""
        return self._submit(stamp_of(path), urgent)

    def _submit(self, stamp: Stamp, urgent: bool = False) -> Future[Verdict]:
        key = content_key(stamp)
        with self._lock:
            known = self._verdicts.get(key)
            if known is not None:
                done: Future[Verdict] = Future()
                done.set_result(known)
                return done
            running = self._running.get(key)
            if running is None:
                self._start()
                running = self._running[key] = Future()
                self._lanes[urgent].append(stamp)
                self._wake.notify_all()
            elif urgent:  # queued (under this path or another link): jump the queue
                queued = next((s for s in self._lanes[False] if content_key(s) == key), None)
                if queued is not None:
                    self._lanes[False].remove(queued)
                    self._lanes[True].append(queued)
                    self._wake.notify_all()
            return running

    def verdict(self, path: str | os.PathLike[str],
                wait_s: float | None = None) -> Verdict | None:
        """Wait (at most `wait_s`, or for as long as vetting takes) for the verdict; None
        if it is not in yet. The file jumps the queue."""
        return self.vetted(path, wait_s)[1]

    def vetted(self, path: str | os.PathLike[str],
               wait_s: float | None = None) -> tuple[Stamp, Verdict | None]:
        """`verdict`, with the stamp it holds for: open the file, then check with
        `same_file` that what was opened is what was vetted."""
        stamp = stamp_of(path)
        future = self._submit(stamp, urgent=True)
        try:
            return stamp, future.result(timeout=wait_s)
        except FutureTimeout:
            return stamp, None

    def _start(self) -> None:
        if not self._started:
            self._started = True
            for n in range(self._workers + 1):  # the last one takes urgent files only
                threading.Thread(target=self._work, args=(n == self._workers,),
                                 daemon=True, name=f"popviz-vet-{n}").start()

    def _work(self, urgent_only: bool) -> None:
        while True:
            with self._lock:
                while not self._closed and not (
                        self._lanes[True] or (self._lanes[False] and not urgent_only)):
                    self._wake.wait()
                if self._closed:
                    return
                lane = self._lanes[True] if self._lanes[True] else self._lanes[False]
                stamp = lane.popleft()
                future = self._running[content_key(stamp)]
                self.vettings += 1
            keep = True
            try:
                verdict = vet_or_refuse(stamp.path, time_limit(self.timeout_s, stamp.size),
                                        self.memory_mb)
            except KeyboardInterrupt:  # the worker got a Ctrl-C: nothing said of the file
                verdict, keep = Verdict(False, "its check was interrupted; reload the "
                                               "page to check it again"), False
            except BaseException as exc:  # never leave a waiter without an answer
                verdict = Verdict(False, f"unreadable ({type(exc).__name__})")
            with self._lock:
                if keep:
                    self._verdicts[content_key(stamp)] = verdict
                while len(self._verdicts) > MAX_VERDICTS:
                    self._verdicts.popitem(last=False)
                self._running.pop(content_key(stamp), None)
            future.set_result(verdict)

    def close(self) -> None:
        """Stop after the vettings under way; queued ones are cancelled."""
        with self._lock:
            self._closed = True
            queued = [self._running.pop(content_key(s)) for lane in self._lanes.values()
                      for s in lane]
            for lane in self._lanes.values():
                lane.clear()
            self._wake.notify_all()
        for future in queued:
            future.cancel()


def vet_or_refuse(path: str, timeout_s: float, memory_mb: int) -> Verdict:
    """`vet`, with a worker that could not be started as a refusal (never opened
    in-process)."""
    try:
        return vet(path, timeout_s, memory_mb)
    except OSError as exc:
        return Verdict(False, f"refused: could not start a worker to check it "
                              f"({exc.strerror or exc})")
