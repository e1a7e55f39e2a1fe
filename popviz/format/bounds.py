"""Values checked against the profile before they size anything (issue 34).

A well-formed file can still hold hostile values: an IPU number of 10^9 (a view then loops
over 10^9 devices), a tile of 10^8 (a tile map of 10^8 cells), a step of 10^8, a slice
depth of 10^9 (10^9 flame rows), one 30 MB string that every row of a CSV repeats. Every
column the analysis, figures or app use as a size, index, count or loop bound is listed
in COLUMNS with what bounds it; the reader checks each table as it reads it (so the vetting
worker refuses the file and the serving process never builds from such a value), with one
line naming the table, column and value:

    liveness.ipu: 1000000000 is not an IPU of this profile (it has 4)

The bounds come from the profile itself (`Dimensions`: its devices, tiles, stages and
rows, from `meta` and the tables' declared row counts) under fixed caps, so memory and time
stay proportional to what the file holds, not to what a value claims.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from popviz.errors import ProfileError

# Fixed caps, far above any real profile: what a count declared in `meta` may say before
# it is not believed (the cap then bounds the column alone).
MAX_DEVICES = 4096  # IPUs, GPUs or ranks in one profile (an IPU-POD256 has 256)
MAX_TILES = 1 << 16  # tiles per IPU (a Mk2 has 1,472)
MAX_STAGES = 4096  # pipeline stages
MAX_STRING_BYTES = 1 << 20  # one string of the string table (as import_limits allows)

# How a column is bounded: (kind, lowest allowed value). Kinds:
#   device: an IPU / GPU / rank number, < the profile's devices
#   tile: a tile number, < tiles per IPU; tiles: a count of tiles, <= tiles per IPU
#   stage: a pipeline stage, < the profile's stages
#   step: a liveness step or training step, < the steps the profile holds
#   index: an id, position or count (op, tensor, section, depth, micro-batch, ...),
#          < the rows the whole profile holds
#   finite: any finite number (a stream or correlation id: a key, never a size)
# A lowest value of -1 is the tables' "none" (no peer, stage unknown, no micro-batch).
Bound = tuple[str, int]
COLUMNS: dict[str, dict[str, Bound]] = {
    "stages": {"stage": ("stage", 0), "ipu": ("device", 0), "steps": ("index", 0),
               "num_ops": ("index", 0), "stash_depth": ("index", 0)},
    "trace": {"ipu": ("device", 0), "stage": ("stage", -1), "microbatch": ("index", -1),
              "step": ("step", 0), "peer": ("device", -1), "superstep": ("index", 0),
              "stream": ("finite", -1), "correlation": ("finite", -1)},
    "liveness": {"ipu": ("device", 0), "step": ("step", 0), "stage": ("stage", -1),
                 "microbatch": ("index", -1), "op_id": ("index", -1),
                 "training_step": ("step", 0), "stashed_microbatches": ("index", 0)},
    "tile_memory": {"ipu": ("device", 0), "tile": ("tile", 0)},
    "exchange": {"stage": ("stage", -1), "microbatch": ("index", -1), "step": ("step", 0)},
    "ops": {"op_id": ("index", 0), "ipu": ("device", 0), "stage": ("stage", -1),
            "microbatch": ("index", -1), "step": ("step", 0), "peer": ("device", -1),
            "section": ("index", -1), "source_op": ("index", -1), "tiles_used": ("tiles", 0),
            "passes": ("index", 0), "kernels": ("index", 0)},
    "tensors": {"tensor_id": ("index", 0), "producer": ("index", -1),
                "last_use": ("index", -1), "stage": ("stage", -1), "ipu": ("device", 0)},
    "variables": {"ipu": ("device", 0), "first_step": ("step", 0), "last_step": ("step", 0),
                  "stage": ("stage", -1), "first_tile": ("tile", 0), "tiles": ("tiles", 0)},
    "always_live_variables": {"ipu": ("device", 0), "first_tile": ("tile", 0),
                              "tiles": ("tiles", 0)},
    "oom": {"ipu": ("device", 0), "tile": ("tile", 0)},
    "alloc_blocks": {"ipu": ("device", 0), "block": ("index", 0), "stack": ("index", -1),
                     "stream": ("finite", -1)},
    "alloc_segments": {"ipu": ("device", 0), "segment": ("index", 0),
                       "stream": ("finite", -1)},
    "alloc_frames": {"ipu": ("device", 0), "stack": ("index", 0), "depth": ("index", 0)},
    "kernels": {"ipu": ("device", 0), "correlation": ("finite", -1)},
    "host_slices": {"ipu": ("device", 0), "tid": ("index", 0), "depth": ("index", 0),
                    "correlation": ("finite", -1)},
    "p2p": {"rank": ("device", 0), "peer": ("device", -1), "stage": ("stage", -1),
            "microbatch": ("index", -1), "step": ("step", 0), "seq": ("index", 0)},
}
# Columns that count something: fractional values are allowed (a stage's mean kernels).
_FRACTIONAL = {("ops", "kernels")}


@dataclass(frozen=True)
class Dimensions:
    """What a profile holds, which its values are checked against."""

    device_word: str  # "IPU", "GPU" or "rank"
    devices: int  # how many; values 0 .. devices - 1
    tiles: int  # per IPU
    stages: int
    steps: int  # liveness rows, tile-liveness steps, ops: the most steps anything counts
    rows: int  # every table's rows together (and the arrays' leading extents)

    def limit(self, kind: str) -> int:
        return {"device": self.devices, "tile": self.tiles, "tiles": self.tiles + 1,
                "stage": self.stages, "step": self.steps, "index": self.rows}[kind]

    def what(self, kind: str) -> str:
        """The end of 'is not ... of this profile (it has N ...)'."""
        article = "an" if self.device_word[0] in "AEIOU" else "a"
        return {"device": f"{article} {self.device_word} of this profile (it has "
                          f"{self.devices:,})",
                "tile": f"a tile of this profile's {self.device_word}s (they have "
                        f"{self.tiles:,})",
                "tiles": f"a count of this profile's tiles (its {self.device_word}s have "
                         f"{self.tiles:,})",
                "stage": f"a stage of this profile (it has {self.stages:,})",
                "step": f"a step of this profile (it has {self.steps:,} at most)",
                "index": f"plausible for this profile (it holds {self.rows:,} rows in "
                         "all)"}[kind]


def _count(value: Any) -> int | None:
    """A declared count: a whole number >= 0, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)


def _ranks_end(value: Any) -> int | None:
    """One past the highest rank of a list of ranks (or stages)."""
    if not isinstance(value, list) or not value or len(value) > MAX_DEVICES:
        return None
    counts = [_count(v) for v in value]
    whole = [c for c in counts if c is not None]
    return max(whole) + 1 if len(whole) == len(counts) else None


def _declared(meta: Mapping[str, Any], *paths: str) -> list[int]:
    """The counts meta states at `paths` ('a.b'): a count; 'a.b[]': one past the highest
    of a list of ranks or stages; 'a.b#': a list's length."""
    found = []
    for path in paths:
        node: Any = meta
        for key in path.rstrip("[]#").split("."):
            node = node.get(key) if isinstance(node, Mapping) else None
        if path.endswith("[]"):
            value = _ranks_end(node)
        elif path.endswith("#"):
            value = len(node) if isinstance(node, list) else None
        else:
            value = _count(node)
        if value is not None:
            found.append(value)
    return found


def dimensions(meta: Mapping[str, Any], device_kind: str, rows: Mapping[str, int],
               arrays: Mapping[str, tuple[int, ...]]) -> Dimensions:
    """The bounds of one profile from its meta, its tables' row counts and its arrays'
    shapes. A count meta does not state, or states past its cap, is the cap."""
    word = {"ipu": "IPU", "gpu": "GPU", "rank": "rank"}.get(device_kind, "device")
    tile_liveness = arrays.get("tile_liveness", ())
    devices = _declared(meta, "target.num_ipus", "target.num_gpus", "options.num_ipus",
                        "measure.world_size", "ranks[]", "measure.ranks[]")
    if len(tile_liveness) == 3:
        devices.append(tile_liveness[0])
    tiles = [t for t in _declared(meta, "target.tiles_per_ipu") if t > 0]
    if len(tile_liveness) == 3:
        tiles.append(tile_liveness[2])
    stages = _declared(meta, "measure.num_stages", "measure.stages[]", "options.stages#",
                       "options.stage_ipus#")
    stages.append(rows.get("stages", 0))
    steps = [rows.get("liveness", 0), rows.get("ops", 0)]
    if len(tile_liveness) >= 2:
        steps.append(tile_liveness[1])
    total = sum(rows.values()) + sum(shape[0] for shape in arrays.values() if shape)

    def bounded(found: list[int], cap: int) -> int:
        best = max(found, default=0)
        return cap if best <= 0 or best > cap else best

    return Dimensions(word, bounded(devices, MAX_DEVICES), bounded(tiles, MAX_TILES),
                      bounded(stages, MAX_STAGES), max(max(steps), 1), max(total, 1))


def check_column(table: str, column: str, values: np.ndarray, dims: Dimensions,
                 label: str) -> None:
    """ProfileError (one line) when a column COLUMNS bounds holds a value outside its
    bound, NaN or infinity, or a fraction where a whole number is meant."""
    bound = COLUMNS.get(table, {}).get(column)
    if bound is None or not len(values) or values.dtype.kind not in "iuf":
        return
    kind, lowest = bound
    where = f"{label}: {table}.{column}"
    if values.dtype.kind == "f":
        finite = np.isfinite(values)
        if not finite.all():
            bad = values[~finite][0]
            raise ProfileError(f"{where}: {'NaN' if np.isnan(bad) else bad} where a "
                               "number is required")
        if (table, column) not in _FRACTIONAL and (values != np.floor(values)).any():
            bad = values[values != np.floor(values)][0]
            raise ProfileError(f"{where}: {bad} where a whole number is required")
    low, high = values.min(), values.max()
    if low < lowest:
        allowed = "-1 (none) or more" if lowest < 0 else "0 or more"
        raise ProfileError(f"{where}: {_show(low)} is not allowed (it must be {allowed})")
    if kind == "finite":
        return
    if high >= dims.limit(kind):
        raise ProfileError(f"{where}: {_show(high)} is not {dims.what(kind)}")


def _show(value: Any) -> str:
    number = float(value)
    return f"{int(number)}" if number.is_integer() else f"{number:g}"


def check_strings(lengths: np.ndarray, label: str) -> None:
    """No one string of the string table longer than MAX_STRING_BYTES."""
    if len(lengths) and int(lengths.max()) > MAX_STRING_BYTES:
        k = int(np.argmax(lengths))
        raise ProfileError(f"{label}: string table: string {k} is {int(lengths[k]):,} bytes, "
                           f"more than {MAX_STRING_BYTES:,} (a name, not a document)")


_TEXT_CHUNK_ROWS = 1 << 18


def text_chars(codes: np.ndarray, lengths: np.ndarray) -> int:
    """How many characters of text the string codes `codes` refer to (in chunks: no
    row-sized temporary)."""
    total = 0
    for start in range(0, len(codes), _TEXT_CHUNK_ROWS):
        part = codes[start:start + _TEXT_CHUNK_ROWS].astype(np.int64, copy=False)
        total += int(lengths[part].sum(dtype=np.int64))
    return total


def check_text(table: str, codes: np.ndarray, lengths: np.ndarray, budget: int,
               label: str) -> None:
    """The text a table's cells refer to, all together, within `budget` characters: a
    few long strings repeated by every row would make a CSV or a figure of gigabytes."""
    check_text_total(table, text_chars(codes, lengths), budget, label)


def check_text_total(table: str, total: int, budget: int, label: str) -> None:
    """As check_text, for a total counted column by column (popviz.format.reader)."""
    if total > budget:
        raise ProfileError(f"{label}: {table}: its text cells refer to {total:,} characters "
                           f"of text, more than the reader's budget of {budget:,} "
                           "(schema.TEXT_BUDGET_BYTES)")
