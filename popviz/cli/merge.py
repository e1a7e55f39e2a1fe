"""`popviz merge DIR_or_files... --out PATH`: one profile from the rank files of a run."""

from __future__ import annotations

import argparse
from pathlib import Path

from popviz.argtypes import non_empty_path
from popviz.cli.command import EXIT_OK, Command
from popviz.cli.vetcache import add_no_vet_argument, open_vetted


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="DIR_OR_FILE", type=non_empty_path,
                        help="rank profiles (.h5), or directories holding them (each "
                        "rank's own file, as popviz measure wrote them before it wrote "
                        "one merged profile)")
    parser.add_argument("--out", "-o", required=True, metavar="PATH", type=non_empty_path,
                        help="merged profile: a .h5 path, or a directory to hold profile.h5")
    parser.add_argument("--force", action="store_true",
                        help="replace a profile already at --out (default: refuse); never "
                        "a rank file named as an input")
    add_no_vet_argument(parser)


def _run(args: argparse.Namespace) -> int:
    from popviz.format.guards import check_target
    from popviz.measure.merge import merge_profiles

    # a folder's earlier merge is not an input (merge_profiles skips it); a named file is
    named = [item for item in args.inputs if not Path(item).is_dir()]
    check_target(args.out, force=args.force, inputs=named, flag="--out")
    path = merge_profiles(args.inputs, args.out,
                          command_line=args.command_line,
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
    "or repeated rank, with a one-line error. A profile already at --out is kept unless "
    "--force is given; a rank file named as an input is never written over. Each rank "
    "file is first read in a worker process, as "
    "summary does (--no-vet: skip), so a damaged one is refused, never crashes popviz.",
    add_arguments=_add_arguments,
    run=_run,
)
