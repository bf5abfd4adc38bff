"""The report's verdicts for a sweep run until resolved (`armorlab sweep --until-resolved`): read
from its ``looks.json`` (armorlab.stats.sequential.latest_comparisons), not recomputed as
fixed-sample verdicts — those are not valid once seeds were added until something looked
resolved. The report re-derives the same verdicts the sweep stopped on, and says where the runs
no longer give the values a look recorded.
"""

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
from armorlab.core.fsutil import SMALL_FILE_BYTES, atomic_write_text, read_regular_text
from armorlab.core.runs import expand_globs
from armorlab.errors import ArmorLabError
from armorlab.stats.margins import NO_PREVENTION
from armorlab.stats.sequential import CONTINUE, Design, latest_comparisons, read_looks_record
from armorlab.stats.sequential_text import (
    endpoint_label,
    interval,
    level_text,
    look_caveat,
    resolved_at,
    sentence,
)

LOOKS_FILE = "looks.json"  # armorlab.sweeps.manifest.LOOKS (a test holds them equal)


@dataclass
class SequentialVerdicts:
    sweep_dir: Path
    design: Design
    looks: list[dict[str, Any]]
    chain: dict[str, Any]
    label: str = ""
    sentences: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return bool(self.looks) and bool(self.looks[-1].get("done"))


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
            chain = data.get("chain") if isinstance(data.get("chain"), dict) else {}
            out.append(SequentialVerdicts(Path(p), design, looks, chain))
    return out


def prepare(seqs: Sequence[SequentialVerdicts], val_metric: str, test_metric: str) -> None:
    for s in seqs:
        s.label = endpoint_label(s.design.endpoint, val_metric, test_metric)
        s.sentences = [sentence(c, s.design, s.looks, s.label) for c in latest_comparisons(s.looks).values()]


def check(seqs: Sequence[SequentialVerdicts], per_run: pd.DataFrame, rs: RunSet, notes: Notes) -> None:
    """A note where the runs a look decided on now give other endpoint values than it recorded
    (a run trained again, or the recipe reads the endpoint differently: select/collapse)."""
    path_of = {Path(p).resolve(): rid for rid, p in zip(rs.runs["run_id"], rs.runs["path"], strict=True)}
    for s in seqs:
        look = s.looks[-1]
        endpoint = s.design.endpoint
        if endpoint not in per_run.columns or not isinstance(look.get("runs"), dict):
            continue
        now = dict(zip(per_run["run_id"].tolist(), numeric_columns(per_run, [endpoint])[endpoint].tolist(),
                       strict=True))
        for arm, by_seed in look["runs"].items():
            recorded = sorted((look.get("stats") or {}).get(arm, {}).get("values") or [])
            ids = [path_of.get((s.sweep_dir / rid).resolve()) for rid in by_seed.values()]
            current = sorted(now.get(i, math.nan) for i in ids)
            if len(recorded) != len(current) or not np.allclose(recorded, current, rtol=0, atol=1e-9, equal_nan=False):
                notes.add(f"{s.sweep_dir.name}/looks.json: look {look.get('look')} recorded {endpoint} of "
                          f"{arm} as {_values(recorded)}; its runs give {_values(current)} now (trained again, "
                          f"or this recipe's select/collapse read {endpoint} differently): the verdicts shown "
                          f"are the ones the sweep stopped on")


def _values(v: Sequence[float]) -> str:
    return "[" + ", ".join("—" if not math.isfinite(x) else f"{x:.4g}" for x in v) + "]"


def table(seqs: Sequence[SequentialVerdicts]) -> pd.DataFrame:
    rows = []
    for s in seqs:
        for c in latest_comparisons(s.looks).values():
            n = list(c.get("n") or [None, None])
            at = resolved_at(s.looks, c["arm"])
            t, tb = c.get("t"), c.get("t_bound")
            verdict = "continues" if c.get("verdict") == CONTINUE else c.get("verdict")
            if look_caveat(s.looks, s.design):
                verdict = NO_PREVENTION if verdict == "equivalent" else f"{verdict}; {NO_PREVENTION}"
            rows.append({
                "arm vs baseline": f"{c['arm']} vs {c.get('baseline', s.design.baseline)}",
                "endpoint": s.label,
                "difference [repeated CI]": interval(c),
                "CI level": level_text(c),
                "verdict": verdict + (" (< δ)" if verdict in ("better", "worse") and c.get("within_delta") else ""),
                "at look": "—" if at is None else str(at),
                "seeds": f"{n[0]} vs {n[1]}",
                "|t| vs boundary": "—" if t is None or tb is None else f"{abs(t):.3g} {'≥' if abs(t) >= tb else '<'} {tb:.3g}",
                "δ": f"{s.design.delta:.3f}" if math.isfinite(s.design.delta) else "—",
                "80% power needs": "—" if c.get("seeds_needed") is None else f"{c['seeds_needed']} per arm",
            })
    return pd.DataFrame(rows)


def numbers(seqs: Sequence[SequentialVerdicts]) -> pd.DataFrame:
    rows = []
    for s in seqs:
        for c in latest_comparisons(s.looks).values():
            ci = list(c.get("ci") or [None, None])
            rows.append({"sweep": s.sweep_dir.name, "arm": c["arm"], "baseline": c.get("baseline"),
                         "endpoint": s.design.endpoint, "verdict": c.get("verdict"),
                         "resolved_at_look": resolved_at(s.looks, c["arm"]), "looks": len(s.looks),
                         "n_arm": (c.get("n") or [None])[0], "n_baseline": (c.get("n") or [None, None])[1],
                         "diff": c.get("diff"), "low": ci[0], "high": ci[1], "level": c.get("level"),
                         "t": c.get("t"), "t_bound": c.get("t_bound"), "z_bound": c.get("z_bound"),
                         "fraction": c.get("fraction"), "delta": s.design.delta,
                         "seeds_needed": c.get("seeds_needed"), "method": s.design.method})
    return pd.DataFrame(rows)


def section(seqs: Sequence[SequentialVerdicts]) -> Section:
    parts = []
    for s in seqs:
        state = (f"finished after {len(s.looks)} look(s)" if s.finished else
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
    return Section("Verdicts (seeds until resolved)", intro=intro, tables=[("", table(seqs))], lead=True)


def write(seqs: Sequence[SequentialVerdicts], tdir: Path) -> list[Path]:
    written = tables.write_table(numbers(seqs), tdir / "verdicts", formats=("csv",))
    display = table(seqs)
    written += tables.write_table(display, tdir / "verdicts", formats=("tex",),
                                  caption="verdicts of a sweep run until resolved (group-sequential, looks.json)")
    md = tdir / "verdicts.md"
    text = "".join(f"- {x}.\n" for s in seqs for x in s.sentences)
    atomic_write_text(md, text + "\n" + tables.to_markdown(display), durable=False)
    return [*written, md]
