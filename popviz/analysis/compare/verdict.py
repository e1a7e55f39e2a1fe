"""The verdict of a comparison: which layout is better, why, and by how much, in words.

Every number quoted comes from the comparison's own tables (never recomputed here), so the
text and the delta tables always agree.
"""

from __future__ import annotations

import math
from typing import Any

from popviz.analysis.compare.sides import Side
from popviz.analysis.compare.table import Comparison
from popviz.analysis.compare.terms import on_equal_terms, shown
from popviz.units import count_of
from popviz.units import fmt_bytes as _fmt_bytes
from popviz.vocab import IMBALANCE_LIMIT, ipu_label, naming_of, rank_label

TIE = 0.02  # throughputs within 2% are "about the same"
WHY = {
    "forward": "on forward compute", "backward": "on backward compute",
    "recompute": "recomputing forward passes", "weight_update": "on weight updates",
    "compute": "on other compute", "exchange": "on exchange (between {devs} and with the host)",
    "idle": "idle (pipeline bubbles, waiting at syncs)", "untraced": "outside the trace",
}
OPTION_FACTS = [("model", "model"), ("run", "run"), ("kind", "kind"), ("target", "target"),
                ("num_ipus", "IPUs per replica"),
                ("replicas", "replicas"), ("strategy", "strategy"), ("schedule", "schedule"),
                ("recomputation", "recomputation"), ("amp", "AMP"), ("splits", "splits"),
                ("precision", "precision"), ("micro_batch_size", "micro-batch"),
                ("gradient_accumulation", "gradient accumulation")]


def _us(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _ok(value: Any) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def _measured(side: Side) -> bool:
    return naming_of(side.facts).measured


def _dev(*sides: Side) -> str:
    """What the sides run on: 'IPU' (modelled), 'GPU' (a modelled GPU), 'rank' (measured),
    or 'device' (they differ)."""
    words = {naming_of(s.facts).device for s in sides}
    return words.pop() if len(words) == 1 else "device"


def _capacity_words(side: Side) -> str:
    """What a side's peak is a share of: an IPU's memory, or a GPU's device memory."""
    return "its device memory" if side.facts.get("capacity_name") == "device memory" \
        else "an IPU"


def _time_unit(dev: str) -> str:
    """Device-time per sample: modelled keeps its 'IPU-us', measured ones read 'rank-µs'."""
    return "IPU-us" if dev == "IPU" else f"{dev}-µs"


def _name(side: Side, index: int) -> str:
    return (rank_label if _measured(side) else ipu_label)(index)


def _who(side: Side) -> str:
    return f"{side.label} ({side.facts['name']})"


def _oom_text(side: Side) -> str:
    where = f" on {side.facts['oom_ipus']}" if side.facts["oom_ipus"] else ""
    return f"{_who(side)} does not fit: {side.facts['oom_tiles']} tile(s) out of memory{where}"


def _metric(comp: Comparison, name: str) -> dict[str, float]:
    rows = comp.metrics[comp.metrics["metric"] == name]
    if rows.empty:
        return {}
    return {str(k): float(v) for k, v in rows.iloc[0][["a", "b", "delta", "ratio"]].items()}


JUDGES = ("total", "per-device")  # the same work in less time; the same devices doing more


def _faster(ratio: float) -> tuple[str | None, float]:
    """From B / A: the faster side's label (None within TIE) and the factor, >= 1."""
    if abs(ratio - 1) <= TIE:
        return None, 1.0
    return ("B", ratio) if ratio > 1 else ("A", 1 / ratio)


def _speed(comp: Comparison, sa: Side, sb: Side, judge: str | None = None
           ) -> tuple[str | None, float | None, str, bool]:
    """(faster side label or None for a tie or a split answer, factor >= 1, sentence,
    whether the two questions have different answers: then the caller says how to ask
    one, the CLI with --judge, the page with its control).
    With the same number of devices on both sides, total and per-device throughput are the
    same question. With different numbers they are two: the same work in less time
    (`judge` "total") or the same devices doing more ("per-device"); unasked, a side wins
    only when it wins both, and the sentence gives both answers."""
    per = _metric(comp, "throughput_per_ipu")
    tot = _metric(comp, "throughput")
    if not per or not (_ok(per["a"]) and _ok(per["b"])) or min(per["a"], per["b"]) <= 0:
        return None, None, "Throughput is not known for both profiles.", False
    dev = _dev(sa, sb)
    na, nb = sa.facts["total_ipus"], sb.facts["total_ipus"]
    have_total = bool(tot) and _ok(tot.get("a")) and _ok(tot.get("b")) and \
        min(tot["a"], tot["b"]) > 0
    total = (f"; in total A does {tot['a']:,.1f} samples/s on {count_of(na, _dev(sa))}, B "
             f"{tot['b']:,.1f} on {nb}" if have_total else "")
    per_fast, per_factor = _faster(per["ratio"])
    same = na == nb or not have_total
    if judge != "total" and (same or judge == "per-device"):
        if per_fast is None:
            return None, 1.0, (f"A and B are about as fast per {dev} ({per['a']:,.1f} vs "
                               f"{per['b']:,.1f} samples/s per {dev}){total}."), False
        fast, slow = (sb, sa) if per_fast == "B" else (sa, sb)
        fv, sv = (per["b"], per["a"]) if per_fast == "B" else (per["a"], per["b"])
        return per_fast, per_factor, (
            f"{_who(fast)} is {per_factor:.2f}x faster per {dev} than {_who(slow)} "
            f"({fv:,.1f} vs {sv:,.1f} samples/s per {dev}){total}."), False
    tot_fast, tot_factor = _faster(tot["ratio"])
    per_words = (f"per {dev} A does {per['a']:,.1f} and B {per['b']:,.1f} samples/s")
    # "the same work" only of one model: of two (or of traces that name none) the samples
    # are not the same work, and the note below the verdict says so
    alike = sa.facts["model"] == sb.facts["model"]
    if tot_fast is None:
        total_words = (("A and B do the same work in about the same time" if alike else
                        "A and B have about the same total throughput")
                       + f" ({tot['a']:,.1f} vs {tot['b']:,.1f} samples/s on {na} vs {nb} "
                       f"{dev}s)")
    else:
        fast, slow = (sb, sa) if tot_fast == "B" else (sa, sb)
        does = "does the same work in less time" if alike else "has the higher total throughput"
        total_words = (f"{_who(fast)} {does}: {tot_factor:.2f}x "
                       f"{_who(slow)}'s total throughput ({max(tot['a'], tot['b']):,.1f} vs "
                       f"{min(tot['a'], tot['b']):,.1f} samples/s, on "
                       f"{fast.facts['total_ipus']} vs {slow.facts['total_ipus']} {dev}s)")
    if judge == "total":
        return tot_fast, tot_factor, f"{total_words}; {per_words}.", False
    if per_fast == tot_fast:  # unasked, and both questions have the same answer
        return per_fast, per_factor, (f"{total_words}, and more per {dev} too: "
                                      f"{per_words} ({per_factor:.2f}x)."), False
    per_side = {"A": sa, "B": sb}.get(per_fast or "")
    each = (f"{_who(per_side)} gets more from each {dev}: {per_factor:.2f}x ({per_words})"
            if per_side is not None else f"per {dev} they are about even ({per_words})")
    return None, None, (f"It depends on the question, as they run on {na} vs {nb} {dev}s: "
                        f"{total_words}; {each}."), True


def _per_device(comp: Comparison) -> tuple[str | None, float | None]:
    """The side faster per device (None within TIE or unknown) and by what factor."""
    per = _metric(comp, "throughput_per_ipu")
    if not per or not (_ok(per["a"]) and _ok(per["b"])) or min(per["a"], per["b"]) <= 0:
        return None, None
    return _faster(per["ratio"])


def _idlest_ipu(comp: Comparison, side: Side) -> str:
    """', most on IPU3 (38% of its step)' (or 'rank 1' when measured) when one device of
    `side` idles most (imbalance)."""
    ipus = comp.ipus.pivot_table(index="ipu", columns="metric", values=side.label.lower())
    need = {"compute_ms", "exchange_ms", "idle_ms"}
    if len(ipus) < 2 or not need <= set(ipus.columns):
        return ""
    # over the step (rank-time, popviz.metrics), not over traced time: the one idle definition
    step = _metric(comp, "step_ms").get(side.label.lower())
    rank_time = step if _ok(step) and step else ipus[list(need)].sum(axis=1)
    share = ipus["idle_ms"] / rank_time
    ipu = int(share.idxmax())  # type: ignore[call-overload]  # pandas-stubs: a label is Hashable
    # unbalanced as /stages and the advice judge it: the busiest device over the mean
    busy = ipus["compute_ms"] + ipus["exchange_ms"]
    uneven = ": stages are unbalanced" if busy.mean() > 0 \
        and float(busy.max() / busy.mean()) > IMBALANCE_LIMIT else ""
    return f", most on {_name(side, ipu)} ({share[ipu]:.0%} of its step{uneven})"


def _time_reasons(comp: Comparison, faster: str, sa: Side, sb: Side) -> list[str]:
    """Which categories of IPU-time (rank-time) per sample make the difference, biggest
    first."""
    dev = _dev(sa, sb)
    unit, devs = _time_unit(dev), f"{dev}s" if dev != "device" else "IPUs or ranks"
    tps = comp.time_per_sample
    sign = -1.0 if faster == "B" else 1.0  # savings of the faster side are positive
    gap = abs(float(tps["delta"].sum()))
    if not gap:
        return []
    saving = tps.assign(saving=sign * tps["delta"]).sort_values("saving", ascending=False)
    slow = "A" if faster == "B" else "B"
    out = []
    for _, r in saving.iterrows():
        if abs(r["saving"]) < 0.05 * gap:
            continue
        share_a = r["a"] / tps["a"].sum() if tps["a"].sum() else 0.0
        share_b = r["b"] / tps["b"].sum() if tps["b"].sum() else 0.0
        shares = f" ({share_a:.0%} of A's {dev} time vs {share_b:.0%} of B's)"
        why = WHY[r["category"]].format(devs=devs)
        if r["saving"] > 0:
            where = (_idlest_ipu(comp, sb if slow == "B" else sa)
                     if r["category"] == "idle" else "")
            out.append(f"{slow} spends {r['saving']:,.1f} {unit} more per sample "
                       f"{why}{shares}{where}")
        else:
            out.append(f"despite {faster} spending {-r['saving']:,.1f} {unit} more per "
                       f"sample {why}{shares}")
    return out[:4]


def _memory_reasons(comp: Comparison, sa: Side, sb: Side) -> list[str]:
    out = []
    peak = _metric(comp, "peak_bytes_max")
    if peak and _ok(peak["a"]) and _ok(peak["b"]):
        cap_a, cap_b = sa.facts["ipu_capacity_bytes"], sb.facts["ipu_capacity_bytes"]
        pa = f" ({peak['a'] / cap_a:.0%} of {_capacity_words(sa)})" if cap_a else ""
        pb = f" ({peak['b'] / cap_b:.0%} of {_capacity_words(sb)})" if cap_b else ""
        out.append(f"peak memory of the fullest {_dev(sa, sb)}: A {_fmt_bytes(peak['a'])}{pa}, "
                   f"B {_fmt_bytes(peak['b'])}{pb}")
    inter = _metric(comp, "inter_ipu_bytes")
    if inter and (inter["a"] or inter["b"]):
        dev = _dev(sa, sb)
        out.append(f"{dev}-to-{dev} traffic per step (incl. all-reduce): A moves "
                   f"{_fmt_bytes(inter['a'])}, B {_fmt_bytes(inter['b'])}")
    stash = _metric(comp, "stash_bytes")
    if stash and _ok(stash["a"]) and _ok(stash["b"]) and (stash["a"] or stash["b"]):
        out.append(f"activation stash: A {_fmt_bytes(stash['a'])}, B {_fmt_bytes(stash['b'])}")
    return out


def _op_reason(comp: Comparison) -> list[str]:
    ops = comp.op_classes
    if ops.empty:
        return []
    top = ops.iloc[0]  # sorted by |delta|
    if not (_ok(top["a"]) and _ok(top["b"])):  # one side has no op costs: nothing to say
        return []
    total = max(float(ops["a"].sum()), float(ops["b"].sum()))
    if not total or abs(top["delta"]) < 0.05 * total:
        return []
    more = "B" if top["delta"] > 0 else "A"
    return [f"the largest compute difference: {top['op_class']} ({top['phase']}) costs "
            f"{_us(abs(top['delta']))} us more per sample on {more} "
            f"({_us(top['a'])} vs {_us(top['b'])})"]


def _model(side: Side) -> str:
    """The side's model name; an import's is its trace file's name, and says so."""
    name = shown(side.facts.get("model"))
    return f"{name} (a file name)" if side.facts.get("model_from_file") else name


def differences(sa: Side, sb: Side) -> list[str]:
    """The layout choices that differ, e.g. 'AMP: IPU0: 0.6 vs IPU0: 0.15' (an absent
    value reads 'unknown')."""
    out = []
    for key, label in OPTION_FACTS:
        va, vb = shown(sa.facts.get(key)), shown(sb.facts.get(key))
        if va != vb:
            out.append(f"{label}: {_model(sa)} vs {_model(sb)}" if key == "model"
                       else f"{label}: {va} vs {vb}")
    return out


def _model_notes(sa: Side, sb: Side) -> list[str]:
    """Whether the sides run different models (or runs). An imported trace names no model:
    its name is the file's, so a mismatch there says nothing either way."""
    out = []
    if sa.facts["model"] != sb.facts["model"]:
        named = [s for s in (sa, sb) if s.facts.get("model_from_file")]
        if named:
            who = " and ".join(f"{s.label}'s name {s.facts['model']}" for s in named)
            whose = "is its trace file's" if len(named) == 1 else "are the trace files'"
            out.append(f"Note: {who} {whose} name (an imported trace records no model), so "
                       f"whether A ({sa.facts['model']}) and B ({sb.facts['model']}) run "
                       "the same model is not known.")
        else:
            out.append(f"Note: A and B are different models ({sa.facts['model']} vs "
                       f"{sb.facts['model']}), so their per-sample figures are not like "
                       "for like.")
    if sa.facts["run"] != sb.facts["run"]:
        out.append(f"Note: A and B are different runs ({sa.facts['run']} vs "
                   f"{sb.facts['run']}), so their per-sample figures are not like for like.")
    return out


def _both_fit(sa: Side, sb: Side) -> str:
    """Neither side is out of memory: whether each is known to fit (a measured run has
    no per-tile data, so its fit is unknown, not yes)."""
    unknown = [s.label for s in (sa, sb) if s.facts["fits"] is None]
    if not unknown:
        return "Both fit."
    if len(unknown) == 2:
        return "Whether they fit is not known (no per-tile data)."
    known = "B" if unknown[0] == "A" else "A"
    return f"{known} fits; whether {unknown[0]} does is not known (no per-tile data)."


def verdict(comp: Comparison, sa: Side, sb: Side, judge: str | None = None
            ) -> dict[str, Any]:
    """{winner, judged_by, faster_per_ipu, speedup_per_ipu, speedup_total, fits, headline,
    reasons, differences}; winner is 'A', 'B' or None (a tie, a split answer, or neither
    fits). `judge`: "total" or "per-device" (_speed); None asks both."""
    if judge is not None and judge not in JUDGES:
        raise ValueError(f"judge {judge!r} is not one of {', '.join(JUDGES)}")
    faster, _, speed, split = _speed(comp, sa, sb, judge)
    per_fast, per_factor = _per_device(comp)
    # unknown (None: a measured run, no tiles) is not out of memory: the run ran
    fa, fb = sa.facts["fits"] is not False, sb.facts["fits"] is not False
    reasons: list[str] = _model_notes(sa, sb)
    if fa and fb:
        winner = faster
        headline = speed if faster else speed + " " + _both_fit(sa, sb)
    elif fa != fb:
        good, bad = (sa, sb) if fa else (sb, sa)
        winner = good.label
        headline = f"Only {_who(good)} fits. {_oom_text(bad)}."
        reasons.append(speed if faster != bad.label else
                       speed.rstrip(".") + f", but {bad.label} does not fit as it is.")
    else:
        winner = None
        headline = f"Neither fits. {_oom_text(sa)}; {_oom_text(sb)}."
        reasons.append(speed)
    if per_fast:
        why = _time_reasons(comp, per_fast, sa, sb)
        if why:
            reasons.append(f"{per_fast} is faster per {_dev(sa, sb)} because "
                           + "; ".join(why) + ".")
    lat = _metric(comp, "latency_ms")
    if lat and _ok(lat["a"]) and _ok(lat["b"]):
        reasons.append(f"latency per batch: A {lat['a']:,.3f} ms, B {lat['b']:,.3f} ms")
    reasons += _op_reason(comp) + _memory_reasons(comp, sa, sb)
    if sa.facts["kind"] != sb.facts["kind"]:
        reasons.append(f"A is {sa.facts['kind']} and B {sb.facts['kind']}: times compared in "
                       "seconds (modelled cycles / clock, measured ns).")
    tot = _metric(comp, "throughput")
    per = _metric(comp, "throughput_per_ipu")
    return on_equal_terms({
        "a": sa.facts["name"], "b": sb.facts["name"], "winner": winner,
        "judged_by": judge or "both", "questions_differ": split,
        "faster_per_ipu": per_fast,
        "factor_per_ipu": per_factor,
        "speedup_per_ipu": per.get("ratio") if per else None,
        "speedup_total": tot.get("ratio") if tot else None,
        "fits": {"A": fa, "B": fb}, "headline": headline, "reasons": reasons,
        "differences": differences(sa, sb),
        "per_device": {
            "a": per.get("a"), "b": per.get("b"),
            "total_a": tot.get("a") if tot else None, "total_b": tot.get("b") if tot else None,
            "devices_a": count_of(sa.facts["total_ipus"], _dev(sa)),
            "devices_b": count_of(sb.facts["total_ipus"], _dev(sb))} if per else {},
    }, sa.facts, sb.facts)
