"""Real multi-rank CPU traces for the import tests: gloo ranks spawned like
popviz.measure.runner does, a tiny torch.distributed.pipelining pipeline (one Linear stage
per rank), one training step per schedule under torch.profiler, exported per rank."""

from __future__ import annotations

import os
import socket
from pathlib import Path

SCHEDULES = ("GPipe", "1F1B")
MICROBATCHES = 4
MICRO_BATCH = 2
FEATURES = 16


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.profiler import ProfilerActivity, profile

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    try:
        for name, cls in zip(SCHEDULES, (ScheduleGPipe, Schedule1F1B)):
            module = torch.nn.Sequential(torch.nn.Linear(FEATURES, FEATURES), torch.nn.ReLU())
            stage = PipelineStage(module, rank, world, torch.device("cpu"))
            schedule = cls(stage, n_microbatches=MICROBATCHES,
                           loss_fn=lambda out, target: ((out - target) ** 2).mean())
            x = torch.randn(MICRO_BATCH * MICROBATCHES, FEATURES)

            def step(schedule=schedule, x=x) -> None:
                if rank == 0:
                    schedule.step(x)
                elif rank == world - 1:
                    schedule.step(target=torch.zeros_like(x))
                else:
                    schedule.step()

            step()  # warm-up: shape inference, buffers
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                         profile_memory=True) as prof:
                step()
            Path(out, name).mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(Path(out, name, f"rank{rank}.json")))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def make_traces(out: Path, world: int = 3) -> dict[str, list[Path]]:
    """Run GPipe and 1F1B on `world` gloo ranks; the trace files per schedule. The ranks
    are forked from a process that already imported torch: spawning them would import it
    once per rank, most of the time these tests take."""
    import torch.distributed.pipelining  # noqa: F401 - imported once, before the fork
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(world, port, str(out)), nprocs=world, join=True,
                       start_method="fork")
    return {name: [out / name / f"rank{r}.json" for r in range(world)]
            for name in SCHEDULES}
