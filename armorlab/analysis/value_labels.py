"""Config values as the report shows them: numpy scalars as Python ones, floats in ``%g``. Kept
apart from armorlab.analysis.groups (pandas) so that the figures can label with it without
importing pandas."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def norm_value(v: Any) -> Any:
    """A config value as plain Python: None for null/NaN, numpy scalars as int/float/bool."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v


def fmt_value(v: Any) -> str:
    v = norm_value(v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
