"""Entry point of the `popviz` command: builds the parser from the subcommand modules."""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys

from popviz._version import __version__
from popviz.cli.command import Command, interrupted, run_guarded, run_program

# Each module defines COMMAND: Command. Order is the order `popviz --help` lists them.
SUBCOMMAND_MODULES = [
    "popviz.cli.serve",
    "popviz.cli.summary",
    "popviz.cli.compare",
    "popviz.cli.tune",
    "popviz.cli.export",
    "popviz.cli.merge",
    "popviz.cli.import_",
    "popviz.cli.train",
    "popviz.cli.measure",
]


def load_commands() -> list[Command]:
    return [importlib.import_module(name).COMMAND for name in SUBCOMMAND_MODULES]


def build_parser(commands: list[Command],
                 only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, just that subcommand gets its arguments (some arguments'
    defaults import heavy modules: `popviz tune`'s import torch)."""
    parser = argparse.ArgumentParser(
        prog="popviz",
        description="PopVision-style profiler for pipelined and recomputed PyTorch training.",
        epilog="Record a run with `popviz train --profile --profile-dir DIR` (or `python "
        "train.py ...`), then `popviz serve DIR`.",
    )
    parser.add_argument("--version", action="version", version=f"popviz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands:
        child = sub.add_parser(command.name, help=command.help, description=command.description)
        if only is None or command.name == only:
            command.add_arguments(child)
        child.set_defaults(_command=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`popviz ARGS`; called without `argv` (the `popviz` program) it ends the process
    itself, so that even a Ctrl-C while it exits is said (command.run_program)."""
    if argv is None:
        run_program(lambda: _caught(None), "popviz")
    return _caught(argv)


def _caught(argv: list[str] | None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # while importing or parsing; commands catch their own
        return interrupted("popviz")


def _main(argv: list[str] | None) -> int:
    commands = load_commands()
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    known = {c.name for c in commands}
    parser = build_parser(commands, only=chosen if chosen in known else None)
    args = parser.parse_args(argv)
    if getattr(args, "_command", None) is None:
        parser.print_help(sys.stderr)
        return 2
    args.command_line = shlex.join(["popviz", *argv])  # what a profile says made it
    return run_guarded(args._command, args)


if __name__ == "__main__":
    sys.exit(main())
