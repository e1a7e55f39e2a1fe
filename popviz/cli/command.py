"""A subcommand is a small object: a name, its arguments and what it runs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from popviz.errors import ProfileError, interrupted_by, os_error_line
from popviz.program_exit import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from popviz.program_exit import run_program as run_program

EXIT_OK = 0
EXIT_BAD_PROFILE = 1
EXIT_FAILED = 1  # could not write (a full disk, no permission)
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad arguments found after parsing (exit code 2, one line on stderr)."""


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def emit(text: str) -> None:
    """Print a command's output; a reader that went away (`| head`) is not an error."""
    try:
        print(text)
    except BrokenPipeError:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the exit flush quiet


def fail(message: str, code: int) -> int:
    print(f"popviz: error: {message}", file=sys.stderr)
    return code


def run_guarded(command: Command, args: argparse.Namespace) -> int:
    """Run a command, turning the errors users can cause into one line and an exit code."""
    try:
        return command.run(args)
    except ProfileError as exc:
        return fail(str(exc), EXIT_BAD_PROFILE)
    except UsageError as exc:
        return fail(str(exc), EXIT_USAGE)
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)
    except OSError as exc:  # a full disk, a folder not writable: one line, not a traceback
        return fail(os_error_line(exc), EXIT_FAILED)
    except SystemError as exc:  # a Ctrl-C inside a C extension (h5py) arrives as this
        if interrupted_by(exc):
            return interrupted("popviz")
        raise
    except KeyboardInterrupt:
        return interrupted("popviz")


def interrupted(prog: str) -> int:
    """Say a Ctrl-C ended the command (one line) and return its exit code."""
    print(f"{prog}: interrupted", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED
