"""The report's last two stages: its tables (tables/*) and its page (index.html, recipe.yaml,
the freshness stamp). The page lists every stage's notes once, in one order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from armorlab.analysis import freshness, mechanism_table, tables, until_resolved_report, verdict_table
from armorlab.analysis import groups as G
from armorlab.analysis.html import Figure, Section, esc, write_index
from armorlab.analysis.load import RunSet
from armorlab.analysis.recipe import Recipe
from armorlab.analysis.stages import Decided, Drawn, Grouped, Loaded, Scored
from armorlab.core.fsutil import atomic_write_text, atomic_write_yaml
from armorlab.core.runs import now_iso
from armorlab.stats import seeds as stats


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


def result_summary(result: ReportResult) -> dict[str, Any]:
    """What the CLI prints about a report, as JSON (kept in the freshness stamp)."""
    return {"index": str(result.index), "plots": [str(p) for p in result.plots],
            "tables": [str(p) for p in result.tables], "warnings": list(result.warnings),
            "n_runs": result.n_runs, "n_groups": result.n_groups, "verdicts": list(result.verdicts)}


@dataclass(frozen=True)
class Tabled:
    written: list[Path]
    groups: pd.DataFrame                # the page's forms of the tables
    headline: pd.DataFrame
    improvement: pd.DataFrame
    tokens: pd.DataFrame | None
    anchors: pd.DataFrame | None
    mechanisms: pd.DataFrame | None


def write_tables(recipe: Recipe, rs: RunSet, grouped: Grouped, scored: Scored, decided: Decided,
                 tdir: Path) -> Tabled:
    sel, keys, summary = recipe.select, grouped.keys, scored.summary
    group_display = tables.display_group_table(summary, keys, scored.cols, sel.metric, sel.report)
    token_display = (tables.display_group_table(summary, keys, scored.tok_cols, sel.metric, sel.report,
                                                n_of=scored.tok_cols[0]) if scored.tok_cols else None)
    headline = tables.display_headline(summary, keys, scored.scores, sel.metric, sel.report)
    poi_display = tables.display_improvement(decided.poi, sel.metric, sel.report)
    anchors = _anchor_table(rs, grouped.groups)
    mechanisms, mechanism_numbers = mechanism_table.mechanism_table(rs, grouped.groups) or (None, None)
    written = _write(tdir, (summary, "groups", ("csv",), None),
                     (group_display, "groups", ("md", "tex"),
                      f"{recipe.title}: mean [95% CI] over seeds (method per row)"),
                     (token_display, "tokens", ("md", "tex"), "token-sample statistics: mean [95% CI] over seeds"),
                     (scored.per_run, "runs", ("csv",), None),
                     (headline, "headline", ("md",), "headline scores: mean [95% CI], IQM, std, n over seeds"))
    # the paper's table: arm names, mean ± CI per headline score (the long one stays headline.md)
    atomic_write_text(tdir / "headline.tex", tables.compact_latex(
        summary, grouped.display, scored.scores, sel.metric, sel.report,
        f"{recipe.title}: mean ± 95% CI half-width over seeds (asymmetric: +upper/-lower; "
        f"Student-t below {stats.T_MIN_BOOTSTRAP} seeds, BCa from {stats.T_MIN_BOOTSTRAP})"), durable=False)
    written += [tdir / "headline.tex", *_write(
        tdir, (decided.poi, "improvement", ("csv",), None),
        (poi_display, "improvement", ("md", "tex"), "probability of improvement P(X > Y) over seeds"),
        (grouped.diff, "configs", ("csv",), None))]
    if decided.verdicts is not None:
        written += verdict_table.write(decided.verdicts, tdir)
    if decided.sequential:
        written += until_resolved_report.write(decided.sequential, tdir)
    written += _write(tdir, (anchors, "anchors", ("csv", "md"), None),
                      (mechanisms, "mechanisms", ("md",), "did each mechanism act? mean [95% CI] over seeds"),
                      (mechanism_numbers, "mechanisms", ("csv",), None))
    return Tabled(written, group_display, headline, poi_display, token_display, anchors, mechanisms)


def _write(tdir: Path, *plan: tuple[pd.DataFrame | None, str, tuple[str, ...], str | None]) -> list[Path]:
    """Each (frame, name, formats, caption) of ``plan`` whose frame exists, as tables/<name>.<format>."""
    return [path for frame, name, formats, caption in plan if frame is not None
            for path in tables.write_table(frame, tdir / name, formats=formats, caption=caption)]


def _anchor_table(rs: RunSet, groups: G.Groups) -> pd.DataFrame | None:
    """ARMOR review points 1 and 4, per group (mean over seeds of each run's mean over steps)."""
    cols = {"anchor/gate_drop_success": "success on gate-dropped queries",
            "anchor/gate_keep_success": "success on kept queries", "anchor/share": "anchor share of loss tokens",
            "anchor/adv_mean": "anchor advantage (mean)"}
    if not any(m in rs.metrics for m in [*cols, "ref/val_acc"]):
        return None
    rows = []
    for g in groups.labels:
        row: dict[str, Any] = {"group": g}
        for m, label in cols.items():
            s = stats.summarise([float(np.mean(v)) for r in groups.members[g] for _, v in [rs.curve(r, m)] if v.size])
            row[label] = tables.fmt_ci(s.mean, s.ci_low, s.ci_high)
        curves = [rs.curve(r, "ref/val_acc") for r in groups.members[g]]
        resets = pd.concat([pd.Series(v, s, dtype=float) for s, v in curves]).groupby(level=0).mean()
        row["ref/val_acc at resets (step: mean over seeds)"] = ", ".join(
            f"{step:g}: {v:.3f}" for step, v in resets.items()) or "—"
        rows.append(row)
    return pd.DataFrame(rows)


def write_page(recipe: Recipe, out: Path, key: Any, loaded: Loaded, grouped: Grouped, scored: Scored,
               decided: Decided, drawn: Drawn, tabled: Tabled, first: Section | None,
               extra_sections: Callable[[Path, Callable[[str], None]], list[Section]] | None) -> ReportResult:
    sel, rs, verdicts = recipe.select, loaded.runs, decided.verdicts
    notes = G.Notes(list(dict.fromkeys(chain(loaded.notes, grouped.notes, scored.curve_notes, decided.notes,
                                             scored.notes))))
    atomic_write_yaml(out / "recipe.yaml", durable=False, obj={  # the recipe as resolved
        "title": recipe.title, "runs": list(recipe.runs), "group_by": list(grouped.keys), "curves": loaded.curves,
        "select": {"metric": sel.metric, "mode": sel.mode, "report": sel.report},
        "matched_steps": list(scored.matched), "scores": scored.scores, "kl": list(recipe.kl),
        "collapse": dict(vars(recipe.collapse)),
        "compare": {"endpoints": list(recipe.compare.endpoints or verdict_table.DEFAULT_ENDPOINTS),
                    "pairs": [list(p) for p in grouped.pairs], "chosen": grouped.compared,
                    "delta": recipe.compare.delta}})  # the declared margin (None: none), as the recipe (or --delta) gave it
    figs: dict[str, list[Figure]] = {}
    for kind, path, caption in drawn.figures:
        figs.setdefault(kind, []).append(Figure(str(path.relative_to(out)), caption,
                                                "first-figure" if kind == "first" else None))
    top = figs.get("first", [])
    lead = [first] if first is not None else []
    if verdicts is not None:
        lead = verdict_table.section(verdicts, len(grouped.pairs), top[0] if top else None) + lead
    elif top:
        lead = [Section(f"{sel.metric} per group", figures=top, lead=True), *lead]
    if decided.sequential:
        lead.insert(0, until_resolved_report.section(decided.sequential))
    names = G.PageNames(grouped.display, scored.summary["group"].tolist(), grouped.keys)
    sections = lead + _sections(recipe, figs, names, tabled, grouped.diff, scored)
    if extra_sections is not None:
        sections += extra_sections(out, notes.add)
    warnings = [G.rename(n, grouped.display) for n in notes.items]
    legend = ", ".join(grouped.keys) if grouped.keys else "group"
    meta = (f"{len(rs.run_ids)} runs in {len(grouped.groups.labels)} groups (group_by: {esc(legend)}) · "
            f"selection on {esc(sel.metric)} ({sel.mode}), reported on {esc(sel.report)} · "
            f"matched steps {esc(', '.join(map(str, scored.matched)) or 'none')}"
            + (f" · compared: {esc(grouped.compared)}" if grouped.pairs else "") + f" · generated {esc(now_iso())}")
    index = write_index(out, recipe.title, meta, warnings, sections)
    result = ReportResult(out, index, [p for _, p, _ in drawn.figures], tabled.written, warnings, len(rs.run_ids),
                          len(grouped.groups.labels), decided.sentences)
    # every figure under plots/, the extra sections' too (an Optuna study's)
    figures = [p for p in (out / "plots").rglob("*") if p.is_file()] if (out / "plots").is_dir() else []
    freshness.write_stamp(out, key, result_summary(result),
                          [index, out / "recipe.yaml", *result.plots, *tabled.written, *figures])
    return result


def _sections(recipe: Recipe, figs: dict[str, list[Figure]], names: G.PageNames, tabled: Tabled,
              diff: pd.DataFrame, scored: Scored) -> list[Section]:
    """The page's sections after its lead ones (verdicts, the first figure, the caller's lead)."""
    sel, matched, token_display = recipe.select, scored.matched, names.tables(tabled.tokens)
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
        f"false-alarm rate per flat curve; binomial SE from the eval count, val/n or val/n_greedy, where logged) and ≥ δ={recipe.collapse.delta}; "
        f"drop (SE) and fall at collapse (SE) say by how many standard errors. AUC: mean level over the run.</p>"),
        tables=[("", names.tables(tabled.groups))], figures=figs.get("results", []))
    compare = Section("Headline scores and probability of improvement", intro=(
        "<p>IQM: scipy's trim_mean(x, 0.25), which drops ⌊n/4⌋ seeds at each end (none at n ≤ 3, where it "
        f"is the mean; one per end at 4–7 seeds) and averages the rest. Mean CIs: Student-t below "
        f"{stats.T_MIN_BOOTSTRAP} seeds, BCa bootstrap from {stats.T_MIN_BOOTSTRAP}. P(X &gt; Y): the chance that a seed of X scores higher than a seed of Y (ties count "
        "½); 0.5 = no difference. Its CI resamples the seeds of X and Y independently (percentile bootstrap); "
        "where even complete separation would not be significant (exact two-sided Mann–Whitney p = 2/C(n+m, n) "
        "&gt; 0.05: 2 vs 2, 3 vs 3, 3 vs 4 seeds) the table says it cannot be resolved instead of giving an "
        "interval. Mann–Whitney p: the exact two-sided test of X against Y.</p>"),
        tables=[("headline scores per group", names.tables(tabled.headline)),
                ("probability of improvement", names.column(names.column(tabled.improvement, "X"), "Y"))])
    out_sections = [results, compare]
    if tabled.mechanisms is not None:  # right after the results: whether a remedy acted, beside whether it held
        out_sections.insert(1, Section("Mechanisms: did each remedy act?", intro=mechanism_table.INTRO,
                                       tables=[("", names.column(tabled.mechanisms))]))
    if figs.get("kl"):
        out_sections.append(Section("KL to the reference", figures=figs.get("kl")))
    if figs.get("capacity") or token_display is not None:
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
            tables=[("", token_display)] if token_display is not None else [], figures=figs.get("capacity", [])))
    if tabled.anchors is not None:
        out_sections.append(Section("Anchor diagnostics", intro=(
            "<p>ARMOR review points 1 and 4. The gate drops queries the reference could not solve: the "
            "policy's own group success rate on dropped vs kept queries shows how hard the dropped ones are "
            "(<code>anchor/gate_drop_success</code>, <code>anchor/gate_keep_success</code>; mean over steps, "
            "then over seeds). The anchors' share of the loss tokens and their mean advantage. "
            "<code>ref/val_acc</code>: π_ref's validation accuracy at step 0 and at each reset — whether "
            "anchors came from a healthy or a collapsed checkpoint.</p>"), tables=[("", names.column(tabled.anchors))]))
    if figs.get("curves"):
        out_sections.append(Section("Other curves", figures=figs.get("curves")))
    out_sections.append(Section("Configs that differ between groups", intro=(
        "<p>Config keys whose value is not the same in every run (seed excluded). A <code>mixed</code> cell "
        "means a group holds runs with different values.</p>"), tables=[("", names.column(diff))]))
    shown = ["run_id", "group", "seed", "state", "world_size", "last_step", "peak", "peak_step", "final",
             "collapse_step", "collapse_z", "noise", "auc", "selected_step", "selected_val", "selected_test",
             *[c for s in matched for c in (f"val@{s}", f"test@{s}")], "reason"]
    per_run = names.column(scored.per_run)
    runs_tbl = per_run[[c for c in shown if c in per_run.columns]].apply(
        lambda col: col.map(lambda v: "—" if pd.isna(v) else f"{v:.4g}") if col.dtype.kind == "f" else col)
    out_sections.append(Section("Runs", intro="<p>Every score of every run: <code>tables/runs.csv</code>.</p>",
                                tables=[("", runs_tbl)]))
    return out_sections
