"""Spawned ranks of `popviz measure` (torch.multiprocessing), and what their failure says:
one line naming the first rank to fail and its cause, with none of torch's
pytorch-errorfile-*.pickle tracebacks left in the temporary folder."""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import shutil
import tempfile
from pathlib import Path

from popviz.measure.runner import MeasureConfig, end_spawned_rank, free_port, init_group, run_rank


class RankFailed(Exception):
    """A spawned rank failed; the message is one line naming the rank and the cause."""


def _spawned(rank: int, config: MeasureConfig, port: int, causes: str) -> None:
    import torch.distributed as dist

    # a crash in torch's C++ prints where this rank's Python was, in the run's stderr
    faulthandler.enable()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        init_group(config, rank, config.ranks)
        try:
            run_rank(config, rank, config.ranks)
        finally:
            dist.destroy_process_group()
    except Exception as exc:  # the parent says it in one line (spawn_ranks)
        _write_cause(causes, rank, exc)
        raise
    end_spawned_rank()


def _write_cause(causes: str, rank: int, exc: BaseException) -> None:
    from popviz.errors import ProfileError, os_error_line

    if isinstance(exc, OSError):
        text = os_error_line(exc)
    elif isinstance(exc, ProfileError | ValueError) and str(exc):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    with contextlib.suppress(OSError):
        Path(causes, f"rank{rank}").write_text(" ".join(text.split())[:500])


def spawn_ranks(config: MeasureConfig) -> None:
    """Run `config.ranks` spawned ranks to the end. A rank that fails is RankFailed: one
    line with the cause of the first rank to fail (the others then fail waiting on it),
    and none of torch's pytorch-errorfile-*.pickle tracebacks is left in the temporary
    folder."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    causes = tempfile.mkdtemp(prefix="popviz-measure-")
    context = None
    # torch logs a warning per rank it stops after another failed: the cause is our line
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    try:
        context = mp.start_processes(_spawned, args=(config, free_port(), causes),
                                     nprocs=config.ranks, join=False, start_method="spawn")
        while not context.join():
            pass
    except ProcessException as exc:
        raise RankFailed(_first_cause(causes, exc)) from None
    finally:
        if context is not None:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                process.join(30)
            for name in context.error_files:
                with contextlib.suppress(OSError, TypeError):
                    os.unlink(name)
        shutil.rmtree(causes, ignore_errors=True)


def _first_cause(causes: str, exc: Exception) -> str:
    written = sorted(Path(causes).glob("rank*"), key=lambda p: p.stat().st_mtime_ns)
    if written:
        first = written[0]
        return f"rank {first.name.removeprefix('rank')} failed: {first.read_text()}"
    index = getattr(exc, "error_index", "?")
    name = getattr(exc, "signal_name", None)
    code = getattr(exc, "exit_code", None)
    how = f"died of {name}" if name else f"exited with code {code}" if code is not None \
        else "failed"
    return f"rank {index} {how}"
