"""`popviz measure ...` = `python -m popviz.measure ...`: run a real pipeline over ranks and
write one profile per rank. A wrapper only: popviz/measure/__main__.py parses the arguments
(`popviz measure --help` is its help) and runs."""

from __future__ import annotations

import argparse

from popviz.cli.command import Command


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """The wrapped entry point declares the arguments (Command.passthrough)."""


def _run(args: argparse.Namespace) -> int:
    from popviz.measure.__main__ import main

    try:
        return main(args.argv)
    except SystemExit as exc:  # its argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


COMMAND = Command(
    name="measure",
    help="run a real pipeline (torch.distributed.pipelining) and write one profile per rank",
    description="The same as `python -m popviz.measure`: train a reference model for a few "
    "real steps as a pipeline, one process per stage, and time every rank "
    "(docs/measure.md). `popviz measure --help` lists its arguments.",
    add_arguments=_no_arguments,
    run=_run,
    passthrough=True,
)
