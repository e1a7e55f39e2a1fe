"""`popviz export PROFILE --to OUT [--format csv|chrome]`: tables as CSV, or a Perfetto trace."""

from __future__ import annotations

import argparse
from pathlib import Path

from popviz.argtypes import non_empty_path
from popviz.cli.command import EXIT_OK, Command
from popviz.cli.vetcache import add_no_vet_argument, open_vetted


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", type=non_empty_path,
                        help="a profile .h5 file or a directory holding one")
    parser.add_argument("--to", required=True, type=non_empty_path,
                        help="output: a directory for csv, a .json file for chrome")
    parser.add_argument("--format", choices=("csv", "chrome"), default="csv",
                        help="csv: one CSV per table plus meta.json (default); chrome: the "
                        "execution trace as Chrome trace-event JSON for Perfetto (an import "
                        "also keeps its host threads and launch -> kernel arrows)")
    parser.add_argument("--tables", nargs="+", metavar="NAME",
                        help="with csv: only these tables (default: all)")
    parser.add_argument("--force", action="store_true",
                        help="replace files an earlier export left at --to (default: "
                        "refuse, naming them); never the profile read, a FIFO or a device")
    add_no_vet_argument(parser)


def _existing(paths: list[Path]) -> list[Path]:
    return [p for p in paths if p.exists() or p.is_symlink()]


def _refuse(found: list[Path], where: Path) -> None:
    from popviz.cli.command import UsageError

    names = ", ".join(p.name for p in found[:6]) + (", ..." if len(found) > 6 else "")
    raise UsageError(f"{where} already holds {names}; pass --force to replace "
                     f"{'it' if len(found) == 1 else 'them'}, or choose another --to")


def _check_outputs(finals: list[Path], profile: Path) -> None:
    """No FIFO or device among the files to write, and never the profile being read."""
    from popviz.format.guards import refuse_own_input, refuse_special_output

    for final in finals:
        refuse_special_output(final)
        refuse_own_input(final, [profile], "--to")


def _folder_of_output(args: argparse.Namespace) -> None:
    """Before anything is read: no file where --to needs a folder (`--to notes.txt/sub`)."""
    from popviz.cli.command import UsageError
    from popviz.errors import not_a_folder, os_error_line

    if args.format == "csv":
        blocked = not_a_folder(args.to, "csv goes into a folder (one file per table)")
    else:
        folder = args.to.parent if args.to.suffix == ".json" else args.to
        blocked = not_a_folder(folder, "the trace goes into a folder (or give a .json path)")
    if blocked is not None:
        raise UsageError(os_error_line(blocked))


def _run(args: argparse.Namespace) -> int:
    from popviz.cli.command import UsageError
    from popviz.format.export import export_chrome_trace, export_csv
    from popviz.format.guards import refuse_special_output

    args.to = Path(args.to)
    refuse_special_output(args.to)
    _folder_of_output(args)
    with open_vetted(args.profile, vet=not args.no_vet) as profile:
        if args.format == "csv":
            unknown = sorted(set(args.tables or []) - set(profile.table_names))
            if unknown:
                raise UsageError(f"unknown table(s) {', '.join(unknown)}; this profile has "
                                 f"{', '.join(profile.table_names)}")
            names = list(args.tables or profile.table_names)
            finals = [args.to / f"{n}.csv" for n in names] + [args.to / "meta.json"]
            _check_outputs(finals, profile.path)
            if not args.force and (found := _existing(finals)):
                _refuse(found, args.to)
            written = export_csv(profile, args.to, args.tables)
            print(f"wrote {len(written)} files to {args.to}")
            others = sorted(p.name for p in args.to.glob("*.csv") if p not in written)
            if others:  # an earlier export's tables: not this profile's
                print(f"note: {args.to} also holds {len(others)} CSV file(s) not written "
                      f"now (an earlier export?): {', '.join(others[:8])}"
                      + (", ..." if len(others) > 8 else ""))
        else:
            target = args.to if args.to.suffix == ".json" else args.to / "trace.json"
            _check_outputs([target], profile.path)
            if not args.force and _existing([target]):
                _refuse([target], target.parent)
            export_chrome_trace(profile, target)
            print(f"wrote {target} (open it in https://ui.perfetto.dev)")
    return EXIT_OK


COMMAND = Command(
    name="export",
    help="export tables as CSV, or the trace as Chrome/Perfetto JSON",
    description="Export a profile's tables as CSV files (plus meta.json), or its execution "
    "trace as Chrome trace-event JSON that Perfetto and chrome://tracing open. Files appear "
    "only when complete: a failed export (a full disk) leaves none, and exits 1.",
    add_arguments=_add_arguments,
    run=_run,
)
