"""`popviz summary PROFILE [--json]`: the headline facts of one or more profiles
(analysis.facts.summary_facts), printed by reporters.summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from popviz.argtypes import non_empty_path
from popviz.cli.command import EXIT_BAD_PROFILE, EXIT_OK, Command, emit, fail
from popviz.cli.vetcache import add_no_vet_argument, check_vetted, open_vetted
from popviz.reporters.summary import SummaryJson, SummaryReport, SummaryText


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", type=non_empty_path,
                        help="a profile .h5 file, or a directory of profiles")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (a list when PROFILE holds several)")
    add_no_vet_argument(parser)


def _run(args: argparse.Namespace) -> int:
    import popviz
    from popviz.errors import ProfileError

    paths = popviz.discover(args.profile)
    if not paths:
        return fail(f"{args.profile}: no profile (.h5) here", EXIT_BAD_PROFILE)
    if len(paths) == 1 and not args.no_vet:
        check_vetted(*paths)  # one file: its reason is the error
    all_facts, skipped = [], []
    for path in paths:
        try:
            facts = _facts(path, vet=not args.no_vet)
            if len(paths) > 1 and not args.json:  # two may share a name: say where
                facts["name"] = _where(Path(path), Path(args.profile))
            all_facts.append(facts)
        except ProfileError as exc:
            if len(paths) == 1:
                raise
            skipped.append(str(exc))  # a folder's foreign or broken .h5: said, then on
    if not all_facts:
        for line in skipped[:-1]:
            fail(line, EXIT_BAD_PROFILE)
        raise ProfileError(skipped[-1])
    reporter = SummaryJson() if args.json else SummaryText()
    emit(reporter.render(SummaryReport(all_facts, single=len(paths) == 1)))
    for line in skipped:
        print(f"popviz: skipped: {line}", file=sys.stderr)
    return EXIT_OK


def _where(path: Path, root: Path) -> str:
    """A profile's place under the folder summarised: 'tutorial_pipelined/training'."""
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        return str(path)
    rel = rel.parent if rel.name == "profile.h5" else rel
    return rel.as_posix() if rel.parts else path.parent.name


def _facts(path: str | Path, vet: bool) -> dict:
    """One profile's facts; ProfileError (one line) when it is not one popviz can read."""
    from popviz.analysis.facts import summary_facts
    from popviz.errors import ProfileError, interrupted_by

    if vet:
        check_vetted(path)
    with open_vetted(path, vet=vet) as profile:
        try:
            return summary_facts(profile)
        except (ProfileError, KeyboardInterrupt):
            raise
        except Exception as exc:  # the file is untrusted: one line, never a traceback
            if interrupted_by(exc):  # a Ctrl-C inside h5py: not the file's fault
                raise KeyboardInterrupt from None
            text = " ".join(str(exc).split())[:200]
            raise ProfileError(f"{path}: cannot summarise ({type(exc).__name__}: "
                               f"{text})") from None


COMMAND = Command(
    name="summary",
    help="headline facts of a profile: fit, OOM tiles, stage cycles, peaks, throughput",
    description="Print the headline facts of a profile (or of every profile under a "
    "directory): whether it fits (an imported GPU: its peak against its device memory; "
    "unknown for a CPU run), out-of-memory tiles, the "
    "fullest tile, per-stage cycles, the bottleneck stage, peak liveness per IPU, "
    "throughput, latency and advice. --json prints the same facts as JSON. A directory "
    "is searched without its hidden folders and virtual environments; a file in it that "
    "is not a readable profile is named on stderr and skipped.",
    add_arguments=_add_arguments,
    run=_run,
)
