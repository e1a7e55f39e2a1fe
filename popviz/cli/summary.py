"""`popviz summary PROFILE [--json]`: the headline facts of one or more profiles."""

from __future__ import annotations

import argparse
import json

from popviz.cli.command import EXIT_BAD_PROFILE, EXIT_OK, Command, emit, fail
from popviz.units import fmt_bytes as _fmt_bytes


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="a profile .h5 file, or a directory of profiles")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (a list when PROFILE holds several)")


def render_text(facts: dict) -> str:
    target = facts.get("target") or {}
    lines = [
        f"{facts['name']}  ({facts['kind']}, {facts.get('model') or 'model ?'} on "
        f"{target.get('name', '?')} x{facts['num_ipus']})",
        f"  fits: {'yes' if facts['fits'] else 'NO'}"
        + ("" if facts["fits"] else
           f"  ({facts['oom_tiles']} tile(s) out of memory on IPU "
           f"{', '.join(map(str, facts['oom_ipus']))})"),
    ]
    for key, label in (("throughput", "throughput"), ("latency_ms", "latency")):
        value = facts.get(key)
        if value is not None:
            unit = " samples/s" if key == "throughput" else " ms"
            lines.append(f"  {label}: {value:,.1f}{unit}")
    for ipu, peak in sorted(facts["peak_liveness_bytes"].items(), key=lambda kv: int(kv[0])):
        device = f"rank {ipu}" if facts["kind"] == "measured" else f"IPU{ipu}"
        lines.append(f"  {device} peak liveness: {_fmt_bytes(peak)}")
    if facts["stages"]:
        unit = "ns" if facts["kind"] == "measured" else "cycles"
        lines.append(f"  stage ipu     forward    backward   recompute    exchange        idle"
                     f"  ({unit})")
        for s in facts["stages"]:
            lines.append(
                f"  {s['stage']:>5} {s['ipu']:>3} {s['forward_cycles']:>11,.0f} "
                f"{s['backward_cycles']:>11,.0f} {s['recompute_cycles']:>11,.0f} "
                f"{s['exchange_cycles']:>11,.0f} {s['idle_cycles']:>11,.0f}"
            )
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    import popviz
    from popviz.analysis.facts import profile_facts
    from popviz.errors import ProfileError

    paths = popviz.discover(args.profile)
    if not paths:
        return fail(f"{args.profile}: no profile (.h5) here", EXIT_BAD_PROFILE)
    all_facts = []
    for path in paths:
        with popviz.open(path) as profile:
            try:
                all_facts.append(profile_facts(profile))
            except (ProfileError, KeyboardInterrupt):
                raise
            except Exception as exc:  # the file is untrusted: one line, never a traceback
                text = " ".join(str(exc).split())[:200]
                raise ProfileError(f"{path}: cannot summarise ({type(exc).__name__}: "
                                   f"{text})") from None
    if args.json:
        payload = all_facts[0] if len(all_facts) == 1 else all_facts
        emit(json.dumps(payload, indent=2, sort_keys=True))
    else:
        emit("\n\n".join(render_text(f) for f in all_facts))
    return EXIT_OK


COMMAND = Command(
    name="summary",
    help="headline facts of a profile: fit, OOM tiles, stage cycles, peaks, throughput",
    description="Print the headline facts of a profile (or of every profile under a "
    "directory): whether it fits, out-of-memory tiles, per-stage cycles, peak liveness "
    "per IPU and throughput. --json prints the same facts as JSON.",
    add_arguments=_add_arguments,
    run=_run,
)
