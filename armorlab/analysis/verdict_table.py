"""The report's verdict table, first on the page: each compared arm against its baseline on the
recipe's endpoints (``compare: {endpoints, delta}``), with one plain sentence per arm on the primary
endpoint. The statistics are armorlab.stats.verdicts'; this module gathers their inputs and formats them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from armorlab.analysis import tables
from armorlab.analysis.groups import Notes, group_rows, numeric_columns
from armorlab.analysis.html import Figure, Section, esc
from armorlab.analysis.load import RunSet
from armorlab.analysis.ranges import clip_interval, difference_range, score_ranges
from armorlab.analysis.recipe import DEFAULT_ENDPOINTS, Recipe
from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError
from armorlab.stats import seeds as stats
from armorlab.stats import verdicts as V
from armorlab.stats.margins import NO_MARGIN, caveat, margin_source, prevention
from armorlab.stats.sequential_text import ENDPOINT_WORDS, endpoint_label, interval, verdict_cell


@dataclass
class VerdictTable:
    verdicts: list[V.Verdict]
    deltas: dict[str, tuple[float, str]]          # endpoint → (δ, how it was set)
    sentences: list[str]
    display: pd.DataFrame
    numbers: pd.DataFrame
    summary: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)     # group label → its name on the page
    primary: str = ""                                       # the endpoint the sentences are on
    hours: dict[str, float] = field(default_factory=dict)   # group label → mean hours of its runs

    def primary_verdicts(self) -> list[V.Verdict]:
        return [v for v in self.verdicts if v.endpoint == self.primary]

    def baseline(self) -> str | None:
        """The one baseline every primary comparison is against (its label), else None."""
        bases = {v.baseline for v in self.primary_verdicts()}
        return bases.pop() if len(bases) == 1 else None


def within(v: V.Verdict, bounds: tuple[float, float] | None) -> V.Verdict:
    """The verdict with its interval inside the difference's range (analysis.ranges R1); the
    verdict itself was decided on the whole interval."""
    low, high = clip_interval(v.low, v.high, bounds)
    return replace(v, low=low, high=high)


def run_hours(rs: RunSet) -> dict[str, float]:
    """Wall hours of each completed run from status.json (started → ended; a resumed run counts
    its last attempt only; a stopped run's hours are its whole cost)."""
    out = {}
    for run in rs.runs.itertuples(index=False):
        try:  # a damaged or hand-edited status.json costs only its run's time
            status = RunDir(run.path).read_status() if run.state in ("completed", "stopped") else {}
            start, end = (datetime.fromisoformat(status[k]) for k in ("started", "ended"))
            out[run.run_id] = (end - start).total_seconds() / 3600
        except (OSError, ValueError, TypeError, KeyError, OverflowError):
            pass
    return {r: h for r, h in out.items() if h > 0}


def values_by_group(per_run: pd.DataFrame, endpoint: str) -> dict[str, list[float]]:
    """Each group's finite values of one per-run score: what sequential.decide_look takes."""
    if endpoint not in per_run.columns:
        raise ArmorLabError("not a score of these runs", key="endpoint", value=endpoint)
    values = pd.to_numeric(per_run[endpoint], errors="coerce").astype(float)
    return {g: v[np.isfinite(v)].tolist() for g, v in values.groupby(per_run["group"], sort=False)}


def build(per_run: pd.DataFrame, rs: RunSet, recipe: Recipe, pairs: Sequence[tuple[str, str]],
          notes: Notes, names: Mapping[str, str] | None = None) -> VerdictTable | None:
    """Verdicts of every pair on every endpoint; None without a pair to compare."""
    if not pairs:
        return None
    sel, cmp_, names = recipe.select, recipe.compare, dict(names or {})
    file = str(recipe.path) if recipe.path else None
    endpoints = list(cmp_.endpoints or DEFAULT_ENDPOINTS)
    scores = [c for c in per_run.columns if per_run[c].dtype.kind in "fiu" and c not in ("seed", "world_size")]
    if unknown := [e for e in endpoints if e not in scores]:
        raise ArmorLabError(f"not a score of these runs (scores: {', '.join(scores)})",
                            key="compare.endpoints", value=unknown[0], file=file)
    at = defaultdict(lambda: np.empty(0, dtype=np.int64), group_rows(per_run))
    numeric = numeric_columns(per_run, endpoints)
    compared = list(dict.fromkeys(g for pair in pairs for g in pair))
    ids, hours = per_run["run_id"].to_numpy(), run_hours(rs)
    group_hours = {g: float(np.mean(timed)) for g in compared
                   if (timed := [hours[r] for r in ids[at[g]] if r in hours])}
    delta = float(cmp_.delta) if cmp_.delta is not None else math.nan
    falls = {b: fall_record(per_run, at[b], b, recipe.collapse.alpha) for _, b in pairs}
    if not math.isfinite(delta):
        notes.add("verdicts: no margin declared (compare.delta, or armorlab report --delta X): no comparison is "
                  "called equivalent and no seeds are planned")
    how = (f"declared: {cmp_.delta_from}" if cmp_.delta_from and cmp_.delta is not None
           else margin_source(cmp_.delta, file, "--delta"))
    ranges = score_ranges(endpoints, sel.metric, sel.report, per_run)
    # drop-like endpoints are better small in either mode (the drop is taken on the sign-corrected curve)
    verdicts = [V.with_caveat(within(v, difference_range(ranges.get(e))),
                              caveat(falls[v.baseline], e, names.get(v.baseline)))
                for e in endpoints
                for v in V.compare({g: numeric[e][at[g]] for g in compared}, pairs, e, delta=delta,
                                   higher_is_better=e not in V.LOWER_IS_BETTER and sel.mode == "max")]
    labels = {e: endpoint_label(e, sel.metric, sel.report) if e in ENDPOINT_WORDS
              else tables.score_label(e, sel.metric, sel.report) for e in endpoints}
    primary = [v for v in verdicts if v.endpoint == endpoints[0]]
    return VerdictTable(
        verdicts, dict.fromkeys(endpoints, (delta, how)),
        [V.sentence(v, labels[v.endpoint], names=names, hours=_hours(v, group_hours)) for v in primary],
        _display(verdicts, labels, names, at, numeric, group_hours), pd.DataFrame(verdicts),
        _summary(primary, group_hours, labels[endpoints[0]]), labels, names, endpoints[0], group_hours)


def fall_record(per_run: pd.DataFrame, rows: np.ndarray, baseline: str, curve_alpha: float) -> dict:
    """margins (F1) for one baseline: how many of its runs (``rows`` of ``per_run``) with a curve to
    judge (a finite ``final``) collapsed; none judged without those columns."""
    if "collapse_step" not in per_run or "final" not in per_run:
        return prevention(baseline, 0, 0, curve_alpha)
    judged = rows[np.isfinite(numeric_columns(per_run, ["final"])["final"][rows])]
    collapsed = int(pd.notna(per_run["collapse_step"].to_numpy()[judged]).sum())
    return prevention(baseline, collapsed, len(judged), curve_alpha)


def _hours(v: V.Verdict, group_hours: Mapping[str, float]) -> float | None:
    if v.seeds_needed is None or v.arm not in group_hours or v.baseline not in group_hours:
        return None
    return sum(max(0, v.seeds_needed - n) * group_hours[g] for g, n in ((v.arm, v.n_arm), (v.baseline, v.n_baseline)))


def open_cost(primary: Sequence[V.Verdict], group_hours: Mapping[str, float]) -> tuple[int, float | None]:
    """(more runs, their hours or None where a run time is unknown) that resolve every open comparison
    at once: each arm up to its planned seeds, the shared baseline up to the largest."""
    open_ = [v for v in primary if v.seeds_needed is not None and V.more_runs(v)]
    base_need: dict[str, tuple[int, int]] = {}     # baseline → (seeds it needs, seeds it has)
    for v in open_:
        base_need[v.baseline] = (max(base_need.get(v.baseline, (0,))[0], v.seeds_needed), v.n_baseline)
    extra = [(g, n) for g, n in [(v.arm, v.seeds_needed - v.n_arm) for v in open_]
             + [(b, need - have) for b, (need, have) in base_need.items()] if n > 0]
    known = all(g in group_hours for g, _ in extra)
    return sum(n for _, n in extra), sum((n * group_hours[g] for g, n in extra), 0.0) if known else None


def _summary(primary: Sequence[V.Verdict], group_hours: Mapping[str, float], label: str) -> str:
    runs, hours = open_cost(primary, group_hours)
    cost = f", ≈ {hours:.1f} h of runs at the measured run times" if hours is not None else ""
    return (f"Resolving every open comparison on {label} at 80% power takes {runs} more runs"
            f"{cost} (each arm up to its planned seeds, the shared baseline up to the largest).") if runs else ""


def _cells(v: V.Verdict, names: Mapping[str, str]) -> dict[str, str]:
    """The columns both verdict tables show."""
    return {"arm vs baseline": f"{names.get(v.arm, v.arm)} vs {names.get(v.baseline, v.baseline)}",
            "verdict": verdict_cell(v.verdict, v.within_delta, bool(v.caveat)),
            "difference [CI]": interval({"diff": v.diff, "ci": [v.low, v.high]}),
            "seeds": V.seeds_phrase(v.n_arm, v.n_baseline).replace(" seeds per arm", " per arm")}


def _display(verdicts, labels, names, at, numeric, group_hours) -> pd.DataFrame:
    rows = []
    for v in verdicts:
        sign = 1.0 if v.higher_is_better else -1.0
        poi = stats.probability_of_improvement(sign * numeric[v.endpoint][at[v.arm]],
                                               sign * numeric[v.endpoint][at[v.baseline]])
        hours, cells, planned = _hours(v, group_hours), _cells(v, names), v.seeds_needed is not None
        rows.append({
            "arm vs baseline": cells["arm vs baseline"], "endpoint": labels[v.endpoint],
            "difference [CI]": cells["difference [CI]"],
            "CI level": "—" if not math.isfinite(v.low) else f"{100 * (1 - v.level):.4g}%",
            "verdict": cells["verdict"], "seeds": cells["seeds"],
            "δ": f"{v.delta:.3f}" if math.isfinite(v.delta) else "—",
            "P(arm better)": "—" if not math.isfinite(poi) else f"{poi:.2f}",
            "80% power needs": f"{v.seeds_needed} per arm" if planned else "—",
            "more runs": str(V.more_runs(v)) if planned else "—",
            "≈ hours": "—" if hours is None else f"{hours:.1f}"})
    return pd.DataFrame(rows)


def _seeds(vs: Sequence[V.Verdict]) -> str:
    low, high = min(min(v.n_arm, v.n_baseline) for v in vs), max(max(v.n_arm, v.n_baseline) for v in vs)
    return f"{low} seed{'s' if low != 1 else ''} per arm" if low == high else f"{low}–{high} seeds per arm"


def _open_cost(vs: Sequence[V.Verdict], table: VerdictTable) -> str:
    """': 24 more runs (≈ 3.1 h) would resolve them at 80% power'; nothing where one has no plan (no δ or spread)."""
    open_ = [v for v in vs if v.verdict in (V.UNRESOLVED, V.TOO_FEW)]
    runs, hours = open_cost(vs, table.hours)
    if not open_ or not runs or any(v.seeds_needed is None for v in open_):
        return ""
    return (f": {runs} more runs" + (f" (≈ {hours:.1f} h)" if hours is not None else "")
            + f" would resolve {'it' if len(open_) == 1 else 'them'} at 80% power")


_WORDS = ((V.BETTER, "better"), (V.WORSE, "worse"), (V.EQUIVALENT, "equivalent within ±δ"),
          (V.NO_PREVENTION, "within ±δ of it"))
_MIRROR = {V.BETTER: V.WORSE, V.WORSE: V.BETTER}   # a verdict read from the baseline's side
MAX_NAMED = 4  # arms named in the answer per verdict; more are counted


def answer(table: VerdictTable) -> str:
    """The report's answer in one sentence, on the primary endpoint: ``Against dapo on final
    val/acc (3 seeds per arm): armor is better, up is worse; gate only (dapo) is not resolved:
    8 more runs (≈ 1.2 h) would resolve it at 80% power.`` With several baselines (every pair
    compared): the group better (worse) than every other one, and how many pairs are resolved."""
    vs = table.primary_verdicts()
    if not vs:
        return ""
    base, label, name = table.baseline(), table.labels[table.primary], table.names.get
    sep = "; " if any("," in name(g, g) for v in vs for g in (v.arm, v.baseline)) else ", "
    open_ = [v for v in vs if v.verdict in (V.UNRESOLVED, V.TOO_FEW)]

    def arms(of: list[V.Verdict]) -> str:  # named up to MAX_NAMED, counted beyond (the table names them)
        if len(of) > MAX_NAMED:
            return f"{'the other ' if of is open_ else ''}{len(of)} arms are"
        shown = [name(v.arm, v.arm) for v in of]
        return (sep.join(shown[:-1]) + " and " if len(shown) > 1 else "") + shown[-1] + \
            (" is" if len(shown) == 1 else " are")

    if base is not None:
        said = [f"{arms(these)} {shown}" for word, shown in _WORDS if (these := [v for v in vs if v.verdict == word])]
        text = f"Against {name(base, base)} on {label} ({_seeds(vs)}): " + "; ".join(said)
        if open_:
            tail = (f"none of the {len(vs)} arms is resolved" if len(open_) == len(vs) > MAX_NAMED
                    else f"{arms(open_)} not resolved")
            if not any(math.isfinite(v.delta) for v in open_):
                tail += f" ({NO_MARGIN})"
            text += ("; " if said else "") + tail + _open_cost(vs, table)
        return text + "." + _caveats(vs)
    rivals, beat = defaultdict(set), defaultdict(set)      # beat[g, "better"]: the groups g is better than
    for v in vs:
        for g, other, word in ((v.arm, v.baseline, v.verdict), (v.baseline, v.arm, _MIRROR.get(v.verdict))):
            rivals[g].add(other)
            beat[g, word].add(other)
    said = [f"{name(g, g)} is {word} than each of the {len(others)} others" for g, others in rivals.items()
            for word in (V.BETTER, V.WORSE) if len(others) > 1 and beat.get((g, word)) == others]
    count = f"{len(vs) - len(open_)} of {len(vs)} pairs are resolved"
    if open_:
        count += _open_cost(vs, table).replace(" would resolve them", " would resolve the rest").replace(
            " would resolve it", " would resolve the last")
    return f"On {label} ({_seeds(vs)}): " + "; ".join([*said, count]) + "." + _caveats(vs)


def _caveats(vs: Sequence[V.Verdict]) -> str:
    """' dapo did not fall here (0 of 3 seeds collapsed): this cannot show prevention.' once per baseline."""
    return "".join(f" {c}." for c in dict.fromkeys(v.caveat for v in vs if v.caveat))


def _cell(v: V.Verdict, mirrored: bool) -> str:
    """One comparison as a cell of the pairwise table, read as row vs column."""
    word = _MIRROR.get(v.verdict, v.verdict) if mirrored else v.verdict
    but = f" ({V.NO_PREVENTION})" if v.caveat and word != V.NO_PREVENTION else ""
    plan = f" ({v.seeds_needed} seeds)" if word in (V.UNRESOLVED, V.TOO_FEW) and v.seeds_needed is not None else ""
    return f"{word} {V.signed(-v.diff if mirrored else v.diff)}{plan}{but}"


def first_screen_table(table: VerdictTable) -> pd.DataFrame:
    """The verdicts on the primary endpoint (every endpoint follows under the figure): with one baseline,
    one row per arm; with several (every pair compared), a row and a column per group, row vs column."""
    label, vs = table.labels[table.primary], table.primary_verdicts()
    if table.baseline() is None:
        order = list(dict.fromkeys(g for v in vs for g in (v.arm, v.baseline)))
        cells = {g: dict.fromkeys(order, "") for g in order}
        for v in vs:
            cells[v.arm][v.baseline] = _cell(v, False)
            cells[v.baseline][v.arm] = _cell(v, True)
        return pd.DataFrame([{f"{label}: row vs column": table.names.get(g, g),
                              **{table.names.get(h, h): cells[g][h] or ("·" if g == h else "—") for h in order}}
                             for g in order])
    rows = []
    for v in vs:
        hours, extra, cells = _hours(v, table.hours), V.more_runs(v), _cells(v, table.names)
        rows.append({
            "arm vs baseline": cells["arm vs baseline"], "verdict": cells["verdict"],
            f"{label}: arm − baseline [CI]": cells["difference [CI]"],
            "arm / baseline": f"{v.mean_arm:.3f} / {v.mean_baseline:.3f}", "seeds": cells["seeds"],
            "to resolve (80% power at δ)": "—" if v.seeds_needed is None else (
                f"{v.seeds_needed} seeds per arm ({extra} more runs"
                + (f", ≈ {hours:.1f} h" if hours is not None and extra else "") + ")")})
    return pd.DataFrame(rows)


def section(table: VerdictTable, n_pairs: int, figure: Figure | None = None) -> list[Section]:
    """The page's first screen (the answer in one sentence, the primary endpoint's verdicts and ``figure``),
    then the verdicts on every endpoint with their sentences and how they are made; both open the page."""
    deltas = "; ".join(dict.fromkeys(f"δ = {d:.3g} ({how})" if math.isfinite(d) else how
                                     for d, how in table.deltas.values()))
    first = Section("Verdict", intro=f'<p class="answer" id="answer"><b>{esc(answer(table))}</b></p>',
                    tables=[("", first_screen_table(table), "verdict-table")],
                    figures=[figure] if figure is not None else [], lead=True)
    intro = ("<p>" + "".join(f"{esc(s)}.<br>" for s in table.sentences) + "</p>"
             + (f"<p>{esc(table.summary)}</p>" if table.summary else "")
             + "<p>Difference: arm − baseline, mean over seeds, with Welch's interval; the interval's "
             f"level is Holm-adjusted over the {n_pairs} comparison(s) of an endpoint (95% when one). "
             "<b>better/worse</b>: the interval excludes 0 (Holm); <b>equivalent</b>: it lies inside ±δ "
             "(two one-sided tests), δ a margin declared before the runs (never a noise unit; without one "
             f"nothing is equivalent); <b>{V.NO_PREVENTION}</b>: inside ±δ on a final or collapse endpoint "
             "while the baseline did not fall (fewer of its seeds collapsed than flat curves give at 5%), "
             "so ending level with it shows nothing about prevention — every verdict on such an endpoint "
             "says so; <b>not resolved</b>: neither — with the seeds per arm a fixed design "
             "needs for 80% power at δ under the measured seed-to-seed spread (noncentral t, at the first "
             f"Holm level), the runs that adds and their hours at the measured run times. {esc(deltas)}. "
             "P(arm better): the chance that a seed of the arm beats a seed of the baseline (ties ½). "
             "These are fixed-sample verdicts: seeds added until something looked significant need the "
             "sequential rule (docs/verdicts.md)."
             + (" In the pairwise table above a cell reads row vs column (row − column); (n seeds): the seeds "
                "per arm that 80% power at δ needs." if table.baseline() is None else "") + "</p>")
    return [first, Section("Verdicts on every endpoint", intro=intro, tables=[("", table.display)], lead=True)]


def write(table: VerdictTable, tdir: Path) -> list[Path]:
    text = "".join(f"- {s}.\n" for s in table.sentences) + (f"\n{table.summary}\n" if table.summary else "")
    return tables.write_verdicts(table.numbers, table.display, text, tdir,
                                 "verdicts: arm vs baseline, Welch interval (Holm), equivalence within ±δ")
