"""The advisor's view of a recorded program's layer sequence, through the one split
planner in `popviz.analysis.pipeline_plan` (the summary's advice uses the same one, so
the two cost a layout alike)."""

from __future__ import annotations

import pandas as pd

from popviz.analysis.pipeline_plan import Segments, segments_over, split_positions_in
from popviz.analysis.pipeline_plan import balanced_bounds as _balanced_bounds
from popviz.recorder.program import Program


def _layers_and_names(program: Program) -> tuple[list[str], list[str]]:
    layers = [str(layer) for layer in program.layers]
    return layers, [str(n) for n in program.model.get("split_names") or layers]


def split_positions(program: Program) -> tuple[list[str], list[int]]:
    """Usable split names and the layer index each starts, in forward order (names at
    the first layer, or repeating an earlier position, are dropped)."""
    return split_positions_in(*_layers_and_names(program))


def segments(program: Program, ops: pd.DataFrame, microbatches: int) -> Segments:
    """Per-segment cycles from a compiled `ops` table (its recorded ops only: the
    compiler's recompute copies depend on the layout and `Segments.stage_cost` adds them
    back)."""
    layers, names = _layers_and_names(program)
    return segments_over(layers, names, ops, microbatches)


def balanced_bounds(segs: Segments, stages: int, recompute: bool) -> list[int]:
    """The balanced partition into `stages` stages ([] for one); ValueError when the
    program has too few usable split names."""
    if stages <= 1:
        return []
    bounds = _balanced_bounds(segs, stages, recompute=recompute)
    if bounds is None:
        raise ValueError(f"{stages} stages need {stages - 1} split names; "
                         f"only {segs.count - 1} are usable")
    return bounds
