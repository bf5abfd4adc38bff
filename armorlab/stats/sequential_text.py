"""Verdicts in words, for `armorlab sweep --until-resolved` and the report (no pandas): the one name of
each endpoint and the one verdict cell of both verdict tables; a sequential comparison's looks
(looks.json, armorlab.stats.sequential) as one sentence per arm and one line per look."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from armorlab.core.eval_sets import TEST_METRIC, VAL_METRIC
from armorlab.stats import verdicts as V
from armorlab.stats.margins import NO_MARGIN, NO_PREVENTION, caveat
from armorlab.stats.sequential import CONTINUE, Design

# peak and final are levels (means of consecutive evals), not evals: say so wherever they are printed
ENDPOINT_WORDS = {"final": "final level of {v}", "drop": "drop from the peak level of {v}",
                  "peak": "peak level of {v}", "auc": "AUC of {v}", "selected_test": "{t} at the val-selected step",
                  "selected_val": "{v} at the val-selected step"}


def endpoint_label(endpoint: str, val_metric: str = VAL_METRIC, test_metric: str = TEST_METRIC) -> str:
    return ENDPOINT_WORDS[endpoint].format(v=val_metric, t=test_metric) if endpoint in ENDPOINT_WORDS else endpoint


def verdict_cell(verdict: str, within_delta: bool, no_prevention: bool) -> str:
    """The verdict as a table cell: (< δ) when smaller than the margin, the caveat of a baseline that did not fall."""
    word = verdict + (" (< δ)" if verdict in (V.BETTER, V.WORSE) and within_delta else "")
    return word + (f"; {NO_PREVENTION}" if no_prevention and verdict != NO_PREVENTION else "")


def look_verdict(c: Mapping[str, Any], no_prevention: bool) -> str:
    """A look's verdict on one arm: ``continues`` while it goes on; equivalent to a baseline that did not fall
    shows no prevention."""
    verdict = "continues" if c.get("verdict") == CONTINUE else c.get("verdict")
    return NO_PREVENTION if no_prevention and verdict == V.EQUIVALENT else verdict


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def interval(c: Mapping[str, Any]) -> str:
    ci = c.get("ci") or [None, None]
    return f"{V.signed(_num(c.get('diff')))} [{V.signed(_num(ci[0]))}, {V.signed(_num(ci[1]))}]"


def level_text(c: Mapping[str, Any]) -> str:
    """The repeated interval's confidence level, e.g. 97.5%."""
    level = _num(c.get("level"))
    return f"{100 * (1 - level):.4g}%" if math.isfinite(level) else "—"


def boundary_text(c: Mapping[str, Any]) -> str | None:
    """``9.1 ≥ 4.2``: |t| against the look's boundary; None without a spread."""
    t, tb = abs(_num(c.get("t"))), _num(c.get("t_bound"))
    return f"{t:.3g} {'≥' if t >= tb else '<'} {tb:.3g}" if math.isfinite(t) and math.isfinite(tb) else None


def resolved_at(looks: Sequence[Mapping[str, Any]], arm: str) -> int | None:
    """The look at which ``arm`` got its verdict (None while it goes on)."""
    return next((int(look["look"]) for look in looks for c in look.get("comparisons", ())
                 if c.get("arm") == arm and c.get("verdict") != CONTINUE and not c.get("carried")), None)


def sentence(c: Mapping[str, Any], design: Design, looks: Sequence[Mapping[str, Any]], label: str) -> str:
    """``armor vs dapo: −0.031 [−0.052, −0.010] final level of val/acc — worse at look 2, resolved with 5
    seeds per arm``: one arm's latest comparison (armorlab.stats.sequential.latest_comparisons)."""
    head = f"{c['arm']} vs {c.get('baseline', design.baseline)}: {interval(c)} {label}"
    seeds = V.seeds_phrase(*(int(n) for n in (list(c.get("n") or []) + [0, 0])[:2]))
    where = f" at look {at}" if (at := resolved_at(looks, c["arm"])) is not None else ""
    d = f"{design.delta:.3f}" if math.isfinite(design.delta) else None
    verdict, why = c.get("verdict"), look_caveat(looks, design)
    but = f"; {why}" if why else ""
    if verdict in (V.BETTER, V.WORSE):
        small = f" (by less than δ = {d})" if c.get("within_delta") and d else ""
        return f"{head} — {verdict}{small}{where}, resolved with {seeds}{but}"
    if verdict == V.EQUIVALENT:
        return (f"{head} — within ±{d}{where} with {seeds}, but {why}" if why
                else f"{head} — equivalent within ±{d}{where}, resolved with {seeds}")
    if verdict == CONTINUE:
        return f"{head} — not resolved yet with {seeds}; the next look adds seeds{but}"
    what = f"{head} — not resolved with {seeds} (--max-seeds {design.max_seeds})"
    if d is None:
        return f"{what}: {NO_MARGIN} (compare.delta) for equivalence or a seed plan{but}"
    plan = (f"{c['seeds_needed']} seeds per arm (a fixed design)" if c.get("seeds_needed") is not None
            else f"more than {V.MAX_SEEDS_PLANNED} seeds per arm or a measured spread")
    return f"{what}; 80% power at δ = {d} needs {plan}{but}"


def look_caveat(looks: Sequence[Mapping[str, Any]], design: Design) -> str:
    """The latest look's prevention caveat (stats.margins F1): empty where the baseline fell or for another endpoint."""
    record = next((look["prevention"] for look in reversed(looks) if look.get("prevention")), None)
    return caveat(record, design.endpoint)


def look_line(look: Mapping[str, Any], design: Design) -> str:
    """``look 2 (objective=dapo 5, objective=up 5 seeds): objective=up better: +0.08 ... |t| 9.1 ≥ 4.2``."""
    seeds = look.get("seeds") or {}
    per = (f"{next(iter(seeds.values()))} seeds per arm" if len(set(seeds.values())) == 1 else
           ", ".join(f"{a} {n}" for a, n in seeds.items()) + " seeds")
    no_prevention = bool(caveat(look.get("prevention"), design.endpoint))
    parts = [f"{c['arm']} {look_verdict(c, no_prevention)}: {interval(c)} ({level_text(c)} repeated interval; "
             + (f"|t| = {boundary_text(c)})" if boundary_text(c) else "no spread yet)")
             for c in look.get("comparisons", ()) if not c.get("carried")]
    by = f", {look['by']}" if look.get("by") else ""
    return f"look {look.get('look')} ({per}{by}): " + ("; ".join(parts) or "every arm resolved before")


def design_line(design: Design, label: str, delta_how: str | None = None) -> str:
    how = f" ({delta_how})" if delta_how else ""
    delta = f"δ = {design.delta:.3g}{how}" if math.isfinite(design.delta) else \
        f"{NO_MARGIN}: nothing is called equivalent" + ("" if delta_how and NO_MARGIN in delta_how else how)
    spending = "O'Brien–Fleming" if design.spending == "obf" else "Pocock"
    return (f"{label} of {', '.join(design.arms)} against {design.baseline}; looks of "
            f"{', '.join(map(str, design.schedule()))} seeds per arm; {spending}-type alpha spending, "
            f"α = {design.alpha:g} over arms and looks; {delta}")
