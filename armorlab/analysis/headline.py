"""The demo's headline: did validation rise then collapse, by how many standard errors, and how did
each remedy fare against the baseline? Per run: the report's scores (armorlab.stats.collapse: peak and
final are levels, not evals), beside them the first (``start``: the warm-started model or a continued
arm's checkpoint), best and last evals, ``drop_start`` (a continued arm that only fell has no drop from
its own peak) and the train reward at both ends. Per group: means over seeds, collapsed seeds k/n, and
(H1) P(final of X > final of the baseline) over seed pairs, ties ½ (Agarwal et al., 2021).
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
        (vs, vv), tv = curve(r["run_id"], val_metric), curve(r["run_id"], train_metric)[1]
        peak, final = (float(r.get(k, math.nan)) for k in ("peak", "final"))
        start = float(vv[0]) if vv.size else math.nan
        rows.append({
            "run_id": r["run_id"], "group": r["group"], "seed": r.get("seed"), "state": r.get("state"),
            "start": start, "peak": peak, "peak_step": r.get("peak_step"),
            "final": final, "final_step": int(vs[-1]) if vs.size else None,
            "drop": peak - final, "drop_se": float(r.get("drop_z", math.nan)),
            "collapse_step": r.get("collapse_step"),
            "best": float(np.max(vv)) if vv.size else math.nan, "last": float(vv[-1]) if vv.size else math.nan,
            "drop_start": start - final,
            "train_start": float(tv[:TRAIN_WINDOW].mean()) if tv.size else math.nan,
            "train_end": float(tv[-TRAIN_WINDOW:].mean()) if tv.size else math.nan})
    return pd.DataFrame(rows)


def group_rows(runs: pd.DataFrame, order: Sequence[str], baseline: str | None) -> pd.DataFrame:
    """One row per group, in ``order``: means over seeds and P(final > baseline's final)."""
    out = []
    base_final = runs.loc[runs["group"] == baseline, "final"].to_numpy(dtype=float) if baseline else None
    for g in order:
        sub = runs[runs["group"] == g]
        if sub.empty:
            continue
        cs = pd.to_numeric(sub["collapse_step"], errors="coerce").dropna()
        compared = base_final is not None and g != baseline
        finals = sub["final"].to_numpy(dtype=float)
        out.append({
            "group": g, "seeds": len(sub), **sub[["start", "peak"]].mean(),
            "peak_step": sub["peak_step"].astype(float).median(),
            **sub[["final", "drop", "drop_se"]].mean(),
            **{k: sub[k].mean() if k in sub else math.nan for k in ("best", "last", "drop_start")},
            "collapsed": f"{len(cs)}/{len(sub)}", "collapse_step": float(cs.median()) if len(cs) else math.nan,
            **sub[["train_start", "train_end"]].mean(),
            "poi_final": probability_of_improvement(finals, base_final) if compared else math.nan,
            "mw_p": mann_whitney_p(finals, base_final) if compared else math.nan,
            "resolvable": compared and poi_resolvable(len(finals), len(base_final))})
    return pd.DataFrame(out)


def display(table: pd.DataFrame, baseline: str | None, unit: str = "step") -> pd.DataFrame:
    """The headline table as strings; ``unit`` names what the steps count (step or rollout)."""
    def f(v, fmt="{:.3f}"):
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    return pd.DataFrame([{
        "group": r["group"], "seeds": r["seeds"], f"{unit} 0": f(r["start"]),
        f"peak level ({unit})": f"{f(r['peak'])} ({f(r['peak_step'], '{:.0f}')})", "best eval": f(r.get("best")),
        "final level": f(r["final"]), "last eval": f(r.get("last")),
        "drop from peak level (SEs)": f"{f(r['drop'])} ({f(r['drop_se'], '{:.1f}')})",
        f"drop from {unit} 0": f(r.get("drop_start")),
        f"collapsed ({unit})": f"{r['collapsed']} ({f(r['collapse_step'], '{:.0f}')})",
        "train reward": f"{f(r['train_start'], '{:.2f}')} → {f(r['train_end'], '{:.2f}')}",
        f"P(final > {baseline or 'baseline'})": "—" if r["group"] == baseline else f(r["poi_final"], "{:.2f}"),
    } for r in table.to_dict("records")])


def verdict(table: pd.DataFrame, baseline: str | None, names: dict[str, str] | None = None,
            unit: str = "step", curve_alpha: float = COLLAPSE_ALPHA) -> list[str]:
    """Plain sentences: the baseline's rise and fall, then each other group against it (``unit``: step or
    rollout). Where the baseline did not fall (margins F1, ``curve_alpha`` the collapse test's false-alarm
    rate) every comparison says it cannot show prevention."""
    names, lines, but = names or {}, [], ""
    rows = {r["group"]: r for r in table.to_dict("records")}
    b, base = rows.get(baseline), names.get(baseline, baseline)
    seeds = int(table["seeds"].min()) if len(table) else 0
    if b is not None:
        rose = b["peak"] - b["start"]
        best = f"; best single eval {b['best']:.3f}" if math.isfinite(b.get("best", math.nan)) else ""
        last = f" (last eval {b['last']:.3f})" if math.isfinite(b.get("last", math.nan)) else ""
        shape = (f"rose from {b['start']:.3f} at {unit} 0 to a peak level of {b['peak']:.3f} (median {unit} "
                 f"{b['peak_step']:.0f}{best})" if rose > 0 else
                 f"did not rise above its start ({b['start']:.3f} at {unit} 0; peak level {b['peak']:.3f}{best})")
        from_start = b.get("drop_start", math.nan)
        k, n = (int(x) for x in str(b["collapsed"]).split("/"))
        but = caveat(prevention(base, k, n, curve_alpha), "final")
        lines.append(
            f"{base}: held-out accuracy {shape}, then ended at a final level of {b['final']:.3f}{last}: "
            + (f"{from_start:.3f} below its start, " if math.isfinite(from_start) and rose <= 0 else "")
            + f"a drop of {b['drop']:.3f} from its peak level, {b['drop_se']:.1f} standard errors of the evaluation "
            f"noise, while train reward went {b['train_start']:.2f} → {b['train_end']:.2f}. Levels are means of "
            f"consecutive evals. Collapse detected in {b['collapsed']} seeds."
            + (f" It did not fall beyond its noise ({k} of {n} seeds collapsed): no comparison below can show "
               "prevention." if but else ""))
    for g, r in rows.items():
        if g == baseline:
            continue
        p, mw = r["poi_final"], r["mw_p"]
        side = f"ended {'above' if p > 0.5 else 'below'} {base}"
        if b is None or math.isnan(p):
            how = "no baseline to compare with"
        elif r["resolvable"] and mw <= 0.05:
            how = f"{side} (Mann–Whitney p = {mw:.3f})"
        elif p >= 0.999 or p <= 0.001:
            how = (f"{side} in every seed pair, which a rank test cannot resolve with {r['seeds']} vs {b['seeds']} "
                   f"seeds (Mann–Whitney p = {mw:.2f}; the verdicts compare means)")
        else:
            how = f"no consistent ordering against {base} (Mann–Whitney p = {mw:.2f})"
        lines.append(f"{names.get(g, g)}: final level {r['final']:.3f} vs {b['final'] if b else math.nan:.3f}, "
                     f"P(final > {base}) = {p:.2f}: {how}; drop from its own peak level {r['drop']:.3f} "
                     f"({r['drop_se']:.1f} SEs), from {unit} 0 {r.get('drop_start', math.nan):.3f}, collapse "
                     f"detected in {r['collapsed']} seeds" + (f"; {but}." if but else "."))
    if seeds and seeds < 5:
        lines.append(f"{seeds} seed(s) per group: P(X > Y) takes only a few values and one seed can flip it; "
                     f"read these as a demonstration, and run more seeds before concluding anything.")
    return lines
