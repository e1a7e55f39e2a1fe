"""A job's ranks parsed on a Dask cluster (`popviz import --scheduler`): each trace is read
and reduced to its rank's tables (`import_rank.rank_part`) on a worker, and the client
gathers the parts as they finish, saying each one.

    parts = dask_rank_parts(paths, "local", workers=2)          # an embedded local cluster
    parts = dask_rank_parts(paths, "tcp://10.0.0.5:8786")       # a running cluster

A remote cluster's workers read the traces themselves, so the paths go to them absolute
and must name the same files there (a shared file system). Dask (`dask.distributed`) is
an optional package: the `dask` extra.
"""

from __future__ import annotations

import contextlib
import logging
import os
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
# AUTO_MIN_CPUS when Dask is installed. On 2 cores a local cluster is slower than parsing
# in one process (its start, 2-3 s, and each rank's tables pickled to the client, while
# the client and the workers share the cores: bench_import_scale.py), so `none` is the
# default and `auto` is asked for
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


@contextlib.contextmanager
def dask_client(scheduler: str, workers: int = 0, tasks: int = 0) -> Iterator[Any]:
    """A Dask client of `scheduler` ("local": a cluster started here with `workers`
    processes, 0: one per CPU, at most `tasks` when given, stopped after; else a running
    scheduler's address), with at least one worker. A missing Dask, or a scheduler that
    does not answer, is a one-line ProfileError."""
    try:
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


def dask_rank_parts(paths: list[PathLike], scheduler: str, workers: int = 0,
                    progress: Callable[[int, int, RankPart], None] | None = None,
                    keep: Callable[[RankPart], RankPart] | None = None) -> list[RankPart]:
    """`rank_part` of every file, in order, parsed on the Dask cluster `scheduler` ("local":
    one started here with `workers` processes, 0: one per CPU, and stopped after).
    `progress(done, total, part)` is called as each rank's part arrives, then `keep(part)`,
    whose return is what the list holds (part_store.PartStore.put: the part without its
    tables, so the client never holds every rank's at once). A file's own
    error is its ProfileError; a worker that dies, a scheduler that does not answer or a
    missing Dask is a ProfileError too, and nothing is kept. A running cluster has its
    own workers: `workers` is for a local one."""
    with dask_client(scheduler, workers, len(paths)) as client:
        from distributed import as_completed  # there: dask_client says when it is missing

        return _gather(client, paths, as_completed, progress, keep)


def _gather(client: Any, paths: list[PathLike], as_completed: Any,
            progress: Callable[[int, int, RankPart], None] | None,
            keep: Callable[[RankPart], RankPart] | None) -> list[RankPart]:
    from distributed import KilledWorker

    from popviz.ingest.import_rank import rank_part

    absolute = [os.path.abspath(p) for p in paths]
    run = uuid.uuid4().hex  # keys of this import alone on a scheduler others share
    futures = [client.submit(rank_part, p, key=f"popviz-rank-part-{run}-{i}", pure=False)
               for i, p in enumerate(absolute)]
    index = {f.key: i for i, f in enumerate(futures)}
    parts: list[Any] = [None] * len(paths)
    try:
        for done, future in enumerate(as_completed(futures, loop=client.loop), start=1):
            i = index[future.key]
            try:
                part = future.result()
            except KilledWorker:
                raise ProfileError(f"{paths[i]}: the Dask worker parsing it died (the "
                                   "scheduler gave up on it); nothing was written") from None
            except ProfileError as exc:  # the file as the user gave it, not as sent
                raise ProfileError(str(exc).replace(absolute[i], str(paths[i]))) from None
            except (OSError, TimeoutError) as exc:  # the scheduler lost mid-import
                raise ProfileError(f"{paths[i]}: the Dask scheduler was lost while it was "
                                   f"parsed ({' '.join(str(exc).split())[:200]}); nothing "
                                   "was written") from None
            part.path = Path(paths[i])  # as given, as an import in this process says it
            future.release()  # the worker may forget it now
            if progress is not None:
                progress(done, len(paths), part)
            parts[i] = keep(part) if keep is not None else part
            del part
    finally:
        client.cancel([f for f in futures if not f.done()])
    return [p for p in parts if p is not None]


__all__ = ["AUTO_MIN_CPUS", "AUTO_MIN_TRACES", "LOCAL", "choose_scheduler", "dask_available",
           "dask_client", "dask_rank_parts"]
