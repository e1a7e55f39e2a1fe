"""`popviz summary` as text and as JSON: the headline facts of one or more profiles
(analysis.facts.summary_facts), one paragraph or one JSON object each."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from popviz.analysis.balance import is_sharded
from popviz.analysis.insights import idle_title
from popviz.units import fmt_bytes as _fmt_bytes
from popviz.vocab import ipu_label, naming_of

_FIT_WORD = {True: "yes", False: "NO", None: "unknown (no per-tile data)"}


@dataclass(frozen=True)
class SummaryReport:
    """The facts of every profile summarised; `single`: one file was named (JSON prints
    its object, not a list of one)."""

    facts: list[dict[str, Any]]
    single: bool = False


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
        if not naming_of(facts).has_tiles:  # a CPU run: no tiles, no device memory
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
        sharded = is_sharded(facts)
        lines.append(f"  {'heaviest shard' if sharded else 'bottleneck'}: stage "
                     f"{neck['stage']} on {words.label(neck['ipu'])}, "
                     f"{neck['relative_load']:.2f}x the mean stage load")
    if int(facts.get("num_ipus") or 0) > 1 and facts.get("bubble_fraction") is not None:
        title = idle_title(is_sharded(facts))
        lines.append(f"  {title}: {facts['bubble_fraction']:.0%} idle")
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
    reserved = facts.get("max_memory_reserved") if words.gpu_plan else None
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


class SummaryText:
    """A paragraph per profile: fit, throughput, peaks, the stages' time, insights."""

    def render(self, result: SummaryReport) -> str:
        return "\n\n".join(render_text(f) for f in result.facts)


class SummaryJson:
    """One JSON object (a list when a folder was summarised): what `summary --json`
    prints and scripts read."""

    def render(self, result: SummaryReport) -> str:
        payload: Any = result.facts[0] if result.single and len(result.facts) == 1 \
            else result.facts
        return json.dumps(payload, indent=2, sort_keys=True)
