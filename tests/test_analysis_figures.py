"""Report figures: the layout that replaced bbox_inches="tight" keeps every legend on the canvas,
onset labels give way when they would overlap, band gaps stay empty, and the group palette is
matplotlib's."""


import numpy as np
import pytest

from armorlab.analysis import panels as P
from armorlab.analysis import plots
from armorlab.analysis import report as R
from armorlab.analysis.recipe import Recipe
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir
from armorlab.stats.seeds import CurveBand


def _sweep(root, groups=3, seeds=2):
    for g in range(groups):
        for k in range(seeds):
            rd = RunDir.create(root, resolve({"objective": "armor", "alpha": 0.5 + 0.1 * g, "seed": k,
                                              "max_steps": 40}))
            for s in range(41):
                m = {"train/reward": s / 40, "train/entropy": 1 - s / 80, "kl/reverse_k3": s / 400}
                if s % 5 == 0:
                    m.update({"val/acc": 0.2 + 0.01 * s - (0.3 if s > 25 and g == 0 else 0) + 0.01 * k,
                              "test/acc": 0.1 + 0.01 * s, "val/n": 500})
                rd.append_metrics(s, m)
            rd.write_status("completed")
    return root


def _bands(groups, label_len=0, scale=1.0, steps=100):
    x = np.arange(0, float(steps))
    return {f"alpha={0.5 + 0.01 * g:.2f}, ref_reset_steps={g * 25}" + "x" * label_len: CurveBand(
        x, scale * (np.sin(x / 20) + g / 10), scale * (np.sin(x / 20) + g / 10 - 0.05),
        scale * (np.sin(x / 20) + g / 10 + 0.05), np.full(x.size, 3)) for g in range(groups)}


def _text_boxes_fit(fig):
    """(what lies outside the canvas, which pairs of parts overlap): every panel with its tick
    labels, axis labels and title, the legends and the suptitle, as the draw placed them."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    panels = [ax.get_tightbbox(renderer, bbox_extra_artists=[]) for ax in fig.axes if ax.axison]
    legends = [a.get_legend().get_window_extent(renderer) for a in fig.axes if a.get_legend()]
    legends += [leg.get_window_extent(renderer) for leg in fig.legends]
    texts = [t.get_window_extent(renderer) for t in fig.texts if t.get_text()]
    outside = [b for b in [*panels, *legends, *texts]
               if b.x0 < -1 or b.y0 < -1 or b.x1 > canvas.x1 + 1 or b.y1 > canvas.y1 + 1]
    # a legend inside its panel ("best", few groups) is meant to lie on it
    legends = [b for b in legends if not any(ax.bbox.contains(b.x0, b.y0) and ax.bbox.contains(b.x1, b.y1)
                                             for ax in fig.axes)]
    parts = [("panel", b) for b in panels] + [("legend", b) for b in legends] + [("text", b) for b in texts]
    overlaps = [(na, nb) for k, (na, a) in enumerate(parts) for nb, b in parts[k + 1:]
                if min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1
                and not (na == nb == "legend")]
    return outside, overlaps


@pytest.mark.parametrize(("groups", "panels", "label_len"), [(1, 1, 0), (3, 3, 0), (20, 2, 0), (20, 5, 40),
                                                            (8, 6, 0)])
def test_legends_stay_on_the_canvas(tmp_path, groups, panels, label_len):
    # what bbox_inches="tight" guaranteed, for the layout that replaced it: an outside legend of up
    # to 20 groups (taller than the axes, long labels), every panel's tick labels, axis labels and
    # title, and the suptitle lie inside the saved image, and none overlaps another
    from PIL import Image

    scales = [1.0, 1000.0, 0.001, 25.0, 1.0, 3e7]   # the last: an offset text ("1e7"), laid out by the fallback
    seen = {}
    real_save = plots._save

    def spy(fig, path):  # measured as saved: _save lays the figure out
        saved = real_save(fig, path)
        seen[path.name] = _text_boxes_fit(fig)
        return saved

    colors = plots.group_colors(list(_bands(groups, label_len)))
    kw = {"legend_title": "alpha, ref_reset_steps", "colors": colors}
    grid = {f"metric/number_{k}": _bands(groups, label_len, scale=scales[k]) for k in range(panels)}
    plots._save = spy
    P._save = spy
    try:
        plots.plot_curves(_bands(groups, label_len), "val/acc", tmp_path / "val.png",
                                      matched_steps=[50], **kw)
        # the first figure: one panel per arm against the first group, and with no baseline
        bands = _bands(groups, label_len)
        first = next(iter(bands))
        markers = {g: [(30, 0.5, "−3.1 SE")] for g in bands}
        noise = {g: (b.steps, np.full(b.steps.size, 0.02)) for g, b in bands.items()}
        P.plot_arms(bands, "val/acc", tmp_path / "arms.png", colors=colors, baseline=first,
                                     verdicts={g: "not resolved" for g in bands}, markers=markers,
                                     matched_steps=[50], noise=noise, verdict_of="final val/acc")
        P.plot_arms(bands, "val/acc", tmp_path / "arms_all.png", colors=colors,
                                     markers=markers, matched_steps=[50])
        P.plot_overoptimisation(_bands(groups, label_len), _bands(groups, label_len, scale=3.0),
                                                "train/reward", "val/acc", tmp_path / "over.png", **kw)
        plots.plot_kl({m: _bands(groups, label_len) for m in ("kl/reverse_k3", "kl/forward_k3",
                                                                           "kl/exact_reverse")[:min(panels, 3)]},
                                  tmp_path / "kl.png", **kw)
        plots.plot_curve_grid(grid, tmp_path / "grid.png", **kw)
    finally:
        plots._save = real_save
        P._save = real_save
    assert set(seen) == {"val.png", "over.png", "kl.png", "grid.png", "arms.png", "arms_all.png"}
    for name, (outside, overlaps) in seen.items():
        assert not outside and not overlaps, (name, outside, overlaps)
    assert Image.open(tmp_path / "val.png").size[0] > 0


@pytest.mark.parametrize(("xs", "hues"), [(2, 2), (4, 5), (3, 0), (2, 12)])
def test_ablation_figure_stays_on_the_canvas(tmp_path, xs, hues):
    # side by side (≤ 8 bars) or stacked panels, with the hue legend under them (up to 12 hues
    # in 3 columns, long names) or without one: everything inside the canvas, nothing overlapping
    scores = ("test_acc", "auc")
    rows, per_run = [], {}
    for x in range(xs):
        for h in range(max(hues, 1)):
            group = f"alpha={x}, ref_reset_steps={h}" + ("0" * 30 if hues > 10 else "")
            row = {"group": group, "alpha": x * 0.1, "ref_reset_steps": group.split("=")[-1]}
            for sc in scores:
                row |= {f"{sc}_mean": 0.5 + 0.01 * h, f"{sc}_ci_low": 0.4, f"{sc}_ci_high": 0.7}
            rows.append(row)
            per_run[group] = {sc: np.array([0.45, 0.5, 0.62]) for sc in scores}
    seen = []
    real_save = plots._save

    def spy(fig, path):  # measured as saved: _save lays the figure out
        saved = real_save(fig, path)
        seen.append(_text_boxes_fit(fig))
        return saved

    plots._save = spy
    try:
        plots.plot_ablation(rows, per_run, scores, {"test_acc": "test/acc @ val-best step"}, "alpha",
                                        ["ref_reset_steps"] if hues else [], tmp_path / "ablation.png",
                                        colors=plots.group_colors([r["group"] for r in rows]))
    finally:
        plots._save = real_save
    (outside, overlaps), = seen
    assert not outside and not overlaps, (outside, overlaps)


def test_group_palette_is_matplotlibs():
    import matplotlib

    for n, name in ((3, "tab10"), (10, "tab10"), (11, "tab20"), (20, "tab20")):
        cmap = matplotlib.colormaps[name]
        labels = [f"g{i}" for i in range(n)]
        assert plots.group_colors(labels) == {g: tuple(cmap(i)) for i, g in enumerate(labels)}


def test_onset_labels_give_way_to_the_runs_table_when_they_would_overlap(tmp_path, monkeypatch):
    sweep = _sweep(tmp_path / "sw")                       # alpha=0.5's two seeds collapse: 2 onsets
    recipe = Recipe(runs=[str(sweep)], group_by=["alpha"])
    R.build_report(recipe, tmp_path / "few", cache=False)
    assert "labelled with how many SEs" in (tmp_path / "few" / "index.html").read_text()
    monkeypatch.setattr(R, "MAX_ONSET_LABELS", 1)
    R.build_report(recipe, tmp_path / "many", cache=False)
    page = (tmp_path / "many" / "index.html").read_text()
    assert "unlabelled at 2 onsets" in page and "collapse_z in the Runs table" in page
    assert "labelled with how many SEs" not in page


def test_band_gaps_stay_empty_and_bands_are_inside_the_axis_limits():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = np.arange(0, 21.0)
    low, high = np.full(21, 1.0), np.full(21, 3.0)
    low[8:13] = np.nan                                  # no CI at steps 8–12 (one seed there)
    fig = Figure(figsize=(4, 3), dpi=50)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    plots._band(ax, CurveBand(steps, np.full(21, 2.0), low, high, np.full(21, 3)), (1.0, 0.0, 0.0, 1.0), "g")
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    assert lo < 1.0 and hi > 3.0                    # the band, not only the line, set the limits
    image = np.asarray(fig.canvas.buffer_rgba())
    h = image.shape[0]

    def pixel(x, y):
        px, py = ax.transData.transform((x, y))
        return image[int(h - py), int(px)]

    assert tuple(pixel(10, 1.5)[:3]) == (255, 255, 255)   # the gap: not filled
    shaded = pixel(4, 1.5)[:3]                             # a run: red at alpha 0.18 on white
    assert shaded[0] == 255 and 200 < shaded[1] < 230 and shaded[1] == shaded[2]

