"""`measure(config)`: a pipeline run on this process's ranks, under torchrun (this rank) or
spawned here (every rank, `spawning`). Apart from `runner`, which spawned ranks import, so
no module imports the other back."""

from __future__ import annotations

import os
from pathlib import Path

from popviz.measure.runner import MeasureConfig, init_group, run_rank, under_torchrun


def measure(config: MeasureConfig) -> list[Path]:
    """Run the pipeline; return the profile's path (`config.out`, else the profile dir) on
    rank 0 (or when spawning), nothing on the other ranks of a torchrun job."""
    import torch.distributed as dist

    from popviz.format.writer import profile_path

    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        config.ranks = world
        config.validate()
        init_group(config, rank, world)
        try:
            path = run_rank(config, rank, world)
        finally:
            dist.destroy_process_group()
        return [path] if path is not None else []
    config.validate()
    from popviz.measure.spawning import spawn_ranks  # loads torch.multiprocessing

    spawn_ranks(config)
    return [profile_path(config.out or config.profile_dir)]
