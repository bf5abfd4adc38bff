"""Equivalence margins (an effect of interest fixed before the first look, never a noise unit) and whether
a comparison on a final or drop endpoint can show prevention (docs/verdicts.md):
    (F1) the baseline fell when k of its n seeds collapse (C5, false-alarm rate α_c a flat curve) and
         P(Bin(n, α_c) ≥ k) ≤ 0.05: with α_c = 0.04, k ≥ 1 for n = 1, k ≥ 2 for 2 ≤ n ≤ 9.
"""

from __future__ import annotations

import math
from typing import Any

ALPHA = 0.05
# per-run scores whose comparison is about a fall from the peak (armorlab.analysis.groups)
PREVENTION_ENDPOINTS = frozenset({"final", "drop", "drop_rel", "drop_z"})
NO_PREVENTION = "cannot show prevention"
NO_MARGIN = "no margin declared"


def margin_source(delta: float | None, file: str | None, flag: str | None = None) -> str:
    """Where a comparison's margin comes from, as looks.json and the report say it."""
    if delta is None or not math.isfinite(delta):
        return f"{NO_MARGIN}: no equivalence verdict (set compare.delta{f' or {flag}' if flag else ''})"
    return f"declared: compare.delta in {file}" if file else "declared: compare.delta"


def fell_p(collapsed: int, n: int, curve_alpha: float) -> float:
    """(F1) P(Bin(n, α_c) ≥ k): how often ``collapsed`` of ``n`` flat curves would show a collapse."""
    from scipy.stats import binom  # lazy: spec parsing reads PREVENTION_ENDPOINTS without scipy

    return float(binom.sf(collapsed - 1, n, curve_alpha)) if n > 0 else math.nan


def baseline_fell(collapsed: int, n: int, curve_alpha: float, level: float = ALPHA) -> bool | None:
    """(F1); None without a seed to judge."""
    p = fell_p(collapsed, n, curve_alpha)
    return None if math.isnan(p) else p <= level


def prevention(baseline: str, collapsed: int, n: int, curve_alpha: float) -> dict[str, Any]:
    """The record of (F1) for one baseline, as looks.json and the report keep it."""
    return {"baseline": baseline, "collapsed": int(collapsed), "n": int(n), "curve_alpha": curve_alpha,
            "p": fell_p(collapsed, n, curve_alpha), "fell": baseline_fell(collapsed, n, curve_alpha)}


def caveat(record: dict[str, Any] | None, endpoint: str, name: str | None = None) -> str:
    """``dapo did not fall here (0 of 3 seeds collapsed): this cannot show prevention`` where (F1) finds
    no fall and ``endpoint`` is about one; empty otherwise."""
    if not record or endpoint not in PREVENTION_ENDPOINTS or record.get("fell") is not False:
        return ""
    return (f"{name or record['baseline']} did not fall here ({record['collapsed']} of {record['n']} seeds "
            f"collapsed): this {NO_PREVENTION}")
