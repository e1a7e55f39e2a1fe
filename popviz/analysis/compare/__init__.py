"""Compare two profiles (pure functions over open profiles; `popviz.compare` takes paths).

Modules, each importing only those above it in this list (no import circle):

- `sides`: one profile's own figures, in seconds and per sample (`Side`, `load_side`)
- `terms`: whether two runs are like for like (what differs, what is decisive)
- `table`: the `Comparison` of aligned delta frames, `deltas`, text of a figure
- `verdict`: which layout is better, why and by how much, in words
- `build`: `compare(a, b)` / `build(side_a, side_b)` -> `Comparison`
- `ops`: op by op (`compare_ops`); `overlay`: both liveness curves on one axis
"""

from popviz.analysis.compare.build import build, compare
from popviz.analysis.compare.table import Comparison, deltas, format_ratio, format_value

__all__ = ["Comparison", "build", "compare", "deltas", "format_ratio", "format_value"]
