"""Live runs: torch.profiler around the user's own pipelining steps, read by `ingest`.

    import popviz.measure
    with popviz.measure.record("measured") as rec:    # on every rank of the job
        for _ in range(steps):
            schedule.step(...)                          # torch.distributed.pipelining's own
            optimiser.step(); optimiser.zero_grad()
            rec.step()
    # rank 0 wrote measured/profile.h5; every rank its measured/traces/rank{r}.json

Nothing of pipelining is patched: torch.profiler records what the schedule annotates
(`PP:` actions, gloo / nccl send and recv) and each rank saves its trace (a user's file:
`popviz import` reads the same). Each rank parses its own trace into its tables
(`ingest.import_rank`); the tables, not files, go to rank 0 over the job's own process
group (`dist.gather_object`), with each rank's clock readings from barriers taken before
the first step, so ranks on hosts whose clocks differ line up (`ingest.clocks`). Rank 0
pairs the sends and recvs, splits waiting from transfer and writes one profile, exactly
as `popviz import` of the saved traces would (plus what the run knows: layers, losses).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from popviz.vocab import MEASURED_KIND

Clock = Callable[[], int]
Adjust = Callable[[dict[str, pd.DataFrame], dict[str, Any], list[dict[str, Any]]], None]


@dataclass
class LiveRecording:
    """What `record` yields on each rank: `step()` after each training step, `extra` (a
    dict this rank hands to rank 0: losses...), and once the block is over `trace_path`
    (this rank's torch.profiler trace) and, on rank 0, `profile_path`."""

    profile_dir: Path
    rank: int
    world: int
    prof: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    out: Path | None = None  # where rank 0 writes the profile
    trace_path: Path | None = None
    profile_path: Path | None = None

    def step(self) -> None:
        """Mark the end of one training step (torch.profiler's `ProfilerStep#N`)."""
        self.prof.step()


def _dist(group: Any) -> tuple[Any, int, int]:
    """torch.distributed if this process is in an initialised job, with rank and size."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist, dist.get_rank(group), dist.get_world_size(group)
    return None, 0, 1


def clock_readings(dist: Any, group: Any, rounds: int, clock: Clock) -> list[int]:
    """`clock()` right after each of `rounds` barriers shared by every rank."""
    readings = []
    for _ in range(rounds):
        if dist is not None:
            dist.barrier(group=group)
        readings.append(int(clock()))
    return readings


def profiler(cuda: bool | None = None) -> Any:
    """torch.profiler as the importer reads it: CPU (and CUDA when there is one) ops,
    their shapes (the micro-batch size) and memory events (liveness)."""
    import torch
    from torch.profiler import ProfilerAction, ProfilerActivity, profile

    cuda = torch.cuda.is_available() if cuda is None else cuda
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # a schedule that always records: torch.profiler marks steps (`ProfilerStep#N`, what
    # the importer numbers steps by) only when it has a schedule
    return profile(activities=activities, record_shapes=True, profile_memory=True,
                   schedule=lambda step: ProfilerAction.RECORD)


@contextlib.contextmanager
def record(profile_dir: str | Path = "measured", *, group: Any = None, rounds: int = 5,
           clock: Clock = time.time_ns, adjust: Adjust | None = None,
           out: str | Path | None = None, command_line: str | None = None,
           write: bool = True) -> Iterator[LiveRecording]:
    """Profile the training steps run inside the block on this rank (call it on every
    rank of the job, or in a single process); on leaving it, gather every rank's tables
    on rank 0 of `group` (default: the whole job) and write `profile_dir/profile.h5`
    there (or at `out`: a .h5 path or a directory). Each rank saves its trace as
    `profile_dir/traces/rank{r}.json` on its own host. `clock` is the wall clock
    torch.profiler stamps events with (a test passes a fake one); `adjust(tables, meta,
    extras)` lets the caller add what it knows (rank 0). An exception inside the block
    leaves it on that rank without gathering: the other ranks then wait in the gather
    until the process group's timeout, as they would in any collective."""
    dist, rank, world = _dist(group)
    rec = LiveRecording(Path(profile_dir), rank, world, out=Path(out or profile_dir))
    readings = clock_readings(dist, group, rounds, clock)
    with profiler() as prof:
        rec.prof = prof
        yield rec
    mine = dist.get_rank() if dist is not None else 0  # the job's rank, as the trace says
    rec.trace_path = rec.profile_dir / "traces" / f"rank{mine}.json"
    rec.trace_path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(rec.trace_path))
    rec.profile_path = hand_over(rec, readings, dist, group, adjust=adjust,
                                 command_line=command_line, write=write)


def rank_payload(rec: LiveRecording, readings: list[int]) -> dict[str, Any]:
    """This rank's share for rank 0: its parsed trace (tables, not the raw events), its
    clock readings, host and extra."""
    from popviz.ingest.import_rank import rank_part

    assert rec.trace_path is not None  # set when the recording started
    part = rank_part(rec.trace_path)
    part.labeller = None  # the parse's spans: not needed once the tables are built
    return {"part": part, "readings": readings, "host": socket.gethostname(),
            "extra": dict(rec.extra)}


def hand_over(rec: LiveRecording, readings: list[int], dist: Any, group: Any, *,
              adjust: Adjust | None = None, command_line: str | None = None,
              write: bool = True) -> Path | None:
    """Every rank's payload to rank 0 over the job's process group; rank 0 merges and
    (with `write`) writes the profile. Returns its path on rank 0, None elsewhere."""
    from popviz.errors import ProfileError

    try:  # a trace this rank cannot read still takes part in the gather, as its error
        payload = rank_payload(rec, readings)
    except ProfileError as exc:
        payload = {"error": str(exc)}
    if dist is None:
        payloads: list[Any] | None = [payload]
    else:
        payloads = [None] * rec.world if rec.rank == 0 else None
        dist.gather_object(payload, payloads, dst=_global_rank(dist, group, 0),
                           group=group)
    failed = [p["error"] for p in payloads or [payload] if "error" in p]
    if failed:  # every rank that read a bad trace says so; rank 0 names the first
        raise ProfileError(failed[0])
    if rec.rank != 0:
        return None
    assert payloads is not None
    result, meta, summary = merge_payloads(payloads, adjust)
    rec.extra["tables"], rec.extra["meta"] = result, meta
    if not write:
        return None
    from popviz.format.writer import write_profile

    return write_profile(rec.out or rec.profile_dir, meta=meta, tables=result, summary=summary,
                         kind=MEASURED_KIND,
                         command_line=command_line or " ".join(sys.argv))


def _global_rank(dist: Any, group: Any, rank: int) -> int:
    return rank if group is None else int(dist.get_global_rank(group, rank))


def merge_payloads(payloads: list[dict[str, Any]], adjust: Adjust | None = None
                   ) -> tuple[dict[str, pd.DataFrame], dict[str, Any], dict[str, Any]]:
    """The ranks' payloads (any order) -> tables, meta, summary, through the importer."""
    from popviz.ingest.clocks import clock_offsets
    from popviz.ingest.importer import import_parts

    payloads = sorted(payloads, key=lambda p: p["part"].rank)
    parts = [p["part"] for p in payloads]
    offsets, clock = clock_offsets([p["readings"] for p in payloads],
                                   [p["host"] for p in payloads])
    extras = [p["extra"] for p in payloads]

    def live(tables: dict[str, pd.DataFrame], meta: dict[str, Any]) -> None:
        m = meta["measure"]
        m.update(imported=False, live=True, hosts=[p["host"] for p in payloads],
                 clock_sync=clock)
        if adjust is not None:
            adjust(tables, meta, extras)

    label = ", ".join(str(p.path) for p in parts[:4]) + (", ..." if len(parts) > 4 else "")
    return import_parts(parts, label, offsets={parts[i].rank: o for i, o in offsets.items()},
                        adjust=live)
