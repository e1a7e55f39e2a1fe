"""`popviz train` (also `python train.py`, a thin shim): train a reference model for real on
the CPU and profile one step as it would run on IPUs.

    popviz train --profile --profile-dir pipeline_profile          # PopTorch tutorial
    popviz train --model resnet --model-size 50 --shards 4 --pipeline \\
        --pipeline-splits b1/2/relu b2/3/relu b3/3/relu --enable-recomputation \\
        --image-size 64 --profile --profile-dir profiles/rn50_pipeline
    popviz train --model resnext --model-size 101 --inference --batch-size 2 4 8 \\
        --num-ipus 2 --target mk1                                     # latency table

`flags.py` declares and checks the flags and builds the Options; `driver.py` runs the four
kinds of run (tutorial, CNN training, CNN inference benchmark, plan); docs/train.md.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path

from popviz.cli.command import Command, UsageError

DESCRIPTION = __doc__.split("\n\n")[0].replace("`popviz train` (also `python train.py`, a "
                                               "thin shim): t", "T")
EXAMPLES = __doc__.split("\n\n")[1]


def execute(args: argparse.Namespace, prog: str) -> int:
    """Run checked flags. Exit codes: 0 done, 1 another run writes into --profile-dir or a
    profile could not be written (a full disk), 2 a placement the compiler refuses."""
    from popviz.errors import not_a_folder, os_error_line
    from popviz.format.folder_lock import FolderInUse, hold_folder

    try:
        # one run per profile folder, so training/ and inference/ come from the same run
        writes = args.profile or args.measure
        if writes and (blocked := not_a_folder(args.profile_dir, "--profile-dir is the "
                                               "folder profiles go into")) is not None:
            raise ValueError(os_error_line(blocked))  # a usage error: exit code 2
        if writes:  # before the folder, its lock or any training: nothing left if refused
            check_targets(args)
        with hold_folder(args.profile_dir, args.command_line) if writes \
                else contextlib.nullcontext():
            return _dispatch(args)
    except FolderInUse as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. a full disk while writing a profile: none was written
        from popviz.errors import os_error_line

        print(f"{prog}: error: {os_error_line(exc)}", file=sys.stderr)
        return 1
    except ValueError as exc:  # e.g. a placement the compiler refuses
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


def profile_targets(args: argparse.Namespace) -> list[Path]:
    """The folders whose profile.h5 this run writes (as driver.py and --measure place
    them): DIR, DIR/bs{N} per batch size, or the tutorial's DIR/training and
    DIR/inference."""
    root = Path(args.profile_dir)
    if args.measure:
        return [root]
    if args.inference:
        sizes = args.batch_size
        return [root] if len(sizes) == 1 else [root / f"bs{b}" for b in sizes]
    if args.name == "tutorial":
        return [root / "training", *([] if args.no_validation else [root / "inference"])]
    return [root]


def check_targets(args: argparse.Namespace) -> None:
    """No profile of an earlier run is replaced without --force; no FIFO, device or file
    of the user's is written (one line, an OSError)."""
    from popviz.format.guards import check_target, refuse_special_output

    refuse_special_output(args.profile_dir)
    for folder in profile_targets(args):
        check_target(folder, force=args.force, flag="--profile-dir")


def _dispatch(args: argparse.Namespace) -> int:
    from popviz.cli.train import driver
    from popviz.cli.train.flags import make_options

    if args.measure:
        from popviz.measure.train_flags import run_from_train_args
        return run_from_train_args(args)
    if args.plan_only:
        return driver.run_plan(args, make_options)
    if args.inference:
        return driver.run_inference(args, make_options)
    if args.name == "tutorial":
        return driver.run_tutorial(args, make_options)
    return driver.run_cnn(args, make_options)


class _Parser(argparse.ArgumentParser):
    """argparse that reports an error in one line on stderr (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    """`python train.py`: the same flags and run as `popviz train`, errors as `train.py:`;
    130 on Ctrl-C (one line, never a traceback). Without `argv` (the program) it ends the
    process itself, so a Ctrl-C while it exits is said too (command.run_program)."""
    from popviz.cli.command import run_program

    if argv is None:
        run_program(lambda: _caught(None), "train.py")
    return _caught(argv)


def _caught(argv: Sequence[str] | None) -> int:
    from popviz.cli.command import interrupted
    from popviz.errors import interrupted_by

    try:
        return _main(argv)
    except KeyboardInterrupt:  # at any point: imports, recording, compiling, writing
        return interrupted("train.py")
    except SystemError as exc:  # a Ctrl-C inside a C extension (h5py) arrives as this
        if interrupted_by(exc):
            return interrupted("train.py")
        raise


def _main(argv: Sequence[str] | None) -> int:
    from popviz.cli.train.flags import add_arguments, resolve

    parser = _Parser(prog="train.py", description=DESCRIPTION, epilog=EXAMPLES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    try:
        args = resolve(parser.parse_args(argv))
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    except UsageError as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 2
    # the command line stored in each profile
    args.command_line = " ".join(["train.py", *(sys.argv[1:] if argv is None else argv)])
    return execute(args, "train.py")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from popviz.cli.train.flags import add_arguments

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    add_arguments(parser)


def _run(args: argparse.Namespace) -> int:
    from popviz.cli.train.flags import resolve

    args = resolve(args)  # UsageError: one line, exit code 2
    return execute(args, "popviz")


COMMAND = Command(
    name="train",
    help="train a reference model on the CPU and profile one step as it would run on IPUs",
    description=DESCRIPTION + " Also `python train.py` (the same flags). Flags follow the "
    "PopTorch pipelining tutorial and Graphcore's TensorFlow CNN application "
    "(docs/train.md).",
    add_arguments=_add_arguments,
    run=_run,
)
