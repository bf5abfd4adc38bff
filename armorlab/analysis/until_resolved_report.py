"""The report's verdicts for a sweep run until resolved, read from its ``looks.json``: fixed-sample
verdicts are not valid once seeds were added until resolved."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from armorlab.analysis import tables
from armorlab.analysis.groups import Notes, numeric_columns
from armorlab.analysis.html import Section, esc
from armorlab.analysis.load import RunSet
from armorlab.core.fsutil import SMALL_FILE_BYTES, read_regular_text
from armorlab.core.runs import expand_globs
from armorlab.errors import ArmorLabError
from armorlab.stats import sequential_text as words
from armorlab.stats.sequential import Design, latest_comparisons, read_looks_record

LOOKS_FILE = "looks.json"  # armorlab.sweeps.manifest.LOOKS (a test holds them equal)


@dataclass
class SequentialVerdicts:
    sweep_dir: Path
    design: Design
    looks: list[dict[str, Any]]
    chain: dict[str, Any]
    label: str = ""
    sentences: list[str] = field(default_factory=list)


def find(paths: Iterable[str]) -> list[SequentialVerdicts]:
    """The sweep dirs among a recipe's inputs that hold a looks.json with at least one look."""
    out = []
    for p in expand_globs(paths):
        path = Path(p) / LOOKS_FILE
        if not path.is_file():
            continue
        try:
            data = json.loads(read_regular_text(path, limit=SMALL_FILE_BYTES))
        except (OSError, ValueError) as exc:
            raise ArmorLabError(f"unreadable looks.json: {exc}", file=str(path)) from None
        design, looks = read_looks_record(data, file=str(path))
        if looks:
            chain = data["chain"] if isinstance(data.get("chain"), dict) else {}
            out.append(SequentialVerdicts(Path(p), design, looks, chain))
    return out


def prepare(seqs: Sequence[SequentialVerdicts], val_metric: str, test_metric: str) -> None:
    for s in seqs:
        s.label = words.endpoint_label(s.design.endpoint, val_metric, test_metric)
        s.sentences = [words.sentence(c, s.design, s.looks, s.label) for c in latest_comparisons(s.looks).values()]


def check(seqs: Sequence[SequentialVerdicts], per_run: pd.DataFrame, rs: RunSet, notes: Notes) -> None:
    """A note where the runs now give other endpoint values than a look recorded."""
    path_of = {Path(p).resolve(): rid for rid, p in zip(rs.runs["run_id"], rs.runs["path"], strict=True)}
    for s in seqs:
        look, endpoint = s.looks[-1], s.design.endpoint
        if endpoint not in per_run.columns or not isinstance(look.get("runs"), dict):
            continue
        now = dict(zip(per_run["run_id"].tolist(), numeric_columns(per_run, [endpoint])[endpoint].tolist(),
                       strict=True))
        for arm, by_seed in look["runs"].items():
            recorded = sorted((look.get("stats") or {}).get(arm, {}).get("values") or [])
            current = sorted(now.get(path_of.get((s.sweep_dir / rid).resolve()), math.nan)
                             for rid in by_seed.values())
            if len(recorded) != len(current) or not np.allclose(recorded, current, rtol=0, atol=1e-9, equal_nan=False):
                notes.add(f"{s.sweep_dir.name}/looks.json: look {look.get('look')} recorded {endpoint} of "
                          f"{arm} as {_values(recorded)}; its runs give {_values(current)} now (trained again, "
                          f"or this recipe's select/collapse read {endpoint} differently): the verdicts shown "
                          f"are the ones the sweep stopped on")


def _values(v: Sequence[float]) -> str:
    return "[" + ", ".join("—" if not math.isfinite(x) else f"{x:.4g}" for x in v) + "]"


def frames(seqs: Sequence[SequentialVerdicts]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the table shown, the numbers written to verdicts.csv): one row per arm's latest comparison."""
    shown, numbers = [], []
    for s in seqs:
        no_prevention = bool(words.look_caveat(s.looks, s.design))
        for c in latest_comparisons(s.looks).values():
            n, ci = list(c.get("n") or [None, None]), list(c.get("ci") or [None, None])
            at = words.resolved_at(s.looks, c["arm"])
            shown.append({
                "arm vs baseline": f"{c['arm']} vs {c.get('baseline', s.design.baseline)}",
                "endpoint": s.label,
                "difference [repeated CI]": words.interval(c), "CI level": words.level_text(c),
                "verdict": words.verdict_cell(words.look_verdict(c, no_prevention), c.get("within_delta"),
                                              no_prevention),
                "at look": "—" if at is None else str(at), "seeds": f"{n[0]} vs {n[1]}",
                "|t| vs boundary": words.boundary_text(c) or "—",
                "δ": f"{s.design.delta:.3f}" if math.isfinite(s.design.delta) else "—",
                "80% power needs": "—" if c.get("seeds_needed") is None else f"{c['seeds_needed']} per arm"})
            numbers.append({"sweep": s.sweep_dir.name, "arm": c["arm"], "baseline": c.get("baseline"),
                            "endpoint": s.design.endpoint, "verdict": c.get("verdict"), "resolved_at_look": at,
                            "looks": len(s.looks), "n_arm": n[0], "n_baseline": n[1], "diff": c.get("diff"),
                            "low": ci[0], "high": ci[1],
                            **{k: c.get(k) for k in ("level", "t", "t_bound", "z_bound", "fraction")},
                            "delta": s.design.delta, "seeds_needed": c.get("seeds_needed"), "method": s.design.method})
    return pd.DataFrame(shown), pd.DataFrame(numbers)


def section(seqs: Sequence[SequentialVerdicts]) -> Section:
    parts = []
    for s in seqs:
        state = (f"finished after {len(s.looks)} look(s)" if s.looks[-1].get("done") else
                 f"{len(s.looks)} look(s) so far, not finished: the open arms' verdicts may still change")
        delta = (s.chain.get("margin") or {}).get("source") or s.chain.get("delta")  # older looks.json: "delta"
        parts.append(f"<p><b>{esc(s.sweep_dir.name)}</b> ({esc(state)}; {esc(s.design.method)}, α = "
                     f"{s.design.alpha:g} over arms and looks; looks of "
                     f"{esc(', '.join(map(str, s.design.schedule())))} seeds per arm; δ = "
                     + (f"{s.design.delta:.3f}" if math.isfinite(s.design.delta) else "none")
                     + (f" ({esc(delta)})" if delta else "") + "):<br>"
                     + "".join(f"{esc(x)}.<br>" for x in s.sentences) + "</p>")
    intro = ("".join(parts) + "<p>These verdicts are the sweep's own, read from its <code>looks.json</code>: its "
             "seeds were added look by look until each arm was resolved (<code>armorlab sweep --until-resolved"
             "</code>), so the group-sequential rule decides — repeated confidence intervals at the Holm level of "
             "each arm, a boundary that holds the error rate over every look — and fixed-sample verdicts, which "
             "would ignore the looks, are not shown. <b>better/worse</b>: |t| crossed the boundary; "
             "<b>equivalent</b>: the repeated interval lies inside ±δ; <b>not resolved</b>: neither by "
             "<code>--max-seeds</code>, with the seeds a fixed design would need for 80% power at δ "
             "(docs/verdicts.md).</p>")
    return Section("Verdicts (seeds until resolved)", intro=intro, tables=[("", frames(seqs)[0])], lead=True)


def write(seqs: Sequence[SequentialVerdicts], tdir: Path) -> list[Path]:
    shown, numbers = frames(seqs)
    return tables.write_verdicts(numbers, shown, "".join(f"- {x}.\n" for s in seqs for x in s.sentences), tdir,
                                 "verdicts of a sweep run until resolved (group-sequential, looks.json)")
