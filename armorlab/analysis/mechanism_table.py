"""Did each remedy's mechanism act? Per group, the mean over seeds of each run's mean of its per-step
telemetry (docs/metrics.md), the share of clipped gradient steps and early/late diversity of correct samples.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from armorlab.analysis import groups as G
from armorlab.analysis import tables
from armorlab.analysis.load import RunSet
from armorlab.stats import seeds as stats

# metric → column label; every one a per-step share or cosine (docs/metrics.md)
MEAN_OVER_STEPS = {
    "obj/clip_frac": "clipped", "obj/widened_frac": "widened", "obj/narrowed_frac": "narrowed",
    "obj/freed_frac": "freed of clipped", "anchor/gate_drop": "gate drop", "anchor/rate": "anchor rate",
    "obj/anchor_grad_share": "anchor grad share", "obj/kl_grad_share": "KL grad share",
    "obj/kl_grad_cos": "cos(KL, policy grad)"}
DIVERSITY = "train/correct_distinct"
EDGE = 0.2  # the first and last fifth of a run's logged steps are its start and end
TRL_MAX_GRAD_NORM = 1.0  # transformers' default, used where a run's config does not state it


def edges(values: np.ndarray) -> tuple[float, float]:
    """(mean of the first EDGE share of the values, mean of the last): a run's start and end level."""
    if values.size == 0:
        return math.nan, math.nan
    k = max(1, int(math.ceil(EDGE * values.size)))
    return float(np.mean(values[:k])), float(np.mean(values[-k:]))


def _cell(values: list[float]) -> tuple[str, float]:
    s = stats.summarise(values)
    return tables.fmt_ci(s.mean, s.ci_low, s.ci_high), s.mean


def mechanism_table(rs: RunSet, groups: G.Groups) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(display table of mean [95% CI], numbers table) per group; None when no mechanism metric was logged."""
    present = [m for m in MEAN_OVER_STEPS if m in rs.metrics]
    has_norm, has_div = "train/grad_norm" in rs.metrics, DIVERSITY in rs.metrics
    if not (present or has_norm or has_div):
        return None
    limit = rs.runs.set_index("run_id").get("max_grad_norm", pd.Series(dtype=float)).fillna(TRL_MAX_GRAD_NORM)
    shown, numbers = [], []
    for g in groups.labels:
        members = groups.members[g]
        row, num = {"group": g}, {"group": g, "seeds": len(members)}
        for m in present:
            per_run = [float(np.nanmean(v)) for r in members for _, v in [rs.curve(r, m)] if np.isfinite(v).any()]
            row[MEAN_OVER_STEPS[m]], num[m] = _cell(per_run)
        if has_norm:  # the share of a run's steps whose pre-clip gradient norm exceeds its max_grad_norm
            norms = [(rs.curve(r, "train/grad_norm")[1], float(limit.get(r, TRL_MAX_GRAD_NORM))) for r in members]
            row["grad clipped"], num["grad_clipped"] = _cell([float(np.mean(v > cap)) if cap > 0 else 0.0
                                                             for v, cap in norms if v.size])
        if has_div:
            pairs = [edges(rs.curve(r, DIVERSITY)[1]) for r in members]
            start, end = _cell([a for a, _ in pairs])[1], _cell([b for _, b in pairs])[1]
            row["distinct correct (start → end)"] = "—" if not math.isfinite(start) else f"{start:.2f} → {end:.2f}"
            num["correct_distinct_start"], num["correct_distinct_end"] = start, end
        shown.append(row)
        numbers.append(num)
    return pd.DataFrame(shown), pd.DataFrame(numbers)


INTRO = (
    "<p>Whether each remedy's mechanism acted, per group: the mean over seeds (95% CI) of each run's mean "
    "over steps. <b>clipped</b>: share of tokens whose update the objective's own clip stopped "
    "(<code>obj/clip_frac</code>). <b>widened</b> / <b>narrowed</b>: share of tokens whose update the "
    "objective's ratio let through where DAPO's plain clip on π_θ/π_old would have stopped it, and the "
    "reverse (<code>obj/widened_frac</code>, <code>obj/narrowed_frac</code>: ARMOR's widened region, UP's "
    "unbounded positive branch; 0 by construction for DAPO). <b>freed of clipped</b>: of the tokens that "
    "plain clip stops, the share the objective lets through (<code>obj/freed_frac</code>; r_mix lies between "
    "1 and r, so ARMOR's widened tokens are some of the plain-clipped ones). <b>gate drop</b>: share of groups the query "
    "gate removed. <b>anchor grad share</b>: ‖g_anchor‖/(‖g_anchor‖+‖g_on-policy‖) of the policy gradient. "
    "<b>KL grad share</b>: ‖g_KL‖/(‖g_KL‖+‖g_policy‖) of the β·KL term, and the cosine between the two "
    "(−1: the penalty pulls straight back). <b>grad clipped</b>: share of optimizer steps whose gradient norm "
    "before clipping exceeded <code>max_grad_norm</code> (at 1 the clip and Adam set every step's size, "
    "whatever the loss). <b>distinct correct</b>: different correct completions among a group's G − 1 "
    "on-policy samples, over the first and the last fifth of the run (mode collapse). "
    "Definitions: docs/metrics.md.</p>")
