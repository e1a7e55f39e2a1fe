"""Report: the compiled, modelled result of placing a Program on a target."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd


@dataclass
class Report:
    """Everything a profile file holds: meta, summary, tables and big arrays."""

    meta: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
