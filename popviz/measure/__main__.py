"""`python -m popviz.measure` (also `popviz measure`): run a real pipeline over ranks, time
it with torch.profiler and write one profile."""

from __future__ import annotations

import argparse
import shlex
import sys

from popviz.argtypes import non_empty_path
from popviz.measure.split import SCHEDULE_NAMES

DESCRIPTION = ("Train a popviz reference model for a few real steps as a pipeline on "
        "torch.distributed.pipelining (one process per stage, gloo on CPU) under "
        "torch.profiler: every rank saves its trace as PROFILE_DIR/traces/rank{r}.json and "
        "hands its tables to rank 0 over the job's process group, which writes "
        "PROFILE_DIR/profile.h5 (kind measured, times in ns). Under torchrun (one node or "
        "several) this process is one rank.")
EPILOG = "Then `popviz serve PROFILE_DIR`. Docs: docs/measure.md (Slurm: srun + torchrun)."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m popviz.measure", description=DESCRIPTION,
                                     epilog=EPILOG)
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `python -m popviz.measure`, also those of `popviz measure`."""
    parser.add_argument("--model", default="tutorial",
                        choices=["tutorial", "resnet", "resnext", "efficientnet"],
                        help="the popviz reference model to train")
    parser.add_argument("--model-size", type=int, default=None,
                        help="ResNet 18/34/50/101/152, ResNeXt 50/101, EfficientNet 0-7")
    parser.add_argument("--ranks", type=int, default=2,
                        help="processes = pipeline ranks (ignored under torchrun)")
    parser.add_argument("--microbatches", type=int, default=4,
                        help="micro-batches per training step")
    parser.add_argument("--batch-size", type=int, default=2, dest="micro_batch_size",
                        help="samples per micro-batch")
    parser.add_argument("--schedule", default="1F1B", choices=SCHEDULE_NAMES,
                        type=lambda s: next((k for k in SCHEDULE_NAMES
                                             if k.lower() == s.lower()), s),
                        help="torch.distributed.pipelining schedule; Interleaved1F1B, "
                        "LoopedBFS and InterleavedZB (ScheduleInterleavedZeroBubble) loop 2 "
                        "stages round the ranks, ZBV (ScheduleZBVZeroBubble) places them in "
                        "a V")
    parser.add_argument("--pipeline-splits", "--splits", nargs="+", default=[],
                        dest="splits", metavar="NAME",
                        help="split names (first layer of each next stage): B2 B3 B4 for the "
                        "tutorial, b1/2/relu ... for ResNet; default: spread evenly")
    parser.add_argument("--steps", type=int, default=2, help="recorded training steps")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded steps first")
    parser.add_argument("--image-size", type=int, default=None,
                        help="input height/width (default 28 for the tutorial, else 64)")
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the weights and synthetic data")
    parser.add_argument("--backend", default="gloo", choices=["gloo"],
                        help="gloo on CPU (NCCL on GPU is not built yet)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per rank (default 1: ranks share the cores)")
    parser.add_argument("--profile-dir", default="measure_profile", type=non_empty_path,
                        help="rank 0 writes PROFILE_DIR/profile.h5, rank r its trace "
                        "PROFILE_DIR/traces/rank{r}.json (on its own host)")
    parser.add_argument("--out", "--merge", default=None, metavar="OUT", dest="out",
                        type=non_empty_path,
                        help="write the profile at OUT instead (a .h5 or a directory)")
    parser.add_argument("--force", action="store_true",
                        help="replace a profile already at PROFILE_DIR/profile.h5 (or OUT); "
                        "default: refuse before any process starts")
    for action in parser._actions:  # every default said, as --help readers expect
        if action.default not in (None, [], False, argparse.SUPPRESS) \
                and "default" not in (action.help or ""):
            action.help = f"{action.help or ''} (default: %(default)s)".strip()


def main(argv: list[str] | None = None) -> int:
    """`python -m popviz.measure ARGS`; without `argv` (the program) it ends the process
    itself, so a Ctrl-C at any moment is one line (popviz.program_exit.run_program)."""
    from popviz.program_exit import run_program

    def body() -> int:
        args = build_parser().parse_args(argv)
        return run(args, ["python", "-m", "popviz.measure",
                          *(sys.argv[1:] if argv is None else argv)])

    if argv is None:
        run_program(body, "popviz.measure")
    return body()


def _check_target(args: argparse.Namespace) -> None:
    """Where rank 0 will write the profile: checked before any process starts (under
    torchrun by rank 0 only, the one that writes it)."""
    import os

    from popviz.format.guards import check_target
    from popviz.measure.runner import under_torchrun

    if under_torchrun() and os.environ.get("RANK") != "0":
        return
    check_target(args.out or args.profile_dir, force=args.force,
                 flag="--out" if args.out else "--profile-dir")


def run(args: argparse.Namespace, command: list[str]) -> int:
    """Measure as the parsed flags say; 2 with one line for an error a user can cause."""
    from popviz.measure.launch import measure
    from popviz.measure.runner import MeasureConfig

    try:
        _check_target(args)
    except OSError as exc:  # an earlier profile without --force, a FIFO, a file of yours
        from popviz.errors import os_error_line

        print(f"popviz.measure: error: {os_error_line(exc)}", file=sys.stderr)
        # a file where the folder goes is a wrong flag (2); a profile already there, 1
        return 2 if isinstance(exc, NotADirectoryError) else 1
    config = MeasureConfig(
        model=args.model, model_size=args.model_size, ranks=args.ranks,
        microbatches=args.microbatches, micro_batch_size=args.micro_batch_size,
        schedule=args.schedule, splits=list(args.splits), steps=args.steps,
        warmup=args.warmup, profile_dir=args.profile_dir, image_size=args.image_size,
        num_classes=args.num_classes, seed=args.seed, learning_rate=args.learning_rate,
        backend=args.backend, threads=args.threads, out=args.out,
        command_line=shlex.join(command))
    from popviz.errors import ProfileError, os_error_line
    from popviz.measure.spawning import RankFailed

    try:
        paths = measure(config)
    except ValueError as exc:  # checked before any rank starts
        print(f"popviz.measure: error: {exc}", file=sys.stderr)
        return 2
    except (RankFailed, ProfileError) as exc:  # a rank's failure, one line naming it
        print(f"popviz.measure: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # under torchrun: this rank's own write
        print(f"popviz.measure: error: {os_error_line(exc)}", file=sys.stderr)
        return 1
    for path in paths:  # rank 0's (the other ranks of a torchrun job print nothing)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
