"""A report figure's PNG (plots._save: one draw of the canvas, encoded by matplotlib's own writer)
has exactly savefig's pixels and its Software entry."""

import io

import numpy as np
from PIL import Image

from armorlab.analysis import plots


def test_a_saved_figure_has_savefigs_pixels(tmp_path):
    fig, ax = plots.plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [0, 1, 0.5], label="a line")
    ax.fill_between([0, 1, 2], [0, 0.2, 0.1], [0.3, 0.5, 0.4], alpha=0.3)
    ax.set_title("title")
    ax.set_xlabel("step")
    ax.legend()
    plots._save(fig, tmp_path / "f.png")
    ref = io.BytesIO()
    fig.savefig(ref, format="png", dpi=plots.DPI)
    ours = Image.open(tmp_path / "f.png")
    assert np.array_equal(np.asarray(ours), np.asarray(Image.open(ref)))
    assert ours.info["Software"].startswith("Matplotlib version")
    assert ours.info["dpi"] == Image.open(ref).info["dpi"]
