"""``index.html``: one self-contained page (inline CSS, no scripts, no network, every figure embedded
as a PNG data URI, so the one file can be mailed) with the tables, the figures (also written beside it
as PNG, PDF and SVG for a paper), the configs that differ between groups, and every warning."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

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


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _section(s: Section, root: Path) -> list[str]:
    parts = [f"<h2>{esc(s.title)}</h2>", *([s.intro] if s.intro else [])]
    for cap, df, *table_id in s.tables:  # each table in its own scrolling box (CSS .tbl)
        # pandas writes it (a hand-written copy saved 0.6 % of a cold 200-run report: not worth its lines)
        block = df.to_html(index=False, escape=True, na_rep="—", border=0)
        if table_id and table_id[0]:
            block = block.replace("<table ", f'<table id="{esc(table_id[0])}" ', 1)
        if cap:
            parts.append(f"<p><b>{esc(cap)}</b></p>")
        parts.append(f'<div class="tbl">{block}</div>')
    for f in s.figures:  # a PNG is embedded as a data URI where it can be read, else linked
        try:
            src = ("data:image/png;base64," + base64.b64encode((root / f.src).read_bytes()).decode("ascii")
                   if f.src.endswith(".png") else f.src)
        except OSError:
            src = f.src
        ident = f' id="{esc(f.id)}"' if f.id else ""
        parts.append(f'<figure><img{ident} src="{esc(src)}" data-file="{esc(f.src)}" '
                     f'alt="{esc(f.caption)}"><figcaption>{esc(f.caption)}</figcaption></figure>')
    return parts


def write_index(out_dir: Path, title: str, meta: str, warnings: Sequence[str],
                sections: Sequence[Section]) -> Path:
    """The page; a figure whose PNG is found under ``out_dir`` is embedded (a data URI), else linked."""
    warned = ('<div class="warn"><ul>' + "".join(f"<li>{esc(w)}</li>" for w in warnings) + "</ul></div>"
              if warnings else "<p>None.</p>")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{esc(title)}</h1>", f'<p class="meta">{meta}</p>',
             *[p for s in sections if s.lead for p in _section(s, out_dir)], "<h2>Warnings</h2>", warned,
             *[p for s in sections if not s.lead for p in _section(s, out_dir)], "</body></html>"]
    path = out_dir / "index.html"
    atomic_write_text(path, "\n".join(parts) + "\n", durable=False)  # see freshness
    return path
