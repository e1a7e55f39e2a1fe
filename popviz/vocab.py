"""What a profile calls its devices and its time: the one place figures and the app ask.

A modelled profile (record + compile) has IPUs and times in cycles; a measured one
(popviz.measure) has ranks (one process each, no tiles) and times in ns. Every figure
builder takes a `Naming` so rows, ticks, hover text and axis titles say the right words."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_IPU_LABEL = re.compile(r"^IPU(\d+)$")


@dataclass(frozen=True)
class Naming:
    """Words for one profile: `device` ("IPU" | "rank"), `unit` ("cycles" | "ns")."""

    device: str = "IPU"
    unit: str = "cycles"
    measured: bool = False

    @property
    def devices(self) -> str:
        return self.device + "s"

    @property
    def prefix(self) -> str:
        """What comes before a device's number: 'IPU' (IPU0) or 'rank ' (rank 0)."""
        return self.device + (" " if self.measured else "")

    def label(self, index: Any) -> str:
        """'IPU0' for a modelled profile, 'rank 0' for a measured one."""
        return f"{self.prefix}{int(index)}"

    def relabel(self, name: Any) -> str:
        """An analysis label such as 'IPU1' (exchange matrix) in this profile's words."""
        found = _IPU_LABEL.match(str(name))
        return self.label(found.group(1)) if found else str(name)

    @property
    def time_title(self) -> str:
        """Axis title of a time axis (the unit always shown)."""
        return "time (ns)" if self.measured else self.unit

    def column(self, name: str) -> str:
        """A table column's display name: `ipu` -> `rank`, `*_cycles` -> `* ns` when the
        numbers are ns; underscores as spaces."""
        if self.measured:
            if name == "ipu":
                name = "rank"
            if name in ("start", "end"):  # ops: times on the common clock
                name += "_ns"
            name = re.sub(r"(^|_)cycles(_|$)", r"\1ns\2", name)
        return name.replace("_", " ")


MODELLED = Naming()
MEASURED = Naming(device="rank", unit="ns", measured=True)


def naming_of(kind: Any = None, meta: Mapping[str, Any] | None = None) -> Naming:
    """The naming of a profile from its kind and meta (meta.kind and meta.target are used
    when the kind is not given): measured -> ranks and ns, anything else IPUs and cycles."""
    meta = meta or {}
    kind = str(kind or meta.get("kind") or "")
    if kind == "measured":
        return MEASURED
    target = meta.get("target") or {}
    if not kind and target.get("name") == "cpu-gloo":  # measure's target, kind missing
        return MEASURED
    return MODELLED


def naming_for(profile: Any) -> Naming:
    """The naming of an open profile (anything with `kind` and `meta`)."""
    return naming_of(getattr(profile, "kind", None), getattr(profile, "meta", None))
