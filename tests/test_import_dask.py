"""`popviz import --scheduler`: a job's ranks parsed on a Dask cluster. The distributed
path runs for real: a scheduler and its workers are separate processes on loopback, as on
a cluster, and the profile they make is the one an import in this process makes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import popviz
from popviz.cli.main import main
from popviz.errors import ProfileError
from tests.bench_util import load_bench

pytest.importorskip("distributed", reason="the dask extra (in the test extra)")

RANKS = 4


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Four synthetic ranks shaped like torch.profiler's (bench/bench_import.py)."""
    return list(load_bench("bench_import").write_traces(tmp_path_factory.mktemp("job"),
                                                         RANKS, 2000))


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "dask", *args], text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, start_new_session=True)


def _cluster(folder: Path, workers: int, env: dict[str, str] | None = None,
             nanny: bool = True) -> Iterator[tuple[str, list[subprocess.Popen[str]]]]:
    """A scheduler and `workers` worker processes on loopback; yields the scheduler's
    address and the worker processes."""
    info = folder / "scheduler.json"
    procs = [_start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                     "--scheduler-file", str(info)], env)]
    try:
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert info.exists(), "the Dask scheduler did not start"
        address = json.loads(info.read_text())["address"]
        for _ in range(workers):  # each its own process, as on separate machines
            procs.append(_start(["worker", address, "--nthreads", "1", "--no-dashboard",
                                 "--nanny" if nanny else "--no-nanny"], env))
        from distributed import Client

        with Client(address, timeout=60) as client:  # the scheduler answers
            if workers:
                client.wait_for_workers(workers, timeout=60)
        yield address, procs[1:]
    finally:
        for p in procs:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, list[subprocess.Popen[str]]]]:
    yield from _cluster(tmp_path_factory.mktemp("cluster"), 2)


def test_a_scheduler_and_two_workers_import_what_one_process_does(
        traces: list[Path], cluster: tuple[str, list[Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    address, _ = cluster
    here = popviz.import_trace(traces, tmp_path / "here")
    assert main(["import", *map(str, traces[::-1]), "--to", str(tmp_path / "dask"),
                 "--scheduler", address]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("popviz: parsed rank")]
    assert len(said) == RANKS and f"({RANKS}/{RANKS})" in said[-1], err
    with popviz.open(here) as a, popviz.open(tmp_path / "dask") as b:
        for name in ("trace", "stages", "exchange", "ops", "liveness", "p2p"):
            pd.testing.assert_frame_equal(a.table(name), b.table(name))
        assert a.meta["options"] == b.meta["options"]
        assert sorted(a.meta["measure"]["source"]) == sorted(b.meta["measure"]["source"])
        assert b.command_line.endswith(f"--scheduler {address}")


def test_a_damaged_rank_on_a_worker_names_its_file_and_writes_nothing(
        traces: list[Path], cluster: tuple[str, list[Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    address, _ = cluster
    broken = tmp_path / "rank2_broken.json"
    broken.write_text(traces[2].read_text()[: 5000])  # cut short
    files = [*traces[:2], broken, traces[3]]
    assert main(["import", *map(str, files), "--to", str(tmp_path / "out"),
                 "--scheduler", address]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"popviz: {broken}") or str(broken) in err[-1], err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_worker_killed_mid_import_is_one_line_and_no_profile(
        tmp_path: Path) -> None:
    """The scheduler gives up on a rank whose worker died (here at once: allowed-failures
    0); the import says which file and leaves nothing."""
    big = load_bench("bench_import").write_traces(tmp_path / "big", 1, 150_000)
    env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="0")
    for address, workers in _cluster(tmp_path, 1, env, nanny=False):
        out = tmp_path / "out"
        run = subprocess.Popen([sys.executable, "-m", "popviz.cli.main", "import",
                                str(big[0]), "--to", str(out), "--scheduler", address],
                               text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        from distributed import Client

        with Client(address, timeout=60) as client:  # kill it while it parses the rank
            deadline = time.monotonic() + 60
            while not any(client.processing().values()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert any(client.processing().values()), "the rank never reached the worker"
            os.killpg(workers[0].pid, signal.SIGKILL)
        _, err = run.communicate(timeout=120)
        assert run.returncode == 1, err
        lines = err.strip().splitlines()
        assert lines[-1] == (f"popviz: error: {big[0]}: the Dask worker parsing it died (the "
                             "scheduler gave up on it); nothing was written"), err
        assert not out.exists() or not any(out.iterdir())


def test_no_scheduler_there_is_one_line(traces: list[Path], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from popviz.ingest import import_dask

    monkeypatch.setattr(import_dask, "CONNECT_SECONDS", 2)
    assert main(["import", str(traces[0]), "--to", str(tmp_path / "o"),
                 "--scheduler", "tcp://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("popviz: error: no Dask scheduler with workers answers at "
                          "tcp://127.0.0.1:9: ")
    assert "\n" not in err
    assert main(["import", str(traces[0]), "--to", str(tmp_path / "o"),
                 "--scheduler", "somewhere"]) == 2
    assert "--scheduler must be auto, none, local" in capsys.readouterr().err


def test_a_scheduler_without_workers_is_one_line_not_a_wait(
        traces: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from popviz.ingest import import_dask

    monkeypatch.setattr(import_dask, "CONNECT_SECONDS", 3)
    for address, _ in _cluster(tmp_path, 0):
        assert main(["import", str(traces[0]), "--to", str(tmp_path / "o"),
                     "--scheduler", address]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"popviz: error: no Dask scheduler with workers answers at "
                          f"{address}: ") and "\n" not in err, err
    assert not (tmp_path / "o").exists()


def test_auto_takes_a_local_cluster_only_for_many_traces_on_many_cores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from popviz.ingest import import_dask
    from popviz.ingest.import_dask import AUTO_MIN_CPUS, AUTO_MIN_TRACES, choose_scheduler

    monkeypatch.setattr(import_dask.os, "cpu_count", lambda: AUTO_MIN_CPUS)
    assert choose_scheduler("auto", AUTO_MIN_TRACES) is None
    assert choose_scheduler("auto", AUTO_MIN_TRACES + 1) == "local"
    monkeypatch.setattr(import_dask.os, "cpu_count", lambda: 2)
    assert choose_scheduler("auto", 1000) is None
    assert choose_scheduler("none", 1000) is None
    assert choose_scheduler("tcp://h:1", 1) == "tcp://h:1"
    with pytest.raises(ProfileError, match="no trace file given"):
        popviz.import_trace([], "nowhere", scheduler="local")


def test_a_local_clusters_workers_keep_glibcs_own_malloc_trimming() -> None:
    """Dask starts workers with MALLOC_TRIM_THRESHOLD_ at 64 KiB, which makes a parse 1.7x
    slower there than here; the clusters popviz starts leave it unset and keep Dask's
    other settings (one BLAS / OpenMP thread a worker)."""
    from popviz.ingest.import_dask import TRIM_VARIABLE, dask_client

    def environ() -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in (TRIM_VARIABLE, "OMP_NUM_THREADS")}

    with dask_client("local", 1) as client:
        seen = client.submit(environ, pure=False).result()
    assert seen == {TRIM_VARIABLE: None, "OMP_NUM_THREADS": "1"}
    import dask

    assert TRIM_VARIABLE in dask.config.get("distributed.nanny.pre-spawn-environ")


@pytest.mark.skipif(sys.platform != "linux", reason="workers are forked on Linux only")
def test_an_imports_local_workers_are_forked_with_the_parser_loaded() -> None:
    """An import's local cluster forks its workers from the client, which has the parser
    and pandas loaded (a spawned worker imports them again on its first rank, ~0.5 s on
    2 cores); other local clusters (tune's, whose client has torch) still spawn."""
    from popviz.ingest import import_rank  # noqa: F401 as dask_ranks loads it
    from popviz.ingest.import_dask import dask_client

    def loaded() -> bool:
        return "popviz.ingest.import_rank" in sys.modules

    with dask_client("local", 1, fork=True) as client:
        forked = client.submit(loaded, pure=False).result()
    with dask_client("local", 1) as client:
        spawned = client.submit(loaded, pure=False).result()
    assert forked is True
    assert spawned is False
