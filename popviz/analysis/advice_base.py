"""What every advice rule returns (`Advice`) and the AMP a profile's options set on a
device: shared by the memory rules (advice_memory.py) and the time rules (advice_time.py)
that `advice.advise` runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from popviz.vocab import DEFAULT_AMP, ipu_label

KiB = 1024


@dataclass(frozen=True)
class Advice:
    severity: str  # "error" (does not fit), "warning" (slow), "info"
    topic: str  # "amp", "split", "recomputation", "accumulation", "memory", "host_io",
    # "idle" (one measured device mostly waiting), "micro_batch" (GPU memory unused), "ok"
    ipu: int | None
    text: str


def amp_for(meta: dict[str, Any], ipu: int) -> float:
    """The conv AMP in effect on `ipu` from meta['options'] ({"all": a, "IPU1": [c, m]})."""
    amp = (meta.get("options") or {}).get("available_memory_proportion") or {}
    value = amp.get(ipu_label(ipu), amp.get(str(ipu), amp.get("all", DEFAULT_AMP)))
    if isinstance(value, (list, tuple)):
        value = value[0]
    try:
        return float(value)
    except (TypeError, ValueError):
        return DEFAULT_AMP
