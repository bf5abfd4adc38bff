"""``index.html``: one self-contained page (inline CSS, no scripts, no network, every figure embedded
as a PNG data URI, so the one file can be mailed) with the tables, the figures (also written beside it
as PNG, PDF and SVG for a paper), the configs that differ between groups, and every warning."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from armorlab.core.fsutil import atomic_write_text

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.2rem auto;max-width:1320px;
     padding:0 1rem;color:#222;line-height:1.45}
h1{font-size:1.45rem;margin:0 0 .2rem} h2{font-size:1.25rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;
     margin-top:2rem} .meta{color:#666;font-size:.85rem;margin:.2rem 0 .6rem}
.answer{font-size:1.05rem;margin:.4rem 0 .5rem} .answer b{font-weight:650}
.tbl{overflow-x:auto;max-width:100%;margin:.6rem 0}
table{border-collapse:separate;border-spacing:0;font-size:.82rem}
th,td{border-right:1px solid #ddd;border-bottom:1px solid #ddd;padding:.25rem .5rem;text-align:left;
     white-space:nowrap;background:#fff}
tr>:first-child{border-left:1px solid #ddd} thead tr>*{border-top:1px solid #ddd}
th{background:#f5f5f5} tr:nth-child(even) td{background:#fafafa}
.tbl tr>:first-child{position:sticky;left:0;z-index:1;box-shadow:1px 0 0 #bbb}
#verdict-table{font-size:.8rem} #verdict-table th,#verdict-table td{padding:.25rem .4rem}
.warn{background:#fff7e0;border-left:4px solid #e0a800;padding:.5rem 1rem}
.warn li{margin:.15rem 0} figure{margin:.6rem 0} figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.8rem} code{background:#f3f3f3;padding:0 .2rem}
"""


@dataclass
class Figure:
    """A PNG (path relative to the report dir), its caption, and an element id for links."""
    src: str
    caption: str
    id: str | None = None


@dataclass
class Section:
    """A titled part of the page: HTML, tables ((caption, frame[, id])), figures; ``lead`` ones open the page."""
    title: str
    intro: str = ""
    figures: list[Figure] = field(default_factory=list)
    tables: list[tuple] = field(default_factory=list)
    lead: bool = False
    figures_first: bool = False


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


NA_REP = "—"
_ESCAPE = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})  # pandas' to_html escapes these
_CONTROL = str.maketrans({"\t": "\\t", "\n": "\\n", "\r": "\\r"})  # its value formatter, these


def _cell(text: str) -> str:
    """pandas' ``_write_cell``: escaped, stripped, double spaces as non-breaking ones."""
    return text.translate(_ESCAPE).strip().replace("  ", "&nbsp;&nbsp;")


def _cells(col: pd.Series) -> list[str] | None:
    """A column's cells as pandas' ``to_html`` writes text, integers and booleans; None for anything else."""
    dtype = col.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "iub":
        return [str(v) for v in col.tolist()]
    if (isinstance(dtype, np.dtype) and dtype.kind == "O") or isinstance(dtype, pd.StringDtype):
        out = []
        for v in col.tolist():
            if isinstance(v, str):
                out.append(_cell(v.translate(_CONTROL)))
            elif isinstance(v, float) and math.isnan(v):
                out.append(NA_REP)
            elif v is None:  # pandas writes None of an object column as it is, not as na_rep
                out.append("None")
            else:
                return None
        return out
    return None


def table_html(df: pd.DataFrame) -> str:
    """``df.to_html(index=False, escape=True, na_rep="—", border=0)``, written directly where it can
    (pandas' formatter was half of writing index.html)."""
    columns = []
    if df.columns.size and df.columns.is_unique and all(isinstance(c, str) for c in df.columns):
        for c in df.columns:  # up to the first column of another kind
            columns.append(_cells(df[c]))
            if columns[-1] is None:
                break
    if not columns or columns[-1] is None:
        return df.to_html(index=False, escape=True, na_rep=NA_REP, border=0)
    lines = ['<table class="dataframe">', "  <thead>", '    <tr style="text-align: right;">',
             *[f"      <th>{_cell(c)}</th>" for c in df.columns], "    </tr>", "  </thead>", "  <tbody>"]
    for row in zip(*columns, strict=True):
        lines.append("    <tr>")
        lines.extend(f"      <td>{cell}</td>" for cell in row)
        lines.append("    </tr>")
    lines += ["  </tbody>", "</table>"]
    return "\n".join(lines)


def render(title: str, meta: str, warnings: Sequence[str], sections: Sequence[Section],
           root: Path | None = None) -> str:
    """The page; a figure whose PNG is found under ``root`` is embedded (a data URI), else linked."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{esc(title)}</h1>", f'<p class="meta">{meta}</p>']
    for s in sections:
        if s.lead:
            _section(parts, s, root)
    parts.append("<h2>Warnings</h2>")
    if warnings:
        parts.append('<div class="warn"><ul>' + "".join(f"<li>{esc(w)}</li>" for w in warnings) + "</ul></div>")
    else:
        parts.append("<p>None.</p>")
    for s in sections:
        if not s.lead:
            _section(parts, s, root)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def table_block(df: pd.DataFrame, table_id: str | None = None) -> str:
    """A table in its own horizontally scrolling box (CSS ``.tbl``), its first column fixed."""
    html_ = table_html(df)
    if table_id:
        html_ = html_.replace("<table ", f'<table id="{esc(table_id)}" ', 1)
    return f'<div class="tbl">{html_}</div>'


def image_src(src: str, root: Path | None) -> str:
    """``data:image/png;base64,…`` of the PNG ``root/src``; ``src`` itself when it cannot be read."""
    try:
        data = (root / src).read_bytes() if root is not None and src.endswith(".png") else None
    except OSError:
        data = None
    return src if data is None else "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _section(parts: list[str], s: Section, root: Path | None = None) -> None:
    parts.append(f"<h2>{esc(s.title)}</h2>")
    if s.intro:
        parts.append(s.intro)
    tables = []
    for cap, df, *table_id in s.tables:
        if cap:
            tables.append(f"<p><b>{esc(cap)}</b></p>")
        tables.append(table_block(df, table_id[0] if table_id else None))
    figures = []
    for f in s.figures:
        ident = f' id="{esc(f.id)}"' if f.id else ""
        figures.append(f'<figure><img{ident} src="{esc(image_src(f.src, root))}" data-file="{esc(f.src)}" '
                       f'alt="{esc(f.caption)}"><figcaption>{esc(f.caption)}</figcaption></figure>')
    parts.extend([*figures, *tables] if s.figures_first else [*tables, *figures])


def write_index(out_dir: Path, title: str, meta: str, warnings: Sequence[str],
                sections: Sequence[Section]) -> Path:
    path = out_dir / "index.html"
    atomic_write_text(path, render(title, meta, warnings, sections, out_dir), durable=False)  # see freshness
    return path
