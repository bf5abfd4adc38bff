"""From loaded runs to the numbers a report shows: groups, per-run scores, seed aggregates,
probability of improvement between groups, and the config keys that differ between groups.
The per-run scores (``val`` = the recipe's select.metric, ``test`` = its select.report) are
listed in docs/reports.md (Recipes; Collapse metrics; Stopped runs).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from armorlab.analysis.importers import GROUP_KEY
from armorlab.analysis.load import META_COLUMNS, RunSet
from armorlab.analysis.ranges import clip_interval
from armorlab.analysis.recipe import SEED_KEYS, Recipe, spec_controls
from armorlab.analysis.value_labels import fmt_value, norm_value
from armorlab.core.config import DROPPED_AT_DEFAULT
from armorlab.errors import ArmorLabError
from armorlab.stats import collapse, select
from armorlab.stats import seeds as stats
from armorlab.stats.stopping import carry_forward

# Headline scores by default: the honest test number, the matched-step test number, the val AUC.
HEADLINE_DEFAULT = ("selected_test", "test@last", "auc")
BARE_KEYS = ("objective", GROUP_KEY)  # the first of these among the group keys names a group bare
GROUP_SCORES = ("peak", "peak_step", "final", "drop", "collapse_step", "auc", "selected_val",
                "selected_test")
# scores aggregated into groups.csv but left out of the (already wide) display tables
EXTRA_SCORES = ("drop_rel", "drop_z", "collapse_z", "divergence_step", "entropy_collapse_step", "length_blowup")


# --------------------------------------------------------------------------- grouping
def varying_keys(runs: pd.DataFrame) -> list[str]:
    """Config keys whose value differs between runs (seeds excluded)."""
    def varies(values: list[Any]) -> bool:
        # the same type and repr in every run is the same JSON below, without encoding 200 values
        return len({(type(v), repr(v)) for v in values}) > 1 and len(
            {json.dumps(norm_value(v), sort_keys=True, default=str) for v in values}) > 1

    return [c for c in runs.columns
            if c not in META_COLUMNS and c not in SEED_KEYS and varies(runs[c].tolist())]


def _partition(runs: pd.DataFrame, keys: Sequence[str]) -> int:
    return len({tuple(map(fmt_value, r)) for r in runs[list(keys)].itertuples(index=False)}) if keys else 1


def auto_group_by(runs: pd.DataFrame) -> list[str]:
    """The fewest varying config keys that still tell all non-seed configs apart: an ``objective`` sweep
    changes many keys through presets, so keys are added greedily (``objective`` first, then whichever
    splits the runs most) until the groups are as fine as all varying keys make them."""
    keys = varying_keys(runs)
    target = _partition(runs, keys)
    chosen = ["objective"] if "objective" in keys else []
    while _partition(runs, chosen) < target:
        chosen.append(max((k for k in keys if k not in chosen),
                          key=lambda k: (_partition(runs, [*chosen, k]), -runs[k].isna().sum(), -len(k))))
    return chosen


def display_names(groups: Groups) -> dict[str, str]:
    """Each group's name on the page, in legends and in sentences: ``armor (alpha=0.7, ref_reset_steps=0)``:
    the objective (else ``run_group``) bare, every other non-null key in brackets, defaults too (they may
    be what tells groups apart); the labels where two names would be equal. Labels stay the groups'
    identities in CSV files and in a recipe's ``compare``."""
    keys = groups.keys
    bare = next((k for k in BARE_KEYS if k in keys), None)

    def name(r) -> str:
        parts = [f"{k}={fmt_value(r[k])}" for k in keys if k != bare and norm_value(r[k]) is not None]
        lead, inner = norm_value(r[bare]) if bare is not None else None, ", ".join(parts)
        return inner if lead is None else fmt_value(lead) + (f" ({inner})" if inner else "")

    full = {r["group"]: name(r) or r["group"] for r in groups.table.to_dict("records")}
    return full if len(set(full.values())) == len(full) else {g: g for g in full}


def rename(text: str, names: Mapping[str, str]) -> str:
    """``text`` with every group label in it replaced by the group's name (longest label first, so
    that a label inside another one is not replaced in it)."""
    for label in sorted(names, key=len, reverse=True):
        text = text.replace(label, names[label])
    return text


@dataclass
class Groups:
    """Runs assigned to groups. ``table``: one row per group (label, keys..., n_runs), in display
    order; ``of_run``: run_id → label."""
    keys: list[str]
    table: pd.DataFrame
    of_run: dict[str, str]
    members: dict[str, list[str]] = field(default_factory=dict)

    @property
    def labels(self) -> list[str]:
        return self.table["group"].tolist()


def names_of(groups: Groups, rs: RunSet,
             names: Callable[[pd.DataFrame, RunSet], Mapping[str, str]] | None) -> dict[str, str]:
    """Each group's name (the caller's ``names``, else groups.display_names), one per group: a
    name given twice, or not at all, is the label."""
    if names is None:
        return display_names(groups)
    ids = pd.DataFrame({"run_id": rs.run_ids, "group": [groups.of_run[r] for r in rs.run_ids]})
    given = {g: str(n) for g, n in names(ids, rs).items()}
    shown = [given.get(g, g) for g in groups.labels]
    return {g: n if shown.count(n) == 1 else g for g, n in zip(groups.labels, shown, strict=True)}


@dataclass
class PageNames:
    """The report's tables as the page shows them: each group named (display names) in the first
    column, which stays in place while a wide table scrolls, instead of its key columns."""
    display: Mapping[str, str]
    order: Sequence[str]
    keys: Sequence[str]

    def tables(self, df: pd.DataFrame | None) -> pd.DataFrame | None:
        """A per-group display table (one row per group in summary order): its key columns (or its
        label) replaced by the group's name."""
        if df is None:
            return None
        out = df.drop(columns=[k for k in self.keys if k in df.columns] + (["group"] if "group" in df else []))
        out.insert(0, "group", [self.display.get(g, g) for g in self.order][:len(out)])
        return out

    def column(self, df: pd.DataFrame | None, column: str = "group") -> pd.DataFrame | None:
        if df is None or column not in df:
            return df
        return df.assign(**{column: df[column].map(lambda g: self.display.get(g, g))})


def _sort_key(v: Any) -> tuple:
    v = norm_value(v)
    if v is None:
        return (2, "")
    return (0, float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, str(v))


def make_groups(runs: pd.DataFrame, keys: Sequence[str], *, file: str | None = None) -> Groups:
    """Assign each run to the group of its values of ``keys`` (unknown key → ArmorLabError; a key
    resolved configs drop at its default, e.g. ``ref_from: null``, has that value in every run)."""
    for k in keys:
        if k not in runs.columns and k in DROPPED_AT_DEFAULT:
            runs = runs.assign(**{k: DROPPED_AT_DEFAULT[k]})
        elif k not in runs.columns:
            raise ArmorLabError(f"not a config key of these runs (varying keys: "
                                f"{', '.join(varying_keys(runs)) or 'none'})", key="group_by", value=k,
                                file=file)
    combos: dict[tuple, list[str]] = {}
    for rid, row in zip(runs["run_id"], runs[list(keys)].itertuples(index=False), strict=True):
        combos.setdefault(tuple(norm_value(v) for v in row), []).append(rid)
    rows, members = [], {}
    for combo in sorted(combos, key=lambda c: tuple(_sort_key(v) for v in c)):
        # "objective=armor, alpha=0.8"; keys whose value is null are left out
        label = ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(keys, combo, strict=True) if v is not None)
        label = label or "all runs"
        rows.append({"group": label, **dict(zip(keys, combo, strict=True)), "n_runs": len(combos[combo])})
        members[label] = combos[combo]
    of_run = {rid: label for label, rids in members.items() for rid in rids}
    return Groups(list(keys), pd.DataFrame(rows), of_run, members)


def run_groups(rs: RunSet, group_by: Sequence[str] | None = None) -> pd.Series:
    """The report's group of each run (index run_id, values its label, e.g.
    ``"objective=armor, alpha=0.8"``): grouped by ``group_by`` as a recipe's ``group_by``, or by the
    keys the report picks itself (auto_group_by); seeds are never a group key. For a plot per group:
    ``rs.long.assign(group=rs.long["run_id"].map(run_groups(rs)))``."""
    keys = list(group_by) if group_by is not None else auto_group_by(rs.runs)
    ids = pd.Index(rs.run_ids, name="run_id")
    return pd.Series(ids, index=ids, name="group").map(make_groups(rs.runs, keys).of_run)


# --------------------------------------------------------------------------- per-run scores
@dataclass
class Notes:
    """Warnings collected while scoring (shown in the report), each once."""
    items: list[str] = field(default_factory=list)

    def add(self, msg: str) -> None:
        if msg not in self.items:
            self.items.append(msg)


def resolve_matched_steps(rs: RunSet, recipe: Recipe) -> list[int]:
    if recipe.matched_steps is not None:
        return list(recipe.matched_steps)
    # runs still going or failed early would drag the default steps down: use completed ones
    done = rs.runs.loc[rs.runs["state"] == "completed", "run_id"].tolist()
    for ids in (done, rs.run_ids):
        per_run = [s for s in (rs.curve(r, recipe.select.metric)[0] for r in ids) if s.size]
        if per_run:
            return select.default_matched_steps(per_run)
    return []


def eval_sizes(rs: RunSet, run_id: str, metric: str, steps: np.ndarray) -> np.ndarray | None:
    """Completions behind each eval of ``metric`` (``val/n`` for ``val/acc``, ``val/n_greedy`` for
    ``val/acc_greedy``), aligned with ``steps``; None when the metric is not one of those (avg@k) or
    ``n`` is missing at any of its steps (older runs): the collapse test then estimates the noise
    from the curve."""
    ns, _, name = metric.rpartition("/")
    counts = {"acc": "n", "acc_greedy": "n_greedy"}
    if name not in counts or not ns:
        return None
    n_steps, n_values = rs.curve(run_id, f"{ns}/{counts[name]}")
    out = pd.Series(n_values, index=n_steps).reindex(np.asarray(steps)).to_numpy(dtype=np.float64)
    return out if out.size and np.all(np.isfinite(out) & (out > 0)) else None


def run_scores(rs: RunSet, groups: Groups, recipe: Recipe, matched: Sequence[int],
               notes: Notes, token_stats: Mapping[str, Mapping[str, float]] | None = None) -> pd.DataFrame:
    """One row per run: identity, state, and every score (docs/reports.md)."""
    sel, col = recipe.select, recipe.collapse
    rows, interp_sel, interp_matched, short = [], [], {}, {}
    # stopped runs are carried to the last eval step of the longest curve
    horizon = max((float(s[-1]) for r in rs.run_ids if (s := rs.curve(r, sel.metric)[0]).size),
                  default=math.nan) if (rs.runs["state"] == "stopped").any() else None
    # a minimised selection metric collapses upwards: negate so "drop" keeps its meaning
    sign = 1.0 if sel.mode == "max" else -1.0
    for run in rs.runs.itertuples(index=False):
        rid = run.run_id
        (vs, vv), (ts, tv) = rs.curve(rid, sel.metric), rs.curve(rid, sel.report)
        row: dict[str, Any] = {"run_id": rid, "group": groups.of_run[rid], "seed": getattr(run, "seed", None),
                               "state": run.state, "reason": run.reason,
                               "world_size": getattr(run, "world_size", None), "last_step": rs.last_step(rid)}
        (trs, trv), (ens, env), (les, lev) = (rs.curve(rid, m) for m in (col.train, col.entropy, col.length))
        # rewards outside [0, 1]: the binomial bound does not hold
        n = eval_sizes(rs, rid, sel.metric, vs) if sign > 0 and not np.any((vv < 0) | (vv > 1)) else None
        m = collapse.collapse_metrics(
            vs, sign * vv, n=n, train_steps=trs, train_values=trv, entropy_steps=ens, entropy_values=env,
            length_steps=les, length_values=lev, delta=col.delta, patience=col.patience, alpha=col.alpha,
            entropy_frac=col.entropy_frac)
        row.update(m, **{k: sign * m[k] for k in ("peak", "final", "auc")})
        chosen = select.select_best(vs, vv, ts, tv, mode=sel.mode)
        # (S2) final is its level at stop already; auc and matched steps carry it on
        if run.state == "stopped" and horizon is not None:
            (vs, vv), (ts, tv) = (carry_forward(xs, xv, horizon, col.patience) for xs, xv in ((vs, vv), (ts, tv)))
            row["auc"] = collapse.curve_auc(vs, vv)
        row.update(selected_step=chosen.step, selected_val=chosen.selected_value,
                   selected_test=chosen.reported_value)
        if chosen.step is not None and ts.size and not chosen.reported_exact and math.isfinite(
                chosen.reported_value):
            interp_sel.append(rid)
        for s in matched:
            for prefix, (xs, xv) in (("val", (vs, vv)), ("test", (ts, tv))):
                at = select.value_at(xs, xv, s)
                row[f"{prefix}@{s}"] = at.value
                if xs.size and not at.exact and math.isfinite(at.value):
                    interp_matched.setdefault(s, set()).add(rid)
                elif xs.size and not at.exact:
                    short.setdefault(rid, set()).add(s)
        if token_stats and rid in token_stats:
            row.update({f"tok_{k}": v for k, v in token_stats[rid].items()})
        rows.append(row)
    if interp_sel:
        notes.add(f"{sel.report} was not logged at the val-selected step of {len(interp_sel)} run(s); "
                  f"interpolated between neighbouring evals ({', '.join(sorted(interp_sel)[:5])})")
    for s, rids in sorted(interp_matched.items()):
        notes.add(f"matched step {s} was not an eval step for {len(rids)} run(s): values interpolated")
    for rid, steps in sorted(short.items()):
        notes.add(f"run {rid} did not reach matched step(s) {', '.join(map(str, sorted(steps)))}: "
                  f"left out of those columns")
    return pd.DataFrame(rows)


def score_columns(per_run: pd.DataFrame, matched: Sequence[int]) -> list[str]:
    """The numeric score columns of the group table, in display order."""
    at_steps = [f"{split}@{s}" for s in matched for split in ("val", "test")]
    return [c for c in (*GROUP_SCORES, *at_steps) if c in per_run.columns]


STEP_SCORES = ("peak_step", "collapse_step", "selected_step", "divergence_step", "entropy_collapse_step")


def group_summary(per_run: pd.DataFrame, groups: Groups, cols: Sequence[str],
                  step_range: tuple[float, float] | None = None,
                  bounds: Mapping[str, tuple[float, float]] | None = None) -> pd.DataFrame:
    """One row per group: keys, n (runs), collapsed (runs with a collapse step), and per score
    ``<score>_mean/_ci_low/_ci_high/_std/_iqm/_n`` (stats.summarise over seeds). The interval of
    a step score (STEP_SCORES) is clipped to ``step_range``, the steps that exist: a Student-t
    interval of the mean peak step 25 over three seeds can read [−3, 53]; a score with ``bounds``
    (analysis.ranges: a proportion's [0, 1]) to those."""
    rows, at, numeric = [], group_rows(per_run), numeric_columns(per_run, cols)
    collapsed = per_run["collapse_step"].notna().to_numpy() if "collapse_step" in per_run else None
    for g in groups.table.to_dict("records"):
        idx = at.get(g["group"], np.empty(0, dtype=np.int64))
        row: dict[str, Any] = {"group": g["group"], **{k: g[k] for k in groups.keys}, "n": len(idx),
                               "collapsed": int(collapsed[idx].sum()) if collapsed is not None else 0}
        for c in cols:
            row.update(stats.summarise(numeric[c][idx]).as_dict(f"{c}_"))
            limits = step_range if c in STEP_SCORES else (bounds or {}).get(c)
            low, high = f"{c}_ci_low", f"{c}_ci_high"
            row[low], row[high] = clip_interval(row[low], row[high], limits)
        rows.append(row)
    return pd.DataFrame(rows)


def group_rows(per_run: pd.DataFrame) -> dict[str, np.ndarray]:
    """Group label → positions of its runs in ``per_run``, in table order."""
    return per_run.groupby("group", sort=False).indices


def numeric_columns(per_run: pd.DataFrame, cols: Sequence[str]) -> dict[str, np.ndarray]:
    """Each column as float64 (non-numbers NaN), converted once."""
    return {c: pd.to_numeric(per_run[c], errors="coerce").to_numpy(dtype=np.float64) for c in dict.fromkeys(cols)}


def resolve_scores(recipe: Recipe, per_run: pd.DataFrame, matched: Sequence[int]) -> list[str]:
    """The headline scores: the recipe's, or selected_test, test@<last matched step>, auc."""
    last = f"test@{matched[-1]}" if matched else None
    out = []
    for s in recipe.scores or HEADLINE_DEFAULT:
        s = last if s == "test@last" else s
        if s is not None and s not in per_run.columns and recipe.scores:
            raise ArmorLabError(f"unknown score (known: {', '.join(score_columns(per_run, matched))})",
                                key="scores", value=s, file=str(recipe.path) if recipe.path else None)
        if s in per_run.columns and per_run[s].notna().any():
            out.append(s)
    return out


# --------------------------------------------------------------------------- comparisons
FIRST_GROUP = "the first group in order"  # the baseline when nothing names one


def comparison_pairs(runs: pd.DataFrame, groups: Groups, recipe: Recipe) -> tuple[list[tuple[str, str]], str]:
    """(X, Y) group pairs for P(X > Y) and the verdicts, and how they were chosen (a phrase for the page).

    The recipe's ``compare`` (baseline or pairs; ``--baseline`` sets its baseline); else the controls
    the sweep specs behind the runs declare (recipe.spec_controls: every arm against its control
    group's baseline); else every group against the first group in order — never every pair."""
    labels, cmp_ = groups.labels, recipe.compare
    file = str(recipe.path) if recipe.path and not cmp_.baseline_from else None  # a flag is in no file

    def pick(selector: Mapping[str, Any], key: str, strict: bool = True) -> list[str]:
        unknown = [k for k in selector if k not in runs.columns]
        if unknown and strict:
            raise ArmorLabError("not a config key of these runs", key=key, value=unknown[0], file=file)
        found = [] if unknown else [g for g in labels if all(
            fmt_value(v) == fmt_value(want) for k, want in selector.items()
            for v in runs.loc[runs["run_id"].isin(groups.members[g]), k].tolist())]
        if not found and strict:
            raise ArmorLabError("selects no group", key=key, value=dict(selector), file=file)
        return found

    def against(base: list[str]) -> list[tuple[str, str]]:
        return [(x, y) for y in base for x in labels if x not in base]

    if cmp_.pairs:
        out = [(x, y) for i, (a, b) in enumerate(cmp_.pairs) for x in pick(a, f"compare.pairs[{i}][0]")
               for y in pick(b, f"compare.pairs[{i}][1]") if x != y]
        return list(dict.fromkeys(out)), "the pairs of compare.pairs"
    key = cmp_.baseline_from or "compare.baseline"
    if isinstance(cmp_.baseline, str):
        if cmp_.baseline not in labels:
            raise ArmorLabError(f"not a group of these runs (groups: {'; '.join(labels)})",
                                key=key, value=cmp_.baseline, file=file)
        return against([cmp_.baseline]), f"every group against {cmp_.baseline} ({key})"
    if cmp_.baseline:
        base = pick(cmp_.baseline, key)
        return against(base), f"every group against {'; '.join(base)} ({key})"
    sweeps = [str(Path(p).parent) for p in runs["path"] if isinstance(p, str)] if "path" in runs else []
    controls = [(pick(b, "", False), [g for a in arms for g in pick(a, "", False)], where)
                for b, arms, where in spec_controls([Path(d) for d in sweeps], recipe.stages)]
    controls = [c for c in controls if c[0]]
    if len(controls) == 1:
        base, _, where = controls[0]
        return against(base), f"every group against {'; '.join(base)} ({where})"
    if controls:
        out = [(x, y) for base, arms, _ in controls for y in base for x in arms if x not in base]
        return list(dict.fromkeys(out)), "each control's arms against its baseline (" + "; ".join(
            w for _, _, w in controls) + ")"
    return against(labels[:1]), (f"every group against {labels[0]}, {FIRST_GROUP}: no compare: in "
                                 "the recipe, no controls: in the runs' sweep spec, no --baseline")


def improvement_table(per_run: pd.DataFrame, pairs: Sequence[tuple[str, str]],
                      scores: Sequence[str]) -> pd.DataFrame:
    """Probability of improvement P(X > Y) per pair and headline score, with its bootstrap CI
    (NaN where the seeds cannot resolve it: ``resolvable`` false, stats S4) and the exact
    two-sided Mann–Whitney p-value ``mw_p``."""
    rows = []
    at, numeric, none = group_rows(per_run), numeric_columns(per_run, scores), np.empty(0, dtype=np.int64)
    for (x, y), s in itertools.product(pairs, scores):
        a, b = numeric[s][at.get(x, none)], numeric[s][at.get(y, none)]
        n_x, n_y = int(np.isfinite(a).sum()), int(np.isfinite(b).sum())
        rows.append((x, y, s, *stats.poi_with_ci(a, b), n_x, n_y, stats.poi_resolvable(n_x, n_y),
                     stats.mann_whitney_p(a, b)))
    return pd.DataFrame(rows, columns=["x", "y", "score", "p_improvement", "ci_low", "ci_high", "n_x", "n_y",
                                       "resolvable", "mw_p"])


def config_diff(runs: pd.DataFrame, groups: Groups) -> pd.DataFrame:
    """Rows = groups, columns = config keys that differ between runs (seed excluded); a cell
    holds the group's value, or ``mixed: a | b`` when the group's own runs disagree."""
    keys = varying_keys(runs)

    def cell(values: list[Any]) -> str:
        shown = list(dict.fromkeys(fmt_value(v) for v in values))
        return shown[0] if len(shown) == 1 else "mixed: " + " | ".join(shown)

    by_run = runs.set_index("run_id")
    return pd.DataFrame([{"group": g, **{k: cell(by_run.loc[groups.members[g], k].tolist()) for k in keys}}
                         for g in groups.labels], columns=["group", *keys])
