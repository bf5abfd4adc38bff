"""Reports for papers (issue 40 §3): one baseline by default (a sweep's controls, --baseline, else
the first group, said so), --delta, every group key in every label, imported runs grouped by their
folder, the compact LaTeX table, PDF and SVG beside each PNG, a self-contained page, light bands
and a capacity axis that shows the data."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from armorlab.analysis import groups as G
from armorlab.analysis import load as L
from armorlab.analysis import plots
from armorlab.analysis import report as R
from armorlab.analysis import tables as T
from armorlab.analysis.recipe import Compare, Recipe, parse_selector_flag
from armorlab.errors import ArmorLabError
from armorlab.stats.seeds import CurveBand
from tests import importer_writers as W


def _runs(sweep: Path, objectives=("armor", "dapo", "up")) -> tuple[pd.DataFrame, G.Groups]:
    runs = pd.DataFrame([{"run_id": f"{o}-{a}-{k}", "objective": o, "advantage_estimator": a,
                          "path": str(sweep / f"{o}{a}{k}")}
                         for o in objectives for a in ("group_mean", "quantile") for k in range(2)])
    return runs, G.make_groups(runs, ["objective", "advantage_estimator"])


def _spec(sweep: Path, spec: dict) -> None:
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "spec.yaml").write_text(yaml.safe_dump(spec))


def test_without_compare_the_sweeps_controls_name_the_baseline(tmp_path):
    sweep = tmp_path / "sw"
    runs, groups = _runs(sweep)
    # groups in order: armor, dapo, up (× group_mean, quantile); the spec names dapo/group_mean
    _spec(sweep, {"name": "sw", "controls": [{"baseline": {"objective": "dapo", "advantage_estimator": "group_mean"},
                                               "arms": [{"select": {"objective": "armor"}, "factor": ["objective"]}]}]})
    pairs, how = G.comparison_pairs(runs, groups, Recipe(runs=[str(sweep)]))
    base = "objective=dapo, advantage_estimator=group_mean"
    assert pairs == [(g, base) for g in groups.labels if g != base] and len(pairs) == 5
    assert how == f"every group against {base} (controls[0].baseline in {sweep / 'spec.yaml'})"
    # two control groups (ARMOR Table 1): each arm against its own baseline, nothing else
    _spec(sweep, {"name": "sw", "stages": [{"name": "dapo"}, {"name": "continue", "controls": [
        {"baseline": {"objective": "dapo", "advantage_estimator": a},
         "arms": [{"select": {"objective": "armor", "advantage_estimator": a}, "factor": ["objective"]}]}
        for a in ("group_mean", "quantile")]}]})
    pairs, how = G.comparison_pairs(runs, groups, Recipe(runs=[str(sweep)]))
    assert pairs == [(f"objective=armor, advantage_estimator={a}", f"objective=dapo, advantage_estimator={a}")
                     for a in ("group_mean", "quantile")]
    assert how.startswith("each control's arms against its baseline (stages[1].controls[0].baseline in ")
    # a report of another stage only: that stage declares no controls
    pairs, how = G.comparison_pairs(runs, groups, Recipe(runs=[str(sweep)], stages=["dapo"]))
    assert G.FIRST_GROUP in how and pairs[0] == ("objective=armor, advantage_estimator=quantile",
                                                 "objective=armor, advantage_estimator=group_mean")


def test_the_recipe_or_the_flag_wins_over_the_spec_and_nothing_means_the_first_group(tmp_path):
    sweep = tmp_path / "sw"
    runs, groups = _runs(sweep, ("dapo", "up"))
    _spec(sweep, {"name": "sw", "controls": {"baseline": {"objective": "dapo", "advantage_estimator": "quantile"},
                                             "arms": []}})
    flag = Compare(baseline=parse_selector_flag("objective=up,advantage_estimator=quantile"),
                   baseline_from="--baseline")
    pairs, how = G.comparison_pairs(runs, groups, Recipe(runs=[str(sweep)], compare=flag))
    assert {y for _, y in pairs} == {"objective=up, advantage_estimator=quantile"} and len(pairs) == 3
    assert how.endswith("(--baseline)")
    with pytest.raises(ArmorLabError) as err:   # the error names the flag, not a recipe key
        G.comparison_pairs(runs, groups, Recipe(runs=[str(sweep)], compare=Compare(
            baseline={"objective": "ppo"}, baseline_from="--baseline")))
    assert err.value.key == "--baseline" and "selects no group" in str(err.value)
    (sweep / "spec.yaml").unlink()
    pairs, how = G.comparison_pairs(runs, groups, Recipe(runs=[str(sweep)]))
    # 4 groups: three comparisons against the first, not the six of every pair
    first = "objective=dapo, advantage_estimator=group_mean"
    assert pairs == [(g, first) for g in groups.labels[1:]]
    assert how == (f"every group against {first}, the first group in order: no compare: in the recipe, "
                   "no controls: in the runs' sweep spec, no --baseline")


def test_a_baseline_flag_reads_yaml_scalars_and_refuses_what_is_not_key_value():
    assert parse_selector_flag("objective=dapo, beta=0.1,anchor_gate=true") == {
        "objective": "dapo", "beta": 0.1, "anchor_gate": True}
    for bad in ("objective", "=dapo", "objective=", "objective=dapo,"):
        with pytest.raises(ArmorLabError) as err:
            parse_selector_flag(bad)
        assert err.value.key == "--baseline" and err.value.value == bad


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "armorlab.cli", "report", *args], capture_output=True, text=True,
                          cwd=cwd)


def test_cli_baseline_and_delta(three_arms, tmp_path):
    out = _cli(str(three_arms), "--out", "r", "--baseline", "objective=dapo", "--delta", "0.05", "--no-cache",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # final levels (means of the last 3 evals): dapo 0.2; armor, up (0.4 + 0.5 + 0.6 + k/10)/3 = 0.5 + k/30,
    # whose mean over k = 0, 1, 2 is 0.5333: both +0.333 against dapo, not against each other
    verdicts = [line for line in out.stdout.splitlines() if " vs " in line]
    assert [v.split(":")[0] for v in verdicts] == ["armor vs dapo", "up vs dapo"]
    assert all(": +0.333 [" in v for v in verdicts)
    page = (tmp_path / "r" / "index.html").read_text()
    assert "δ = 0.05 (declared: --delta)" in page and "compared: every group against dapo (--baseline)" in page
    resolved = yaml.safe_load((tmp_path / "r" / "recipe.yaml").read_text())["compare"]
    assert resolved["delta"] == 0.05 and resolved["pairs"] == [["objective=armor", "objective=dapo"],
                                                               ["objective=up", "objective=dapo"]]
    for args, key in ((["--baseline", "objective"], "--baseline"), (["--delta", "-1"], "--delta"),
                      (["--baseline", "objective=ppo"], "--baseline")):
        bad = _cli(str(three_arms), "--out", "r2", *args, cwd=tmp_path)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr and f"'{key}'" in bad.stderr, bad.stderr


def test_imported_runs_are_grouped_and_named_by_their_folder(tmp_path):
    for folder in ("collapse", "flat"):
        for seed in (0, 1):
            W.write_tensorboard(tmp_path / "tb" / folder / f"seed{seed}",
                                [(s, {"eval/reward": 0.5 + 0.01 * seed}) for s in range(0, 40, 5)])
    rs = L.load([tmp_path / "tb"])
    # seed0 twice: both named with their folder (not seed0 beside flat/seed0)
    assert sorted(rs.run_ids) == ["collapse/seed0", "collapse/seed1", "flat/seed0", "flat/seed1"]
    groups = G.make_groups(rs.runs, G.auto_group_by(rs.runs))
    assert groups.members == {"run_group=collapse": ["collapse/seed0", "collapse/seed1"],
                              "run_group=flat": ["flat/seed0", "flat/seed1"]}
    assert sorted(G.display_names(groups).values()) == ["collapse", "flat"]
    # a name no other run has stays bare; a runs.yaml group wins over the folder
    mapping = tmp_path / "runs.yaml"
    mapping.write_text("runs:\n  tb/*/seed0: {group: first}\n")
    rs = L.load([tmp_path / "tb" / "flat"], mapping=mapping)
    assert sorted(rs.run_ids) == ["seed0", "seed1"]
    assert dict(zip(rs.runs["run_id"], rs.runs["run_group"], strict=True)) == {"seed0": "first", "seed1": "flat"}


def test_the_compact_latex_table_has_one_row_per_arm_and_mean_pm_ci_cells():
    summary = pd.DataFrame([
        # Student-t, symmetric: 0.5333 ± 0.0410
        {"group": "objective=armor, ref_reset_steps=0", "n": 3, "auc_mean": 0.53333, "auc_ci_low": 0.49233,
         "auc_ci_high": 0.57433, "final_mean": 0.5, "final_ci_low": 0.45, "final_ci_high": 0.6},
        # one seed: the value alone; no value: --
        {"group": "objective=dapo, ref_reset_steps=0", "n": 1, "auc_mean": 0.2, "auc_ci_low": np.nan,
         "auc_ci_high": np.nan, "final_mean": np.nan, "final_ci_low": np.nan, "final_ci_high": np.nan}])
    names = {"objective=armor, ref_reset_steps=0": "armor (ref_reset_steps=0)",
             "objective=dapo, ref_reset_steps=0": "dapo_1 & co"}
    tex = T.compact_latex(summary, names, ["auc", "final"], "val/acc", "test/acc", "caption")
    body = tex.split("\\midrule\n")[1].split("\n\\bottomrule")[0].splitlines()
    # a clipped interval [0.45, 0.6] around 0.5 is not symmetric: +0.100 / −0.050
    assert body == ["armor (ref\\_reset\\_steps=0) & 3 & $0.533 \\pm 0.041$ & $0.500^{+0.100}_{-0.050}$ \\\\",
                    "dapo\\_1 \\& co & 1 & $0.200$ & -- \\\\"]
    assert "\\begin{tabular}{lrrr}" in tex and tex.count(" & ") == 3 * 3   # arm, n and two scores: 4 columns


def test_a_report_writes_pdf_svg_and_a_page_that_holds_its_figures(three_arms, tmp_path):
    res = R.build_report(Recipe(runs=[str(three_arms)], title="t", compare=Compare(baseline={"objective": "dapo"})),
                         tmp_path / "r", cache=False)
    for png in res.plots:
        assert png.suffix == ".png"
        assert png.with_suffix(".pdf").read_bytes().startswith(b"%PDF-")
        assert b"<svg" in png.with_suffix(".svg").read_bytes()[:1000]
    page = res.index.read_text()
    # every figure embedded: the page read from another folder still shows them, byte for byte
    embedded = dict(re.findall(r'<img (?:id="[^"]*" )?src="data:image/png;base64,([^"]+)" data-file="([^"]+)"',
                               page))
    assert sorted(embedded.values()) == sorted(str(p.relative_to(res.out_dir)) for p in res.plots)
    for data, file in embedded.items():
        assert base64.b64decode(data) == (res.out_dir / file).read_bytes()
    assert 'src="plots/' not in page
    # the compact table names the arms, one column per headline score
    tex = (res.out_dir / "tables" / "headline.tex").read_text()
    rows = tex.split("\\midrule\n")[1].split("\n\\bottomrule")[0].splitlines()
    assert [r.split(" & ")[0] for r in rows] == ["armor", "dapo", "up"]
    assert all(len(r.split(" & ")) == 2 + 3 for r in rows)     # arm, n, selected_test, test@50, auc


def test_light_bands_stay_inside_and_the_capacity_axis_spans_the_data():
    from matplotlib.figure import Figure

    assert plots.BAND_ALPHA <= 0.15
    ax = Figure().subplots()
    steps = np.arange(11.0)
    mean = np.linspace(0.5, 0.6, 11)
    # two seeds: Student-t's t(0.975, 1) = 12.7 makes a CI of ±0.5 everywhere; the axis stops one
    # span of the means (0.1) beyond them: [0.4, 0.7], plus 5% padding
    wide = CurveBand(steps, mean, mean - 0.5, mean + 0.5, np.full(11, 2))
    assert plots.robust_ylim(ax, [wide])
    assert ax.get_ylim() == pytest.approx((0.4 - 0.015, 0.7 + 0.015))
    axes = [Figure().subplots() for _ in range(2)]
    # capacities of 1e-4 … 1e-1 (3 decades) beside an unbounded one: a log axis on the finite range
    lo, hi, scale = plots.capacity_axis(axes, [np.array([1e-4, 1e-3]), np.array([1e-1, np.inf])])
    assert (lo, hi, scale) == (pytest.approx(1e-4 / 1.25), pytest.approx(1e-1 * 1.25), "log")
    assert axes[1].get_xscale() == "log" and axes[1].get_xlim() == pytest.approx((8e-5, 0.125))
    # within two decades: linear on the data's range, 4% of it (0.28 · 0.04 = 0.0112) padded each side
    assert plots.capacity_axis(axes, [np.array([0.02, 0.3])])[:2] == pytest.approx((0.0088, 0.3112))
    assert axes[0].get_xscale() == "linear"
    # a zero (a token the clip stops) beside decades of positive values: symlog from 0
    assert plots.capacity_axis(axes, [np.array([0.0, 1e-4, 0.5])]) == (0.0, pytest.approx(0.625), "symlog")
