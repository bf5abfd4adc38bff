"""The verdict of a comparison: an arm better than, worse than or equivalent to its baseline on an
endpoint, or not resolved yet and how many seeds would resolve it (per report: analysis.verdict_table;
look by look: stats.sequential). The equations in full: docs/verdicts.md.
    (W1) d = x̄ − ȳ, se² = s_x²/n_x + s_y²/n_y    (W2) Welch–Satterthwaite ν    (W3) d ± t_{1−a/2, ν}·se
    (H1) Holm (1979) over the m arms, each interval at the level its arm was tested at, so it excludes 0
         exactly when Holm rejects
    (E1) equivalent when that interval lies inside (−δ, δ) (two one-sided tests, Schuirmann 1987)
    (P1) power of the two-sided two-sample t-test (noncentral t)    (P2) seeds per arm for (P1) ≥ 1 − β
δ is a margin declared before the first look (stats.margins), never a noise unit: without one nothing
is called equivalent and no seeds are planned.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from armorlab.stats.margins import NO_MARGIN, NO_PREVENTION
from armorlab.stats.seeds import finite, sps

ALPHA = 0.05
POWER = 0.8
MAX_SEEDS_PLANNED = 1000   # (P2) gives up above this many seeds per arm
# endpoints where a smaller value is the better one (the drop from the peak)
LOWER_IS_BETTER = frozenset({"drop", "drop_rel", "drop_z"})

BETTER, WORSE, EQUIVALENT, UNRESOLVED, TOO_FEW = "better", "worse", "equivalent", "not resolved", "too few seeds"


@dataclass(frozen=True)
class Welch:
    """(W1)/(W2) of arm x against baseline y."""
    diff: float
    se: float
    df: float
    n_x: int
    n_y: int
    mean_x: float
    mean_y: float
    sd_x: float
    sd_y: float

    @property
    def pooled_sd(self) -> float:
        """√((s_x² + s_y²)/2): the seed-to-seed spread (P1) plans with."""
        return math.sqrt((self.sd_x ** 2 + self.sd_y ** 2) / 2)


def welch(x, y) -> Welch:
    """(W1)/(W2), NaNs dropped; se and ν NaN below two values a side; no spread: se = 0, ν = n_x + n_y − 2."""
    x, y = finite(x), finite(y)
    nx, ny = int(x.size), int(y.size)
    mx, my = (float(a.mean()) if a.size else math.nan for a in (x, y))
    if nx < 2 or ny < 2:
        return Welch(mx - my, math.nan, math.nan, nx, ny, mx, my, math.nan, math.nan)
    vx, vy = float(x.var(ddof=1)), float(y.var(ddof=1))
    ax, ay = vx / nx, vy / ny
    se2 = ax + ay
    den = ax * ax / (nx - 1) + ay * ay / (ny - 1)
    df = se2 * se2 / den if den > 0 else float(nx + ny - 2)
    return Welch(mx - my, math.sqrt(se2), df, nx, ny, mx, my, math.sqrt(vx), math.sqrt(vy))


def welch_interval(w: Welch, level: float) -> tuple[float, float]:
    """(W3) by scipy.stats.t.interval (NaN without a spread estimate)."""
    if not math.isfinite(w.se):
        return math.nan, math.nan
    if w.se == 0:
        return w.diff, w.diff
    lo, hi = sps.t.interval(1 - level, w.df, loc=w.diff, scale=w.se)
    return float(lo), float(hi)


def welch_p(w: Welch) -> float:
    """(W3) by scipy.stats.ttest_ind_from_stats(equal_var=False)."""
    if not math.isfinite(w.se):
        return math.nan
    if w.se == 0:
        return 0.0 if w.diff != 0 else 1.0
    return float(sps.ttest_ind_from_stats(w.mean_x, w.sd_x, w.n_x, w.mean_y, w.sd_y, w.n_y,
                                          equal_var=False).pvalue)


def holm(p: Sequence[float], alpha: float = ALPHA) -> tuple[list[bool], list[float]]:
    """(H1) by statsmodels' multipletests: rejected, and each arm's level. A NaN p-value (too few seeds)
    is one of the m hypotheses, never rejected."""
    from statsmodels.stats.multitest import multipletests

    m = len(p)
    if m == 0:
        return [], []
    rejected = [bool(r) for r in multipletests(np.nan_to_num(np.asarray(p, dtype=np.float64), nan=1.0),
                                               alpha=alpha, method="holm")[0]]
    levels = [alpha / max(m - sum(rejected), 1)] * m
    for j, i in enumerate(sorted((i for i in range(m) if rejected[i]), key=lambda i: p[i])):
        levels[i] = alpha / (m - j)
    return rejected, levels


def t_test_power(n: int, delta: float, sd: float, level: float = ALPHA) -> float:
    """(P1) by statsmodels' TTestIndPower. scipy's noncentral t is NaN at a large noncentrality nc (seen at
    nc > 5.9 only): then the near tail alone (the far one is below Φ(−nc) < 2e-9), and 1 where that is NaN
    too (seen at nc > 36 only, where a simulation rejects every time)."""
    from statsmodels.stats.power import TTestIndPower

    if n < 2 or not (sd > 0) or not math.isfinite(sd):
        return math.nan
    power = TTestIndPower().power(abs(delta) / sd, n, level, ratio=1.0, alternative="two-sided")
    if math.isnan(power):
        power = TTestIndPower().power(abs(delta) / sd, n, level / 2, ratio=1.0, alternative="larger")
    return 1.0 if math.isnan(power) else float(power)


def seeds_for_power(delta: float, sd: float, level: float = ALPHA, power: float = POWER,
                    n_max: int = MAX_SEEDS_PLANNED) -> int | None:
    """(P2) the fewest seeds per arm whose (P1) reaches ``power``, by bisection (statsmodels' solver can
    return NaN where n = 2 nearly suffices); None above ``n_max`` or without a spread (sd NaN); with no
    spread at all, 2 seeds already resolve any δ > 0."""
    if not (delta > 0) or not math.isfinite(sd):
        return None
    if sd == 0:
        return 2
    if t_test_power(n_max, delta, sd, level) < power:
        return None
    ns = range(2, n_max + 1)
    return ns[bisect.bisect_left(ns, True, key=lambda n: t_test_power(n, delta, sd, level) >= power)]


@dataclass(frozen=True)
class Verdict:
    """One arm against its baseline on one endpoint: ``diff`` = arm − baseline, ``low``/``high`` its (H1)
    interval at ``level``; ``within_delta``: inside ±δ (E1), also when better/worse (then by less than δ);
    ``seeds_needed``: (P2) while unresolved; ``caveat``: why it cannot show prevention (stats.margins)."""
    arm: str
    baseline: str
    endpoint: str
    n_arm: int
    n_baseline: int
    mean_arm: float
    mean_baseline: float
    diff: float
    low: float
    high: float
    level: float
    p: float
    verdict: str
    within_delta: bool
    delta: float
    sd: float
    seeds_needed: int | None
    higher_is_better: bool
    caveat: str = ""


def classify(diff: float, low: float, high: float, rejected: bool, delta: float,
             higher_is_better: bool) -> tuple[str, bool]:
    """Better/worse when Holm rejects, equivalent inside ±δ (E1), else not resolved; and whether inside."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return TOO_FEW, False
    inside = bool(math.isfinite(delta) and -delta < low and high < delta)
    if rejected:
        return (BETTER if (diff > 0) == higher_is_better else WORSE), inside
    return (EQUIVALENT if inside else UNRESOLVED), inside


def compare(values: Mapping[str, Sequence[float]], pairs: Sequence[tuple[str, str]], endpoint: str, *,
            delta: float = math.nan, alpha: float = ALPHA, power: float = POWER,
            higher_is_better: bool | None = None) -> list[Verdict]:
    """Verdicts of every (arm, baseline) pair on one endpoint: W1–W3, H1 over the pairs, E1, P2."""
    if higher_is_better is None:
        higher_is_better = endpoint not in LOWER_IS_BETTER
    tests = [welch(values.get(a, ()), values.get(b, ())) for a, b in pairs]
    p = [welch_p(w) for w in tests]
    rejected, levels = holm(p, alpha)
    first_level = alpha / len(pairs) if pairs else alpha
    out = []
    for (a, b), w, pv, rej, level in zip(pairs, tests, p, rejected, levels, strict=True):
        lo, hi = welch_interval(w, level)
        verdict, inside = classify(w.diff, lo, hi, rej, delta, higher_is_better)
        needed = (seeds_for_power(delta, w.pooled_sd, first_level, power)
                  if verdict in (UNRESOLVED, TOO_FEW) and math.isfinite(delta) else None)
        out.append(Verdict(a, b, endpoint, w.n_x, w.n_y, w.mean_x, w.mean_y, w.diff, lo, hi, level, pv,
                           verdict, inside, delta, w.pooled_sd, needed, higher_is_better))
    return out


def with_caveat(v: Verdict, caveat: str) -> Verdict:
    """``v`` carrying ``caveat``; equivalent becomes cannot show prevention: level with a baseline that
    did not fall is no evidence of preventing a fall."""
    if not caveat:
        return v
    return replace(v, caveat=caveat, verdict=NO_PREVENTION if v.verdict == EQUIVALENT else v.verdict)


# --------------------------------------------------------------------------- words
def signed(v: float, digits: int = 3) -> str:
    """+0.012 / −0.031 (a true minus sign); — for NaN."""
    if v is None or not math.isfinite(v):
        return "—"
    text = f"{abs(v):.{digits}f}"
    return ("−" if v < 0 and float(text) != 0 else "+") + text


def seeds_phrase(n_arm: int, n_baseline: int) -> str:
    return f"{n_arm} seeds per arm" if n_arm == n_baseline else f"{n_arm} vs {n_baseline} seeds"


def more_runs(v: Verdict) -> int:
    """Runs a fixed design of (P2) adds to this comparison: both arms up to seeds_needed."""
    if v.seeds_needed is None:
        return 0
    return max(0, v.seeds_needed - v.n_arm) + max(0, v.seeds_needed - v.n_baseline)


def sentence(v: Verdict, label: str, *, names: Mapping[str, str] | None = None,
             hours: float | None = None) -> str:
    """One plain sentence: ``armor vs dapo: −0.031 [−0.052, −0.010] final level of val/acc — worse,
    resolved with 7 seeds per arm``; ``hours``: what the extra runs of an unresolved
    comparison cost (None: run times unknown)."""
    names = names or {}
    head = (f"{names.get(v.arm, v.arm)} vs {names.get(v.baseline, v.baseline)}: {signed(v.diff)} "
            f"[{signed(v.low)}, {signed(v.high)}] {label}")
    seeds = seeds_phrase(v.n_arm, v.n_baseline)
    d = f"{v.delta:.3f}" if math.isfinite(v.delta) else None
    but = f"; {v.caveat}" if v.caveat else ""
    if v.verdict in (BETTER, WORSE):
        small = f" (by less than δ = {d})" if v.within_delta and d else ""
        return f"{head} — {v.verdict}{small}, resolved with {seeds}{but}"
    if v.verdict == EQUIVALENT:
        return f"{head} — equivalent within ±{d}, resolved with {seeds}"
    if v.verdict == NO_PREVENTION:
        return f"{head} — within ±{d} with {seeds}, but {v.caveat}"
    what = "too few seeds for an interval" if v.verdict == TOO_FEW else f"not resolved with {seeds}"
    if d is None:
        return f"{head} — {what}: {NO_MARGIN} (compare.delta or --delta) for equivalence or a seed plan{but}"
    if v.seeds_needed is None:
        why = ("no seed-to-seed spread measured yet" if not math.isfinite(v.sd)
               else f"more than {MAX_SEEDS_PLANNED} seeds per arm")
        return f"{head} — {what}; 80% power at δ = {d} needs {why}{but}"
    extra = more_runs(v)
    cost = f", ≈ {hours:.1f} h of runs" if hours is not None and math.isfinite(hours) and extra else ""
    return (f"{head} — {what}; 80% power at δ = {d} needs {v.seeds_needed} seeds per arm "
            f"({extra} more runs{cost}){but}")
