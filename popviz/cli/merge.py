"""`popviz merge DIR_or_files... --out PATH`: one profile from the rank files of a run."""

from __future__ import annotations

import argparse
import shlex
import sys

from popviz.cli.command import EXIT_OK, Command
from popviz.cli.vetcache import add_no_vet_argument, open_vetted


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="DIR_OR_FILE",
                        help="rank profiles (.h5), or directories holding them (each "
                        "rank's own file, as popviz measure wrote them before it wrote "
                        "one merged profile)")
    parser.add_argument("--out", "-o", required=True, metavar="PATH",
                        help="merged profile: a .h5 path, or a directory to hold profile.h5")
    add_no_vet_argument(parser)


def _run(args: argparse.Namespace) -> int:
    from popviz.measure.merge import merge_profiles

    path = merge_profiles(args.inputs, args.out,
                          command_line=shlex.join(["popviz", *sys.argv[1:]]),
                          opener=lambda f: open_vetted(f, vet=not args.no_vet))
    print(f"merged into {path}")
    return EXIT_OK


COMMAND = Command(
    name="merge",
    help="merge the per-rank profiles of an older measured run into one profile",
    description="Merge the per-rank profiles that earlier popviz versions of `popviz "
    "measure` wrote (one per rank, kind measured) into one profile whose trace has one row "
    "per rank (ipu = rank). A run of this version already writes one merged profile: "
    "nothing to merge. Refuses modelled profiles, profiles of different runs, a missing "
    "or repeated rank, with a one-line error. Each rank file is first read in a worker process, as "
    "summary does (--no-vet: skip), so a damaged one is refused, never crashes popviz.",
    add_arguments=_add_arguments,
    run=_run,
)
