"""``armorlab report`` as stages, each a function returning a frozen result with its own notes:
load → group → score → decide → draw → tables → page (the last two: armorlab.analysis.page); the
output is described in docs/reports.md. Callers add sections of their own (``extra_sections``: the
report command's Optuna section), so analysis never imports tune."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from armorlab.analysis import capacity_stats as cs
from armorlab.analysis import freshness, page, panels, plots, tables, until_resolved_report, verdict_table
from armorlab.analysis import groups as G
from armorlab.analysis.html import Section
from armorlab.analysis.load import RunSet, load
from armorlab.analysis.page import ReportResult, result_summary  # noqa: F401 (re-export)
from armorlab.analysis.ranges import score_ranges
from armorlab.analysis.recipe import DEFAULT_CURVES, Recipe, default_out_dir, unit_disagreement  # noqa: F401 (re-export)
from armorlab.analysis.stages import Decided, Drawn, Grouped, Loaded, Scored
from armorlab.core.fsutil import refuse_symlinks
from armorlab.core.runs import RunDir
from armorlab.stats import collapse, select
from armorlab.stats import seeds as stats
from armorlab.stats.effective_batch import EFFECTIVE_BATCH_TOLERANCE, effective_batch_gap

log = logging.getLogger(__name__)

CAP_SAMPLE = 100_000  # A>0 tokens per run kept for the capacity ECDF (a plot needs no more)
MAX_ONSET_LABELS = 40  # collapse onsets labelled with their fall in SE, at most


def build_report(recipe: Recipe, out_dir: str | Path | None = None, *, cache: bool = True,
                 progress: Callable[[int, int], None] | None = None,
                 extra_sections: Callable[[Path, Callable[[str], None]], list[Section]] | None = None,
                 lead: Callable[[pd.DataFrame, RunSet, Path], Section | None] | None = None,
                 names: Callable[[pd.DataFrame, RunSet], Mapping[str, str]] | None = None) -> ReportResult:
    """Write the whole report for ``recipe`` and return what was written. ``extra_sections(out_dir,
    warn)``: sections after the run report's (``warn`` adds a warning); ``lead(per_run, runs, out_dir)``:
    a section shown first (the demo's headline); ``names(runs_groups, runs)``: the groups' names on the
    page from a frame of ``run_id`` and ``group`` (default: groups.display_names)."""
    out = Path(out_dir) if out_dir is not None else default_out_dir(recipe)
    key = freshness.input_key(recipe, out)  # before reading: a run growing meanwhile makes it stale
    refuse_symlinks(out / "plots", within=out.parent)  # every file below is written by path
    freshness.forget(out)
    loaded = load_runs(recipe, cache=cache, progress=progress)
    grouped = group_runs(recipe, loaded, names)
    scored = score(recipe, loaded, grouped)
    decided = decide(recipe, loaded, grouped, scored)
    drawn = draw(recipe, loaded, grouped, scored, decided, out / "plots")
    tabled = page.write_tables(recipe, loaded.runs, grouped, scored, decided, out / "tables")
    first = lead(scored.per_run, loaded.runs, out) if lead is not None else None
    return page.write_page(recipe, out, key, loaded, grouped, scored, decided, drawn, tabled, first,
                           extra_sections)


def load_runs(recipe: Recipe, *, cache: bool = True, progress: Callable[[int, int], None] | None = None) -> Loaded:
    rs = load(recipe.runs, cache=cache, progress=progress, format=recipe.format, mapping=recipe.runs_map,
              val_n=recipe.val_n, stages=recipe.stages)
    rs.counter = recipe.x  # steps in optimizer steps or rollouts, everywhere below
    notes = G.Notes(list(rs.warnings))
    for run in rs.runs.itertuples(index=False):
        reason = run.reason if isinstance(run.reason, str) else ""
        if run.state == "stopped":
            notes.add(f"run {run.run_id} stopped itself{f' ({reason})' if reason else ''}: its level at stop is "
                      "carried forward to the horizon in final, auc and matched-step scores")
        elif run.state not in ("completed", "unknown"):  # unknown: an import whose source says not how it ended
            notes.add(f"run {run.run_id} is {run.state}{f': {reason}' if reason else ''} (its curves end early)")
        elif run.state == "completed" and reason.startswith("stopped"):
            notes.add(f"run {run.run_id} {reason}")
    uncounted = [r for r in rs.run_ids if rs.last_step(r) is None] if rs.counter != "step" else []
    if uncounted:  # runs older than the rollout counter
        notes.add(f"{len(uncounted)} run(s) log no `{rs.counter}` counter and are left out of the curves: "
                  f"{_first_six(uncounted)}")
    units = {_sweep_file(Path(path).parent): unit if isinstance(unit, str) else "optimizer"  # each sweep's unit
             for path, unit in rs.runs.reindex(columns=["path", "step_unit"]).itertuples(index=False)
             if isinstance(path, str)}
    if text := unit_disagreement(recipe.x, str(recipe.path) if recipe.path else None, units):
        log.warning("%s", text)
        notes.add(text)
    sel, present = recipe.select, set(rs.metrics)
    curves = (list(recipe.curves) if recipe.curves is not None
              else [m for m in (*DEFAULT_CURVES, *recipe.kl) if m in present])
    curves = list(dict.fromkeys([m for m in (recipe.collapse.train, sel.metric) if m in present and m not in curves]
                                + curves))
    explicit = set(recipe.curves or ()) | {sel.metric, sel.report}
    configs = {r["run_id"]: r for r in rs.runs.to_dict("records")}
    for m in dict.fromkeys([sel.metric, sel.report, *curves]):
        expected = [r for r in rs.run_ids if logged_under(m, configs[r])]
        missing = [r for r in expected if not rs.has_metric(r, m)]
        if len(missing) == len(expected) and missing and m in explicit:
            notes.add(f"metric {m} missing in all {len(expected)} runs (not logged by this trainer version?)")
        elif 0 < len(missing) < len(expected):
            notes.add(f"metric {m} missing in {len(missing)}/{len(expected)} runs: {_first_six(missing)}")
    return Loaded(rs, curves, tuple(notes.items))


def _sweep_file(sweep_dir: Path) -> str:
    """The spec a sweep dir was submitted from (its sweep.json's ``source``), else the dir."""
    try:
        source = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError):
        source = None
    return source if isinstance(source, str) and source else str(sweep_dir)


def _first_six(items: Sequence[str], sep: str = ", ") -> str:
    return sep.join(items[:6]) + (" …" if len(items) > 6 else "")


def logged_under(metric: str, config: Mapping[str, Any]) -> bool:
    """Whether the trainer logs ``metric`` for a run with this config (design.md's metric list):
    a metric that cannot exist in a run is not reported as missing from it."""
    def on(key: str) -> bool:  # a config without the key (older run dirs): assume it is logged
        value = config.get(key)
        return not (isinstance(value, (int, float, np.number, np.bool_)) and value == 0)

    if metric.startswith(("anchor/", "kl/forward_")):
        return on("anchor") or on("anchor_gate")
    return all(on(key) for key in _LOGGED_WHEN.get(metric, ()))


_LOGGED_WHEN = {"obj/beta_kl": ("beta",), "obj/kl_grad_share": ("beta", "grad_share_every"),
                "obj/kl_grad_cos": ("beta", "grad_share_every"), "obj/anchor_grad_share": ("anchor", "grad_share_every")}


def group_runs(recipe: Recipe, loaded: Loaded,
               names: Callable[[pd.DataFrame, RunSet], Mapping[str, str]] | None = None) -> Grouped:
    rs = loaded.runs
    keys = recipe.group_by if recipe.group_by is not None else G.auto_group_by(rs.runs)
    groups = G.make_groups(rs.runs, keys, file=str(recipe.path) if recipe.path else None)
    notes = G.Notes()
    single = [g for g in groups.labels if len(groups.members[g]) == 1]
    if len(single) == 1:
        notes.add(f"group {single[0]} has a single seed: no confidence interval, read its numbers as anecdotes")
    elif single:
        notes.add(f"{len(single)} of {len(groups.labels)} groups have a single seed (no confidence interval, "
                  f"read their numbers as anecdotes): {_first_six(single, '; ')}")
    if weak := [g for g in groups.labels if 1 < len(groups.members[g]) <= stats.LOW_POWER_N]:
        notes.add(f"low-powered: {len(weak)} group(s) with 2–{stats.LOW_POWER_N} seeds ({_first_six(weak, '; ')}); "
                  "their Student-t intervals are wide and a probability of improvement between so few seeds "
                  "cannot be resolved")
    diff = G.config_diff(rs.runs, groups)
    for row in diff.to_dict("records"):
        if mixed := [k for k, v in row.items() if isinstance(v, str) and v.startswith("mixed: ")]:
            notes.add(f"group {row['group']} mixes runs with different {', '.join(mixed)}: "
                      f"add them to group_by to separate them")
    display, (pairs, compared) = G.names_of(groups, rs, names), G.comparison_pairs(rs.runs, groups, recipe)
    if G.FIRST_GROUP in compared and pairs:
        notes.add(f"baseline: {compared}; name one with --baseline KEY=VALUE or compare: {{baseline: ...}}")
    for a, b in pairs:  # effective batches (armorlab.stats.effective_batch) beyond the tolerance
        shortfalls = [[float(m.mean()) for r in groups.members.get(label, ())
                       if (m := rs.curve(r, "train/refill_shortfall")[1]).size] for label in (b, a)]
        if (gap := effective_batch_gap(*shortfalls)) is not None:
            notes.add(f"effective batch differs between {display.get(a, a)} and {display.get(b, b)}: "
                      f"{gap[1]:.0%} vs {gap[0]:.0%} of the batch trains (1 − mean train/refill_shortfall; "
                      f"tolerance {EFFECTIVE_BATCH_TOLERANCE:.0%}): their batch sizes and loss normalisers "
                      f"differ — raise max_num_gen_batches, or read the comparison with that in mind")
    return Grouped(groups, list(keys), display, diff, pairs, tuple(notes.items), G.rename(compared, display))


def score(recipe: Recipe, loaded: Loaded, grouped: Grouped) -> Scored:
    """Each group's mean curves, each run's scores, each group's summary of them."""
    rs, groups, sel = loaded.runs, grouped.groups, recipe.select
    curve_notes, notes = G.Notes(), G.Notes()
    # the KL figure's metrics whether or not they are curves; their notes first, as ever
    wanted = [m for m in dict.fromkeys([*recipe.kl, sel.metric, recipe.collapse.train, *loaded.curves])
              if m in loaded.curves or m in recipe.kl]
    bands = {m: b for m in wanted if (b := grouped.named(_bands(rs, groups, m, curve_notes)))}
    noise = grouped.named(_noise_bands(rs, groups, sel.metric)) if sel.metric in bands else {}
    tok_stats, capacity, counterfactual = _token_samples(rs, groups, notes)
    matched = G.resolve_matched_steps(rs, recipe)
    per_run = G.run_scores(rs, groups, recipe, matched, notes, tok_stats)
    cols = G.score_columns(per_run, matched)
    # token-sample statistics (tokens/ parquet), aggregated like scores but shown apart
    tok_cols = [c for c in per_run.columns if c.startswith("tok_") and c != "tok_tokens"]
    # a step score's interval lies inside the logged steps (a Student-t interval can reach before the first)
    logged = [s for r in rs.run_ids if (s := rs.curve(r, sel.metric)[0]).size]
    summary = G.group_summary(per_run, groups, cols + [c for c in G.EXTRA_SCORES if c in per_run] + tok_cols,
                              step_range=(float(min(s[0] for s in logged)), float(max(s[-1] for s in logged)))
                              if logged else None,
                              bounds=score_ranges(cols, sel.metric, sel.report, per_run))
    return Scored(bands, noise, matched, per_run, cols, tok_cols, summary, G.resolve_scores(recipe, per_run, matched),
                  grouped.named(capacity), counterfactual, tuple(curve_notes.items), tuple(notes.items))


def _bands(rs: RunSet, groups: G.Groups, metric: str, notes: G.Notes) -> dict[str, stats.CurveBand]:
    out = {}
    for g in groups.labels:
        if curves := [c for c in (rs.curve(r, metric) for r in groups.members[g]) if c[0].size]:
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
        aligned = stats.align_curves([(s, collapse.eval_se(v, G.eval_sizes(rs, r, metric, s)) ** 2)
                                      for r in groups.members[g] for s, v in [rs.curve(r, metric)] if s.size])
        count = np.isfinite(aligned.values).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            se = np.where(count > 0, np.sqrt(np.nansum(aligned.values, axis=0)) / count, np.nan)
        if np.isfinite(se).any():
            out[g] = (aligned.grid, se)
    return out


def _token_samples(rs: RunSet, groups: G.Groups, notes: G.Notes):
    """Token-sample statistics per run, own-objective capacities per group, counterfactuals."""
    per_run, per_group, cf_parts = {}, {}, {}
    for run in rs.runs.to_dict("records"):
        tokens = cs.read_tokens(run["path"])
        if tokens is None:
            continue
        if lacks := sorted({"logp", "old_logp", "advantage"} - set(tokens.columns)):
            notes.add(f"run {run['run_id']}: tokens/ lacks {', '.join(lacks)}")
            continue
        cfg = RunDir(run["path"]).read_config()
        try:
            per_run[run["run_id"]] = cs.token_stats(tokens, cfg)
        except ValueError as exc:
            notes.add(f"run {run['run_id']}: token statistics skipped ({exc})")
            continue
        own = cs.counterfactual_capacity(tokens, cfg, objectives=(cs.objective_params(cfg)["objective"],))
        per_group.setdefault(groups.of_run[run["run_id"]], []).append(next(iter(own.values()),
                                                                           np.empty(0))[:CAP_SAMPLE])
        for obj, arr in cs.counterfactual_capacity(tokens, cfg).items():
            cf_parts.setdefault(obj, []).append(arr[:CAP_SAMPLE])
    return (per_run, {g: np.concatenate(v) for g, v in per_group.items()},
            {o: np.concatenate(v) for o, v in cf_parts.items()})


def decide(recipe: Recipe, loaded: Loaded, grouped: Grouped, scored: Scored) -> Decided:
    """Verdicts per arm (a sweep run until resolved: its looks.json's, since fixed-sample verdicts
    would ignore the looks) and the probability of improvement per compared pair."""
    notes, sel = G.Notes(), recipe.select
    if sequential := until_resolved_report.find(recipe.runs):
        until_resolved_report.prepare(sequential, sel.metric, sel.report)
        until_resolved_report.check(sequential, scored.per_run, loaded.runs, notes)
    verdicts = None if sequential else verdict_table.build(scored.per_run, loaded.runs, recipe, grouped.pairs,
                                                           notes, grouped.display)
    poi = G.improvement_table(scored.per_run, grouped.pairs, scored.scores)
    return Decided(verdicts, sequential, poi, tuple(notes.items))


def draw(recipe: Recipe, loaded: Loaded, grouped: Grouped, scored: Scored, decided: Decided,
         plot_dir: Path) -> Drawn:
    """Every figure, in the page's order: the selection metric, over-optimisation, KL, capacity,
    ablation, the other curves."""
    colors = plots.group_colors([grouped.display[g] for g in grouped.groups.labels])
    legend = ", ".join(grouped.keys) if grouped.keys else "group"
    style = {"legend_title": legend, "colors": colors}
    axis = {} if recipe.x == "step" else {"x_label": plots.AXIS_LABELS[recipe.x]}
    sel, col, bands = recipe.select, recipe.collapse, scored.bands
    kl_panels = {m: bands[m] for m in recipe.kl if m in bands}
    # the small multiples show only what no figure above shows: each extra figure costs a second
    shown = {sel.metric, col.train, *kl_panels} if sel.metric in bands else set(kl_panels)
    others = {m: bands[m] for m in loaded.curves if m in bands and m not in shown}
    figures = [
        _val_figure(recipe, loaded, grouped, scored, decided, plot_dir, colors, axis, legend),
        ("results", panels.plot_overoptimisation(bands[col.train], bands[sel.metric], col.train, sel.metric,
                                                 plot_dir / "overoptimisation.png", **style, **axis),
         f"{col.train} (dashed) against {sel.metric} (solid): the over-optimisation picture")
        if sel.metric in bands and col.train in bands else None,
        ("kl", plots.plot_kl(kl_panels, plot_dir / "kl.png", **style, **axis), _kl_caption(kl_panels, recipe.kl))
        if kl_panels else None,
        ("capacity", plots.plot_capacity(scored.capacity, scored.counterfactual, plot_dir / "capacity.png", **style),
         "ECDF of probability capacity of A>0 tokens from tokens/ samples") if scored.capacity else None,
        _ablation_figure(recipe, grouped, scored, plot_dir, colors),
        ("curves", plots.plot_curve_grid(others, plot_dir / "curves.png", **style, **axis),
         f"the recipe's other curves: mean over seeds with 95% CI (Student-t below "
         f"{stats.T_MIN_BOOTSTRAP} seeds, BCa bootstrap from {stats.T_MIN_BOOTSTRAP})") if others else None]
    return Drawn(tuple(f for f in figures if f is not None))


def _val_figure(recipe, loaded, grouped, scored, decided, plot_dir, colors, axis, legend):
    sel, col, verdicts, display = recipe.select, recipe.collapse, decided.verdicts, grouped.display
    band = scored.bands.get(sel.metric)
    if not band:
        return None
    records, at = scored.per_run.to_dict("records"), G.group_rows(scored.per_run)
    onsets = {display[g]: [r for r in (records[i] for i in at.get(g, ())) if pd.notna(r.get("collapse_step"))]
              for g in grouped.groups.labels}
    n_onsets = sum(map(len, onsets.values()))
    labelled = n_onsets <= MAX_ONSET_LABELS  # past this they overlap into a smear (and cost a fifth of figure time)

    def label(z: float) -> str:  # the fall in SE
        return "" if not labelled else f"−{z:.1f} SE" if math.isfinite(z) else "−∞ SE" if z == math.inf else ""

    markers = {g: [(r["collapse_step"], select.value_at(*loaded.runs.curve(r["run_id"], sel.metric),
                                                        r["collapse_step"]).value, label(r.get("collapse_z", math.nan)))
                   for r in runs] for g, runs in onsets.items()}
    common = {"colors": colors, "markers": markers, "matched_steps": scored.matched, "noise": scored.noise, **axis}
    if 2 <= len(grouped.groups.labels) <= panels.MAX_PANELS:  # one panel per arm, its baseline in each
        base = verdicts.baseline() if verdicts is not None else None
        words = {display[v.arm]: v.verdict for v in verdicts.primary_verdicts()} if base is not None else {}
        path = panels.plot_arms(band, sel.metric, plot_dir / "val.png", baseline=display.get(base), verdicts=words,
                                verdict_of=verdicts.labels[verdicts.primary] if verdicts else "", **common)
        how = (f"one panel per arm, its baseline {display[base]} in grey in each" if base is not None else
               "one panel per group, the other groups' means in light grey")
        how += f"; panel titles: each arm's verdict on {verdicts.labels[verdicts.primary]}" if words else ""
    else:
        path = plots.plot_curves(band, sel.metric, plot_dir / "val.png", legend_title=legend, **common)
        how = "all groups on one axis"
    onsets = ("labelled with how many SEs its level fell below the earlier peak " if labelled else
              f"unlabelled at {n_onsets} onsets (over {MAX_ONSET_LABELS} the labels overlap): how many SEs each "
              "level fell below the earlier peak is collapse_z in the Runs table ")
    return ("first", path, f"{sel.metric}, {how}: mean over seeds with its 95% CI (lightly shaded; the y axis "
            "holds the means and the bands but for spikes, at most one range of the means beyond them: a wider CI "
            "is cut at the frame); thin dashed lines: ±1 SE of eval noise (binomial from the eval count, val/n or "
            "val/n_greedy, where logged, else estimated from the curve); ▼ = a seed's collapse onset, " + onsets
            + f"(m={col.patience} evals per level, α={col.alpha}, δ={col.delta}); vertical dotted = matched steps")


def _ablation_figure(recipe, grouped, scored, plot_dir, colors):
    keys, groups, scores, per_run = grouped.keys, grouped.groups, scored.scores, scored.per_run
    varying = [k for k in keys if groups.table[k].map(G.fmt_value).nunique() > 1]
    if not (scores and len(groups.labels) > 1 and varying):
        return None
    *hue, x_key = varying
    at, numeric, sel = G.group_rows(per_run), G.numeric_columns(per_run, scores), recipe.select
    seeds = {g: {s: numeric[s][at.get(g, np.empty(0, dtype=np.int64))] for s in scores} for g in groups.labels}
    label = {s: tables.score_label(s, sel.metric, sel.report) for s in scored.cols + scored.tok_cols}
    path = plots.plot_ablation(scored.summary.to_dict("records"), seeds, scores, label, x_key, hue,
                               plot_dir / "ablation.png", colors={g: colors[grouped.display[g]] for g in groups.labels})
    return ("results", path, f"headline scores by {x_key}: mean with 95% CI (Student-t below "
                             f"{stats.T_MIN_BOOTSTRAP} seeds); dots are seeds")


def _kl_caption(kl_panels: Mapping[str, Any], wanted: Sequence[str]) -> str:
    """What the KL figure shows, direction by direction, from the panels it has; a direction the
    recipe asks for but no run logged is said to be missing."""
    by_direction: dict[str, list[str]] = {}
    for m in kl_panels:
        by_direction.setdefault(plots.kl_direction(m)[0] or "other", []).append(m)
    text = (" and ".join(f"{d} ({', '.join(ms)})" for d, ms in by_direction.items()) + " over steps, mean over seeds with its 95% CI; reverse KL is estimated on "
            "samples of π_θ, forward KL on unconditioned samples of π_ref (panel titles say which)")
    if plots.KL_FORWARD not in by_direction and any(plots.kl_direction(m)[0] == plots.KL_FORWARD for m in wanted):
        text += ("; no forward KL: these runs log none (kl/forward_k* needs anchors or the gate, kl/exact_forward "
                 "the probe, kl_probe_prompts > 0)")
    return text
