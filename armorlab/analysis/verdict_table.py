"""The report's verdict table, first on the page: each compared arm against its baseline on the
recipe's endpoints (``compare: {endpoints, delta}``), from the report's per-run scores, with
one plain sentence per arm on the primary endpoint. The statistics are armorlab.stats.verdicts';
this module only gathers their inputs (scores per group, eval sizes, run times from status.json)
and formats what they return.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
from armorlab.core.fsutil import atomic_write_text
from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError
from armorlab.stats import seeds as stats
from armorlab.stats import verdicts as V
from armorlab.stats.margins import NO_MARGIN, caveat, margin_source, prevention


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
    return dataclasses.replace(v, low=low, high=high)


def endpoint_label(endpoint: str, val_metric: str, test_metric: str) -> str:
    # peak and final are levels (means of consecutive evals), not evals: say so wherever they are printed
    fixed = {"final": f"final level of {val_metric}", "drop": f"drop from the peak level of {val_metric}",
             "selected_test": f"{test_metric} at the val-selected step", "peak": f"peak level of {val_metric}"}
    return fixed.get(endpoint) or tables.score_label(endpoint, val_metric, test_metric)


def higher_is_better(endpoint: str, mode: str) -> bool:
    """drop-like endpoints are better small; the others follow select.mode (max: larger is better).
    The drop is computed on the sign-corrected curve, so it is better small in either mode."""
    return endpoint not in V.LOWER_IS_BETTER and mode == "max"


def run_hours(rs: RunSet) -> dict[str, float]:
    """Wall hours of each completed run from status.json (started → ended; a resumed run counts
    its last attempt only)."""
    out = {}
    for run in rs.runs.itertuples(index=False):
        if run.state not in ("completed", "stopped"):  # a stopped run's hours are its whole cost
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
    hours = run_hours(rs)
    group_hours = {}
    for g in compared:
        timed = [hours[r] for r in ids[at.get(g, none)] if r in hours]
        if timed:
            group_hours[g] = float(np.mean(timed))
    verdicts, deltas = [], {}
    delta = float(cmp_.delta) if cmp_.delta is not None else math.nan
    falls = {b: fall_record(per_run, at.get(b, none), b, recipe.collapse.alpha) for _, b in pairs}
    if not math.isfinite(delta):
        notes.add("verdicts: no margin declared (compare.delta, or armorlab report --delta X): no comparison is "
                  "called equivalent and no seeds are planned")
    ranges = score_ranges(endpoints, sel.metric, sel.report, per_run)
    for e in endpoints:
        values = {g: numeric[e][at.get(g, none)] for g in compared}
        deltas[e] = (delta, f"declared: {cmp_.delta_from}" if cmp_.delta_from and cmp_.delta is not None
                     else margin_source(cmp_.delta, file, "--delta"))
        verdicts += [V.with_caveat(within(v, difference_range(ranges.get(e))),
                                   caveat(falls[v.baseline], e, (names or {}).get(v.baseline)))
                     for v in V.compare(values, pairs, e, delta=delta,
                                        higher_is_better=higher_is_better(e, sel.mode))]
    labels = {e: endpoint_label(e, sel.metric, sel.report) for e in endpoints}
    names = dict(names or {})
    primary = [v for v in verdicts if v.endpoint == endpoints[0]]
    sentences = [V.sentence(v, labels[v.endpoint], names=names, hours=_hours(v, group_hours))
                 for v in primary]
    return VerdictTable(verdicts, deltas, sentences, _display(verdicts, labels, names, per_run, at, numeric,
                                                            group_hours),
                        pd.DataFrame([v.as_dict() for v in verdicts]), _summary(primary, group_hours, labels[endpoints[0]]),
                        labels, names, endpoints[0], group_hours)


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
    return (max(0, v.seeds_needed - v.n_arm) * group_hours[v.arm]
            + max(0, v.seeds_needed - v.n_baseline) * group_hours[v.baseline])


def open_cost(primary: Sequence[V.Verdict], group_hours: Mapping[str, float]) -> tuple[int, float | None]:
    """The cost of resolving every open comparison on the primary endpoint at once: each arm up
    to its planned seeds, the shared baseline up to the largest: (more runs, their hours, None
    where a run time is unknown)."""
    open_ = [v for v in primary if v.seeds_needed is not None and V.more_runs(v)]
    base_need: dict[str, tuple[int, int]] = {}
    for v in open_:
        need, have = base_need.get(v.baseline, (0, v.n_baseline))
        base_need[v.baseline] = (max(need, v.seeds_needed), have)
    extra = ([(v.arm, max(0, v.seeds_needed - v.n_arm)) for v in open_]
             + [(b, max(0, need - have)) for b, (need, have) in base_need.items()])
    runs = sum(n for _, n in extra)
    if any(n and g not in group_hours for g, n in extra):
        return runs, None
    return runs, sum((n * group_hours[g] for g, n in extra if g in group_hours), 0.0)


def _summary(primary: Sequence[V.Verdict], group_hours: Mapping[str, float], label: str) -> str:
    runs, hours = open_cost(primary, group_hours)
    if not runs:
        return ""
    cost = f", ≈ {hours:.1f} h of runs at the measured run times" if hours is not None else ""
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
            "verdict": verdict_word(v),
            "seeds": V.seeds_phrase(v.n_arm, v.n_baseline).replace(" seeds per arm", " per arm"),
            "δ": f"{v.delta:.3f}" if math.isfinite(v.delta) else "—",
            "P(arm better)": "—" if not math.isfinite(poi) else f"{poi:.2f}",
            "80% power needs": "—" if v.seeds_needed is None else f"{v.seeds_needed} per arm",
            "more runs": "—" if v.seeds_needed is None else str(V.more_runs(v)),
            "≈ hours": "—" if hours is None else f"{hours:.1f}",
        })
    return pd.DataFrame(rows)


def verdict_word(v: V.Verdict) -> str:
    """The verdict as a table cell: with (< δ) for a difference smaller than the margin, and the
    prevention caveat where the baseline did not fall."""
    word = v.verdict + (" (< δ)" if v.verdict in (V.BETTER, V.WORSE) and v.within_delta else "")
    return word + (f"; {V.NO_PREVENTION}" if v.caveat and v.verdict != V.NO_PREVENTION else "")


def _seeds(vs: Sequence[V.Verdict]) -> str:
    counts = sorted({v.n_arm for v in vs} | {v.n_baseline for v in vs})
    if len(counts) == 1:
        return f"{counts[0]} seed{'s' if counts[0] != 1 else ''} per arm"
    return f"{counts[0]}–{counts[-1]} seeds per arm"


def _open_cost(vs: Sequence[V.Verdict], table: VerdictTable) -> str:
    """': 24 more runs (≈ 3.1 h) would resolve them at 80% power' for the open comparisons
    (nothing where a comparison has no plan: no δ or no spread yet)."""
    open_ = [v for v in vs if v.verdict in (V.UNRESOLVED, V.TOO_FEW)]
    if not open_ or any(v.seeds_needed is None for v in open_):
        return ""
    runs, hours = open_cost(vs, table.hours)
    if not runs:
        return ""
    it = "it" if len(open_) == 1 else "them"
    return (f": {runs} more runs" + (f" (≈ {hours:.1f} h)" if hours is not None else "")
            + f" would resolve {it} at 80% power")


_WORDS = ((V.BETTER, "better"), (V.WORSE, "worse"), (V.EQUIVALENT, "equivalent within ±δ"),
          (V.NO_PREVENTION, "within ±δ of it"))
MAX_NAMED = 4  # arms named in the answer per verdict; more are counted


def answer(table: VerdictTable) -> str:
    """The report's answer in one sentence, on the primary endpoint: ``Against dapo on final
    val/acc (3 seeds per arm): armor is better, up is worse; gate only (dapo) is not resolved:
    8 more runs (≈ 1.2 h) would resolve it at 80% power.`` With several baselines (every pair
    compared): the group better (worse) than every other one, and how many pairs are resolved."""
    vs = table.primary_verdicts()
    if not vs:
        return ""
    base = table.baseline()
    name = table.names.get
    sep = "; " if any("," in name(g, g) for v in vs for g in (v.arm, v.baseline)) else ", "

    def join(items: Sequence[str]) -> str:
        items = list(items)
        return items[0] if len(items) == 1 else sep.join(items[:-1]) + " and " + items[-1]

    def be(items: Sequence[str]) -> str:
        return "is" if len(items) == 1 else "are"

    def arms(of: Sequence[V.Verdict]) -> str:  # named up to four, counted beyond (the table names them)
        names = [name(v.arm, v.arm) for v in of]
        if len(names) <= MAX_NAMED:
            return f"{join(names)} {be(names)}"
        return f"{'the other ' if of is open_ else ''}{len(of)} arms are"

    open_ = [v for v in vs if v.verdict in (V.UNRESOLVED, V.TOO_FEW)]
    if base is not None:
        said = []
        for word, shown in _WORDS:
            these = [v for v in vs if v.verdict == word]
            if these:
                said.append(f"{arms(these)} {shown}")
        text = f"Against {name(base, base)} on {table.labels[table.primary]} ({_seeds(vs)}): " + "; ".join(said)
        if open_:
            tail = (f"none of the {len(vs)} arms is resolved" if len(open_) == len(vs) > MAX_NAMED
                    else f"{arms(open_)} not resolved")
            if not any(math.isfinite(v.delta) for v in open_):
                tail += f" ({NO_MARGIN})"
            text += ("; " if said else "") + tail + _open_cost(vs, table)
        return text + "." + _caveats(vs)
    wins, losses, rivals = defaultdict(set), defaultdict(set), defaultdict(set)
    for v in vs:
        rivals[v.arm].add(v.baseline)
        rivals[v.baseline].add(v.arm)
        if v.verdict in (V.BETTER, V.WORSE):
            up, down = (v.arm, v.baseline) if v.verdict == V.BETTER else (v.baseline, v.arm)
            wins[up].add(down)
            losses[down].add(up)
    said = []
    for g, others in rivals.items():
        if len(others) > 1 and wins.get(g) == others:
            said.append(f"{name(g, g)} is better than each of the {len(others)} others")
        if len(others) > 1 and losses.get(g) == others:
            said.append(f"{name(g, g)} is worse than each of the {len(others)} others")
    resolved = len(vs) - len(open_)
    count = f"{resolved} of {len(vs)} pairs are resolved"
    if open_:
        count += _open_cost(vs, table).replace(" would resolve them", " would resolve the rest").replace(
            " would resolve it", " would resolve the last")
    return f"On {table.labels[table.primary]} ({_seeds(vs)}): " + "; ".join([*said, count]) + "." + _caveats(vs)


def _caveats(vs: Sequence[V.Verdict]) -> str:
    """' dapo did not fall here (0 of 3 seeds collapsed): this cannot show prevention.' once per baseline."""
    said = dict.fromkeys(v.caveat for v in vs if v.caveat)
    return "".join(f" {c}." for c in said)


def _cell(v: V.Verdict, mirrored: bool) -> str:
    """One comparison as a cell of the pairwise table, read as row vs column."""
    diff = -v.diff if mirrored else v.diff
    word = v.verdict
    if mirrored and word in (V.BETTER, V.WORSE):
        word = V.WORSE if word == V.BETTER else V.BETTER
    but = f" ({V.NO_PREVENTION})" if v.caveat and word != V.NO_PREVENTION else ""
    if word in (V.UNRESOLVED, V.TOO_FEW) and v.seeds_needed is not None:
        return f"{word} {V.signed(diff)} ({v.seeds_needed} seeds){but}"
    return f"{word} {V.signed(diff)}{but}"


def first_screen_table(table: VerdictTable) -> pd.DataFrame:
    """The verdicts on the primary endpoint in the columns that answer the question (the full
    table, every endpoint, follows under the figure): with one baseline, one row per arm; with
    several (every pair compared), one row and one column per group, a cell reading row vs
    column."""
    label = table.labels[table.primary]
    vs = table.primary_verdicts()
    if table.baseline() is None:
        order = list(dict.fromkeys(g for v in vs for g in (v.arm, v.baseline)))
        shown = [table.names.get(g, g) for g in order]
        cells = {g: dict.fromkeys(order, "") for g in order}
        for v in vs:
            cells[v.arm][v.baseline] = _cell(v, False)
            cells[v.baseline][v.arm] = _cell(v, True)
        head = f"{label}: row vs column"
        return pd.DataFrame([{head: shown[i], **{shown[j]: cells[g][h] or ("·" if g == h else "—")
                                                 for j, h in enumerate(order)}}
                             for i, g in enumerate(order)])
    rows = []
    for v in vs:
        hours = _hours(v, table.hours)
        if v.seeds_needed is None:
            plan = "—"
        else:
            extra = V.more_runs(v)
            plan = (f"{v.seeds_needed} seeds per arm ({extra} more runs"
                    + (f", ≈ {hours:.1f} h" if hours is not None and extra else "") + ")")
        rows.append({
            "arm vs baseline": f"{table.names.get(v.arm, v.arm)} vs {table.names.get(v.baseline, v.baseline)}",
            "verdict": verdict_word(v),
            f"{label}: arm − baseline [CI]": f"{V.signed(v.diff)} [{V.signed(v.low)}, {V.signed(v.high)}]",
            "arm / baseline": f"{v.mean_arm:.3f} / {v.mean_baseline:.3f}",
            "seeds": V.seeds_phrase(v.n_arm, v.n_baseline).replace(" seeds per arm", " per arm"),
            "to resolve (80% power at δ)": plan,
        })
    return pd.DataFrame(rows)


def section(table: VerdictTable, n_pairs: int, figure: Figure | None = None) -> list[Section]:
    """The page's first screen (the answer in one sentence, the verdicts on the primary endpoint
    and ``figure``, the one that shows them), then the verdicts on every endpoint with their
    sentences and how they are made; both open the page."""
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
    written = tables.write_table(table.numbers, tdir / "verdicts", formats=("csv",))
    written += tables.write_table(table.display, tdir / "verdicts", formats=("tex",),
                                  caption="verdicts: arm vs baseline, Welch interval (Holm), equivalence within ±δ")
    md = tdir / "verdicts.md"
    text = "".join(f"- {s}.\n" for s in table.sentences) + (f"\n{table.summary}\n" if table.summary else "")
    atomic_write_text(md, text + "\n" + tables.to_markdown(table.display), durable=False)
    return [*written, md]

