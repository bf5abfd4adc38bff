"""What the report's first screen is made of, without a browser (tests/test_report_screen.py looks
at it in Chromium): the groups' names, y limits that one wide CI cannot stretch, KL panels titled
by the direction of the data they plot, step intervals inside the steps that exist, the one
sentence that answers, and the page's order."""

from __future__ import annotations

import html
import math
import re

import numpy as np
import pandas as pd
import pytest

from armorlab.analysis import groups as G
from armorlab.analysis import plots
from armorlab.analysis import report as R
from armorlab.analysis import verdict_table as VT
from armorlab.analysis.recipe import Compare, Recipe, Select
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir
from armorlab.stats import verdicts as V
from armorlab.stats.seeds import CurveBand


def _groups(rows, keys):
    runs = pd.DataFrame([{"run_id": f"r{i}", **r} for i, r in enumerate(rows)])
    return G.make_groups(runs, keys)


def test_display_names_show_every_group_key_defaults_included():
    demo = [{"objective": "dapo", "beta": 0.0, "anchor_gate": False},
            {"objective": "dapo", "beta": 0.1, "anchor_gate": False},
            {"objective": "armor", "beta": 0.0, "anchor_gate": True, "alpha": 0.7, "ref_reset_steps": 0},
            {"objective": "armor", "beta": 0.0, "anchor_gate": True, "alpha": 0.9, "ref_reset_steps": 2}]
    keys = ["objective", "beta", "anchor_gate", "alpha", "ref_reset_steps"]
    names = G.display_names(_groups(demo, keys))
    # the objective bare, every other key in brackets, a default (beta=0, ref_reset_steps=0) too; a
    # null (alpha outside ARMOR: inert) is no value of the group and stays out
    assert sorted(names.values()) == ["armor (beta=0, anchor_gate=True, alpha=0.7, ref_reset_steps=0)",
                                      "armor (beta=0, anchor_gate=True, alpha=0.9, ref_reset_steps=2)",
                                      "dapo (beta=0, anchor_gate=False)", "dapo (beta=0.1, anchor_gate=False)"]
    # no objective: k=v only; an import's run_group (its folder, or a runs.yaml group) stands bare
    sweep = [{"alpha": a, "ref_reset_steps": t} for a in (0.5, 0.9) for t in (0, 50)]
    assert sorted(G.display_names(_groups(sweep, ["alpha", "ref_reset_steps"])).values()) == [
        "alpha=0.5, ref_reset_steps=0", "alpha=0.5, ref_reset_steps=50", "alpha=0.9, ref_reset_steps=0",
        "alpha=0.9, ref_reset_steps=50"]
    folders = [{"run_group": "collapse"}, {"run_group": "flat"}]
    assert G.display_names(_groups(folders, ["run_group"])) == {"run_group=collapse": "collapse",
                                                                "run_group=flat": "flat"}


def test_rename_replaces_the_longest_label_first():
    names = {"objective=dapo": "dapo", "objective=dapo, beta=0.1": "dapo (beta=0.1)"}
    assert G.rename("low-powered: objective=dapo, beta=0.1; objective=dapo", names) == \
        "low-powered: dapo (beta=0.1); dapo"


def _band(mean, low=None, high=None):
    mean = np.asarray(mean, dtype=float)
    steps = np.arange(mean.size, dtype=float)
    return CurveBand(steps, mean, mean - 0.01 if low is None else np.asarray(low, float),
                     mean + 0.01 if high is None else np.asarray(high, float), np.full(mean.size, 3))


def test_one_wide_ci_does_not_stretch_the_y_axis():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    calm = _band(np.linspace(0.0, 1.0, 11))
    low, high = np.full(11, 0.4), np.full(11, 0.6)
    low[5], high[5] = -40.0, 60.0                     # one spike of one seed: a Student-t CI of ±50
    spiky = _band(np.full(11, 0.5), low, high)
    # the means span [0, 1]; the axis holds the bands' edges but for the 5% quantiles at each end: of
    # the 22 lows (−40, −0.01, 0.09, …) the 5% quantile lies 1.05 places up, −0.01 + 0.05·0.1 = −0.005;
    # of the 22 highs (…, 0.91, 1.01, 60) the 95% one 19.95 places up, 0.91 + 0.95·0.1 = 1.005; the
    # spike is cut (never further than one span out), then 5% padding
    assert plots.robust_ylim(ax, [calm, spiky])
    assert ax.get_ylim() == pytest.approx((-0.005 - 0.0505, 1.005 + 0.0505))
    # CIs inside that reach: the axis holds them whole (not cut)
    assert not plots.robust_ylim(ax, [calm, _band(np.full(11, 0.5), np.full(11, -0.2), np.full(11, 1.1))])
    assert ax.get_ylim() == pytest.approx((-0.2 - 0.065, 1.1 + 0.065))


def test_kl_panels_are_titled_by_the_direction_of_what_they_plot(tmp_path):
    assert plots.kl_direction("kl/reverse_k3") == ("reverse KL(π_θ‖π_ref)", "k3 estimate on samples of π_θ")
    assert plots.kl_direction("kl/exact_forward") == ("forward KL(π_ref‖π_θ)",
                                                      "exact, on unconditioned samples of π_ref")
    assert plots.kl_direction("anchor/kl_k1")[0] == "anchor KL (neither direction)"
    assert plots.kl_direction("kl/something") == ("", "")
    panels = {"kl/reverse_k3": {"g": _band(np.full(5, 1.0))}, "kl/forward_k3": {"g": _band(np.full(5, 5.0))},
              "kl/exact_reverse": {"g": _band(np.full(5, 2.0))}, "kl/exact_forward": {"g": _band(np.full(5, 7.0))}}
    seen = {}
    real = plots._save

    def spy(fig, path):
        for ax in fig.axes:
            if ax.axison:
                seen[ax.get_title()] = float(np.mean(ax.lines[0].get_ydata()))
        return real(fig, path)

    plots._save = spy
    try:
        plots.plot_kl(panels, tmp_path / "kl.png", legend_title="g", colors={"g": (0, 0, 1, 1)})
    finally:
        plots._save = real
    # each panel's title names its metric's direction, and the panel plots that metric's data
    assert seen == {"reverse KL(π_θ‖π_ref)\nkl/reverse_k3: k3 estimate on samples of π_θ": 1.0,
                    "forward KL(π_ref‖π_θ)\nkl/forward_k3: k3 estimate on unconditioned samples of π_ref": 5.0,
                    "reverse KL(π_θ‖π_ref)\nkl/exact_reverse: exact, on samples of π_θ": 2.0,
                    "forward KL(π_ref‖π_θ)\nkl/exact_forward: exact, on unconditioned samples of π_ref": 7.0}
    caption = R._kl_caption({"kl/reverse_k3": 0, "kl/exact_reverse": 0}, ["kl/reverse_k3", "kl/forward_k3"])
    assert caption.startswith("reverse KL(π_θ‖π_ref) (kl/reverse_k3, kl/exact_reverse) over steps")
    assert "no forward KL: these runs log none" in caption


def test_a_step_interval_stays_inside_the_steps_that_exist():
    per_run = pd.DataFrame({"run_id": ["a", "b", "c"], "group": ["g"] * 3, "peak_step": [0.0, 0.0, 45.0],
                            "peak": [0.5, 0.6, 0.7]})
    groups = _groups([{"objective": "dapo"}] * 3, ["objective"])
    groups.table["group"] = ["g"]
    # mean 15, sd 15·√3 = 25.98; Student-t at 2 df: 15 ± 4.302653·25.98/√3 = 15 ± 64.54 → [−49.5, 79.5]
    half = 4.302653 * 15 * math.sqrt(3) / math.sqrt(3)
    free = G.group_summary(per_run, groups, ["peak_step", "peak"]).iloc[0]
    assert free["peak_step_ci_low"] == pytest.approx(15 - half, rel=1e-5)
    clipped = G.group_summary(per_run, groups, ["peak_step", "peak"], step_range=(0.0, 50.0)).iloc[0]
    assert clipped["peak_step_ci_low"] == 0.0 and clipped["peak_step_ci_high"] == 50.0
    assert clipped["peak_ci_low"] == free["peak_ci_low"]        # not a step: untouched


def test_the_page_opens_with_the_answer_the_verdicts_and_their_figure(three_arms, tmp_path):
    recipe = Recipe(runs=[str(three_arms)], title="t", select=Select("val/acc", "max", "test/acc"),
                    compare=Compare(baseline={"objective": "dapo"}, endpoints=["final"]))
    res = R.build_report(recipe, tmp_path / "r", cache=False)
    page = res.index.read_text()
    order = ['id="answer"', 'id="verdict-table"', 'id="first-figure"', "<h2>Verdicts on every endpoint</h2>",
             "<h2>Warnings</h2>", "<h2>Results per group</h2>"]
    assert [page.index(x) for x in order] == sorted(page.index(x) for x in order)
    # final levels: dapo 0.2, armor and up 0.5 + k/30 → both +0.333 better (Holm over 2 arms)
    answer = re.search(r'id="answer"><b>(.*?)</b>', page).group(1)
    assert answer == "Against dapo on final level of val/acc (3 seeds per arm): armor and up are better."
    assert 'data-file="plots/val.png"' in page and (tmp_path / "r" / "plots" / "val.png").is_file()
    # the groups' names everywhere on the page, their labels only in the CSV files
    assert "objective=" not in page.split("<h2>Configs that differ")[0]
    assert set(pd.read_csv(tmp_path / "r" / "tables" / "groups.csv")["group"]) == {
        "objective=armor", "objective=dapo", "objective=up"}


def _table(page: str, table_id: str) -> pd.DataFrame:
    """The cells of the table with this id (the page's tables are plain rows of th/td cells)."""
    body = re.search(rf'<table id="{table_id}".*?</table>', page, re.S).group(0)
    rows = [[html.unescape(c.strip()) for c in re.findall(r"<t[hd]>(.*?)</t[hd]>", r, re.S)]
            for r in re.findall(r"<tr.*?</tr>", body, re.S)]
    return pd.DataFrame(rows[1:], columns=rows[0])


def test_every_pair_compared_reads_as_a_table_of_rows_against_columns(three_arms, tmp_path):
    arm, dapo, up = ({"objective": o} for o in ("armor", "dapo", "up"))
    recipe = Recipe(runs=[str(three_arms)], title="t", select=Select("val/acc", "max", "test/acc"),
                    compare=Compare(pairs=[(arm, dapo), (up, dapo), (arm, up)], endpoints=["final"]))
    res = R.build_report(recipe, tmp_path / "r", cache=False)
    page = res.index.read_text()
    answer = re.search(r'id="answer"><b>(.*?)</b>', page).group(1)
    # armor and up end alike, dapo below both: dapo is worse than each; armor vs up stays open
    assert answer.startswith("On final level of val/acc (3 seeds per arm): dapo is worse than each of the 2 others; "
                             "2 of 3 pairs are resolved")
    table = _table(page, "verdict-table").set_index("final level of val/acc: row vs column")
    assert table.loc["armor", "dapo"] == "better +0.333" and table.loc["dapo", "armor"] == "worse −0.333"
    assert table.loc["armor", "armor"] == "·" and table.loc["up", "armor"].startswith("not resolved +0.000")


def test_the_kl_figure_shows_forward_kl_the_recipe_does_not_list_as_a_curve(tmp_path):
    from armorlab.commands.demo import demo_recipe

    dirs = []
    for objective, gate in (("dapo", False), ("armor", True)):
        for seed in (0, 1):
            rd = RunDir.create(tmp_path / "sw", resolve({"objective": objective, "seed": seed, "max_steps": 20,
                                                         "task": {"name": "arithmetic", "val_size": 400}}))
            for s in range(21):
                row = {"kl/reverse_k3": 0.1 * s, "train/reward": s / 20}
                if gate:
                    row["kl/forward_k3"] = 0.2 * s
                if s % 5 == 0:
                    row.update({"val/acc": 0.5, "val/n": 400.0, "test/acc": 0.5})
                rd.append_metrics(s, row, rollout=s)  # the demo's recipe counts in rollouts
            rd.write_status("completed")
            dirs.append(rd.path)
    recipe = demo_recipe(dirs)
    assert "kl/forward_k3" not in recipe.curves
    res = R.build_report(recipe, tmp_path / "r", cache=False)
    caption = re.search(r'data-file="plots/kl.png" alt="([^"]*)"', res.index.read_text()).group(1)
    assert caption.startswith("reverse KL(π_θ‖π_ref) (kl/reverse_k3) and forward KL(π_ref‖π_θ) (kl/forward_k3)")


def _verdicts(words: list[str], seeds_needed: int | None = None) -> VT.VerdictTable:
    vs = [V.Verdict(f"arm{i}", "base", "final", 3, 3, 0.5, 0.5, 0.0, -0.1, 0.1, 0.05, 0.5, w, False, 0.05,
                    0.1, seeds_needed, True) for i, w in enumerate(words)]
    names = {f"arm{i}": f"arm {i}" for i in range(len(words))} | {"base": "dapo"}
    return VT.VerdictTable(vs, {}, [], pd.DataFrame(), pd.DataFrame(), labels={"final": "final val/acc"},
                           names=names, primary="final")


def test_the_answer_names_a_few_arms_and_counts_many():
    head = "Against dapo on final val/acc (3 seeds per arm): "
    assert VT.answer(_verdicts(["better", "worse", "not resolved"])) == \
        head + "arm 0 is better; arm 1 is worse; arm 2 is not resolved."
    assert VT.answer(_verdicts(["better"] + ["not resolved"] * 5)) == \
        head + "arm 0 is better; the other 5 arms are not resolved."
    assert VT.answer(_verdicts(["not resolved"] * 6)) == head + "none of the 6 arms is resolved."
    assert VT.answer(_verdicts(["equivalent", "equivalent"])) == head + "arm 0 and arm 1 are equivalent within ±δ."
    # with a plan for every open comparison: what resolving them costs (each arm to 5 seeds, the
    # shared baseline too: 2 + 2 + 2 runs; no run times known, so no hours)
    assert VT.answer(_verdicts(["not resolved"] * 2, seeds_needed=5)) == \
        head + "arm 0 and arm 1 are not resolved: 6 more runs would resolve them at 80% power."
