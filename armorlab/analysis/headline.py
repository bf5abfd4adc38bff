"""The demo's headline: did validation rise then collapse, by how many standard errors, and how
did each remedy fare against the baseline? Pure pandas/numpy over the report's per-run scores.

Per run (``run_rows``):
    start        first val value (the warm-started model, step 0)
    peak, peak_step, final, drop, drop_z, collapse_step   the report's per-run scores
                 (armorlab.stats.collapse: peak and final are levels, means of m evals; drop_z
                 is the drop in standard errors of the eval noise, binomial from ``val/n``;
                 collapse_step is the onset of a fall the noise cannot explain, calibrated to a
                 fixed false-alarm rate on flat curves)
    train_start, train_end   mean train reward over the first and last ``TRAIN_WINDOW`` logged steps
Per group (``group_rows``): means over seeds, collapsed seeds k/n with their median collapse step,
and (H1) P(final of X > final of baseline) over all seed pairs (ties ½), the probability of
improvement of Agarwal et al. (2021) on the level each run ends with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from armorlab.core.eval_sets import VAL_METRIC
from armorlab.stats.collapse import ALPHA as COLLAPSE_ALPHA
from armorlab.stats.margins import caveat, prevention
from armorlab.stats.seeds import mann_whitney_p, poi_resolvable, probability_of_improvement

TRAIN_WINDOW = 10
Curve = Callable[[str, str], tuple[np.ndarray, np.ndarray]]


def run_rows(per_run: pd.DataFrame, curve: Curve, *, val_metric: str = VAL_METRIC,
             train_metric: str = "train/reward") -> pd.DataFrame:
    """One row per run with the headline quantities (see the module docstring)."""
    rows = []
    for r in per_run.to_dict("records"):
        rid = r["run_id"]
        vs, vv = curve(rid, val_metric)
        _, tv = curve(rid, train_metric)
        peak, final = float(r.get("peak", math.nan)), float(r.get("final", math.nan))
        rows.append({
            "run_id": rid, "group": r["group"], "seed": r.get("seed"), "state": r.get("state"),
            "start": float(vv[0]) if vv.size else math.nan, "peak": peak, "peak_step": r.get("peak_step"),
            "final": final, "final_step": int(vs[-1]) if vs.size else None,
            "drop": peak - final, "drop_se": float(r.get("drop_z", math.nan)), "collapse_step": r.get("collapse_step"),
            "train_start": float(tv[:TRAIN_WINDOW].mean()) if tv.size else math.nan,
            "train_end": float(tv[-TRAIN_WINDOW:].mean()) if tv.size else math.nan,
        })
    return pd.DataFrame(rows)


def _collapsed(steps: pd.Series) -> list[float]:
    return [float(s) for s in steps if s is not None and not (isinstance(s, float) and math.isnan(s))]


def group_rows(runs: pd.DataFrame, order: Sequence[str], baseline: str | None) -> pd.DataFrame:
    """One row per group, in ``order``: means over seeds and P(final > baseline's final)."""
    out = []
    base_final = runs.loc[runs["group"] == baseline, "final"].to_numpy(dtype=float) if baseline else None
    for g in order:
        sub = runs[runs["group"] == g]
        if sub.empty:
            continue
        cs = _collapsed(sub["collapse_step"])
        compared = base_final is not None and g != baseline
        finals = sub["final"].to_numpy(dtype=float)
        poi = probability_of_improvement(finals, base_final) if compared else math.nan
        mw_p = mann_whitney_p(finals, base_final) if compared else math.nan
        resolvable = compared and poi_resolvable(len(finals), len(base_final))
        out.append({
            "group": g, "seeds": len(sub), "start": sub["start"].mean(), "peak": sub["peak"].mean(),
            "peak_step": sub["peak_step"].astype(float).median(), "final": sub["final"].mean(),
            "drop": sub["drop"].mean(), "drop_se": sub["drop_se"].mean(),
            "collapsed": f"{len(cs)}/{len(sub)}", "collapse_step": float(np.median(cs)) if cs else math.nan,
            "train_start": sub["train_start"].mean(), "train_end": sub["train_end"].mean(), "poi_final": poi,
            "mw_p": mw_p, "resolvable": resolvable,
        })
    return pd.DataFrame(out)


def display(table: pd.DataFrame, baseline: str | None, unit: str = "step") -> pd.DataFrame:
    """The headline table as strings, for the terminal, Markdown and the HTML report; ``unit`` names
    what the steps count (step or rollout)."""
    def f(v, fmt="{:.3f}"):
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    rows = []
    for r in table.to_dict("records"):
        rows.append({
            "group": r["group"], "seeds": r["seeds"], f"{unit} 0": f(r["start"]),
            f"peak ({unit})": f"{f(r['peak'])} ({f(r['peak_step'], '{:.0f}')})", "final": f(r["final"]),
            "drop (SEs)": f"{f(r['drop'])} ({f(r['drop_se'], '{:.1f}')})",
            f"collapsed ({unit})": f"{r['collapsed']} ({f(r['collapse_step'], '{:.0f}')})",
            "train reward": f"{f(r['train_start'], '{:.2f}')} → {f(r['train_end'], '{:.2f}')}",
            f"P(final > {baseline or 'baseline'})": "—" if r["group"] == baseline else f(r["poi_final"], "{:.2f}"),
        })
    return pd.DataFrame(rows)


def verdict(table: pd.DataFrame, baseline: str | None, names: dict[str, str] | None = None,
            unit: str = "step", curve_alpha: float = COLLAPSE_ALPHA) -> list[str]:
    """Plain sentences: the baseline's rise and fall, then each other group against it; ``unit``
    names what the steps count (step or rollout). Where the baseline did not fall (margins F1,
    ``curve_alpha`` the collapse test's false-alarm rate) every comparison says it cannot show
    prevention."""
    names = names or {}

    def name(g):
        return names.get(g, g)

    lines, but = [], ""
    rows = {r["group"]: r for r in table.to_dict("records")}
    seeds = int(table["seeds"].min()) if len(table) else 0
    if baseline in rows:
        b = rows[baseline]
        rose = b["peak"] - b["start"]
        shape = (f"rose from {b['start']:.3f} at {unit} 0 to a peak of {b['peak']:.3f} (median {unit} "
                 f"{b['peak_step']:.0f})" if rose > 0 else f"did not rise above its start ({b['start']:.3f})")
        lines.append(
            f"{name(baseline)}: held-out accuracy {shape}, then ended at {b['final']:.3f}: a drop of "
            f"{b['drop']:.3f}, {b['drop_se']:.1f} standard errors of the evaluation noise, while train reward went "
            f"{b['train_start']:.2f} → {b['train_end']:.2f}. Collapse detected in {b['collapsed']} seeds.")
        k, n = (int(x) for x in str(b["collapsed"]).split("/"))
        but = caveat(prevention(name(baseline), k, n, curve_alpha), "final")
        if but:
            lines[-1] += (f" It did not fall beyond its noise ({k} of {n} seeds collapsed): no comparison below "
                          "can show prevention.")

    for g, r in rows.items():
        if g == baseline:
            continue
        p = r["poi_final"]
        if baseline not in rows or math.isnan(p):
            how = "no baseline to compare with"
        elif r["resolvable"] and r["mw_p"] <= 0.05:
            how = (f"ended {'above' if p > 0.5 else 'below'} {name(baseline)} "
                   f"(Mann–Whitney p = {r['mw_p']:.3f})")
        elif p >= 0.999 or p <= 0.001:
            how = (f"ended {'above' if p > 0.5 else 'below'} {name(baseline)} in every seed pair, which a rank "
                   f"test cannot resolve with {r['seeds']} vs {rows[baseline]['seeds']} seeds (Mann–Whitney p = "
                   f"{r['mw_p']:.2f}; the verdicts compare means)")
        else:
            how = f"no consistent ordering against {name(baseline)} (Mann–Whitney p = {r['mw_p']:.2f})"
        final_b = rows[baseline]["final"] if baseline in rows else math.nan
        lines.append(f"{name(g)}: final {r['final']:.3f} vs {final_b:.3f}, P(final > {name(baseline)}) = {p:.2f}: "
                     f"{how}; drop from its own peak {r['drop']:.3f} ({r['drop_se']:.1f} SEs), collapse "
                     f"detected in {r['collapsed']} seeds" + (f"; {but}." if baseline in rows and but else "."))
    if seeds and seeds < 5:
        lines.append(f"{seeds} seed(s) per group: P(X > Y) takes only a few values and one seed can flip it; "
                     f"read these as a demonstration, and run more seeds before concluding anything.")
    return lines
