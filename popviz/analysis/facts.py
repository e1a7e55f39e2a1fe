"""Headline facts of one profile, as a JSON-safe dict (what `popviz summary --json` prints).

Facts that the tables determine (fit, OOM tiles, peaks, per-stage cycles) are derived from
the tables here, so they are right even for a profile whose stored summary lacks them; the
stored summary adds what only the compiler knows (throughput, latency, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from popviz.analysis.insights import insights
from popviz.jsonsafe import jsonable as _plain
from popviz.metrics import device_capacities, device_fit, fit_verdict, oom_tiles, peak_liveness
from popviz.vocab import profile_words

if TYPE_CHECKING:  # the type only: importing popviz.format loads h5py
    from popviz.format.profile import Profile


def profile_warnings(meta: dict[str, Any], limit: int = 20) -> list[str]:
    """What the tool that wrote the profile warned about (`meta.warnings`, e.g. a memory
    snapshot from another run); an untrusted file's: strings only, at most `limit`, each
    cut to 500 characters, unprintable characters blanked."""
    stored = meta.get("warnings")
    if not isinstance(stored, list):
        return []
    # control characters (terminal escapes) become spaces: the text reaches a terminal
    return ["".join(c if c.isprintable() else " " for c in w[:500])
            for w in stored if isinstance(w, str)][:limit]


def profile_facts(profile: Profile) -> dict[str, Any]:
    """One JSON-safe dict of headline facts about `profile`."""
    meta, stored = profile.meta, dict(profile.summary)
    tiles = profile.tile_memory
    over = oom_tiles(tiles)
    stages = profile.stages
    facts: dict[str, Any] = {
        "profile": str(profile.path),
        "name": profile.name,
        "kind": profile.kind,
        "format_version": profile.format_version,
        # the words the profile states: what `ipu` counts and what times hold
        **dict(zip(("device_kind", "time_unit"), profile_words(profile))),
        "model": meta.get("model", {}).get("name"),
        "target": meta.get("target", {}),
        "options": meta.get("options", {}),
        "fits": fit_verdict(tiles, profile.liveness, meta),
        "device_memory": _plain(device_fit(profile.liveness, device_capacities(meta))
                                .to_dict(orient="records")),
        "warnings": profile_warnings(meta),
        "oom_tiles": len(over),
        "oom_ipus": sorted(int(i) for i in over["ipu"].unique()),
        "num_ipus": int(meta.get("target", {}).get("num_ipus", tiles["ipu"].nunique())),
        "peak_liveness_bytes": {int(i): int(v) for i, v in  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable
                                peak_liveness(profile.liveness).items()},
        "stages": _plain(stages.to_dict(orient="records")),
        "tile_memory_bytes": {
            "max": int(tiles["total_bytes"].max()) if len(tiles) else 0,
            "mean": float(tiles["total_bytes"].mean()) if len(tiles) else 0.0,
            "capacity": int(tiles["capacity_bytes"].max()) if len(tiles) else 0,
        },
    }
    # The compiler's own figures win for what only it knows; table-derived facts win
    # for what the tables decide.
    for key, value in stored.items():
        facts.setdefault(key, value)
    return _plain(facts)


def insight_facts(profile: Profile) -> dict[str, Any]:
    """What the summary page adds to the stored facts: whether fit is known, the fullest
    tile, the bottleneck stage and the advice (JSON-safe)."""
    found = insights(profile)
    tiles = found["fullest_tiles"]
    top = tiles.iloc[0] if len(tiles) else None
    return _plain({
        "fit_known": bool(found["fit"]["known"]),
        "fullest_tile": None if top is None else {
            k: top[k] for k in ("ipu", "tile", "utilisation", "capacity_bytes",
                                "largest_category") if k in top},
        "bottleneck": found["bottleneck"],
        # the summary page's "pipeline bubbles" (a sharded run's "waiting for other
        # shards", insights.idle_title): idle over rank-time of every device
        "bubble_fraction": found["bubble_fraction"],
        "advice": [a.text for a in found["advice"]],
    })


def summary_facts(profile: Profile) -> dict[str, Any]:
    """What `popviz summary` says of one profile, text or JSON: the stored and
    table-derived facts with what the summary page adds."""
    return {**profile_facts(profile), **insight_facts(profile)}
