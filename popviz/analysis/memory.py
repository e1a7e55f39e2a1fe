"""Tile memory: fit / out-of-memory, the fullest tiles, per-IPU totals, one tile's breakdown."""

from __future__ import annotations

from typing import Any

import pandas as pd

from popviz.metrics import fits, oom_tiles
from popviz.vocab import ALWAYS_LIVE, ALWAYS_LIVE_MEANING

NOT_ALWAYS_LIVE = "not_always_live_peak"  # the one tile category that is not always-live

BASE_COLUMNS = ("ipu", "tile", "capacity_bytes", "total_bytes")


def memory_categories(tile_memory: pd.DataFrame) -> list[str]:
    """Category columns in file order (code, always_live, not_always_live_peak, exchange,
    and any extra numeric column a compiler adds)."""
    return [c for c in tile_memory.columns if c not in BASE_COLUMNS
            and pd.api.types.is_numeric_dtype(tile_memory[c])]


def with_utilisation(tile_memory: pd.DataFrame) -> pd.DataFrame:
    """Each tile with `utilisation` and `bytes_over` (as popviz.metrics.oom_tiles)."""
    out = tile_memory.copy()
    cap = out["capacity_bytes"].astype(float).where(out["capacity_bytes"] > 0)
    out["utilisation"] = (out["total_bytes"] / cap).fillna(0.0)
    out["bytes_over"] = (out["total_bytes"] - out["capacity_bytes"]).clip(lower=0)
    return out


def fullest_tiles(tile_memory: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The `n` tiles with the highest utilisation, with their largest category."""
    tm = with_utilisation(tile_memory)
    top = tm.sort_values(["utilisation", "ipu", "tile"], ascending=[False, True, True],
                         kind="stable").head(n).reset_index(drop=True)
    cats = memory_categories(tile_memory)
    top["largest_category"] = top[cats].idxmax(axis=1).astype(str) if cats and len(top) else ""
    return top


def ipu_totals(tile_memory: pd.DataFrame) -> pd.DataFrame:
    """Per IPU: bytes per category, total, capacity, utilisation and OOM tile count."""
    cats = memory_categories(tile_memory)
    tm = with_utilisation(tile_memory)
    grouped = tm.groupby("ipu", sort=True)
    out = grouped[[*cats, "total_bytes", "capacity_bytes"]].sum()
    out["utilisation"] = out["total_bytes"] / out["capacity_bytes"].where(
        out["capacity_bytes"] > 0)
    out["max_tile_utilisation"] = grouped["utilisation"].max()
    out["oom_tiles"] = grouped["bytes_over"].apply(lambda s: int((s > 0).sum()))
    return out.fillna(0.0).reset_index()


def tile_breakdown(tile_memory: pd.DataFrame, ipu: int, tile: int) -> pd.DataFrame:
    """Bytes per category of one tile (category, bytes, share of capacity)."""
    row = tile_memory[(tile_memory["ipu"] == ipu) & (tile_memory["tile"] == tile)]
    if row.empty:
        raise ValueError(f"no tile {tile} on IPU {ipu}")
    row = row.iloc[0]
    cats = memory_categories(tile_memory)
    cap = float(row["capacity_bytes"]) or 1.0
    return pd.DataFrame({"category": cats, "bytes": [int(row[c]) for c in cats],
                         "share_of_capacity": [float(row[c]) / cap for c in cats]})


def fit_summary(tile_memory: pd.DataFrame, oom: pd.DataFrame | None = None) -> dict[str, Any]:
    """Does it fit? OOM tile count overall and per IPU, worst overflow, worst utilisation."""
    known = fits(tile_memory)
    if known is None:
        return {"known": False, "fits": None, "oom_tiles": 0, "oom_by_ipu": {},
                "max_over_bytes": 0, "max_utilisation": 0.0}
    over = oom_tiles(tile_memory)
    by_ipu = {int(k): int(v) for k, v in over.groupby("ipu").size().items()}  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable
    result: dict[str, Any] = {
        "known": True, "fits": known, "oom_tiles": len(over), "oom_by_ipu": by_ipu,
        "max_over_bytes": int(over["bytes_over"].max()) if len(over) else 0,
        "max_utilisation": float(with_utilisation(tile_memory)["utilisation"].max()),
    }
    if oom is not None and not oom.empty and "variables" in oom.columns:
        result["oom_variables"] = [str(v) for v in oom["variables"].head(5)]
    return result


def always_live_by_ipu(tile_memory: pd.DataFrame) -> dict[int, float]:
    """Always-live bytes per IPU from the tiles: every category but the not-always-live
    peak (code, always-live variables, exchange, vertex state), PopVision's meaning."""
    if tile_memory.empty:
        return {}
    cats = [c for c in memory_categories(tile_memory) if c != NOT_ALWAYS_LIVE]
    sums = tile_memory.groupby("ipu", sort=True)[cats].sum().sum(axis=1)
    return {int(k): float(v) for k, v in sums.items()}  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable


def always_live_from_liveness(liveness: pd.DataFrame) -> dict[int, float]:
    """Always-live bytes per IPU from the liveness table (constant over the steps)."""
    if liveness.empty or "always_live_bytes" not in liveness.columns:
        return {}
    peak = liveness.groupby("ipu", sort=True)["always_live_bytes"].max()
    return {int(k): float(v) for k, v in peak.items()}  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable


def always_live_text(by_ipu: dict[int, float], label: Any) -> str:
    """The one line both the memory and the liveness page show (same words, same
    precision): 'Always-live (everything ...): IPU0 41.0 MiB · IPU1 63.1 MiB'."""
    parts = " · ".join(f"{label(i)} {v / 2**20:,.1f} MiB" for i, v in sorted(by_ipu.items()))
    return f"{ALWAYS_LIVE.capitalize()} ({ALWAYS_LIVE_MEANING}): {parts}"
