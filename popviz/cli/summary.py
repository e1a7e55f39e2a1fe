"""`popviz summary PROFILE [--json]`: the headline facts of one or more profiles."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from popviz.argtypes import non_empty_path
from popviz.cli.command import EXIT_BAD_PROFILE, EXIT_OK, Command, emit, fail
from popviz.cli.vetcache import add_no_vet_argument, check_vetted, open_vetted
from popviz.units import fmt_bytes as _fmt_bytes
from popviz.vocab import ipu_label, is_gpu_target, naming_of

if TYPE_CHECKING:
    from popviz.format.profile import Profile

_FIT_WORD = {True: "yes", False: "NO", None: "unknown (no per-tile data)"}

def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", type=non_empty_path,
                        help="a profile .h5 file, or a directory of profiles")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (a list when PROFILE holds several)")
    add_no_vet_argument(parser)


def _duration(ms: float) -> str:
    """2.83 ms, 85.2 µs, 1,234 ms: three significant figures, never '0.0 ms'."""
    if ms >= 100:
        return f"{ms:,.0f} ms"
    if ms >= 0.1:
        return f"{ms:.3g} ms"
    return f"{ms * 1e3:.3g} µs"


def _fit_line(facts: dict) -> str:
    devices = facts.get("device_memory") or []
    if devices and facts.get("fits") is not None:  # a GPU (imported or modelled): its memory
        words = naming_of(facts)
        return f"  fits: {_FIT_WORD[bool(facts['fits'])]}  (" + "; ".join(
            f"{words.label(d['ipu'])} peak {_fmt_bytes(d['peak_bytes'])} of "
            f"{_fmt_bytes(d['capacity_bytes'])} device memory, {d['utilisation']:.1%}"
            for d in devices) + ")"
    if facts.get("fit_known") is False or facts.get("fits") is None:
        if naming_of(facts).measured:  # a CPU run: no tiles, no device memory
            return "  fits: unknown (no tiles, no device memory recorded)"
        return f"  fits: {_FIT_WORD[None]}"
    return (f"  fits: {_FIT_WORD[bool(facts['fits'])]}"
            + ("" if facts["fits"] else
               f"  ({facts['oom_tiles']} tile(s) out of memory on IPU "
               f"{', '.join(map(str, facts['oom_ipus']))})"))


def _insight_lines(facts: dict) -> list[str]:
    words = naming_of(facts)
    lines = []
    tile = facts.get("fullest_tile")
    if tile:
        lines.append(f"  fullest tile: {ipu_label(tile['ipu'])} tile {tile['tile']}, "
                     f"{tile['utilisation']:.0%} of {_fmt_bytes(tile['capacity_bytes'])}"
                     + (f" (mostly {tile['largest_category'].replace('_', ' ')})"
                        if tile.get("largest_category") else ""))
    neck = facts.get("bottleneck")
    if neck and len(facts.get("stages") or []) > 1:
        lines.append(f"  bottleneck: stage {neck['stage']} on {words.label(neck['ipu'])}, "
                     f"{neck['relative_load']:.2f}x the mean stage load")
    if int(facts.get("num_ipus") or 0) > 1 and facts.get("bubble_fraction") is not None:
        lines.append(f"  pipeline bubbles: {facts['bubble_fraction']:.0%} idle")
    advice = facts.get("advice") or []
    if advice:
        lines.append("  advice:")
        lines += [f"    - {a}" for a in advice]
    return lines


def render_text(facts: dict) -> str:
    target = facts.get("target") or {}
    words = naming_of(facts)
    lines = [
        f"{facts['name']}  ({facts['kind']}, {facts.get('model') or 'model ?'} on "
        f"{target.get('name', '?')} x{facts['num_ipus']})",
        _fit_line(facts),
    ]
    if facts.get("throughput") is not None:
        lines.append(f"  throughput: {facts['throughput']:,.1f} samples/s")
    latency = facts.get("latency_ms")
    if latency:  # absent or 0 (a training step has no single-batch latency): left out
        lines.append(f"  latency: {_duration(float(latency))}")
    reserved = facts.get("max_memory_reserved") if is_gpu_target(facts) else None
    if reserved is not None and facts.get("gpu_precision"):  # how the plan holds its state
        per = facts.get("gpu_precision_bytes_per_param")
        lines.append(f"  GPU precision: {facts['gpu_precision']}" + (
            f", {per:g} B/param of weights, grads and optimiser state" if per else ""))
    for ipu, peak in sorted(facts["peak_liveness_bytes"].items(), key=lambda kv: int(kv[0])):
        if isinstance(reserved, dict) and str(ipu) in reserved:  # a GPU plan: the allocator
            lines.append(f"  {words.label(ipu)} max_memory_allocated {_fmt_bytes(peak)}, "
                         f"max_memory_reserved {_fmt_bytes(reserved[str(ipu)])}")
            continue
        lines.append(f"  {words.label(ipu)} peak liveness: {_fmt_bytes(peak)}")
    if facts["stages"]:
        # every part of a stage's step: the optimiser and a measured rank's other work
        # (host ops outside the pipeline's actions) too, where there are any
        cols = ("forward", "backward", "recompute", "optimiser", "other", "exchange", "idle")
        cols = tuple(c for c in cols if c not in ("optimiser", "other")
                     or any(float(s.get(c + "_cycles") or 0) for s in facts["stages"]))
        device = "gpu" if words.gpu_plan else "ipu"
        lines.append(f"  stage {device} " + " ".join(f"{c:>14}" for c in cols)
                     + f"  ({words.unit})")
        for s in facts["stages"]:
            lines.append(f"  {s['stage']:>5} {s['ipu']:>3} " + " ".join(
                f"{float(s.get(c + '_cycles') or 0):>14,.0f}" for c in cols))
    lines += _insight_lines(facts)
    lines += [f"  warning: {w}" for w in facts.get("warnings") or []]
    return "\n".join(lines)


def insight_facts(profile: Profile) -> dict:
    """What the summary page adds to the stored facts: whether fit is known, the fullest
    tile, the bottleneck stage and the advice (JSON-safe)."""
    from popviz.analysis.insights import insights
    from popviz.jsonsafe import jsonable

    found = insights(profile)
    tiles = found["fullest_tiles"]
    top = tiles.iloc[0] if len(tiles) else None
    return jsonable({
        "fit_known": bool(found["fit"]["known"]),
        "fullest_tile": None if top is None else {
            k: top[k] for k in ("ipu", "tile", "utilisation", "capacity_bytes",
                                "largest_category") if k in top},
        "bottleneck": found["bottleneck"],
        # the summary page's "pipeline bubbles": idle over rank-time of every device
        "bubble_fraction": found["bubble_fraction"],
        "advice": [a.text for a in found["advice"]],
    })


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
    if args.json:
        payload = all_facts[0] if len(all_facts) == 1 and len(paths) == 1 else all_facts
        emit(json.dumps(payload, indent=2, sort_keys=True))
    else:
        emit("\n\n".join(render_text(f) for f in all_facts))
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
    from popviz.analysis.facts import profile_facts
    from popviz.errors import ProfileError, interrupted_by

    if vet:
        check_vetted(path)
    with open_vetted(path, vet=vet) as profile:
        try:
            return {**profile_facts(profile), **insight_facts(profile)}
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
