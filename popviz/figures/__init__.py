"""Figures: one plain Plotly builder per view (no Dash), usable in a notebook."""

from popviz.figures.exchange import (
    exchange_matrix_figure,
    exchange_time_figure,
    stage_links_figure,
)
from popviz.figures.liveness import liveness_figure, tile_liveness_figure
from popviz.figures.lod import TraceIndex, maxpool2d, minmax_indices
from popviz.figures.memory import (
                                   ipu_totals_figure,
                                   memory_histogram,
                                   tile_breakdown_figure,
                                   tile_map_figure,
                                   tile_memory_figure,
)
from popviz.figures.stages import amp_figure, ipu_time_figure, stage_load_figure, stash_figure
from popviz.figures.style import empty_figure
from popviz.figures.trace import trace_figure

__all__ = ["TraceIndex", "amp_figure", "empty_figure", "exchange_matrix_figure",
           "exchange_time_figure", "ipu_time_figure", "ipu_totals_figure",
           "liveness_figure", "maxpool2d", "memory_histogram", "minmax_indices",
           "stage_links_figure", "stage_load_figure", "stash_figure", "tile_breakdown_figure",
           "tile_liveness_figure", "tile_map_figure", "tile_memory_figure", "trace_figure"]
