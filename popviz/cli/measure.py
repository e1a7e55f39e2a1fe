"""`popviz measure ...`: `python -m popviz.measure` as a subcommand (docs/measure.md)."""

from __future__ import annotations

import argparse
import shlex

from popviz.cli.command import Command


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from popviz.measure.__main__ import EPILOG, add_arguments

    parser.epilog = EPILOG
    add_arguments(parser)


def _run(args: argparse.Namespace) -> int:
    from popviz.measure.__main__ import run

    return run(args, shlex.split(args.command_line))


COMMAND = Command(
    name="measure",
    help="run a reference model as a real pipeline (ranks spawned, or one rank of a "
    "torchrun job on any number of nodes), timed by torch.profiler, into one profile",
    description="Train a popviz reference model for a few real steps as a pipeline on "
    "torch.distributed.pipelining under torch.profiler. Every rank saves its trace as "
    "PROFILE_DIR/traces/rank{r}.json and hands its tables to rank 0 over the job's "
    "process group, which writes PROFILE_DIR/profile.h5 (kind measured, times in ns), the "
    "same tables `popviz import` gives for those traces. Under torchrun (e.g. `torchrun "
    "--nnodes 2 --nproc-per-node 1 ... --no-python popviz measure ...`) this process is "
    "one rank.",
    add_arguments=_add_arguments,
    run=_run,
)
