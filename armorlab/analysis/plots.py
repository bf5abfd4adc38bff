"""Report figures (matplotlib, Agg backend). Each function takes prepared numbers, writes one PNG
and returns its path; every figure has a title, axis labels with units and a legend titled with
the group-by keys, and a group keeps its colour across figures."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from armorlab.algos.capacity import capacity_family
from armorlab.analysis.value_labels import fmt_value
from armorlab.core.fsutil import atomic_file
from armorlab.core.lazy import Lazy
from armorlab.stats.seeds import CurveBand


@functools.cache
def _matplotlib():
    """matplotlib imported at the first figure; a Figure on an Agg canvas, not pyplot (whose import,
    registry and redraw hook were ~4 % of the figures' cost)."""
    import types

    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    def subplots(nrows=1, ncols=1, *, figsize, squeeze=True):
        fig = Figure(figsize=figsize, dpi=DPI)  # text measured at the resolution drawn
        FigureCanvasAgg(fig)  # headless (clusters, CI), whatever backend pyplot would pick
        return fig, fig.subplots(nrows, ncols, squeeze=squeeze)

    return types.SimpleNamespace(subplots=subplots, Line2D=Line2D, Rectangle=Rectangle,
                                 get_cmap=matplotlib.colormaps.__getitem__, rcParams=matplotlib.rcParams)


plt = Lazy(_matplotlib)

DPI = 110
# each capacity family (armorlab.algos.objectives.CAPACITY_FAMILIES) in the counterfactual panel
CAPACITY_STYLE = {"clipped": ("clipped", "tab:red", "--"), "unbounded_positive": ("unbounded for A > 0", "tab:green", "-"),
                  "mixed": ("mixed trust region, Eq. 6", "tab:blue", "-.")}
STEP_LABEL = "step (optimizer steps)"
AXIS_LABELS = {"step": STEP_LABEL, "rollout": "rollout (generation batches)"}  # a recipe's ``x``
_UNITS = {"acc": "accuracy, avg@k", "reward": "mean reward", "entropy": "nats/token",
          "length": "tokens", "approx_kl": "nats/token", "rate": "fraction", "gate_drop": "fraction",
          "pos_mean": "Δπ", "neg_mean": "Δπ", "pos_bound_frac": "fraction of A>0 tokens"}


def metric_label(metric: str) -> str:
    """Axis label with units; KL is in nats per sequence (docs/training.md, "What a run logs")."""
    ns, _, name = metric.partition("/")
    unit = "nats/sequence" if ns == "kl" else "fraction solved" if name.startswith("pass@") else _UNITS.get(name)
    return f"{metric} ({unit})" if unit else metric


def _step_axis(ax, fontsize=None, label: str = STEP_LABEL) -> None:
    """x axis in optimizer steps (or ``label``'s counter), integer ticks only."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(label, fontsize=fontsize)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def group_colors(labels: Sequence[str]) -> dict[str, tuple]:
    """matplotlib's tab10 up to ten groups, else tab20."""
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {g: cmap(i % cmap.N) for i, g in enumerate(labels)}


def _finish(fig, ax_legend, path: Path, legend_title: str, *, extra_handles=()) -> Path:
    """The groups' legend in ``ax_legend``, hung outside it past six entries; then laid out and saved."""
    handles, labels = ax_legend.get_legend_handles_labels()
    handles, labels = [*handles, *[h for h, _ in extra_handles]], [*labels, *[n for _, n in extra_handles]]
    if handles:
        outside = len(handles) > 6
        ax_legend.legend(handles, labels, title=legend_title, fontsize=8, title_fontsize=8,
                         loc="upper left" if outside else "best", bbox_to_anchor=(1.01, 1.0) if outside else None,
                         frameon=False)
        if outside:
            em = 8 / 72
            # make room as bbox_inches="tight" did (without its second full draw): wider by the legend
            # (~0.5 em a character), taller when the legend (~1.55 em a row, hung from the axes' top)
            # would run off the bottom
            w, h = fig.get_size_inches()
            width = 0.9 + 0.5 * em * max(len(t) for t in [*labels, legend_title])
            top = h * (1 - ax_legend.get_position().y1)
            fig.set_size_inches(w + max(0.0, width - 1.0), max(h, top + (len(labels) + 1) * 1.55 * em + 0.5))
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    """The figure in constrained layout, laid out once (each format's save would lay it out again), as
    PNG at ``path`` and as PDF and SVG beside it (for a paper), each renamed into place (a reader never
    sees half a file); no creation dates: the same figure gives the same bytes."""
    fig.set_layout_engine("constrained")
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    for fmt, metadata in (("png", None), ("pdf", {"CreationDate": None}), ("svg", {"Date": None})):
        with atomic_file(path.with_suffix(f".{fmt}")) as tmp:
            fig.savefig(tmp, format=fmt, dpi=DPI, metadata=metadata)
    return path


def _band(ax, band: CurveBand, color, label: str | None, *, linestyle="-") -> None:
    """The mean over its 95 % CI band; a step without both bounds is a gap in the band."""
    ax.fill_between(band.steps, band.low, band.high, facecolor=color, edgecolor="none", alpha=BAND_ALPHA,
                    linewidth=0)
    ax.plot(band.steps, band.mean, color=color, linestyle=linestyle, linewidth=1.6, label=label)


def _noise(ax, band: CurveBand, noise: tuple[np.ndarray, np.ndarray] | None, color) -> None:
    """±1 SE of eval noise (``noise``: its steps and SE) around the mean, thin and dashed."""
    if noise is not None and noise[0].size:
        se = np.interp(band.steps, *noise, left=np.nan, right=np.nan)
        for sign in (-1, 1):
            ax.plot(band.steps, band.mean + sign * se, color=color, linestyle="--", linewidth=0.7)


def _onsets(ax, pts: Sequence[tuple], color, *, labels: bool = True, size: float = 40) -> None:
    """▼ at each seed's collapse onset (step, level[, its fall in SE as a label])."""
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="v", s=size, color=color, edgecolor="black",
                   linewidth=0.6, zorder=5)
    for p in pts if labels else ():
        if len(p) > 2 and p[2]:
            ax.annotate(p[2], (p[0], p[1]), textcoords="offset points", xytext=(4, -11), fontsize=7, color=color)


def _legend_keys(noise, markers, matched_steps) -> list[tuple]:
    """Legend entries for the ±1 SE lines, ▼ onsets and matched steps a figure draws."""
    keys = []
    if noise and any(s.size for s, _ in noise.values()):
        keys.append((plt.Line2D([], [], color="gray", linestyle="--", linewidth=0.7), "±1 SE eval noise"))
    if markers and any(markers.values()):
        labelled = any(len(p) > 2 and p[2] for pts in markers.values() for p in pts)
        keys.append((plt.Line2D([], [], marker="v", linestyle="", color="gray", markeredgecolor="black"),
                     "collapse onset (one per seed; fall in SE)" if labelled else "collapse onset (one per seed)"))
    if matched_steps:
        keys.append((plt.Line2D([], [], color="gray", linestyle=":"), "matched steps"))
    return keys


BAND_ALPHA = 0.12  # CI bands: light enough that the means and the other groups read through them
CI_REACH = 1.0  # a CI may widen the y axis by at most this share of the means' range on each side
BAND_QUANTILE = 0.05  # the axis holds the bands' edges but for this share at each end (spikes)


def _finite(arrays) -> np.ndarray:
    x = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays] or [np.empty(0)])
    return x[np.isfinite(x)]


def robust_ylim(ax, bands: Sequence[CurveBand], points: Sequence[float] = ()) -> bool:
    """y limits holding the means (and ``points``) and the bands' edges but for their lowest and
    highest BAND_QUANTILE (one seed's spike), widened by bands by at most CI_REACH of the means'
    range: the band sits inside the panel instead of shading all of it, and a spike must not hide
    where the means go. True when a band is cut at the frame."""
    means = _finite([*(b.mean for b in bands), points])
    if not means.size:
        return False
    lo, hi = float(means.min()), float(means.max())
    span = hi - lo if hi > lo else max(abs(hi), 1.0) * 0.1
    lows, highs = _finite(b.low for b in bands), _finite(b.high for b in bands)
    band_lo, edge_lo = (lows.min(), np.quantile(lows, BAND_QUANTILE)) if lows.size else (lo, lo)
    band_hi, edge_hi = (highs.max(), np.quantile(highs, 1 - BAND_QUANTILE)) if highs.size else (hi, hi)
    y0 = max(min(edge_lo, lo), lo - CI_REACH * span)
    y1 = min(max(edge_hi, hi), hi + CI_REACH * span)
    if y1 - y0 < span:  # a flat curve without a band: an axis around it, not a singular one
        y0, y1 = (y0 + y1 - span) / 2, (y0 + y1 + span) / 2
    pad = 0.05 * (y1 - y0)
    ax.set_ylim(float(y0 - pad), float(y1 + pad))
    return bool(band_lo < y0 or band_hi > y1)


def plot_curves(bands: Mapping[str, CurveBand], metric: str, path: Path, *, legend_title: str,
                colors: Mapping[str, tuple], markers: Mapping[str, Sequence[tuple]] | None = None,
                matched_steps: Sequence[int] = (), title: str | None = None,
                noise: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                x_label: str = STEP_LABEL) -> Path:
    """One metric per group: mean with its 95 % CI band, ▼ at seeds' collapse steps, ``noise`` ±1 SE lines."""
    fig, (ax,) = _metric_panels({metric: bands}, 1, (8, 4.6), colors, x_label)
    markers, noise = markers or {}, noise or {}
    for g, band in bands.items():
        _noise(ax, band, noise.get(g), colors[g])
    for g, pts in markers.items():
        _onsets(ax, pts, colors[g], size=46)
    for s in matched_steps:
        ax.axvline(s, color="gray", linestyle=":", linewidth=0.9)
    robust_ylim(ax, list(bands.values()), [p[1] for pts in markers.values() for p in pts])
    ax.set_title(title or f"{metric} per group (mean over seeds, 95% CI)")
    return _finish(fig, ax, path, legend_title, extra_handles=_legend_keys(noise, markers, matched_steps))


def _panel_grid(n: int, rows: int, cols: int, figsize: tuple[float, float]):
    """Small multiples for ``n`` panels: the figure and its ``n`` axes in reading order, spare ones hidden."""
    fig, axes = plt.subplots(rows, cols, figsize=figsize, squeeze=False)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    return fig, axes.ravel()[:n]


def _metric_panels(panels: Mapping[str, Mapping[str, CurveBand]], max_cols: int, size: tuple[float, float],
                   colors: Mapping[str, tuple], x_label: str, fontsize: float | None = None):
    """One panel per metric, each group's band in it, in rows of ``max_cols`` panels of ``size`` inches."""
    cols = min(max_cols, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = _panel_grid(len(panels), rows, cols, (size[0] * cols, size[1] * rows))
    for ax, (metric, bands) in zip(axes, panels.items(), strict=True):
        for g, band in bands.items():
            _band(ax, band, colors[g], g)
        robust_ylim(ax, list(bands.values()))
        _step_axis(ax, fontsize=fontsize, label=x_label)
        ax.set_ylabel(metric_label(metric), fontsize=fontsize)
        ax.grid(alpha=0.3)
    return fig, axes


KL_REVERSE, KL_FORWARD = "reverse KL(π_θ‖π_ref)", "forward KL(π_ref‖π_θ)"
_KL_SOURCES = {"reverse": (KL_REVERSE, "samples of π_θ"), "forward": (KL_FORWARD, "unconditioned samples of π_ref")}


def kl_direction(metric: str) -> tuple[str, str]:
    """(direction, where its samples come from) of a KL metric by name (design.md); ("", "") if none."""
    ns, _, name = metric.partition("/")
    if ns == "anchor" and name.startswith("kl_"):
        return "anchor KL (neither direction)", f"{name[3:]} estimate on reward-filtered samples of π_ref"
    head, _, tail = name.partition("_")
    direction, source = _KL_SOURCES.get(tail if head == "exact" else head, ("", ""))
    if ns != "kl" or not (direction and tail):
        return "", ""
    return direction, f"exact, on {source}" if head == "exact" else f"{tail} estimate on {source}"


def plot_kl(panels: Mapping[str, Mapping[str, CurveBand]], path: Path, *, legend_title: str,
            colors: Mapping[str, tuple], x_label: str = STEP_LABEL) -> Path:
    """KL over steps, one panel per KL metric (ARMOR Fig. 2b style), titled by kl_direction."""
    fig, axes = _metric_panels(panels, 2, (5.2, 4.0), colors, x_label)
    for ax, metric in zip(axes, panels, strict=True):
        direction, source = kl_direction(metric)
        ax.set_title(f"{direction}\n{metric}: {source}" if direction else metric, fontsize=9)
    fig.suptitle("KL to the reference policy (mean over seeds, 95% CI)")
    return _finish(fig, axes[-1], path, legend_title)


def plot_capacity(per_group: Mapping[str, np.ndarray], counterfactual: Mapping[str, np.ndarray], path: Path,
                  *, legend_title: str, colors: Mapping[str, tuple]) -> Path:
    """ECDF of capacity of A > 0 tokens: each group under its objective; the same tokens under UP, DAPO, ARMOR."""
    sides = [("Capacity of A>0 tokens, own objective", legend_title,
              [(cap, colors[g], g, "-") for g, cap in per_group.items()])]
    if counterfactual:
        sides.append(("Same tokens under each objective", "objective formula",
                      [(cap, color, f"{obj} ({words})", ls) for obj, cap in counterfactual.items()
                       for words, color, ls in [CAPACITY_STYLE[capacity_family(obj)]]]))
    fig, axes = plt.subplots(1, len(sides), figsize=(5.6 * len(sides), 4.4), squeeze=False)
    for ax, (title, legend, ecdfs) in zip(axes[0], sides, strict=True):
        for cap, color, label, ls in ecdfs:
            x = np.sort(np.asarray(cap, dtype=np.float64))
            if x.size:
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", color=color,
                        label=f"{label} (n={x.size:,})", linestyle=ls)
        ax.set_title(title)
        ax.set_xlabel("probability capacity Δπ (UP Eq. 11)")
        ax.set_ylabel("fraction of tokens ≤ x (ECDF)")
        ax.grid(alpha=0.3)
        # upper left: an ECDF rises to the right, so that corner is empty
        ax.legend(title=legend, fontsize=7, title_fontsize=7, frameon=False, loc="upper left")
    capacity_axis(list(axes[0]), [*per_group.values(), *counterfactual.values()])
    fig.suptitle("Probability capacity distributions")
    return _save(fig, path)


DECADES = 2.0  # data spanning more than this many powers of ten gets a log axis


def capacity_axis(axes, samples: Sequence[np.ndarray]) -> tuple[float, float, str] | None:
    """x limits on the data's range (its finite values; an unbounded capacity is off the axis), on a
    log scale where the positive values span more than DECADES powers of ten: capacities of 1e-4 to
    1e-2 sat at x≈0 on a 0–1 axis. Returns (low, high, scale); None without finite data."""
    x = _finite(samples)
    if not x.size:
        return None
    lo, hi = float(x.min()), float(x.max())
    pos = x[x > 0]
    if lo >= 0 and pos.size and np.log10(hi / pos.min()) > DECADES:
        # zeros (a token the clip stops) keep a linear stretch below the smallest positive value
        scale, kw = ("log", {}) if lo > 0 else ("symlog", {"linthresh": float(pos.min())})
        lo, hi = (lo / 1.25 if lo > 0 else 0.0), hi * 1.25
    else:
        pad = 0.04 * (hi - lo) if hi > lo else max(abs(hi), 1e-3) * 0.1
        lo, hi, scale, kw = lo - pad, hi + pad, "linear", {}
    for ax in axes:
        ax.set_xscale(scale, **kw)
        ax.set_xlim(lo, hi)
    return lo, hi, scale


def plot_ablation(summary_rows: Sequence[Mapping], per_run: Mapping[str, Mapping[str, np.ndarray]],
                  scores: Sequence[str], score_labels: Mapping[str, str], x_key: str, hue_keys: Sequence[str],
                  path: Path, *, colors: Mapping[str, tuple]) -> Path:
    """Bars over ``x_key`` per combination of the other keys: mean, 95 % CI and every seed as a dot."""
    ticks = ["none" if fmt_value(r[x_key]) == "None" else fmt_value(r[x_key]) for r in summary_rows]
    hue = [", ".join(f"{k}={fmt_value(r[k])}" for k in hue_keys) or "all" for r in summary_rows]
    xs, hues = list(dict.fromkeys(ticks)), list(dict.fromkeys(hue))
    hue_color = group_colors(hues)
    # at each x only the hues that exist there, centred: no gaps for combinations never run
    ran = set(zip(ticks, hue, strict=True))
    at_x = {x: [h for h in hues if (x, h) in ran] for x in xs}
    width = 0.8 / max(len(v) for v in at_x.values())
    pos = [xs.index(x) + (at_x[x].index(h) - (len(at_x[x]) - 1) / 2) * width for x, h in zip(ticks, hue, strict=True)]
    bars = len(ran)
    # side by side while bars are few; stacked (one full-width row per score) when they are many
    shape = (1, len(scores)) if bars <= 8 else (len(scores), 1)
    panel_w = min(12.0, max(6.0 if shape[0] > 1 else 4.6, 1.2 + 0.45 * bars))
    fig, axes = plt.subplots(*shape, figsize=(panel_w * shape[1], 3.8 * shape[0]), squeeze=False)
    for ax, score in zip(axes.ravel(), scores, strict=True):
        # one bar call and one scatter per panel (one per group cost a second at 20 groups)
        drawn, dots = [], []
        for r, h, xi in zip(summary_rows, hue, pos, strict=True):
            mean, lo, hi = r[f"{score}_mean"], r[f"{score}_ci_low"], r[f"{score}_ci_high"]
            if np.isfinite(mean):
                ci = np.isfinite(lo) and np.isfinite(hi)  # a missing CI is a NaN error, which draws nothing
                # max(0, ·): a bootstrap mean can round an ulp past the sample mean (near-tied seeds)
                drawn.append((xi, mean, hue_color[h] if hue_keys else colors[r["group"]],
                              max(0.0, mean - lo) if ci else np.nan, max(0.0, hi - mean) if ci else np.nan))
            seeds = _finite([per_run.get(r["group"], {}).get(score, ())])
            jitter = np.linspace(-0.25, 0.25, seeds.size) * width if seeds.size > 1 else np.zeros(seeds.size)
            dots += zip(xi + jitter, seeds, strict=True)
        if drawn:
            bx, by, bc, err_lo, err_hi = zip(*drawn, strict=True)
            ax.bar(bx, by, width=width * 0.9, color=list(bc), alpha=0.8, capsize=3, ecolor="black",
                   yerr=[err_lo, err_hi] if np.isfinite(err_lo).any() else None)
        if dots:
            ax.scatter(*zip(*dots, strict=True), s=12, color="black", zorder=5)
        ax.set_xticks(range(len(xs)), xs)
        ax.set_xlabel(x_key)
        ax.set_ylabel(score_labels.get(score, score))
        ax.set_title(score_labels.get(score, score), fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    if hue_keys:
        handles = [plt.Rectangle((0, 0), 1, 1, color=hue_color[h], alpha=0.8) for h in hues]
        fig.legend(handles, hues, title=", ".join(hue_keys), fontsize=8, title_fontsize=8, frameon=False,
                           loc="outside lower center", ncols=min(3, len(hues)))
    fig.suptitle(f"Ablation over {x_key}: mean over seeds with 95% CI (dots = seeds)")
    return _save(fig, path)


def plot_curve_grid(panels: Mapping[str, Mapping[str, CurveBand]], path: Path, *, legend_title: str,
                    colors: Mapping[str, tuple], x_label: str = STEP_LABEL) -> Path:
    """Small multiples: every recipe curve, one panel per metric."""
    fig, axes = _metric_panels(panels, 3, (4.6, 3.5), colors, x_label, fontsize=8)
    for ax, metric in zip(axes, panels, strict=True):
        ax.set_title(metric, fontsize=10)
        ax.tick_params(labelsize=7)
    fig.suptitle("Other curves (mean over seeds, 95% CI)")
    return _finish(fig, axes[-1], path, legend_title)
