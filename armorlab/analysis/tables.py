"""Report tables (CSV, Markdown, LaTeX booktabs; cells ``mean [95% CI]`` with the interval's method),
per-run CSV, P(X > Y), config diff; written atomically.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from armorlab.analysis.groups import STEP_SCORES, fmt_value
from armorlab.core.fsutil import atomic_write_text
from armorlab.stats.seeds import CI_METHOD_NAMES, LOW_POWER_N, ci_method


def score_label(score: str, val_metric: str, test_metric: str) -> str:
    """Column header for a score: ``test/acc @ val-best step``, ``val/acc @ 200`` ..."""
    fixed = {"peak": f"peak level {val_metric}", "peak_step": "step of peak", "final": f"final level {val_metric}",
             "drop": "drop (peak level − final level)", "drop_rel": "relative drop", "collapse_step": "collapse step",
             "auc": f"AUC {val_metric} (mean level)", "selected_val": f"{val_metric} @ best step",
             "selected_test": f"{test_metric} @ val-best step", "selected_step": "val-best step",
             "divergence_step": "divergence step", "entropy_collapse_step": "entropy-collapse step",
             "drop_z": "drop (SE)", "collapse_z": "fall at collapse (SE)",
             "length_blowup": "length blow-up (max/first)"}
    for prefix, head in (("val@", f"{val_metric} @ "), ("test@", f"{test_metric} @ "), ("tok_", "tokens: ")):
        if score.startswith(prefix):
            return head + score[len(prefix):]
    return fixed.get(score, score)


def fmt_ci(mean: float, lo: float, hi: float, *, step: bool = False) -> str:
    """``0.512 [0.480, 0.550]``; a single seed shows the value alone; nothing shows ``—``."""
    if mean is None or not math.isfinite(mean):
        return "—"
    f = (lambda v: f"{v:.0f}") if step else (lambda v: f"{v:.3f}")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f(mean)
    return f"{f(mean)} [{f(lo)}, {f(hi)}]"


def ci_note(n: int) -> str:
    """Which interval a group's cells carry (stats S3), flagged low-powered at n ≤ LOW_POWER_N."""
    name = CI_METHOD_NAMES[ci_method(int(n))]
    return f"{name} · low-powered (n={int(n)})" if int(n) <= LOW_POWER_N else name


def display_group_table(summary: pd.DataFrame, keys: Sequence[str], scores: Sequence[str],
                        val_metric: str, test_metric: str, *, n_of: str | None = None) -> pd.DataFrame:
    """Group keys, n (with ``n_of``: the runs that have that score), one ``mean [CI]`` column per score."""
    rows = []
    for r in summary.to_dict("records"):
        row = {k: fmt_value(r[k]) for k in keys} if keys else {"group": r["group"]}
        row["n"] = str(r["n"] if n_of is None else r[f"{n_of}_n"])
        for s in scores:
            cell = fmt_ci(r[f"{s}_mean"], r[f"{s}_ci_low"], r[f"{s}_ci_high"], step=s in STEP_SCORES)
            if s == "collapse_step":
                cell = f"{r['collapsed']}/{r['n']} runs" + (f" @ {cell}" if cell != "—" else "")
            row[score_label(s, val_metric, test_metric)] = cell
        row["95% CI"] = ci_note(row["n"])
        rows.append(row)
    return pd.DataFrame(rows)


def display_headline(summary: pd.DataFrame, keys: Sequence[str], scores: Sequence[str], val_metric: str,
                     test_metric: str) -> pd.DataFrame:
    """Headline scores with every seed statistic: mean [CI], IQM, std and n per group."""
    rows = []
    for r in summary.to_dict("records"):
        row = {k: fmt_value(r[k]) for k in keys} if keys else {"group": r["group"]}
        for s in scores:
            label = score_label(s, val_metric, test_metric)
            row[label] = fmt_ci(r[f"{s}_mean"], r[f"{s}_ci_low"], r[f"{s}_ci_high"])
            row[f"{label}: IQM"] = fmt_ci(r[f"{s}_iqm"], None, None)
            row[f"{label}: std"] = fmt_ci(r[f"{s}_std"], None, None)
            row[f"{label}: n"] = str(r[f"{s}_n"])
        if scores:
            row["95% CI"] = ci_note(r[f"{scores[0]}_n"])
        rows.append(row)
    return pd.DataFrame(rows)


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub pipe table (no extra dependency for something this small)."""
    def cell(v) -> str:
        return fmt_value(v).replace("|", "\\|").replace("\n", " ")
    head, *body = ("| " + " | ".join(map(cell, row)) + " |" for row in [df.columns, *df.itertuples(index=False)])
    return "\n".join([head, "|" + "|".join("---" for _ in df.columns) + "|", *body]) + "\n"


_LATEX_WORDS = {"\\": "\\textbackslash ", "~": "\\textasciitilde ", "^": "\\textasciicircum "}


def _escape_latex(text: str) -> str:
    """pandas' LaTeX escaping (Styler's ``escape="latex"``) in one pass: & % $ # _ { } get a backslash;
    \\ ~ ^ become words, and a space after one of them ``\\space``."""
    return re.sub(r"[&%$#_{}]|([\\~^])( ?)",
                  lambda m: _LATEX_WORDS[m[1]] + "\\space " * bool(m[2]) if m[1] else "\\" + m[0], text)


def _booktabs(spec: str, cells: list[list[str]]) -> str:
    """A booktabs tabular of column ``spec`` whose first row is the header."""
    head, *rows = (" & ".join(r) + " \\\\" for r in cells)
    return "\n".join([f"\\begin{{tabular}}{{{spec}}}", "\\toprule", head, "\\midrule", *rows, "\\bottomrule",
                      "\\end{tabular}"]) + "\n"


def to_latex(df: pd.DataFrame, caption: str | None = None) -> str:
    """pandas' booktabs tabular, LaTeX special characters escaped."""
    body = df.to_latex(index=False, escape=True)
    return f"% {caption}\n% needs \\usepackage{{booktabs}}\n{body}" if caption else body


def _pm(mean: float, lo: float, hi: float) -> str:
    """``$0.533 \\pm 0.041$`` (the CI's half-width), ``$0.533^{+0.030}_{-0.041}$`` where a clipped or
    bootstrap interval is not symmetric at three decimals, the value alone for one seed, ``--`` for none."""
    if mean is None or not math.isfinite(mean):
        return "--"
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f"${mean:.3f}$"
    up, down = f"{hi - mean:.3f}", f"{mean - lo:.3f}"
    return f"${mean:.3f} \\pm {up}$" if up == down else f"${mean:.3f}^{{+{up}}}_{{-{down}}}$"


def compact_latex(summary: pd.DataFrame, names: dict[str, str], scores: Sequence[str], val_metric: str,
                  test_metric: str, caption: str) -> str:
    """The paper's table: one row per arm (its name), n, one ``mean ± 95% CI`` column per score (booktabs)."""
    head = ["arm", "$n$", *(_escape_latex(score_label(s, val_metric, test_metric)) for s in scores)]
    rows = [[_escape_latex(names.get(r["group"], r["group"])), str(r["n"]),
             *(_pm(r[f"{s}_mean"], r[f"{s}_ci_low"], r[f"{s}_ci_high"]) for s in scores)]
            for r in summary.to_dict("records")]
    return f"% {caption}\n% needs \\usepackage{{booktabs}}\n" + _booktabs("l" + "r" * (len(head) - 1), [head, *rows])


def display_improvement(poi: pd.DataFrame, val_metric: str, test_metric: str) -> pd.DataFrame:
    """P(X > Y) with its bootstrap CI, or that seeds cannot resolve it (stats S4); the exact Mann–Whitney p."""
    rows = []
    for r in poi.to_dict("records"):
        cell = fmt_ci(r["p_improvement"], r["ci_low"], r["ci_high"])
        if not r.get("resolvable", True) and cell != "—":
            cell += f" (cannot be resolved with {r['n_x']} vs {r['n_y']} seeds)"
        mw = r.get("mw_p", math.nan)
        rows.append({"X": r["x"], "Y": r["y"], "score": score_label(r["score"], val_metric, test_metric),
                     "P(X > Y)": cell, "Mann–Whitney p": "—" if not math.isfinite(mw) else f"{mw:.3g}",
                     "seeds X/Y": f"{r['n_x']}/{r['n_y']}"})
    return pd.DataFrame(rows, columns=["X", "Y", "score", "P(X > Y)", "Mann–Whitney p", "seeds X/Y"])


def write_table(df: pd.DataFrame, stem: Path, *, formats=("csv", "md", "tex"), caption: str | None = None
                ) -> list[Path]:
    """Write ``stem.csv``/``.md``/``.tex``; returns the paths."""
    text = {"csv": lambda: df.to_csv(index=False), "md": lambda: to_markdown(df), "tex": lambda: to_latex(df, caption)}
    for fmt in formats:  # durable=False: a report is rebuilt, never the only copy (freshness)
        atomic_write_text(stem.with_suffix(f".{fmt}"), text[fmt](), durable=False)
    return [stem.with_suffix(f".{fmt}") for fmt in formats]


def write_verdicts(numbers: pd.DataFrame, shown: pd.DataFrame, text: str, tdir: Path, caption: str) -> list[Path]:
    """verdicts.csv (the numbers), verdicts.tex (the table shown) and verdicts.md (``text``, then the table)."""
    written = write_table(numbers, tdir / "verdicts", formats=("csv",))
    written += write_table(shown, tdir / "verdicts", formats=("tex",), caption=caption)
    md = tdir / "verdicts.md"
    atomic_write_text(md, text + "\n" + to_markdown(shown), durable=False)
    return [*written, md]
