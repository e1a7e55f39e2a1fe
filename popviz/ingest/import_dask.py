"""A job's ranks on a Dask cluster (`popviz import --scheduler`): each trace is read and
reduced to its rank's tables (`import_rank.rank_part`) on a worker, which keeps them; the
client gathers only each rank's light part (calls, stages, steps), saying each one,
plans what spans the ranks, then has each rank finished on its worker
(`import_merge.finish_rank`) and writes the finished ranks in order as they come.

    with dask_ranks(paths, "local", workers=2) as job:          # an embedded local cluster
        lights = job.parse()                                     # (or "tcp://10.0.0.5:8786")
        for finished in job.finished(order, args, p2p): ...

A remote cluster's workers read the traces themselves, so the paths go to them absolute
and must name the same files there (a shared file system). Dask (`dask.distributed`) is
an optional package: the `dask` extra.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from popviz.errors import ProfileError

if TYPE_CHECKING:  # imported when used: the CLI reads this module's names at start
    from popviz.ingest.import_rank import RankPart

PathLike = str | os.PathLike[str]
LOCAL = "local"
CONNECT_SECONDS = 20  # a scheduler that does not answer in this long is refused
# `--scheduler auto`: more traces than this go to a local cluster on a machine of at least
# AUTO_MIN_CPUS when Dask is installed. On 2 cores a local cluster is no faster than a pool
# of 2 processes (its start and stop, 1.5-2 s, and the client's writing, while the client
# and the workers share the cores: bench_import_scale.py), so `none` is the default and
# `auto` is asked for
AUTO_MIN_TRACES = 8
AUTO_MIN_CPUS = 8


def dask_available() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def choose_scheduler(scheduler: str, traces: int) -> str | None:
    """The scheduler a `--scheduler` value means for `traces` files: None (parse here),
    "local" or a scheduler's address. "auto": a local cluster for many traces on a machine
    of many CPUs when Dask is installed, else here."""
    if scheduler == "auto":
        many = traces > AUTO_MIN_TRACES and (os.cpu_count() or 1) >= AUTO_MIN_CPUS
        return LOCAL if many and dask_available() else None
    if scheduler == "none":
        return None
    return scheduler


ENVIRON = "distributed.nanny.pre-spawn-environ"  # what a worker process starts with
# Dask starts workers with glibc's MALLOC_TRIM_THRESHOLD_ at 64 KiB (to hand freed memory
# back to the system), which also turns off glibc's adaptive mmap threshold: a parse's
# many short-lived arrays then each cost an mmap and its page faults, and a rank parses
# 1.7x slower on a worker than here (3.5 s against 6.0 s for 32 ranks of 20,000 events).
# The local clusters popviz starts leave glibc's defaults; a remote cluster keeps its own.
TRIM_VARIABLE = "MALLOC_TRIM_THRESHOLD_"
METHOD = "distributed.worker.multiprocessing-method"
# An import's local workers are forked on Linux, as its process pool's are (import_rank.
# rank_parts): a spawned worker starts a new interpreter and imports Dask, pandas and the
# parser again (~1 s of each run's 4-8 s at 64 ranks on 2 cores, bench_import_scale.py);
# a forked one has them already. The importing client runs no threads of its own then
# (torch is not loaded: tests/test_import_stream.py); Dask supports fork as a start method.
# Spawn elsewhere (macOS's system libraries are not fork-safe) and for `tune`'s clusters,
# whose client has torch and its thread pools loaded.
FORK_METHOD = "fork" if sys.platform == "linux" else None
# What an embedded cluster runs beside the work and the import has no use for, each a
# share of the cores the workers and the writing client need (no dashboard shows it): the
# workers' statistical profiler (a stack sample every 10 ms) and, in every process, the
# event-loop tick watch (every 20 ms) and the system monitor (every 0.5 s). Measured
# together: 0.2 s of the 7.5 s of CPU a 64-rank import takes (bench_import_scale.py).
QUIET_LOCAL = {"distributed.worker.profile.enabled": False,
               "distributed.admin.tick.interval": "1s",
               "distributed.admin.system-monitor.interval": "5s"}


def _untrimmed(environ: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in dict(environ).items() if k != TRIM_VARIABLE}


@contextlib.contextmanager
def dask_client(scheduler: str, workers: int = 0, tasks: int = 0, *,
                fork: bool = False) -> Iterator[Any]:
    """A Dask client of `scheduler` ("local": a cluster started here with `workers`
    processes, 0: one per CPU, at most `tasks` when given, stopped after; else a running
    scheduler's address), with at least one worker. `fork`: a local cluster's workers
    are forked from this process where fork is safe (`FORK_METHOD`). A missing Dask, or a
    scheduler that does not answer, is a one-line ProfileError."""
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError:
        raise ProfileError("--scheduler needs Dask's distributed scheduler: pip install "
                           "'popviz[dask]' (or dask[distributed])") from None
    cluster: Any = None
    client: Any = None
    try:
        try:
            if scheduler == LOCAL:
                count = workers if workers > 0 else os.cpu_count() or 1
                count = min(count, tasks) if tasks > 0 else count
                settings: dict[str, Any] = {ENVIRON: _untrimmed(dask.config.get(ENVIRON, {})),
                                            **QUIET_LOCAL}
                if fork and FORK_METHOD:
                    settings[METHOD] = FORK_METHOD
                with dask.config.set(settings):
                    cluster = LocalCluster(n_workers=max(1, count), threads_per_worker=1,
                                           processes=True, dashboard_address=None,
                                           silence_logs=logging.ERROR)
                client = Client(cluster, set_as_default=False)
            else:
                client = Client(scheduler, timeout=CONNECT_SECONDS, set_as_default=False)
            # a scheduler with no workers would take the work and never do it
            client.wait_for_workers(1, timeout=CONNECT_SECONDS)
        except (OSError, TimeoutError, ValueError) as exc:
            raise ProfileError(f"no Dask scheduler with workers answers at {scheduler}: "
                               f"{' '.join(str(exc).split())[:300]}") from None
        yield client
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()


@contextlib.contextmanager
def dask_ranks(paths: list[PathLike], scheduler: str, workers: int = 0
               ) -> Iterator[DaskRanks]:
    """A job's ranks on the Dask cluster `scheduler` ("local": one started here with
    `workers` processes, 0: one per CPU, and stopped after; else a running scheduler's
    address, whose own workers read the files). A missing Dask or a scheduler that does not
    answer is a ProfileError."""
    from popviz.ingest import import_merge, import_rank  # noqa: F401 in forked workers

    with dask_client(scheduler, workers, len(paths), fork=True) as client:
        job = DaskRanks(client, paths)
        try:
            yield job
        finally:
            job.cancel()


class DaskRanks:
    """The ranks parsed on the cluster and kept there (`parse`: only each rank's light
    part comes back), then finished there in rank order (`finished`): each rank's tables
    cross to the client once, ready to write, and the client holds a few at a time. A
    file's own error is its ProfileError; a worker that dies or a scheduler lost is a
    ProfileError naming the file, and nothing is kept."""

    def __init__(self, client: Any, paths: list[PathLike]) -> None:
        self.client = client
        self.paths = paths
        self.absolute = [os.path.abspath(p) for p in paths]
        self.run = uuid.uuid4().hex  # keys of this import alone on a scheduler others share
        self.parts: list[Any] = []  # each rank's parsed part, on a worker

    def parse(self, progress: Callable[[int, int, RankPart], None] | None = None
              ) -> list[RankPart]:
        """Every file's light part (`light_of`), in the order given; `progress(done,
        total, light)` as each arrives."""
        from distributed import as_completed

        from popviz.ingest.import_rank import light_of

        submit = self.client.submit
        self.parts = [submit(_parsed, p, key=f"popviz-rank-part-{self.run}-{i}", pure=False)
                      for i, p in enumerate(self.absolute)]
        lights = [submit(light_of, f, key=f"popviz-rank-light-{self.run}-{i}", pure=False)
                  for i, f in enumerate(self.parts)]
        index = {f.key: i for i, f in enumerate(lights)}
        out: list[Any] = [None] * len(self.paths)
        for done, future in enumerate(as_completed(lights, loop=self.client.loop), start=1):
            i = index[future.key]
            light = self._result(future, i, "parsing")
            future.release()
            light.path = Path(self.paths[i])  # as given, as an import here says it
            if progress is not None:
                progress(done, len(self.paths), light)
            out[i] = light
        return out

    def update(self, i: int, change: Callable[..., Any], path: PathLike, *,
               given: str) -> RankPart:
        """`change(part, path)` applied to file i's part where it is (`path`, a file the
        workers read, goes to them absolute; errors name it as `given`); its new light."""
        from popviz.ingest.import_rank import light_of

        absolute = os.path.abspath(path)
        self.parts[i] = self.client.submit(_changed, self.parts[i], change, Path(absolute),
                                           key=f"popviz-rank-part-{self.run}-{i}-changed",
                                           pure=False)
        try:
            light = self._result(self.client.submit(light_of, self.parts[i], pure=False),
                                 i, "reading")
        except ProfileError as exc:
            raise ProfileError(str(exc).replace(absolute, given)) from None
        light.path = Path(self.paths[i])
        light.warnings = [w.replace(absolute, given) for w in light.warnings]
        return light

    def finished(self, order: list[int], args: list[Any], p2p: Any) -> Iterator[Any]:
        """`finish_rank` of file order[k] with args[k] on its worker (its columns
        encoded there: `finish_rank_encoded`), yielded in that order; a few ranks in flight,
        each part forgotten once finished."""
        from popviz.ingest.import_merge import finish_rank_encoded

        shared = self.client.scatter(p2p, broadcast=True)
        window = 2 * max(1, len(self.client.scheduler_info().get("workers", {}))) + 1
        pending: collections.deque[tuple[int, Any]] = collections.deque()
        todo = iter(zip(order, args, strict=True))

        def submit() -> None:
            for i, rank_args in itertools.islice(todo, 1):
                pending.append((i, self.client.submit(
                    finish_rank_encoded, self.parts[i], rank_args, shared,
                    key=f"popviz-rank-finish-{self.run}-{i}", pure=False)))

        for _ in range(window):
            submit()
        while pending:
            i, future = pending.popleft()
            done = self._result(future, i, "finishing")
            future.release()
            self.parts[i].release()
            submit()
            yield done

    def cancel(self) -> None:
        self.client.cancel([f for f in self.parts if not f.done()])

    def _result(self, future: Any, i: int, doing: str) -> Any:
        from distributed import KilledWorker

        try:
            return future.result()
        except KilledWorker:
            raise ProfileError(f"{self.paths[i]}: the Dask worker {doing} it died (the "
                               "scheduler gave up on it); nothing was written") from None
        except ProfileError as exc:  # the file as the user gave it, not as sent
            raise ProfileError(str(exc).replace(self.absolute[i], str(self.paths[i]))
                               ) from None
        except (OSError, TimeoutError) as exc:  # the scheduler lost mid-import
            raise ProfileError(f"{self.paths[i]}: the Dask scheduler was lost while "
                               f"{doing} it ({' '.join(str(exc).split())[:200]}); nothing "
                               "was written") from None


def _parsed(path: PathLike) -> RankPart:
    """`rank_part` on a worker with the cyclic collector paused, as an import here runs it:
    a parse makes millions of short-lived objects in no cycle, which the collector would
    rescan again and again (a Dask worker runs with it on)."""
    from popviz.ingest.import_rank import rank_part

    collecting = gc.isenabled()
    gc.disable()
    try:
        return rank_part(path)
    finally:
        if collecting:
            gc.enable()


def _changed(part: RankPart, change: Callable[..., Any], *args: Any) -> RankPart:
    change(part, *args)
    return part


__all__ = ["AUTO_MIN_CPUS", "AUTO_MIN_TRACES", "LOCAL", "DaskRanks", "choose_scheduler",
           "dask_available", "dask_client", "dask_ranks"]
