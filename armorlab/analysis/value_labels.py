"""Config values as the report shows them (floats in ``%g``), without pandas, for the figures."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def norm_value(v: Any) -> Any:
    """A config value as plain Python: None for null/NaN, numpy scalars as int/float/bool."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if isinstance(v, (np.integer, np.floating, np.bool_)) else v


def fmt_value(v: Any) -> str:
    v = norm_value(v)
    return f"{v:g}" if isinstance(v, float) else str(v)
