"""The words and limits every layer shares: profile kinds, device naming, trace categories
and the policy thresholds. A leaf (imports nothing of popviz), so record, compile, measure,
format, analysis, figures, the CLI and the app all say the same thing the same way.

Device naming: a modelled profile (record + compile) has IPUs and times in cycles; a
measured one (popviz.measure) has ranks (one process each, no tiles) and times in ns.
Profiles of format 1.2 state these words (root attributes `device_kind`, `time_unit`);
`words_of` says what an older file's kind and target imply. Every figure builder, card and
CLI line takes a `Naming` made from the words, so rows, ticks, hover text and axis titles
say the right words."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

# --- profile kinds (meta.kind, the root attribute `kind`) ------------------------------
MODELLED_KIND = "modelled"  # record + compile: a target model, IPUs and cycles
MEASURED_KIND = "measured"  # popviz.measure: real ranks, ns
KINDS = (MODELLED_KIND, MEASURED_KIND)


def is_measured(kind: Any) -> bool:
    """True for a measured profile's kind (a string, or anything with a `kind`)."""
    kind = getattr(kind, "kind", kind)
    return str(kind or "") == MEASURED_KIND


# --- policy thresholds (advice, cards, the compare page) -------------------------------
IMBALANCE_LIMIT = 1.15  # busiest stage over the mean before we call it a bottleneck
BUBBLE_LIMIT = 0.30  # idle share of the step worth acting on (advice and every warning)
NEARLY_FULL = 0.70  # fullest tile's share of its capacity past which AMP is not raised
TILE_AMBER = 0.90  # fullest tile's share from which a fitting IPU is amber, not green
DEFAULT_AMP = 0.6  # availableMemoryProportion when none is set (docs/hardware.md)
MIN_AMP = 0.05  # lower end of the reasonable AMP range (docs/hardware.md)

# --- always-live: one meaning on every page (PopVision's, docs/hardware.md) ------------
ALWAYS_LIVE = "always-live"
ALWAYS_LIVE_MEANING = ("everything present for the whole program: code, always-live "
                       "variables such as weights and optimiser state, exchange buffers, "
                       "vertex state")

# --- trace categories ------------------------------------------------------------------
# An instant covered by several events goes to the first category listed here: compute
# (by pass) beats exchange beats host_io beats sync beats idle. Drawing order is the same.
CATEGORIES = ("forward", "backward", "recompute", "weight_update", "compute",
              "exchange", "host_io", "sync", "idle")
COMPUTE = ("forward", "backward", "recompute", "weight_update", "compute")
WAITING = ("idle", "sync")  # what "idle" means everywhere: waiting, at a sync or not
TRACE_KINDS = ("compute", "exchange", "sync", "host_io", "idle")  # trace.kind (contract)
PASS_CATEGORY = {"F": "forward", "B": "backward", "R": "recompute", "WU": "weight_update"}
SHORT = {v: k for k, v in PASS_CATEGORY.items()}  # forward -> F (legend keys, pass column)


def category_codes(kind: Any, passes: Any = None) -> np.ndarray:
    """Each event's index in CATEGORIES from its kind and pass. A compute event goes to
    its pass's category (plain compute without a known pass); a kind outside the contract
    (an importer's own) counts as compute: a traced event is work, idle is only waiting.
    Decided once per distinct (kind, pass) pair: traces have 10^5+ events, a few pairs."""
    k_codes, k_names = pd.factorize(np.asarray(kind, dtype=object))
    if passes is None:
        p_codes, p_names = np.zeros(len(k_codes), dtype=np.int64), np.array([""])
    else:
        p_codes, p_names = pd.factorize(np.asarray(passes, dtype=object))
    compute = CATEGORIES.index("compute")
    # one row / column more for a missing value (code -1: the last), read as ""
    kinds, pass_texts = [*map(str, k_names), ""], [*map(str, p_names), ""]
    table = np.full((len(kinds), len(pass_texts)), compute, dtype=np.int64)
    for i, k in enumerate(kinds):
        for j, p in enumerate(pass_texts):
            if k == "compute" and p in PASS_CATEGORY:
                table[i, j] = CATEGORIES.index(PASS_CATEGORY[p])
            elif k in ("exchange", "host_io", "sync", "idle"):
                table[i, j] = CATEGORIES.index(k)
    return table[k_codes, p_codes]


# --- device naming ---------------------------------------------------------------------
_IPU_LABEL = re.compile(r"^IPU(\d+)$")


def ipu_label(index: Any) -> str:
    """'IPU3': a modelled device's name (also the key of per-IPU options)."""
    return f"IPU{int(index)}"


def rank_label(index: Any) -> str:
    """'rank 3': a measured device's name."""
    return f"rank {int(index)}"


@dataclass(frozen=True)
class Naming:
    """What kind of profile this is, said once: the device its `ipu` column counts and the
    unit its times hold, as the profile states them (`device_kind`, `time_unit`).

    Three kinds: a modelled IPU plan ("IPU", cycles), a modelled GPU plan ("GPU", ns) and a
    measured or imported run ("rank", ns). Pages, figures, reporters and advice ask it what
    applies (tiles, AMP, supersteps, real times) and how to say it; they do not test the
    target or the kind themselves."""

    device: str = "IPU"
    unit: str = "cycles"

    @property
    def devices(self) -> str:
        return self.device + "s"

    @property
    def family(self) -> str:
        """'ipu', 'gpu' or 'rank': what the `ipu` column counts (the stated device_kind)."""
        return self.device.lower()

    @property
    def measured(self) -> bool:
        """Times a real run took (popviz measure, popviz import), not a model's."""
        return self.device == "rank"

    @property
    def gpu_plan(self) -> bool:
        """A modelled GPU target: GPUs, ns and no tiles, the times modelled."""
        return self.device == "GPU"

    @property
    def has_tiles(self) -> bool:
        """Tiles to fill: an IPU plan (per-tile memory, BSP supersteps, exchange between
        tiles). A GPU plan and a run have device memory, not tiles."""
        return self.device == "IPU" and self.unit == "cycles"

    @property
    def has_amp(self) -> bool:
        """availableMemoryProportion applies (an IPU compiler option): IPU plans only."""
        return self.has_tiles

    @property
    def in_ns(self) -> bool:
        """Times in ns per step (a GPU plan or a run), not cycles."""
        return self.unit == "ns"

    @property
    def timed(self) -> str:
        """How the times were got: 'measured', or 'modelled' (IPUs, GPU targets)."""
        return "measured" if self.measured else "modelled"

    @property
    def prefix(self) -> str:
        """What comes before a device's number: 'IPU' (IPU0) or 'rank ' (rank 0)."""
        return self.device + ("" if self.has_tiles else " ")

    def label(self, index: Any) -> str:
        """'IPU0' for a modelled IPU profile, 'rank 0' for a measured one, 'GPU 0' for a
        modelled GPU."""
        if self.has_tiles:
            return ipu_label(index)
        return rank_label(index) if self.device == "rank" else f"{self.device} {int(index)}"

    def lane(self, lane: str) -> str:
        """A trace lane's title: a GPU plan's are its streams (the compute stream with the
        kernels it runs, the NCCL stream for sends and all-reduces) and the waits between
        them; an IPU's and a rank's keep the lane's own name."""
        return _GPU_LANES.get(lane, lane) if self.gpu_plan else lane

    def relabel(self, name: Any) -> str:
        """An analysis label such as 'IPU1' (exchange matrix) in this profile's words."""
        found = _IPU_LABEL.match(str(name))
        return self.label(found.group(1)) if found else str(name)

    @property
    def time_title(self) -> str:
        """Axis title of a time axis (the unit always shown)."""
        return "time (ns)" if self.in_ns else self.unit

    def column(self, name: str) -> str:
        """A table column's display name: `ipu` -> `rank`, `*_cycles` -> `* ns` when the
        numbers are ns; underscores as spaces."""
        if self.in_ns:
            if name == "ipu":
                name = self.device.lower()
            if name in ("start", "end"):  # ops: times on the common clock
                name += "_ns"
            name = re.sub(r"(^|_)cycles(_|$)", r"\1ns\2", name)
        return name.replace("_", " ")


_GPU_LANES = {"compute": "compute stream", "ops": "kernels", "exchange": "NCCL stream",
              "sync": "waiting"}
MODELLED = Naming()
MEASURED = Naming(device="rank", unit="ns")
MODELLED_GPU = Naming(device="GPU", unit="ns")  # a modelled GPU target: GPUs, ns, no tiles
GPU_FAMILY = "gpu"


def is_gpu_target(meta: Mapping[str, Any] | None) -> bool:
    """True when a profile's meta (or facts) names a modelled GPU target (family gpu)."""
    if not isinstance(meta, Mapping):
        return False
    target = meta.get("target")
    if isinstance(target, Mapping):
        return target.get("family") == GPU_FAMILY
    return meta.get("family") == GPU_FAMILY  # facts that keep the family beside the name


# --- the words a profile states (format 1.2: root attributes, and meta as read) ----------
DEVICE_KINDS = ("ipu", "gpu", "rank")  # what the `ipu` column counts
TIME_UNITS = ("cycles", "ns")  # what `start`, `end` and the `*_cycles` columns hold
_NAMINGS = {("ipu", "cycles"): MODELLED, ("gpu", "ns"): MODELLED_GPU, ("rank", "ns"): MEASURED}


def words_of(kind: Any = None, meta: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """(device_kind, time_unit) a profile's kind and meta imply, for one that does not
    state them (a format 1.1 file, a Report not yet written): measured -> ranks and ns, a
    GPU target -> GPUs and ns, anything else IPUs and cycles. Meta that states valid words
    (as `popviz.open` gives it) keeps them."""
    if isinstance(kind, Mapping):
        kind, meta = kind.get("kind"), kind
    meta = meta or {}
    stated = (meta.get("device_kind"), meta.get("time_unit"))
    if stated[0] in DEVICE_KINDS and stated[1] in TIME_UNITS:
        return str(stated[0]), str(stated[1])
    kind = str(kind or meta.get("kind") or "")
    if kind == MEASURED_KIND:
        return ("rank", "ns")
    if is_gpu_target(meta):
        return ("gpu", "ns")
    target = meta.get("target") or {}
    if not kind and target.get("name") == "cpu-gloo":  # measure's target, kind missing
        return ("rank", "ns")
    return ("ipu", "cycles")


def naming_from_words(device_kind: str, time_unit: str) -> Naming:
    """The Naming of stated words: ipu + cycles, gpu + ns, rank + ns (any other pair gets
    its device's name and unit; ns means no tiles)."""
    known = _NAMINGS.get((device_kind, time_unit))
    if known is not None:
        return known
    device = "rank" if device_kind == "rank" else device_kind.upper()
    return Naming(device=device, unit=time_unit)


def naming_of(kind: Any = None, meta: Mapping[str, Any] | None = None) -> Naming:
    """The naming of a profile from the words its meta (or facts) states, else from its
    kind and meta (`words_of`; meta.kind and meta.target are used when the kind is not
    given; a facts or meta dict may stand for both)."""
    return naming_from_words(*words_of(kind, meta))


def profile_words(profile: Any) -> tuple[str, str]:
    """(device_kind, time_unit) of an open profile: the words it states (an older file's
    are mapped by the reader), else what its kind and meta imply (a Report)."""
    words = (getattr(profile, "device_kind", None), getattr(profile, "time_unit", None))
    if words[0] in DEVICE_KINDS and words[1] in TIME_UNITS:
        return str(words[0]), str(words[1])
    return words_of(getattr(profile, "kind", None), getattr(profile, "meta", None))


def naming_for(profile: Any) -> Naming:
    """The naming of an open profile, from the words it states (`profile_words`)."""
    return naming_from_words(*profile_words(profile))
