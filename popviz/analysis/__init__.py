"""Analysis: pure functions over a profile's DataFrames (pandas in, pandas / dicts out)."""

from popviz.analysis.advice import Advice, advise
from popviz.analysis.balance import (
                                     bottleneck_stage,
                                     imbalance,
                                     ipu_balance,
                                     profile_stages,
                                     stage_balance,
                                     time_by_kind,
                                     timed_stages,
)
from popviz.analysis.exchange import exchange_by_kind, exchange_matrix, exchange_over_time
from popviz.analysis.insights import insights
from popviz.analysis.liveness import (
    bumps,
    find_bumps,
    liveness_peaks,
    liveness_source,
    step_memory,
    variables_live_at,
)
from popviz.analysis.memory import (
                                     fit_summary,
                                     fullest_tiles,
                                     ipu_totals,
                                     memory_categories,
                                     oom_tiles,
                                     tile_breakdown,
)
from popviz.analysis.table import filter_table, query_table

__all__ = ["Advice", "advise", "bottleneck_stage", "bumps", "exchange_by_kind", "exchange_matrix",
           "exchange_over_time", "filter_table", "find_bumps", "fit_summary", "fullest_tiles",
           "imbalance", "insights", "ipu_balance", "ipu_totals", "liveness_peaks",
           "liveness_source", "memory_categories", "oom_tiles", "profile_stages", "query_table",
           "stage_balance", "step_memory", "tile_breakdown", "time_by_kind", "timed_stages",
           "variables_live_at"]
