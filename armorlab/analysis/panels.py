"""Small-multiple figures, one panel per group (ten overlapping bands do not read): ``plot_arms`` (the first
figure) and ``plot_overoptimisation``; conventions as armorlab.analysis.plots.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from armorlab.analysis.plots import (
    STEP_LABEL,
    _band,
    _finish,
    _lay_out,
    _save,
    _step_axis,
    metric_label,
    plt,
    robust_ylim,
)
from armorlab.stats.seeds import CurveBand

BASELINE_COLOR = (0.35, 0.35, 0.35, 1.0)
CONTEXT_COLOR = (0.75, 0.75, 0.75, 1.0)
VERDICT_COLORS = {"better": "#1a7f37", "worse": "#cf222e", "equivalent": "#0550ae"}
MAX_COLS = 4
SINGLE_AXIS_GROUPS = 4  # the over-optimisation figure keeps one axis up to this many groups
# and from this many on again (the first figure too): 4 columns × 4 rows of panels at page width
# are too small to read, and each costs ~45 ms (a 20-group figure took a second more than one axis)
MAX_PANELS = 13


def grid_shape(n: int, max_cols: int = MAX_COLS) -> tuple[int, int]:
    """(rows, cols) for ``n`` panels: fewest rows of ≤ ``max_cols``, spread evenly (5 → 2×3)."""
    rows = max(1, math.ceil(n / max_cols))
    return rows, max(1, math.ceil(n / rows))


def _panels(n: int, width: float, panel_height: float, extra_height: float):
    rows, cols = grid_shape(n)
    fig, axes = plt.subplots(rows, cols, figsize=(width, panel_height * rows + extra_height), squeeze=False)
    flat = axes.ravel()
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n], rows, cols


def _share_axes(axes, rows: int, cols: int, x_label: str, y_label: str, bands: Sequence[CurveBand],
                points: Sequence[float] = ()) -> None:
    """Same limits in every panel, tick labels on the outer ones only; four ticks an axis (each tick is a
    fifth of a small multiple's drawing time)."""
    from matplotlib.ticker import MaxNLocator

    robust_ylim(axes[0], bands, points)
    steps = [np.asarray(b.steps, dtype=np.float64) for b in bands if len(b.steps)]
    x0 = min(float(s.min()) for s in steps) if steps else 0.0
    x1 = max(float(s.max()) for s in steps) if steps else 1.0
    for i, ax in enumerate(axes):
        ax.set_ylim(axes[0].get_ylim())
        ax.set_xlim(x0, x1 if x1 > x0 else x0 + 1)
        below = i + cols < len(axes)  # another panel under this one
        first = i % cols == 0
        _step_axis(ax, fontsize=8, label=x_label if not below else "")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.set_ylabel(y_label if first else "", fontsize=8)
        ax.tick_params(labelsize=7, labelbottom=not below, labelleft=first)
        ax.grid(alpha=0.3)


def _onsets(ax, pts: Sequence[tuple], color, *, labels: bool = True) -> None:
    if not pts:
        return
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="v", s=40, color=color, edgecolor="black",
               linewidth=0.6, zorder=5)
    if labels:
        for p in pts:
            if len(p) > 2 and p[2]:
                ax.annotate(p[2], (p[0], p[1]), textcoords="offset points", xytext=(4, -11), fontsize=7,
                            color=color)


def _text_inches(text: str, size: float) -> float:
    """About how wide ``text`` is at ``size`` points (DejaVu Sans averages ~0.55 em a character)."""
    return 0.55 * len(text) * size / 72


def _legend_below(fig, handles: list, labels: list[str]):
    """A figure legend under the panels, in as many columns as fit the figure's width."""
    width = fig.get_size_inches()[0] - 0.3
    ncols = 1
    for n in range(len(labels), 0, -1):
        rows = math.ceil(len(labels) / n)
        columns = [labels[i:i + rows] for i in range(0, len(labels), rows)]
        if sum(0.7 + max(_text_inches(t, 8) for t in col) for col in columns) <= width:
            ncols = n
            break
    return fig.legend(handles, labels, fontsize=8, frameon=False, loc="outside lower center", ncols=ncols)


def _wrapped(text: str, width: float, size: float) -> str:
    """``text`` in lines that fit ``width`` inches at ``size`` points."""
    return textwrap.fill(text, max(8, int(width / _text_inches("x", size))))


def plot_arms(bands: Mapping[str, CurveBand], metric: str, path: Path, *, colors: Mapping[str, tuple],
              baseline: str | None = None, verdicts: Mapping[str, str] | None = None,
              markers: Mapping[str, Sequence[tuple]] | None = None, matched_steps: Sequence[int] = (),
              noise: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None, x_label: str = STEP_LABEL,
              verdict_of: str = "", width: float = 11.0) -> Path:
    """``metric`` per arm, one panel each (mean, CI band, ±1 SE noise, ▼ collapse onsets), the ``baseline`` in
    grey in every panel, each titled with its verdict (``verdicts``: better green, worse red, equivalent blue)."""
    arms = [g for g in bands if g != baseline]
    if not arms:  # the baseline alone: its own panel
        arms, baseline = list(bands), None
    n = len(arms)
    rows, cols = grid_shape(n)
    # at most ~5 inches tall up to two rows: the figure shares the first screen with the verdicts
    fig, axes, rows, cols = _panels(n, min(width, 3.0 * cols + 2.0), 3.0 if rows == 1 else 1.85, 0.8)
    markers, verdicts, noise = markers or {}, verdicts or {}, noise or {}
    base = bands.get(baseline) if baseline is not None else None
    points = [p[1] for pts in markers.values() for p in pts]
    for ax, g in zip(axes, arms, strict=True):
        if base is not None and g != baseline:
            _band(ax, base, BASELINE_COLOR, None)
            _onsets(ax, markers.get(baseline, ()), BASELINE_COLOR, labels=False)
        else:
            for other, band in bands.items():
                if other != g:
                    ax.plot(band.steps, band.mean, color=CONTEXT_COLOR, linewidth=1.0)
        band = bands[g]
        _band(ax, band, colors[g], None)
        if g in noise and noise[g][0].size:
            se = np.interp(band.steps, *noise[g], left=np.nan, right=np.nan)
            for sign in (-1, 1):
                ax.plot(band.steps, band.mean + sign * se, color=colors[g], linestyle="--", linewidth=0.7)
        _onsets(ax, markers.get(g, ()), colors[g])
        for s in matched_steps:
            ax.axvline(s, color="gray", linestyle=":", linewidth=0.9)
        word = verdicts.get(g)
        ax.set_title(_wrapped(f"{g}: {word}" if word else g, fig.get_size_inches()[0] / cols - 0.4, 10),
                     fontsize=10, color=VERDICT_COLORS.get(word, "black"))
    _share_axes(axes, rows, cols, x_label, metric_label(metric), list(bands.values()), points)
    handles = [plt.Line2D([], [], color="black", linewidth=1.6), ]
    labels = ["arm: mean over seeds, 95% CI shaded"]
    if base is not None:
        handles.append(plt.Line2D([], [], color=BASELINE_COLOR, linewidth=1.6))
        labels.append(f"baseline {baseline}")
    elif n > 1:
        handles.append(plt.Line2D([], [], color=CONTEXT_COLOR))
        labels.append("the other groups' means")
    if any(s.size for s, _ in noise.values()):
        handles.append(plt.Line2D([], [], color="gray", linestyle="--", linewidth=0.7))
        labels.append("±1 SE eval noise")
    if any(markers.values()):
        handles.append(plt.Line2D([], [], marker="v", linestyle="", color="gray", markeredgecolor="black"))
        labels.append("collapse onset (one per seed; fall in SE)")
    if matched_steps:
        handles.append(plt.Line2D([], [], color="gray", linestyle=":"))
        labels.append("matched steps")
    below = _legend_below(fig, handles, labels)
    against = f" against {baseline}" if base is not None else ""
    titled = f"; titles: verdict on {verdict_of}" if verdicts and verdict_of else ""
    sup = fig.suptitle(_wrapped(f"{metric} per arm{against} (mean over seeds, 95% CI){titled}",
                                fig.get_size_inches()[0] - 0.3, 11), fontsize=11)
    _lay_out(fig, None, sup, below)
    return _save(fig, path)


def plot_overoptimisation(train: Mapping[str, CurveBand], val: Mapping[str, CurveBand], train_metric: str,
                          val_metric: str, path: Path, *, legend_title: str,
                          colors: Mapping[str, tuple], x_label: str = STEP_LABEL, width: float = 11.0) -> Path:
    """Train reward (dashed) over validation (solid): one axis up to SINGLE_AXIS_GROUPS groups, then one
    panel per group, one axis again above MAX_PANELS."""
    groups = list(dict.fromkeys([*val, *train]))
    title = f"Over-optimisation: {train_metric} (dashed) vs {val_metric} (solid)"
    drawn = [*val.values(), *train.values()]
    style = [(plt.Line2D([], [], color="gray"), val_metric),
             (plt.Line2D([], [], color="gray", linestyle="--"), train_metric)]
    if len(groups) <= SINGLE_AXIS_GROUPS or len(groups) > MAX_PANELS:
        fig, ax = plt.subplots(figsize=(8, 4.6))
        for g in groups:
            if g in val:
                _band(ax, val[g], colors[g], g)
            if g in train:
                _band(ax, train[g], colors[g], None if g in val else g, linestyle="--")
        robust_ylim(ax, drawn)
        ax.set_title(title)
        _step_axis(ax, label=x_label)
        ax.set_ylabel("reward / accuracy (fraction)")
        ax.grid(alpha=0.3)
        return _finish(fig, ax, path, legend_title, extra_handles=style)
    rows, _ = grid_shape(len(groups))
    fig, axes, rows, cols = _panels(len(groups), width, 2.6, 0.8)
    for ax, g in zip(axes, groups, strict=True):
        if g in val:
            _band(ax, val[g], colors[g], None)
        if g in train:
            _band(ax, train[g], colors[g], None, linestyle="--")
        ax.set_title(_wrapped(g, width / cols - 0.4, 10), fontsize=10)
    _share_axes(axes, rows, cols, x_label, "reward / accuracy (fraction)", drawn)
    below = _legend_below(fig, [h for h, _ in style], [n for _, n in style])
    sup = fig.suptitle(_wrapped(f"{title}, one panel per group ({legend_title})", width - 0.3, 11), fontsize=11)
    _lay_out(fig, None, sup, below)
    return _save(fig, path)
