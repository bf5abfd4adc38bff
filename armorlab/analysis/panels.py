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
    _legend_keys,
    _noise,
    _onsets,
    _panel_grid,
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


def _share_axes(axes, cols: int, x_label: str, y_label: str, bands: Sequence[CurveBand],
                points: Sequence[float] = ()) -> None:
    """Same limits in every panel, tick labels on the outer ones only; four ticks an axis (each tick is a
    fifth of a small multiple's drawing time)."""
    from matplotlib.ticker import MaxNLocator

    robust_ylim(axes[0], bands, points)
    steps = [float(f(b.steps)) for b in bands if len(b.steps) for f in (np.min, np.max)] or [0.0, 1.0]
    x0, x1 = min(steps), max(steps)
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


def _text_inches(text: str, size: float) -> float:
    """About how wide ``text`` is at ``size`` points (DejaVu Sans averages ~0.55 em a character)."""
    return 0.55 * len(text) * size / 72


def _legend_below(fig, keys: Sequence[tuple]):
    """A figure legend under the panels, in as many columns as fit the figure's width."""
    handles, labels = [h for h, _ in keys], [t for _, t in keys]

    def fits(ncols: int) -> bool:
        rows = math.ceil(len(labels) / ncols)
        return sum(0.7 + max(_text_inches(t, 8) for t in labels[i:i + rows])
                   for i in range(0, len(labels), rows)) <= fig.get_size_inches()[0] - 0.3

    ncols = next((n for n in range(len(labels), 0, -1) if fits(n)), 1)
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
    if baseline not in bands or len(bands) == 1:  # the baseline alone: its own panel
        baseline = None
    arms = [g for g in bands if g != baseline]
    rows, cols = grid_shape(len(arms))
    # at most ~5 inches tall up to two rows: the figure shares the first screen with the verdicts
    width = min(width, 3.0 * cols + 2.0)
    fig, axes = _panel_grid(len(arms), rows, cols, (width, (3.0 if rows == 1 else 1.85) * rows + 0.8))
    markers, verdicts, noise = markers or {}, verdicts or {}, noise or {}
    for ax, g in zip(axes, arms, strict=True):
        if baseline is not None:
            _band(ax, bands[baseline], BASELINE_COLOR, None)
            _onsets(ax, markers.get(baseline, ()), BASELINE_COLOR, labels=False)
        for other, band in bands.items() if baseline is None else ():
            if other != g:
                ax.plot(band.steps, band.mean, color=CONTEXT_COLOR, linewidth=1.0)
        _band(ax, bands[g], colors[g], None)
        _noise(ax, bands[g], noise.get(g), colors[g])
        _onsets(ax, markers.get(g, ()), colors[g])
        for s in matched_steps:
            ax.axvline(s, color="gray", linestyle=":", linewidth=0.9)
        word = verdicts.get(g)
        ax.set_title(_wrapped(f"{g}: {word}" if word else g, width / cols - 0.4, 10),
                     fontsize=10, color=VERDICT_COLORS.get(word, "black"))
    _share_axes(axes, cols, x_label, metric_label(metric), list(bands.values()),
                [p[1] for pts in markers.values() for p in pts])
    keys = [(plt.Line2D([], [], color="black", linewidth=1.6), "arm: mean over seeds, 95% CI shaded")]
    if baseline is not None:
        keys.append((plt.Line2D([], [], color=BASELINE_COLOR, linewidth=1.6), f"baseline {baseline}"))
    elif len(arms) > 1:
        keys.append((plt.Line2D([], [], color=CONTEXT_COLOR), "the other groups' means"))
    _legend_below(fig, keys + _legend_keys(noise, markers, matched_steps))
    against = f" against {baseline}" if baseline is not None else ""
    titled = f"; titles: verdict on {verdict_of}" if verdicts and verdict_of else ""
    fig.suptitle(_wrapped(f"{metric} per arm{against} (mean over seeds, 95% CI){titled}", width - 0.3, 11),
                       fontsize=11)
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
    one_axis = len(groups) <= SINGLE_AXIS_GROUPS or len(groups) > MAX_PANELS
    if one_axis:
        fig, ax = plt.subplots(figsize=(8, 4.6))
        axes = [ax] * len(groups)
    else:
        rows, cols = grid_shape(len(groups))
        fig, axes = _panel_grid(len(groups), rows, cols, (width, 2.6 * rows + 0.8))
    for ax, g in zip(axes, groups, strict=True):
        if g in val:
            _band(ax, val[g], colors[g], g if one_axis else None)
        if g in train:
            _band(ax, train[g], colors[g], g if one_axis and g not in val else None, linestyle="--")
        if not one_axis:
            ax.set_title(_wrapped(g, width / cols - 0.4, 10), fontsize=10)
    if one_axis:
        robust_ylim(ax, drawn)
        ax.set_title(title)
        _step_axis(ax, label=x_label)
        ax.set_ylabel("reward / accuracy (fraction)")
        ax.grid(alpha=0.3)
        return _finish(fig, ax, path, legend_title, extra_handles=style)
    _share_axes(axes, cols, x_label, "reward / accuracy (fraction)", drawn)
    _legend_below(fig, style)
    fig.suptitle(_wrapped(f"{title}, one panel per group ({legend_title})", width - 0.3, 11), fontsize=11)
    return _save(fig, path)
