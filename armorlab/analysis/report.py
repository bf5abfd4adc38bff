"""``armorlab report``: recipe → loaded runs → scores and statistics → figures, tables, index.html.

Output directory layout::

    index.html                the page (tables inline, figures referenced from plots/)
    plots/*.png               val curves, over-optimisation, KL, capacity, ablation bars, all curves
    tables/groups.{csv,md,tex}        one row per group (CSV: numbers; md/tex: mean [95% CI])
    tables/runs.csv                   one row per run, every score
    tables/improvement.{csv,md,tex}   probability of improvement per compared pair
    tables/verdicts.{csv,md,tex}      better / worse / equivalent / not resolved per arm (first on the page;
                                      a sweep run until resolved: its looks.json's, analysis/looks_report.py)
    tables/configs.csv                config keys that differ between groups
    tables/mechanisms.{csv,md}        whether each remedy's mechanism acted (armorlab.analysis.mechanisms)
    recipe.yaml               the recipe as resolved (group keys, matched steps, scores)

Extra sections: the caller may add its own (``extra_sections``); the report command adds the
Optuna section of study dirs that way (armorlab.tune.study.report_sections), so analysis never
imports tune.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from armorlab.analysis import capacity_stats as cs
from armorlab.analysis import (
    freshness,
    looks_report,
    mechanisms,
    panels,
    plots,
    tables,
    verdict_table,
)
from armorlab.analysis import groups as G
from armorlab.analysis.html import Figure, Section, esc, write_index
from armorlab.analysis.load import RunSet, load
from armorlab.analysis.recipe import DEFAULT_CURVES, Recipe, default_out_dir, unit_disagreement  # noqa: F401 (re-export)
from armorlab.core.fsutil import atomic_write_yaml
from armorlab.core.runs import RunDir, now_iso
from armorlab.stats import collapse, select
from armorlab.stats import seeds as stats
from armorlab.stats.effective_batch import EFFECTIVE_BATCH_TOLERANCE, effective_batch_gap

log = logging.getLogger(__name__)

CAP_SAMPLE = 100_000  # A>0 tokens per run kept for the capacity ECDF (a plot needs no more)


@dataclass
class ReportResult:
    out_dir: Path
    index: Path
    plots: list[Path] = field(default_factory=list)
    tables: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    n_runs: int = 0
    n_groups: int = 0
    verdicts: list[str] = field(default_factory=list)   # one sentence per compared arm


def _curves(recipe: Recipe, rs: RunSet) -> list[str]:
    present = set(rs.metrics)
    if recipe.curves is not None:
        wanted = list(recipe.curves)
    else:
        wanted = [m for m in DEFAULT_CURVES if m in present]
        wanted += [m for m in recipe.kl if m in present]
    for m in (recipe.select.metric, recipe.collapse.train):
        if m in present and m not in wanted:
            wanted.insert(0, m)
    return list(dict.fromkeys(wanted))


def logged_under(metric: str, config: Mapping[str, Any]) -> bool:
    """Whether the trainer logs ``metric`` for a run with this config (design.md's metric list):
    ``anchor/*`` and ``kl/forward_*`` (unconditioned draws of π_ref) only with anchors or the gate
    on; ``obj/beta_kl`` and the KL term's gradient share and cosine only at β ≠ 0; the anchors'
    gradient share only with anchors, and neither share at ``grad_share_every: 0``. A metric that
    cannot exist in a run is not reported as missing from it."""
    def on(key: str) -> bool:  # a config without the key (older run dirs): assume it is logged
        value = config.get(key)
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value):
            return value != 0
        return True

    if metric.startswith(("anchor/", "kl/forward_")):
        return on("anchor") or on("anchor_gate")
    if metric == "obj/beta_kl":
        return on("beta")
    if metric in ("obj/kl_grad_share", "obj/kl_grad_cos"):
        return on("beta") and on("grad_share_every")
    if metric == "obj/anchor_grad_share":
        return on("anchor") and on("grad_share_every")
    return True


def _missing_metric_notes(rs: RunSet, metrics: Sequence[str], notes: G.Notes, explicit: set[str]) -> None:
    configs = {r["run_id"]: r for r in rs.runs.to_dict("records")}
    for m in metrics:
        expected = [r for r in rs.run_ids if logged_under(m, configs[r])]
        n = len(expected)
        missing = [r for r in expected if not rs.has_metric(r, m)]
        if not missing:
            continue
        if len(missing) == n:
            if m in explicit:
                notes.add(f"metric {m} missing in all {n} runs (not logged by this trainer version?)")
        else:
            notes.add(f"metric {m} missing in {len(missing)}/{n} runs: {', '.join(missing[:6])}"
                      + (" …" if len(missing) > 6 else ""))


def _state_notes(rs: RunSet, notes: G.Notes) -> None:
    for run in rs.runs.itertuples(index=False):
        if run.state == "unknown":  # an imported run whose source does not record how it ended
            continue
        if run.state != "completed":
            reason = f": {run.reason}" if isinstance(run.reason, str) and run.reason else ""
            notes.add(f"run {run.run_id} is {run.state}{reason} (its curves end early)")
        elif isinstance(run.reason, str) and run.reason.startswith("stopped"):
            notes.add(f"run {run.run_id} {run.reason}")


def _counter_notes(rs: RunSet, notes: G.Notes) -> None:
    """With ``x: rollout``, name the runs whose lines carry no rollout counter (written before it
    existed): their curves are left out."""
    if rs.counter == "step":
        return
    lacking = [r for r in rs.run_ids if rs.last_step(r) is None]
    if lacking:
        notes.add(f"{len(lacking)} run(s) log no `{rs.counter}` counter and are left out of the curves: "
                  f"{', '.join(lacking[:6])}" + (" …" if len(lacking) > 6 else ""))


def _unit_notes(recipe: Recipe, rs: RunSet, notes: G.Notes) -> None:
    """Warn (in the report and the log) when the recipe's ``x`` is not the unit its sweeps count in."""
    if "path" not in rs.runs or not len(rs.runs):
        return
    units: dict[str, str] = {}
    units_col = rs.runs["step_unit"] if "step_unit" in rs.runs else pd.Series(None, index=rs.runs.index)
    for path, unit in zip(rs.runs["path"], units_col, strict=True):
        if isinstance(path, str):
            units[_sweep_file(Path(path).parent)] = unit if isinstance(unit, str) else "optimizer"
    text = unit_disagreement(recipe.x, str(recipe.path) if recipe.path else None, units)
    if text:
        log.warning("%s", text)
        notes.add(text)


def _sweep_file(sweep_dir: Path) -> str:
    """The spec a sweep dir was submitted from (its sweep.json's ``source``), else the dir."""
    try:
        source = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError):
        source = None
    return source if isinstance(source, str) and source else str(sweep_dir)


def _bands(rs: RunSet, groups: G.Groups, metric: str, notes: G.Notes) -> dict[str, stats.CurveBand]:
    out = {}
    for g in groups.labels:
        curves = [rs.curve(r, metric) for r in groups.members[g]]
        curves = [c for c in curves if c[0].size]
        if not curves:
            continue
        aligned = stats.align_curves(curves)
        if aligned.interpolated:
            notes.add(f"group {g}: {metric} was logged at different steps across seeds; curves were "
                      f"linearly interpolated onto the union of steps")
        out[g] = stats.curve_band(aligned)
    return out


def _noise_bands(rs: RunSet, groups: G.Groups, metric: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Eval noise of each group's mean curve: SE(step) = sqrt(Σ_r SE_r²)/R over the R seeds that
    logged that step, SE_r from collapse.eval_se (binomial from ``<split>/n``, else from the curve)."""
    out = {}
    for g in groups.labels:
        curves = []
        for r in groups.members[g]:
            s, v = rs.curve(r, metric)
            if s.size:
                se = collapse.eval_se(v, G.eval_sizes(rs, r, metric, s))
                curves.append((s, se ** 2))
        aligned = stats.align_curves(curves) if curves else None
        if aligned is None or not aligned.grid.size:
            continue
        var = aligned.values
        count = np.isfinite(var).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            se = np.sqrt(np.nansum(var, axis=0)) / count
        se[count == 0] = np.nan
        if np.isfinite(se).any():
            out[g] = (aligned.grid, se)
    return out


def _anchor_table(rs: RunSet, groups: G.Groups) -> pd.DataFrame | None:
    """ARMOR review points 1 and 4, per group (mean over seeds of each run's mean over steps):
    the policy's success on queries the gate drops vs keeps, the anchors' share and advantage,
    and π_ref's validation accuracy at each reset (mean over seeds per reset step)."""
    cols = {"anchor/gate_drop_success": "success on gate-dropped queries",
            "anchor/gate_keep_success": "success on kept queries", "anchor/share": "anchor share of loss tokens",
            "anchor/adv_mean": "anchor advantage (mean)"}
    if not any(m in rs.metrics for m in [*cols, "ref/val_acc"]):
        return None
    rows = []
    for g in groups.labels:
        row: dict[str, Any] = {"group": g}
        for m, label in cols.items():
            per_run = [float(np.mean(v)) for r in groups.members[g] for _, v in [rs.curve(r, m)] if v.size]
            s = stats.summarise(per_run)
            row[label] = tables.fmt_ci(s.mean, s.ci_low, s.ci_high)
        resets: dict[float, list[float]] = {}
        for r in groups.members[g]:
            for step, v in zip(*rs.curve(r, "ref/val_acc"), strict=True):
                resets.setdefault(float(step), []).append(float(v))
        row["ref/val_acc at resets (step: mean over seeds)"] = ", ".join(
            f"{step:g}: {np.mean(v):.3f}" for step, v in sorted(resets.items())) or "—"
        rows.append(row)
    return pd.DataFrame(rows)


def _token_samples(rs: RunSet, groups: G.Groups, notes: G.Notes):
    """Token-sample statistics per run, own-objective capacities per group, counterfactuals."""

    per_run, per_group, cf_parts = {}, {}, {}
    for run in rs.runs.to_dict("records"):
        tokens = cs.read_tokens(run["path"])
        if tokens is None:
            continue
        need = {"logp", "old_logp", "advantage"}
        if not need <= set(tokens.columns):
            notes.add(f"run {run['run_id']}: tokens/ lacks {', '.join(sorted(need - set(tokens.columns)))}")
            continue
        cfg = RunDir(run["path"]).read_config()
        try:
            per_run[run["run_id"]] = cs.token_stats(tokens, cfg)
        except ValueError as exc:
            notes.add(f"run {run['run_id']}: token statistics skipped ({exc})")
            continue
        params = cs.objective_params(cfg)
        own = cs.counterfactual_capacity(tokens, cfg, objectives=(params["objective"],))
        cap = next(iter(own.values()), np.empty(0))
        per_group.setdefault(groups.of_run[run["run_id"]], []).append(cap[:CAP_SAMPLE])
        for obj, arr in cs.counterfactual_capacity(tokens, cfg).items():
            cf_parts.setdefault(obj, []).append(arr[:CAP_SAMPLE])
    per_group = {g: np.concatenate(v) for g, v in per_group.items()}
    cf = {o: np.concatenate(v) for o, v in cf_parts.items()}
    return per_run, per_group, cf


def _kl_caption(kl_panels: Mapping[str, Any], wanted: Sequence[str]) -> str:
    """What the KL figure shows, direction by direction, from the panels it has; a direction the
    recipe asks for but no run logged is said to be missing."""
    by_direction: dict[str, list[str]] = {}
    for m in kl_panels:
        by_direction.setdefault(plots.kl_direction(m)[0] or "other", []).append(m)
    parts = [f"{d} ({', '.join(ms)})" for d, ms in by_direction.items()]
    text = (" and ".join(parts) + " over steps, mean over seeds with its 95% CI; reverse KL is estimated on "
            "samples of π_θ, forward KL on unconditioned samples of π_ref (panel titles say which)")
    if plots.KL_FORWARD not in by_direction and any(plots.kl_direction(m)[0] == plots.KL_FORWARD for m in wanted):
        text += ("; no forward KL: these runs log none (kl/forward_k* needs anchors or the gate, kl/exact_forward "
                 "the probe, kl_probe_prompts > 0)")
    return text


def _step_range(rs: RunSet, metric: str) -> tuple[float, float] | None:
    """The first and last step at which any run logged ``metric``: a step score's interval lies
    inside it (a mean step's Student-t interval can reach before the first step)."""
    ends = [(float(s[0]), float(s[-1])) for r in rs.run_ids for s, _ in [rs.curve(r, metric)] if s.size]
    return (min(e[0] for e in ends), max(e[1] for e in ends)) if ends else None


MAX_ONSET_LABELS = 40  # collapse onsets labelled with their fall in SE, at most

def build_report(recipe: Recipe, out_dir: str | Path | None = None, *, cache: bool = True,
                 progress: Callable[[int, int], None] | None = None,
                 extra_sections: Callable[[Path, Callable[[str], None]], list[Section]] | None = None,
                 lead: Callable[[pd.DataFrame, RunSet, Path], Section | None] | None = None,
                 names: Callable[[pd.DataFrame, RunSet], Mapping[str, str]] | None = None) -> ReportResult:
    """Write the whole report for ``recipe`` and return what was written.

    ``extra_sections(out_dir, warn)`` returns sections appended after the run report's; ``warn``
    adds a note to the report's warnings. ``lead(per_run, runs, out_dir)`` may return a section
    shown first (the demo's headline); ``names(runs_groups, runs)`` the groups' names in figures,
    tables, warnings and verdict sentences, from a frame of the runs' ``run_id`` and ``group``
    (default: groups.display_names). With ``cache``, the runs' parsed metrics come from the
    metrics cache (armorlab.analysis.load)."""
    out = Path(out_dir) if out_dir is not None else default_out_dir(recipe)
    return _build_report(recipe, out, cache=cache, progress=progress, extra_sections=extra_sections, lead=lead,
                         names=names)


def _effective_batch_notes(rs: RunSet, groups: G.Groups, pairs: Sequence[tuple[str, str]],
                           display: Mapping[str, str], notes: G.Notes) -> None:
    """A note for each compared pair whose effective batches differ beyond the tolerance
    (armorlab.stats.effective_batch, from train/refill_shortfall)."""
    def shortfalls(label: str) -> list[float]:
        means = [rs.curve(r, "train/refill_shortfall")[1] for r in groups.members.get(label, ())]
        return [float(m.mean()) for m in means if m.size]

    for a, b in pairs:
        gap = effective_batch_gap(shortfalls(b), shortfalls(a))
        if gap is not None:
            notes.add(f"effective batch differs between {display.get(a, a)} and {display.get(b, b)}: "
                      f"{gap[1]:.0%} vs {gap[0]:.0%} of the batch trains (1 − mean train/refill_shortfall; "
                      f"tolerance {EFFECTIVE_BATCH_TOLERANCE:.0%}): their batch sizes and loss normalisers "
                      f"differ — raise max_num_gen_batches, or read the comparison with that in mind")


def _draw(plot: Callable[..., Path], *args: Any, **kwargs: Any) -> Callable[[], Path]:
    """Draw one figure (a function of armorlab.analysis.plots) now; the page asks for its path."""
    path = plot(*args, **kwargs)
    return lambda: path


def _build_report(recipe: Recipe, out: Path, *, cache: bool, progress: Callable[[int, int], None] | None,
                  extra_sections: Callable[[Path, Callable[[str], None]], list[Section]] | None,
                  lead: Callable[[pd.DataFrame, RunSet, Path], Section | None] | None = None,
                  names: Callable[[pd.DataFrame, RunSet], Mapping[str, str]] | None = None) -> ReportResult:
    file = str(recipe.path) if recipe.path else None
    key = freshness.input_key(recipe, out)  # before reading: a run growing meanwhile makes it stale
    freshness.forget(out)
    rs = load(recipe.runs, cache=cache, progress=progress, format=recipe.format, mapping=recipe.runs_map,
              val_n=recipe.val_n, stages=recipe.stages)
    rs.counter = recipe.x  # steps in optimizer steps or rollouts, everywhere below
    notes = G.Notes(list(rs.warnings))
    _state_notes(rs, notes)
    _counter_notes(rs, notes)
    _unit_notes(recipe, rs, notes)
    axis = {} if recipe.x == "step" else {"x_label": plots.AXIS_LABELS[recipe.x]}
    keys = recipe.group_by if recipe.group_by is not None else G.auto_group_by(rs.runs)
    groups = G.make_groups(rs.runs, keys, file=file)
    legend = ", ".join(keys) if keys else "group"
    sel = recipe.select
    display = G.names_of(groups, rs, names)  # label → the group's name in figures, page and sentences

    def named(by_label: Mapping[str, Any]) -> dict[str, Any]:
        return {display[g]: v for g, v in by_label.items()}

    curves = _curves(recipe, rs)
    # notes are added in the order the page always listed them, whatever order the figures take
    colors = plots.group_colors([display[g] for g in groups.labels])
    computed: dict[str, dict[str, stats.CurveBand]] = {}

    def band(m: str, into: G.Notes = notes) -> dict[str, stats.CurveBand]:
        """The groups' bands of ``m`` by name (the KL figure's metrics whether or not they are curves)."""
        if m not in computed:
            computed[m] = named(_bands(rs, groups, m, into)) if m in curves or m in recipe.kl else {}
        return computed[m]

    plot_dir = out / "plots"
    drawn: dict[str, tuple[str, Callable[[], Path], str]] = {}   # name → (section, path when drawn, caption)
    col = recipe.collapse
    kl_notes = G.Notes()
    kl_panels = {m: band(m, kl_notes) for m in recipe.kl}
    kl_panels = {m: b for m, b in kl_panels.items() if b}
    if kl_panels:
        drawn["kl"] = ("kl", _draw(plots.plot_kl, kl_panels, plot_dir / "kl.png", legend_title=legend,
                                         colors=colors, **axis), _kl_caption(kl_panels, recipe.kl))
    explicit = set(recipe.curves or ()) | {sel.metric, sel.report}
    _missing_metric_notes(rs, list(dict.fromkeys([sel.metric, sel.report, *curves])), notes, explicit)
    single = [g for g in groups.labels if len(groups.members[g]) == 1]
    if len(single) == 1:
        notes.add(f"group {single[0]} has a single seed: no confidence interval, read its numbers as anecdotes")
    elif single:
        notes.add(f"{len(single)} of {len(groups.labels)} groups have a single seed (no confidence interval, "
                  f"read their numbers as anecdotes): {'; '.join(single[:6])}" + (" …" if len(single) > 6 else ""))
    weak = [g for g in groups.labels if 1 < len(groups.members[g]) <= stats.LOW_POWER_N]
    if weak:
        notes.add(f"low-powered: {len(weak)} group(s) with 2–{stats.LOW_POWER_N} seeds ({'; '.join(weak[:6])}"
                  + (" …" if len(weak) > 6 else "") + "); their Student-t intervals are wide and a "
                  "probability of improvement between so few seeds cannot be resolved")
    diff = G.config_diff(rs.runs, groups)
    for row in diff.to_dict("records"):
        mixed = [k for k, v in row.items() if isinstance(v, str) and v.startswith("mixed: ")]
        if mixed:
            notes.add(f"group {row['group']} mixes runs with different {', '.join(mixed)}: "
                      f"add them to group_by to separate them")
    notes.extend(kl_notes)  # after the notes above, as the page always listed them
    band(sel.metric)  # its notes before those of the scores, as ever
    score_notes = G.Notes()
    tok_stats, cap_groups, cap_cf = _token_samples(rs, groups, score_notes)
    matched = G.resolve_matched_steps(rs, recipe)
    per_run = G.run_scores(rs, groups, recipe, matched, score_notes, tok_stats)
    pairs = G.comparison_pairs(rs.runs, groups, recipe)
    _effective_batch_notes(rs, groups, pairs, display, notes)
    # a sweep run until resolved: its looks.json's verdicts; fixed-sample ones would ignore the looks
    sequential = looks_report.find(recipe.runs)
    if sequential:
        looks_report.prepare(sequential, sel.metric, sel.report)
        looks_report.check(sequential, per_run, rs, notes)
        verdicts = None
    else:
        verdicts = verdict_table.build(per_run, rs, recipe, pairs, notes, display)
    if band(sel.metric):
        markers = {}
        records = per_run.to_dict("records")
        at = G.group_rows(per_run)
        for g in groups.labels:
            pts = []
            for r in (records[i] for i in at.get(g, ())):
                cs = r.get("collapse_step")
                if cs is not None and not (isinstance(cs, float) and math.isnan(cs)):
                    v = select.value_at(*rs.curve(r["run_id"], sel.metric), cs).value
                    z = r.get("collapse_z", math.nan)
                    pts.append((cs, v, f"−{z:.1f} SE" if math.isfinite(z) else "−∞ SE" if z == math.inf else ""))
            markers[display[g]] = pts
        n_onsets = sum(len(p) for p in markers.values())
        labelled = n_onsets <= MAX_ONSET_LABELS
        if not labelled:  # past this they overlap into a smear (and cost a fifth of all figure time)
            markers = {g: [(x, y, "") for x, y, _ in pts] for g, pts in markers.items()}
        noise = named(_noise_bands(rs, groups, sel.metric))
        common = {"colors": colors, "markers": markers, "matched_steps": matched, "noise": noise, **axis}
        if 2 <= len(groups.labels) <= panels.MAX_PANELS:  # one panel per arm, its baseline in each
            base = verdicts.baseline() if verdicts is not None else None
            words = ({display[v.arm]: v.verdict for v in verdicts.primary_verdicts()} if base is not None else {})
            figure = _draw(panels.plot_arms, band(sel.metric), sel.metric, plot_dir / "val.png",
                                 baseline=display.get(base), verdicts=words,
                                 verdict_of=verdicts.labels[verdicts.primary] if verdicts else "", **common)
            how = (f"one panel per arm, its baseline {display[base]} in grey in each" if base is not None else
                   "one panel per group, the other groups' means in light grey")
            how += f"; panel titles: each arm's verdict on {verdicts.labels[verdicts.primary]}" if words else ""
        else:
            figure = _draw(plots.plot_curves, band(sel.metric), sel.metric, plot_dir / "val.png",
                                 legend_title=legend, **common)
            how = "all groups on one axis"
        drawn["val"] = ("first", figure,
                        f"{sel.metric}, {how}: mean over seeds with its 95% CI (shaded; the y axis follows the "
                        f"means, a wider CI is cut at the frame); thin dashed lines: ±1 SE "
                        f"of eval noise (binomial from val/n where logged, else estimated from the curve); ▼ = a "
                        f"seed's collapse onset, "
                        + ("labelled with how many SEs its level fell below the earlier peak " if labelled else
                           f"unlabelled at {n_onsets} onsets (over {MAX_ONSET_LABELS} the labels overlap): how many "
                           f"SEs each level fell below the earlier peak is collapse_z in the Runs table ")
                        + f"(m={col.patience} evals per level, α={col.alpha}, δ={col.delta}); vertical dotted = "
                        f"matched steps")
    cols = G.score_columns(per_run, matched)
    tok_cols = G.token_columns(per_run)
    summary = G.group_summary(per_run, groups, cols + G.extra_columns(per_run) + tok_cols,
                              step_range=_step_range(rs, sel.metric))
    scores = G.resolve_scores(recipe, per_run, matched)
    label = {s: tables.score_label(s, sel.metric, sel.report) for s in cols + tok_cols}

    varying = [k for k in keys if groups.table[k].map(G.fmt_value).nunique() > 1]
    if scores and len(groups.labels) > 1 and varying:
        x_key = varying[-1]
        hue = [k for k in keys if k != x_key and k in varying]
        at, numeric = G.group_rows(per_run), G.numeric_columns(per_run, scores)
        seeds = {g: {s: numeric[s][at.get(g, np.empty(0, dtype=np.int64))] for s in scores} for g in groups.labels}
        drawn["ablation"] = ("results", _draw(plots.plot_ablation, summary.to_dict("records"), seeds,
                                                    scores, label, x_key, hue, plot_dir / "ablation.png",
                                                    colors={g: colors[display[g]] for g in groups.labels}),
                             f"headline scores by {x_key}: mean with 95% CI (Student-t below "
                             f"{stats.T_MIN_BOOTSTRAP} seeds); dots are seeds")
    if band(sel.metric) and band(col.train):
        drawn["overoptimisation"] = ("results", _draw(
            panels.plot_overoptimisation, band(col.train), band(sel.metric), col.train, sel.metric,
            plot_dir / "overoptimisation.png", legend_title=legend, colors=colors, **axis),
            f"{col.train} (dashed) against {sel.metric} (solid): the over-optimisation picture")
    bands = {m: band(m) for m in curves if band(m)}
    # the small multiples show only what no figure above shows: each extra figure costs a second
    shown = {sel.metric, col.train, *kl_panels} if sel.metric in bands else set(kl_panels)
    others = {m: b for m, b in bands.items() if m not in shown}
    if others:
        drawn["curves"] = ("curves", _draw(plots.plot_curve_grid, others, plot_dir / "curves.png",
                                                 legend_title=legend, colors=colors, **axis),
                           f"the recipe's other curves: mean over seeds with 95% CI (Student-t below "
                           f"{stats.T_MIN_BOOTSTRAP} seeds, BCa bootstrap from {stats.T_MIN_BOOTSTRAP})")
    notes.extend(score_notes)
    if cap_groups:
        drawn["capacity"] = ("capacity", _draw(plots.plot_capacity, named(cap_groups), cap_cf,
                                                     plot_dir / "capacity.png", legend_title=legend,
                                                     colors=colors),
                             "ECDF of probability capacity of A>0 tokens from tokens/ samples")
    poi = G.improvement_table(per_run, pairs, scores)

    tdir = out / "tables"
    group_display = tables.display_group_table(summary, keys, cols, sel.metric, sel.report)
    written = []
    written += tables.write_table(summary, tdir / "groups", formats=("csv",))
    written += tables.write_table(group_display, tdir / "groups", formats=("md", "tex"),
                                  caption=f"{recipe.title}: mean [95% CI] over seeds (method per row)")
    token_display = None
    if tok_cols:
        token_display = tables.display_group_table(summary, keys, tok_cols, sel.metric, sel.report,
                                                   n_of=tok_cols[0])
        written += tables.write_table(token_display, tdir / "tokens", formats=("md", "tex"),
                                      caption="token-sample statistics: mean [95% CI] over seeds")
    written += tables.write_table(per_run, tdir / "runs", formats=("csv",))
    headline = tables.display_headline(summary, keys, scores, sel.metric, sel.report)
    written += tables.write_table(headline, tdir / "headline", formats=("md", "tex"),
                                  caption="headline scores: mean [95% CI], IQM, std, n over seeds")
    poi_display = tables.display_improvement(poi, sel.metric, sel.report)
    written += tables.write_table(poi, tdir / "improvement", formats=("csv",))
    written += tables.write_table(poi_display, tdir / "improvement", formats=("md", "tex"),
                                  caption="probability of improvement P(X > Y) over seeds")
    written += tables.write_table(diff, tdir / "configs", formats=("csv",))
    if verdicts is not None:
        written += verdict_table.write(verdicts, tdir)
    if sequential:
        written += looks_report.write(sequential, tdir)
    anchors = _anchor_table(rs, groups)
    if anchors is not None:
        written += tables.write_table(anchors, tdir / "anchors", formats=("csv", "md"))
    acted = mechanisms.mechanism_table(rs, groups)
    if acted is not None:
        written += tables.write_table(acted[0], tdir / "mechanisms", formats=("md",),
                                      caption="did each mechanism act? mean [95% CI] over seeds")
        written += tables.write_table(acted[1], tdir / "mechanisms", formats=("csv",))

    atomic_write_yaml(out / "recipe.yaml", durable=False, obj={
        "title": recipe.title, "runs": list(recipe.runs), "group_by": list(keys), "curves": curves,
        "select": {"metric": sel.metric, "mode": sel.mode, "report": sel.report},
        "matched_steps": list(matched), "scores": scores, "kl": list(recipe.kl),
        "collapse": dict(vars(recipe.collapse)),
        "compare": {"endpoints": list(recipe.compare.endpoints or verdict_table.DEFAULT_ENDPOINTS),
                    "delta": recipe.compare.delta}})  # the declared margin (None: none), as the recipe gave it

    order = ("val", "overoptimisation", "kl", "capacity", "ablation", "curves")  # their place on the page
    figs = [(section, path(), caption) for name in order if name in drawn
            for section, path, caption in [drawn[name]]]
    page = G.PageNames(display, summary["group"].tolist(), keys)
    sections = _sections(recipe, out, figs, page.tables(group_display), page.tables(headline),
                         page.pairs(poi_display), page.column(diff), page.column(per_run), matched,
                         page.tables(token_display), page.column(anchors))
    if acted is not None:  # right after the results: whether a remedy acted, beside whether it held
        sections.insert(1, Section("Mechanisms: did each remedy act?", intro=mechanisms.INTRO,
                                   tables=[("", page.column(acted[0]))]))
    first = lead(per_run, rs, out) if lead is not None else None
    if first is not None:
        sections.insert(0, first)
    top = [Figure(str(p.relative_to(out)), cap, "first-figure") for k, p, cap in figs if k == "first"]
    if verdicts is not None:
        sections[:0] = verdict_table.section(verdicts, len(pairs), top[0] if top else None)
    elif top:
        sections.insert(0, Section(f"{sel.metric} per group", figures=top, lead=True))
    if sequential:
        sections.insert(0, looks_report.section(sequential))
    if extra_sections is not None:
        sections += extra_sections(out, notes.add)
    notes.items[:] = [G.rename(n, display) for n in notes.items]
    meta = (f"{len(rs.run_ids)} runs in {len(groups.labels)} groups (group_by: {esc(legend)}) · "
            f"selection on {esc(sel.metric)} ({sel.mode}), reported on {esc(sel.report)} · "
            f"matched steps {esc(', '.join(map(str, matched)) or 'none')} · generated {esc(now_iso())}")
    index = write_index(out, recipe.title, meta, notes.items, sections)
    sentences = verdicts.sentences if verdicts is not None else [x for s in sequential for x in s.sentences]
    result = ReportResult(out, index, [p for _, p, _ in figs], written, list(notes.items), len(rs.run_ids),
                          len(groups.labels), sentences)
    # every figure under plots/, the extra sections' too (an Optuna study's)
    figures = [p for p in (out / "plots").rglob("*") if p.is_file()] if (out / "plots").is_dir() else []
    freshness.write_stamp(out, key, result_summary(result),
                          [index, out / "recipe.yaml", *result.plots, *written, *figures])
    return result


def result_summary(result: ReportResult) -> dict[str, Any]:
    """What the CLI prints about a report, as JSON (kept in the freshness stamp)."""
    return {"index": str(result.index), "plots": [str(p) for p in result.plots],
            "tables": [str(p) for p in result.tables], "warnings": list(result.warnings),
            "n_runs": result.n_runs, "n_groups": result.n_groups, "verdicts": list(result.verdicts)}



def _sections(recipe: Recipe, out: Path, figs, group_display, headline, poi_display, diff, per_run, matched,
              token_display, anchors=None) -> list[Section]:
    sel = recipe.select

    def fig_list(kind):
        return [Figure(str(p.relative_to(out)), cap) for k, p, cap in figs if k == kind]

    results = Section("Results per group", intro=(
        f"<p>Each cell is the mean over seeds with its 95% CI; n = seeds. The CI is Student-t below "
        f"{stats.T_MIN_BOOTSTRAP} seeds (the percentile bootstrap covers the mean only ~74% of the time at 3 "
        f"seeds) and a BCa bootstrap from {stats.T_MIN_BOOTSTRAP}; the <b>95% CI</b> column names it and flags groups of ≤ {stats.LOW_POWER_N} seeds as low-powered. "
        f"<b>{esc(sel.metric)} @ best step</b> and <b>{esc(sel.report)} @ val-best step</b> pick each run's "
        f"best checkpoint on {esc(sel.metric)} (optimistic: validation noise picks a lucky step); "
        f"the <b>@ step</b> columns read every run at the same pre-declared steps "
        f"({esc(', '.join(map(str, matched)) or 'none')}) — no selection, so a collapse after the peak "
        f"shows. Peak and final are levels (means of {recipe.collapse.patience} evals), so the peak is not the "
        f"maximum of noise. Collapse step: the onset of the first fall of the level below the earlier peak that "
        f"is larger than the eval noise allows (z above a threshold calibrated to a {recipe.collapse.alpha:.0%} "
        f"false-alarm rate per flat curve; binomial SE from val/n where logged) and ≥ δ={recipe.collapse.delta}; "
        f"drop (SE) and fall at collapse (SE) say by how many standard errors. AUC: mean level over the run.</p>"),
        tables=[("", group_display)], figures=fig_list("results"))
    compare = Section("Headline scores and probability of improvement", intro=(
        "<p>IQM: scipy's trim_mean(x, 0.25), which drops ⌊n/4⌋ seeds at each end (none at n ≤ 3, where it "
        f"is the mean; one per end at 4–7 seeds) and averages the rest. Mean CIs: Student-t below "
        f"{stats.T_MIN_BOOTSTRAP} seeds, BCa bootstrap from {stats.T_MIN_BOOTSTRAP}. P(X &gt; Y): the chance that a seed of X scores higher than a seed of Y (ties count "
        "½); 0.5 = no difference. Its CI resamples the seeds of X and Y independently (percentile bootstrap); "
        "where even complete separation would not be significant (exact two-sided Mann–Whitney p = 2/C(n+m, n) "
        "&gt; 0.05: 2 vs 2, 3 vs 3, 3 vs 4 seeds) the table says it cannot be resolved instead of giving an "
        "interval. Mann–Whitney p: the exact two-sided test of X against Y.</p>"),
        tables=[("headline scores per group", headline), ("probability of improvement", poi_display)])
    out_sections = [results, compare]
    if fig_list("kl"):
        out_sections.append(Section("KL to the reference", figures=fig_list("kl")))
    if fig_list("capacity") or token_display is not None:
        out_sections.append(Section("Probability capacity and token-level KL", intro=(
            "<p>Capacity: how far a token's probability can move before the clip stops its gradient "
            "(UP Eq. 11; ARMOR's region Eq. 6). pos_bound_frac: share of A&gt;0 tokens whose capacity the "
            "clip binds; low_prob_limited: that share among A&gt;0 tokens with π_old &lt; 0.2. KL from the "
            "tokens/ samples: reverse k1/k2/k3 on policy tokens; forward_next_token_on_policy: the next-token "
            "KL(π_ref‖π_θ) at the policy's own prefixes, by importance weighting (not the sequence-level forward "
            "KL, whose prefixes come from π_ref: that is kl/forward_k*); "
            "anchor_kl_k1/k3 on anchor tokens: samples of π_ref conditioned on a correct reward, so neither KL "
            "direction (as the trainer's anchor/kl_k*). Right panel: the same A&gt;0 tokens under "
            "each formula.</p>"),
            tables=[("", token_display)] if token_display is not None else [], figures=fig_list("capacity")))
    if anchors is not None:
        out_sections.append(Section("Anchor diagnostics", intro=(
            "<p>ARMOR review points 1 and 4. The gate drops queries the reference could not solve: the "
            "policy's own group success rate on dropped vs kept queries shows how hard the dropped ones are "
            "(<code>anchor/gate_drop_success</code>, <code>anchor/gate_keep_success</code>; mean over steps, "
            "then over seeds). The anchors' share of the loss tokens and their mean advantage. "
            "<code>ref/val_acc</code>: π_ref's validation accuracy at step 0 and at each reset — whether "
            "anchors came from a healthy or a collapsed checkpoint.</p>"), tables=[("", anchors)]))
    if fig_list("curves"):
        out_sections.append(Section("Other curves", figures=fig_list("curves")))
    out_sections.append(Section("Configs that differ between groups", intro=(
        "<p>Config keys whose value is not the same in every run (seed excluded). A <code>mixed</code> cell "
        "means a group holds runs with different values.</p>"), tables=[("", diff)]))
    shown = ["run_id", "group", "seed", "state", "world_size", "last_step", "peak", "peak_step", "final",
             "collapse_step",
             "collapse_z", "noise", "auc", "selected_step", "selected_val", "selected_test",
             *[c for s in matched for c in (f"val@{s}", f"test@{s}")], "reason"]
    runs_tbl = per_run[[c for c in shown if c in per_run.columns]].copy()
    for c in runs_tbl.columns:
        if runs_tbl[c].dtype.kind == "f":
            runs_tbl[c] = runs_tbl[c].map(lambda v: "—" if pd.isna(v) else f"{v:.4g}")
    out_sections.append(Section("Runs", intro="<p>Every score of every run: <code>tables/runs.csv</code>.</p>",
                                tables=[("", runs_tbl)]))
    return out_sections
