"""Equivalence margins and whether a comparison can show prevention. Pure functions, no I/O.

An equivalence margin δ is an effect of interest fixed before the first look: ``compare.delta``
of a sweep spec (seeds until resolved) or of a report recipe. It is never a noise unit: twice one
evaluation's standard error shrinks as evaluations grow, so with a large val set two arms that
differ by an effect anyone cares about would still pass as "equivalent". Without a declared
margin no comparison is called equivalent; it stays "not resolved — no margin declared".

A comparison on a final or collapse endpoint (``PREVENTION_ENDPOINTS``) asks whether an arm
prevented the fall its baseline shows. When the baseline did not fall, an arm that ends level
with it (or above it) shows nothing about prevention, so every such verdict says so:

    (F1) The baseline fell when more of its n seeds show a collapse than flat curves would give:
         k seeds collapse (armorlab.stats.collapse C5: significantly below their own earlier
         peak, and by at least collapse.delta), each of which happens on a flat curve with
         probability ≤ α_c (the detector's calibrated false-alarm rate); the baseline fell when
         P(Bin(n, α_c) ≥ k) ≤ a, a = 0.05 (scipy.stats.binom). With α_c = 0.04 that is k ≥ 1
         for n = 1 and k ≥ 2 for 2 ≤ n ≤ 9. benchmarks/sequential_seeds.py measures how often a
         baseline that truly collapses is missed.
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
    """Where a comparison's margin comes from, as looks.json and the report record it (``flag``: the
    command-line option that also sets it, ``--delta`` of `armorlab report`)."""
    if delta is None or not math.isfinite(delta):
        return f"{NO_MARGIN}: no equivalence verdict (set compare.delta{f' or {flag}' if flag else ''})"
    return f"declared: compare.delta in {file}" if file else "declared: compare.delta"


def fell_p(collapsed: int, n: int, curve_alpha: float) -> float:
    """(F1) P(Bin(n, α_c) ≥ k): how often ``collapsed`` of ``n`` flat curves would show a collapse."""
    from scipy.stats import binom  # lazy: spec parsing reads PREVENTION_ENDPOINTS without scipy

    if n <= 0:
        return math.nan
    return float(binom.sf(collapsed - 1, n, curve_alpha))


def baseline_fell(collapsed: int, n: int, curve_alpha: float, level: float = ALPHA) -> bool | None:
    """(F1); None without a seed to judge."""
    p = fell_p(collapsed, n, curve_alpha)
    return None if math.isnan(p) else p <= level


def prevention(baseline: str, collapsed: int, n: int, curve_alpha: float) -> dict[str, Any]:
    """The record of (F1) for one baseline: looks.json and the report keep it as is."""
    return {"baseline": baseline, "collapsed": int(collapsed), "n": int(n), "curve_alpha": curve_alpha,
            "p": fell_p(collapsed, n, curve_alpha), "fell": baseline_fell(collapsed, n, curve_alpha)}


def caveat(record: dict[str, Any] | None, endpoint: str, name: str | None = None) -> str:
    """``dapo did not fall here (0 of 3 seeds collapsed): this cannot show prevention`` where
    (F1) finds no fall and ``endpoint`` is about one; empty otherwise."""
    if not record or endpoint not in PREVENTION_ENDPOINTS or record.get("fell") is not False:
        return ""
    return (f"{name or record['baseline']} did not fall here ({record['collapsed']} of {record['n']} seeds "
            f"collapsed): this {NO_PREVENTION}")
