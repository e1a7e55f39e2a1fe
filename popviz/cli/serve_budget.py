"""One slow or memory-hungry page cannot take the server down: threads, time and memory
budgets for the requests that build views.

A hostile profile that passes vetting can still make one view spin for minutes or
allocate gigabytes in the serving process (issue 34). Three budgets keep that to one
error message:

- **Threads** (`FairDispatcher`, waitress' task queue): requests that build something
  (Dash callbacks and downloads: *heavy*) run on at most `threads - RESERVED_THREADS`
  threads, so pages, layouts, assets and `/` always find a thread; and one profile's
  views take all of those but OTHER_PROFILES_THREADS, so eight requests for one bad
  profile leave the other profiles' pages running. Past a share a request waits in the
  queue (no error under ordinary load); nothing is refused. (The shares are loose on
  purpose: with more profiles than the cache holds, fewer threads on a profile's
  requests means more reopening; bench/bench_serve.py shows it.)
- **Time** (`Deadline`, WSGI middleware): a heavy request still running after
  `timeout_s` gets `RequestStopped` raised in its thread (at the next Python
  instruction; a C call finishes first), which the app answers as one line on the
  page, or a 422 for a download. The thread is then free again.
- **Memory** (`limit_memory`): the process' data segment (RLIMIT_DATA: heap and
  private mappings, what its RSS is made of) is capped, so a runaway allocation is a
  MemoryError in the request that made it, answered as one line, instead of the machine
  swapping or the kernel killing the server; after a request that grew the process, freed
  memory is handed back to the system (malloc_trim).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from waitress.task import ThreadedTaskDispatcher

from popviz.errors import RequestStopped

log = logging.getLogger("popviz.serve")

RESERVED_THREADS = 2  # never building a view: `/`, layouts, assets stay answerable
OTHER_PROFILES_THREADS = 2  # of those building views, never taken by one profile
DEFAULT_REQUEST_TIMEOUT_S = 60.0
DEFAULT_MEMORY_MB = 4096
# a request that grew the process this much: freed heap handed back after it (not after
# every request: trimming takes the allocator's locks while the others allocate)
TRIM_GROWTH_BYTES = 512 << 20
WATCH_INTERVAL_S = 0.25
CALLBACK_ROUTE = "/_dash-update-component"
DOWNLOAD_PREFIX = "/download/"
# libraries whose Python code holds a lock of their own (h5py's global lock): a stop is
# raised only once the thread is out of them, so no such lock is left held
_NEVER_INSIDE = (f"{os.sep}h5py{os.sep}",)


def is_heavy(path: str) -> bool:
    """Whether a request to `path` builds something (a callback or a download)."""
    return path.endswith(CALLBACK_ROUTE) or path.startswith(DOWNLOAD_PREFIX)


def callback_profile(body: bytes) -> str:
    """The `profile=` of the page a Dash callback body comes from ('' when none)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(data, dict):
        return ""
    for key in ("state", "inputs"):
        items = data.get(key)
        for item in items if isinstance(items, list) else []:
            if (isinstance(item, dict) and item.get("id") == "url"
                    and item.get("property") == "search"):
                return _profile_param(str(item.get("value") or "").lstrip("?"))
    return ""


def _profile_param(query: str) -> str:
    return parse_qs(query).get("profile", [""])[0][:1024]


def request_share(request: Any) -> str | None:
    """None for a light request; else the profile it builds for ('' for none): what
    `FairDispatcher` shares threads by. `request`: waitress' parsed request."""
    path = str(getattr(request, "path", "") or "")
    if getattr(request, "error", None) is not None or not is_heavy(path):
        return None
    if path.startswith(DOWNLOAD_PREFIX):
        return _profile_param(str(request.query or ""))
    try:
        stream = request.get_body_stream()
        where = stream.tell()
        body = stream.read(int(request.content_length or 0))
        stream.seek(where)  # waitress hands the same file to the app
    except (OSError, ValueError, AttributeError):
        return ""
    return callback_profile(body)


@dataclass(frozen=True)
class Share:
    """How many threads may build views at all, and for one profile."""

    heavy: int
    per_profile: int

    @classmethod
    def of(cls, threads: int) -> Share:
        heavy = max(1, threads - RESERVED_THREADS)
        return cls(heavy, max(1, heavy - OTHER_PROFILES_THREADS))


class _Queued:
    """A waitress task (a channel with a request to answer) and what it builds for."""

    __slots__ = ("profile", "task")

    def __init__(self, task: Any, profile: str | None) -> None:
        self.task, self.profile = task, profile

    def service(self) -> None:
        self.task.service()

    def cancel(self) -> None:
        self.task.cancel()


class FairDispatcher(ThreadedTaskDispatcher):
    """waitress' thread pool, taking from its queue the first request whose share is
    free (see the module): light requests always, heavy ones within `share`."""

    def __init__(self, share: Share) -> None:
        super().__init__()
        self.share = share
        self.heavy_running = 0
        self.running: Counter[str] = Counter()  # heavy requests running per profile

    def add_task(self, task: Any) -> None:
        requests = getattr(task, "requests", None)
        profile = request_share(requests[0]) if requests else None
        super().add_task(_Queued(task, profile))

    def _next(self) -> _Queued | None:
        for n, queued in enumerate(self.queue):
            if queued.profile is None or (
                    self.heavy_running < self.share.heavy
                    and self.running[queued.profile] < self.share.per_profile):
                del self.queue[n]
                return queued
        return None

    def handler_thread(self, thread_no: int) -> None:
        while True:
            with self.lock:
                queued: _Queued | None = None
                while self.stop_count == 0 and (queued := self._next()) is None:
                    self.active_count -= 1
                    self.queue_cv.wait()
                    self.active_count += 1
                if self.stop_count > 0 or queued is None:
                    self.active_count -= 1
                    self.stop_count -= 1
                    self.threads.discard(thread_no)
                    self.thread_exit_cv.notify()
                    break
                if queued.profile is not None:
                    self.heavy_running += 1
                    self.running[queued.profile] += 1
            try:
                queued.service()
            except BaseException:
                self.logger.exception("Exception when servicing %r", queued.task)
            finally:
                if queued.profile is not None:
                    with self.lock:
                        self.heavy_running -= 1
                        self.running[queued.profile] -= 1
                        if not self.running[queued.profile]:
                            del self.running[queued.profile]
                        self.queue_cv.notify_all()  # a request waiting on this share


@dataclass
class _Running:
    thread_id: int
    started: float
    stopped: bool = False


@dataclass
class Deadline:
    """WSGI middleware: heavy requests past `timeout_s` are stopped (see the module), and
    memory a request freed is handed back."""

    app: Callable[..., Iterable[bytes]]
    timeout_s: float
    running: dict[int, _Running] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _watching: bool = False

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not is_heavy(str(environ.get("PATH_INFO", ""))):
            return self.app(environ, start_response)
        self._watch()
        before = resident_bytes()
        ticket = _Running(threading.get_ident(), time.monotonic())
        with self.lock:
            self.running[id(ticket)] = ticket
        try:
            try:
                result = self.app(environ, start_response)
                try:  # built here, inside the deadline, not while waitress sends it
                    return [b"".join(result)]
                finally:
                    close = getattr(result, "close", None)
                    if close is not None:
                        close()
            finally:
                self._done(ticket)
        except RequestStopped:  # raised outside the app's own handlers
            start_response("503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8")], sys.exc_info())
            return [f"popviz: {RequestStopped(self.timeout_s)}\n".encode()]
        finally:
            if resident_bytes() - before > TRIM_GROWTH_BYTES:
                give_back_memory()

    def _done(self, ticket: _Running) -> None:
        """Forget `ticket`; a stop raised in its thread but not yet delivered is
        withdrawn (it must not land in the next request)."""
        while True:
            try:
                with self.lock:
                    self.running.pop(id(ticket), None)
                    if ticket.stopped:
                        _raise_in(ticket.thread_id, None)
                return
            except RequestStopped:  # delivered just now: done all the same
                continue

    def _watch(self) -> None:
        with self.lock:
            if self._watching:
                return
            self._watching = True
        threading.Thread(target=self._watcher, daemon=True, name="popviz-deadline").start()

    def _watcher(self) -> None:
        stop = type("RequestStopped", (RequestStopped,), {"limit_s": self.timeout_s})
        while True:
            time.sleep(WATCH_INTERVAL_S)
            now = time.monotonic()
            frames = sys._current_frames()
            with self.lock:
                for ticket in self.running.values():
                    if (not ticket.stopped and now - ticket.started > self.timeout_s
                            and not _inside_locked_library(frames.get(ticket.thread_id))):
                        ticket.stopped = True
                        _raise_in(ticket.thread_id, stop)
                        log.warning("stopped a request after %.0f s (--request-timeout)",
                                    now - ticket.started)


def _inside_locked_library(frame: Any) -> bool:
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _NEVER_INSIDE):
            return True
        frame = frame.f_back
    return False


def _raise_in(thread_id: int, exc_type: type[BaseException] | None) -> None:
    """Raise `exc_type` in thread `thread_id` at its next Python instruction (None:
    withdraw one not delivered yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type else None)


def resident_bytes() -> int:
    """This process' resident memory (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def data_bytes() -> int:
    """This process' data segment now (what RLIMIT_DATA counts; 0 if unknown)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[5]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def give_back_memory() -> None:
    """Hand freed heap pages back to the system (glibc keeps them otherwise). No
    gc.collect: a full collection holds the GIL for every thread."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def limit_memory(memory_mb: int) -> str | None:
    """Cap this process' data segment at `memory_mb` (soft limit: the vet workers it
    starts set their own). Why not, in one line, or None when set."""
    limit = memory_mb << 20
    used = data_bytes()
    if used and limit < used + (256 << 20):
        return (f"--memory-mb {memory_mb} leaves no room: the server already uses "
                f"{used >> 20:,} MB before reading any profile")
    try:
        _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ValueError, OSError) as exc:  # not supported here: serve without the cap
        log.warning("could not cap the server's memory: %s", exc)
    return None
