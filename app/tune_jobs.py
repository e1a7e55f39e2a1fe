"""Tune searches off the request path: one background job per profile at a time, at most
MAX_RUNNING searches at once (each compiles for ~1 s per plan), polled by the /tune page."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

MAX_RUNNING = 1  # a search is CPU-bound: one at a time leaves the other workers free
MAX_QUEUED = 4  # jobs waiting for the runner; more are refused with a clear message
FULL = 100  # max tile fill in percent: no ceiling below the tile's own memory


@dataclass
class TuneJob:
    """One search: `state` is queued | running | done | error; `fill` is its memory
    ceiling, in percent of a tile's memory (popviz tune --max-tile-fill)."""

    rel: str
    budget: int
    fill: int = FULL
    state: str = "queued"
    result: Any = None
    error: str = ""
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    finished_at: float | None = None

    def progress(self) -> str:
        """What the page shows while it waits."""
        now = time.monotonic()
        if self.state == "queued":
            return f"Waiting for another tune search to finish ({now - self.queued_at:.0f} s)."
        if self.state == "running":
            return (f"Compiling up to {self.budget} plans with the cost model"
                    + (f" (fits = every tile at most {self.fill}% full)"
                       if self.fill < FULL else "") + ": "
                    f"{now - (self.started_at or now):.0f} s so far (about 1 s a plan).")
        return ""


class TuneJobs:
    """The jobs of one server, keyed by (profile, budget, fill %): runs at 60 % and at
    100 % are different searches. A finished job is kept, so the page shows its plans
    again without searching."""

    def __init__(self, max_running: int = MAX_RUNNING, max_queued: int = MAX_QUEUED) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_running, thread_name_prefix="tune")
        self._max_queued = max_queued
        self._jobs: dict[tuple[str, int, int], TuneJob] = {}
        self._last: dict[str, tuple[str, int, int]] = {}  # per profile: the job last asked for
        self._lock = threading.Lock()

    def get(self, rel: str, budget: int, fill: int = FULL) -> TuneJob | None:
        with self._lock:
            return self._jobs.get((rel, int(budget), int(fill)))

    def latest(self, rel: str) -> TuneJob | None:
        """The job a Run tune press on `rel` last started or joined: what a reload of the
        page shows again, whatever budget and fill it was run with."""
        with self._lock:
            key = self._last.get(rel)
            return None if key is None else self._jobs.get(key)

    def start(self, rel: str, budget: int, search: Callable[[], Any],
              fill: int = FULL) -> TuneJob:
        """The job for (rel, budget, fill), started unless one exists; a profile with a
        search still queued or running gets that one (one per profile: the caller reads
        its budget and fill). Raises RuntimeError when too many searches wait."""
        key = (rel, int(budget), int(fill))
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.state != "error":
                self._last[rel] = key
                return job
            busy = [j for j in self._jobs.values() if j.state in ("queued", "running")]
            same = [j for j in busy if j.rel == rel]
            if same:
                self._last[rel] = (rel, same[0].budget, same[0].fill)
                return same[0]
            if len(busy) >= self._max_queued:
                raise RuntimeError(f"{len(busy)} tune searches are already waiting; try "
                                   "again when one has finished")
            job = self._jobs[key] = TuneJob(rel, int(budget), int(fill))
            self._last[rel] = key
        self._pool.submit(self._run, job, search)
        return job

    @staticmethod
    def _run(job: TuneJob, search: Callable[[], Any]) -> None:
        job.started_at, job.state = time.monotonic(), "running"
        try:
            job.result = search()
            job.state = "done"
        except Exception as exc:  # shown on the page, one line
            job.error, job.state = f"{type(exc).__name__}: {exc}" if not isinstance(
                exc, ValueError) else str(exc), "error"
        finally:
            job.finished_at = time.monotonic()
