"""Plain-Python, JSON-safe copies of results that hold numpy scalars (used by every layer)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def jsonable(value: Any) -> Any:
    """dicts / lists / numpy scalars -> plain Python; NaN and infinities -> None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
