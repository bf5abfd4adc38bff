"""The report's verdict table, first on the page: each compared arm against its baseline on the
recipe's endpoints (``compare: {endpoints, delta}``), from the report's per-run scores, with
one plain sentence per arm on the primary endpoint. The statistics are armorlab.analysis.verdicts';
this module only gathers their inputs (scores per group, eval sizes, run times from status.json)
and formats what they return.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from armorlab.analysis import stats, tables
from armorlab.analysis import verdicts as V
from armorlab.analysis.groups import Notes, group_rows, numeric_columns
from armorlab.analysis.html import Section, esc
from armorlab.analysis.load import RunSet
from armorlab.analysis.recipe import DEFAULT_ENDPOINTS, Recipe, Select
from armorlab.core.fsutil import atomic_write_text
from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError


@dataclass
class VerdictTable:
    verdicts: list[V.Verdict]
    deltas: dict[str, tuple[float, str]]          # endpoint → (δ, how it was set)
    sentences: list[str]
    display: pd.DataFrame
    numbers: pd.DataFrame
    summary: str = ""
    labels: dict[str, str] = field(default_factory=dict)


def endpoint_label(endpoint: str, val_metric: str, test_metric: str) -> str:
    fixed = {"final": f"final {val_metric}", "drop": f"drop from peak of {val_metric}",
             "selected_test": f"{test_metric} at the val-selected step", "peak": f"peak {val_metric}"}
    return fixed.get(endpoint) or tables.score_label(endpoint, val_metric, test_metric)


def _metric_of(endpoint: str, val_metric: str, test_metric: str) -> str:
    """The metric whose evaluations an endpoint is read from (its eval size sets the default δ)."""
    return test_metric if endpoint.startswith(("selected_test", "test@")) else val_metric


def higher_is_better(endpoint: str, mode: str) -> bool:
    """drop-like endpoints are better small; the others follow select.mode (max: larger is better).
    The drop is computed on the sign-corrected curve, so it is better small in either mode."""
    if endpoint in V.LOWER_IS_BETTER:
        return False
    return mode == "max"


def eval_size(rs: RunSet, run_ids: Sequence[str], metric: str) -> float:
    """Median completions behind one evaluation of ``metric`` (``val/n`` for ``val/acc``) over the
    runs' evaluations; NaN when the metric is not an ``acc`` or no ``n`` is logged."""
    ns, _, name = metric.rpartition("/")
    if name != "acc" or not ns:
        return math.nan
    sizes = [rs.curve(r, f"{ns}/n")[1] for r in run_ids]
    sizes = [s[np.isfinite(s) & (s > 0)] for s in sizes if s.size]
    return float(np.median(np.concatenate(sizes))) if sizes and any(s.size for s in sizes) else math.nan


def run_hours(rs: RunSet) -> dict[str, float]:
    """Wall hours of each completed run from status.json (started → ended; a resumed run counts
    its last attempt only)."""
    out = {}
    for run in rs.runs.itertuples(index=False):
        if run.state != "completed":
            continue
        try:  # a damaged or hand-edited status.json costs only its run's time
            status = RunDir(run.path).read_status()
            start, end = (datetime.fromisoformat(status[k]) for k in ("started", "ended"))
            hours = (end - start).total_seconds() / 3600
        except (OSError, ValueError, TypeError, KeyError, OverflowError):
            continue
        if hours > 0:
            out[run.run_id] = hours
    return out


def values_by_group(per_run: pd.DataFrame, endpoint: str) -> dict[str, list[float]]:
    """Each group's finite values of one per-run score: what sequential.decide_look takes."""
    if endpoint not in per_run.columns:
        raise ArmorLabError("not a score of these runs", key="endpoint", value=endpoint)
    numeric = numeric_columns(per_run, [endpoint])[endpoint]
    return {g: [float(v) for v in numeric[idx] if math.isfinite(v)] for g, idx in group_rows(per_run).items()}


def build(per_run: pd.DataFrame, rs: RunSet, recipe: Recipe, pairs: Sequence[tuple[str, str]],
          notes: Notes, names: Mapping[str, str] | None = None) -> VerdictTable | None:
    """Verdicts of every pair on every endpoint; None without a pair to compare."""
    if not pairs:
        return None
    sel, cmp_ = recipe.select, recipe.compare
    file = str(recipe.path) if recipe.path else None
    endpoints = list(cmp_.endpoints or DEFAULT_ENDPOINTS)
    scores = [c for c in per_run.columns if per_run[c].dtype.kind in "fiu" and c not in ("seed", "world_size")]
    for e in endpoints:
        if e not in scores:
            raise ArmorLabError(f"not a score of these runs (scores: {', '.join(scores)})",
                                key="compare.endpoints", value=e, file=file)
    at = group_rows(per_run)
    numeric = numeric_columns(per_run, endpoints)
    none = np.empty(0, dtype=np.int64)
    compared = list(dict.fromkeys(g for pair in pairs for g in pair))
    ids = per_run["run_id"].to_numpy()
    run_ids = [str(r) for g in compared for r in ids[at.get(g, none)]]
    hours = run_hours(rs)
    group_hours = {}
    for g in compared:
        timed = [hours[r] for r in ids[at.get(g, none)] if r in hours]
        if timed:
            group_hours[g] = float(np.mean(timed))
    verdicts, deltas = [], {}
    for e in endpoints:
        values = {g: numeric[e][at.get(g, none)] for g in compared}
        if cmp_.delta is not None:
            deltas[e] = (float(cmp_.delta), "compare.delta")
        else:
            deltas[e] = default_delta_for(per_run, rs, run_ids, e, sel, [at.get(g, none) for g in compared])
            d, metric = deltas[e][0], _metric_of(e, sel.metric, sel.report)
            if not math.isfinite(d):
                notes.add(f"verdicts on {e}: no δ (no eval size for {metric}): equivalence and seed "
                          f"planning need compare.delta")
        verdicts += V.compare(values, pairs, e, delta=deltas[e][0],
                              higher_is_better=higher_is_better(e, sel.mode))
    labels = {e: endpoint_label(e, sel.metric, sel.report) for e in endpoints}
    names = dict(names or {})
    primary = [v for v in verdicts if v.endpoint == endpoints[0]]
    sentences = [V.sentence(v, labels[v.endpoint], names=names, hours=_hours(v, group_hours))
                 for v in primary]
    return VerdictTable(verdicts, deltas, sentences, _display(verdicts, labels, names, per_run, at, numeric,
                                                            group_hours),
                        pd.DataFrame([v.as_dict() for v in verdicts]), _summary(primary, group_hours, labels[endpoints[0]]),
                        labels)


def default_delta_for(per_run: pd.DataFrame, rs: RunSet, run_ids: Sequence[str], endpoint: str, sel: Select,
                      rows: list[np.ndarray]) -> tuple[float, str]:
    """(D1)'s δ of one endpoint over the compared runs (``run_ids``, at ``rows`` of ``per_run``) and
    how it was set; NaN when the endpoint's metric logs no eval size. ``sel``: the recipe's select."""
    metric = _metric_of(endpoint, sel.metric, sel.report)
    n = eval_size(rs, run_ids, metric)
    level = _mean_level(per_run, endpoint, rows)
    d = V.default_delta(level, n)
    if not math.isfinite(d):
        return d, f"unknown: {metric} has no logged eval size; set compare.delta"
    return d, (f"twice one evaluation's standard error, 2·√(p(1 − p)/n) with n = {n:g} "
               f"({metric.rpartition('/')[0]}/n) at p = {level:.3f}")


def _mean_level(per_run: pd.DataFrame, endpoint: str, rows: list[np.ndarray]) -> float:
    """(D1)'s p: the compared runs' mean of the level the endpoint is read at (a drop or an AUC
    at the final level); NaN when none has it."""
    col = endpoint if endpoint in ("selected_test", "final", "peak") or "@" in endpoint else "final"
    if col not in per_run.columns:
        return math.nan
    x = numeric_columns(per_run, [col])[col][np.concatenate(rows)]
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def _hours(v: V.Verdict, group_hours: Mapping[str, float]) -> float | None:
    if v.seeds_needed is None or v.arm not in group_hours or v.baseline not in group_hours:
        return None
    return (max(0, v.seeds_needed - v.n_arm) * group_hours[v.arm]
            + max(0, v.seeds_needed - v.n_baseline) * group_hours[v.baseline])


def _summary(primary: Sequence[V.Verdict], group_hours: Mapping[str, float], label: str) -> str:
    """The cost of resolving every open comparison on the primary endpoint at once: each arm up
    to its planned seeds, the shared baseline up to the largest."""
    open_ = [v for v in primary if v.seeds_needed is not None and V.more_runs(v)]
    if not open_:
        return ""
    runs, hours, known = 0, 0.0, True
    base_need: dict[str, tuple[int, int]] = {}
    for v in open_:
        extra = max(0, v.seeds_needed - v.n_arm)
        runs += extra
        if v.arm in group_hours:
            hours += extra * group_hours[v.arm]
        elif extra:
            known = False
        need, have = base_need.get(v.baseline, (0, v.n_baseline))
        base_need[v.baseline] = (max(need, v.seeds_needed), have)
    for b, (need, have) in base_need.items():
        extra = max(0, need - have)
        runs += extra
        if b in group_hours:
            hours += extra * group_hours[b]
        elif extra:
            known = False
    cost = f", ≈ {hours:.1f} h of runs at the measured run times" if known else ""
    return (f"Resolving every open comparison on {label} at 80% power takes {runs} more runs"
            f"{cost} (each arm up to its planned seeds, the shared baseline up to the largest).")


def _display(verdicts, labels, names, per_run, at, numeric, group_hours) -> pd.DataFrame:
    none = np.empty(0, dtype=np.int64)
    rows = []
    for v in verdicts:
        x = numeric[v.endpoint][at.get(v.arm, none)]
        y = numeric[v.endpoint][at.get(v.baseline, none)]
        sign = 1.0 if v.higher_is_better else -1.0
        poi = stats.probability_of_improvement(sign * x, sign * y)
        hours = _hours(v, group_hours)
        rows.append({
            "arm vs baseline": f"{names.get(v.arm, v.arm)} vs {names.get(v.baseline, v.baseline)}",
            "endpoint": labels[v.endpoint],
            "difference [CI]": f"{V.signed(v.diff)} [{V.signed(v.low)}, {V.signed(v.high)}]",
            "CI level": "—" if not math.isfinite(v.low) else f"{100 * (1 - v.level):.4g}%",
            "verdict": v.verdict + (" (< δ)" if v.verdict in (V.BETTER, V.WORSE) and v.within_delta else ""),
            "seeds": V.seeds_phrase(v.n_arm, v.n_baseline).replace(" seeds per arm", " per arm"),
            "δ": f"{v.delta:.3f}" if math.isfinite(v.delta) else "—",
            "P(arm better)": "—" if not math.isfinite(poi) else f"{poi:.2f}",
            "80% power needs": "—" if v.seeds_needed is None else f"{v.seeds_needed} per arm",
            "more runs": "—" if v.seeds_needed is None else str(V.more_runs(v)),
            "≈ hours": "—" if hours is None else f"{hours:.1f}",
        })
    return pd.DataFrame(rows)


def section(table: VerdictTable, n_pairs: int) -> Section:
    deltas = "; ".join(f"{table.labels[e]}: δ = {d:.3f} ({how})" if math.isfinite(d) else
                       f"{table.labels[e]}: δ {how}" for e, (d, how) in table.deltas.items())
    intro = ("<p>" + "".join(f"{esc(s)}.<br>" for s in table.sentences) + "</p>"
             + (f"<p>{esc(table.summary)}</p>" if table.summary else "")
             + "<p>Difference: arm − baseline, mean over seeds, with Welch's interval; the interval's "
             f"level is Holm-adjusted over the {n_pairs} comparison(s) of an endpoint (95% when one). "
             "<b>better/worse</b>: the interval excludes 0 (Holm); <b>equivalent</b>: it lies inside ±δ "
             "(two one-sided tests); <b>not resolved</b>: neither — with the seeds per arm a fixed design "
             "needs for 80% power at δ under the measured seed-to-seed spread (noncentral t, at the first "
             f"Holm level), the runs that adds and their hours at the measured run times. {esc(deltas)}. "
             "P(arm better): the chance that a seed of the arm beats a seed of the baseline (ties ½). "
             "These are fixed-sample verdicts: seeds added until something looked significant need the "
             "sequential rule (docs/verdicts.md).</p>")
    return Section("Verdicts", intro=intro, tables=[("", table.display)], lead=True)


def write(table: VerdictTable, tdir: Path) -> list[Path]:
    written = tables.write_table(table.numbers, tdir / "verdicts", formats=("csv",))
    written += tables.write_table(table.display, tdir / "verdicts", formats=("tex",),
                                  caption="verdicts: arm vs baseline, Welch interval (Holm), equivalence within ±δ")
    md = tdir / "verdicts.md"
    text = "".join(f"- {s}.\n" for s in table.sentences) + (f"\n{table.summary}\n" if table.summary else "")
    atomic_write_text(md, text + "\n" + tables.to_markdown(table.display), durable=False)
    return [*written, md]

