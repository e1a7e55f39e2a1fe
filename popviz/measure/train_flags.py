"""train.py --measure: the CNN application's flags as a real pipeline (docs/measure.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from popviz.measure import launch
from popviz.measure.runner import MeasureConfig

# train.py's schedule names (TF CNN app) -> the torch schedule with the same idea
TRAIN_SCHEDULES = {None: "1F1B", "Grouped": "GPipe", "Interleaved": "1F1B",
                   "GPipe": "GPipe", "1F1B": "1F1B"}  # and torch's own names


def config_from_train_args(args: Any) -> MeasureConfig:
    """train.py --measure: the CNN app's flags as a real pipeline over --shards processes
    (the tutorial: its 4 blocks B1-B4 on 4 ranks unless --shards says otherwise)."""
    ranks = args.shards if args.shards > 1 else (4 if args.name == "tutorial" else 0)
    if ranks < 2:
        raise ValueError("--measure needs --shards N >= 2 (one process per pipeline stage)")
    if args.pipeline_schedule not in TRAIN_SCHEDULES:
        raise ValueError(f"--pipeline-schedule {args.pipeline_schedule} has no "
                         "torch.distributed.pipelining schedule here (one stage per "
                         "process); use GPipe (Grouped) or 1F1B (Interleaved)")
    return MeasureConfig(
        model=args.name, model_size=args.model_size, ranks=ranks,
        microbatches=args.gradient_accumulation, micro_batch_size=args.batch_size[0],
        schedule=TRAIN_SCHEDULES[args.pipeline_schedule],
        splits=list(args.pipeline_splits or []), steps=args.iterations,
        profile_dir=str(args.profile_dir), image_size=args.image_size,
        num_classes=args.num_classes, seed=args.seed, learning_rate=args.learning_rate,
        command_line=args.command_line)


def run_from_train_args(args: Any) -> int:
    """Run train.py --measure and print one summary line."""
    from popviz.format.reader import open as open_profile
    from popviz.format.writer import profile_path
    from popviz.measure.spawning import RankFailed

    config = config_from_train_args(args)
    try:
        launch.measure(config)
    except RankFailed as exc:  # one line naming the rank and its cause
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 1
    with open_profile(profile_path(str(config.profile_dir))) as merged:
        s, losses = merged.summary, merged.meta["measure"].get("losses", [])
        loss = f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, " if losses else ""
        print(f"measured {config.schedule} pipeline over {config.ranks} gloo ranks: "
              f"{config.warmup + config.steps} steps, {loss}step {s['step_ms']:.2f} ms, "
              f"{s['throughput']:.1f} samples/s; profile: {merged.path} "
              f"(torch.profiler traces in {Path(config.profile_dir, 'traces')})")
    return 0
