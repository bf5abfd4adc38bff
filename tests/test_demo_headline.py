"""The demo's headline: per-group rows, plain verdicts, the demo's report with its headline first."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from armorlab.analysis import headline as H
from armorlab.commands.demo import BASELINE, demo_name, demo_recipe, group_names, headline_section
from armorlab.core.config import load_yaml_mapping, resolve
from armorlab.core.runs import RunDir


def _runs():
    # two groups × two seeds; per run: start, peak, final, collapse step
    rows = [("dapo", 0, 0.75, 0.80, 0.60, 30), ("dapo", 1, 0.75, 0.82, 0.62, 40),
            ("armor", 0, 0.75, 0.80, 0.70, None), ("armor", 1, 0.75, 0.78, 0.58, 50)]
    return pd.DataFrame([{"run_id": f"{g}{s}", "group": g, "seed": s, "start": st, "peak": p, "peak_step": 10,
                          "final": f, "drop": p - f, "drop_se": (p - f) / 0.03, "collapse_step": c,
                          "train_start": 0.6, "train_end": 0.9} for g, s, st, p, f, c in rows])


def test_group_rows_means_collapses_and_probability_of_improvement():
    t = H.group_rows(_runs(), ["dapo", "armor"], "dapo").set_index("group")
    assert t.loc["dapo", "final"] == pytest.approx(0.61)
    assert t.loc["armor", "peak"] == pytest.approx(0.79)
    assert t.loc["armor", "collapsed"] == "1/2" and t.loc["armor", "collapse_step"] == 50
    assert t.loc["dapo", "collapsed"] == "2/2" and t.loc["dapo", "collapse_step"] == 35
    # armor finals 0.70, 0.58 vs dapo 0.60, 0.62: pairs won 0.70>0.60, 0.70>0.62 → 2 of 4
    assert t.loc["armor", "poi_final"] == pytest.approx(0.5)
    assert math.isnan(t.loc["dapo", "poi_final"])


def test_verdict_states_rise_fall_and_comparison_plainly():
    t = H.group_rows(_runs(), ["dapo", "armor"], "dapo")
    lines = H.verdict(t, "dapo", {"dapo": "DAPO", "armor": "ARMOR"})
    assert lines[0].startswith("DAPO: held-out accuracy rose from 0.750 at step 0 to a peak level of 0.810")
    assert "ended at a final level of 0.610" in lines[0] and "0.60 → 0.90" in lines[0] and "2/2 seeds" in lines[0]
    assert "no consistent ordering against DAPO (Mann–Whitney p = 1.00)" in lines[1]
    assert "2 seed(s) per group" in lines[-1]
    better = _runs()
    better.loc[better["group"] == "armor", "final"] = [0.70, 0.65]
    t = H.group_rows(better, ["dapo", "armor"], "dapo")
    # 2 vs 2 seeds: the smallest exact two-sided Mann–Whitney p is 2/C(4, 2) = 1/3, never significant
    line = H.verdict(t, "dapo", {"dapo": "DAPO"})[1]
    assert "ended above DAPO in every seed pair, which a rank test cannot resolve with 2 vs 2 seeds" in line
    assert "p = 0.33" in line
    # 5 vs 5 seeds fully separated: exact p = 2/C(10, 5) = 0.0079 → stated as a difference
    five = pd.concat([_runs()] * 3, ignore_index=True).iloc[:10].copy()
    five["group"] = ["dapo"] * 5 + ["armor"] * 5
    five["final"] = [0.60, 0.61, 0.62, 0.63, 0.64, 0.70, 0.71, 0.72, 0.73, 0.74]
    line = H.verdict(H.group_rows(five, ["dapo", "armor"], "dapo"), "dapo")[1]
    assert "ended above dapo (Mann–Whitney p = 0.008)" in line


def test_a_continued_arm_that_only_fell_says_so_from_its_start():
    # the demo: a start of 0.715, a peak level 0.684 below it, a final level 0.652
    runs = pd.DataFrame([{"run_id": "d0", "group": "dapo", "seed": 0, "start": 0.715, "peak": 0.684,
                          "peak_step": 2, "final": 0.652, "drop": 0.032, "drop_se": 1.5, "collapse_step": 6,
                          "best": 0.715, "last": 0.64, "drop_start": 0.715 - 0.652, "train_start": 0.5,
                          "train_end": 0.7}])
    line = H.verdict(H.group_rows(runs, ["dapo"], "dapo"), "dapo", unit="rollout")[0]
    assert "did not rise above its start (0.715 at rollout 0; peak level 0.684; best single eval 0.715)" in line
    assert "final level of 0.652 (last eval 0.640): 0.063 below its start, a drop of 0.032 from its peak level" in line


def test_a_baseline_that_did_not_fall_cannot_show_prevention():
    t = H.group_rows(_runs(), ["dapo", "armor"], "dapo")
    assert not any("prevention" in line for line in H.verdict(t, "dapo"))   # dapo fell in 2 of 2 seeds
    flat = _runs()
    flat.loc[flat["group"] == "dapo", "collapse_step"] = None   # margins (F1): 0 of 2 is no fall
    lines = H.verdict(H.group_rows(flat, ["dapo", "armor"], "dapo"), "dapo", {"dapo": "DAPO"})
    assert lines[0].endswith("It did not fall beyond its noise (0 of 2 seeds collapsed): no comparison below can "
                             "show prevention.")
    assert lines[1].endswith("; DAPO did not fall here (0 of 2 seeds collapsed): this cannot show prevention.")
    # one of two seeds collapsing is what flat curves give 7.8% of the time (1 − 0.96²): still no fall
    flat.loc[flat["run_id"] == "dapo0", "collapse_step"] = 30
    lines = H.verdict(H.group_rows(flat, ["dapo", "armor"], "dapo"), "dapo")
    assert "(1 of 2 seeds collapsed): this cannot show prevention" in lines[1]


def test_demo_names_and_baseline_match_the_shipped_spec():
    from importlib import resources

    from armorlab.commands.demo import FIRST_STAGE

    spec = load_yaml_mapping(resources.files("armorlab").joinpath("demo.yaml"))
    first, arms = spec["stages"]
    assert first["name"] == FIRST_STAGE and len(first["seeds"]) == 1  # one DAPO run every arm continues from
    assert arms["from"]["stage"] == FIRST_STAGE
    cfgs = [resolve({**spec["base"], **arms["base"], **point}) for point in arms["include"]]
    names = [demo_name(c) for c in cfgs]
    assert names == ["dapo", "armor (π_ref = peak)", "armor (π_ref = warm start)",
                     "dapo + KL β=1 (π_ref = warm start)"]
    assert [all(c[k] == v for k, v in BASELINE.items()) for c in cfgs] == [True, False, False, False]
    assert len(spec["seeds"]) >= 3
    # the over-optimisation setting: few fixed prompts, 2 epochs per rollout, greedy accuracy selects
    assert spec["base"]["task"]["train_size"] == 32 and spec["base"]["num_iterations"] == 2
    assert arms["from"]["select"]["metric"] == spec["base"]["keep_select"]["metric"] == "val/acc_greedy"


def _write(root, cfg, val, reward, *, n_steps=80):
    rd = RunDir.create(root, resolve(cfg))
    rd.write_status("completed")
    for step in range(0, n_steps + 1):
        row = {"train/reward": reward(step)} if step else {}
        if step % 10 == 0:
            row.update({"val/acc_greedy": val(step), "val/n_greedy": 400.0, "test/acc_greedy": val(step)})
        rd.append_metrics(step, row, rollout=step)  # one update per rollout: the demo reads rollouts
    return rd.path


COLLAPSE = [0.75, 0.80, 0.82, 0.80, 0.70, 0.62, 0.58, 0.57, 0.56]   # evals at steps 0, 10, ..., 80
STEADY = [0.75, 0.78, 0.79, 0.79, 0.78, 0.79, 0.78, 0.79, 0.78]


def test_demo_report_leads_with_the_headline(tmp_path):
    base = {"max_steps": 80, "task": {"name": "arithmetic", "val_size": 400}, "val_samples": 1}
    dirs = []
    for seed in (0, 1):
        dirs.append(_write(tmp_path, {**base, "objective": "dapo", "seed": seed}, lambda s: COLLAPSE[s // 10],
                           lambda s: 0.6 + s / 400))
        dirs.append(_write(tmp_path, {**base, "objective": "armor", "seed": seed, "ref_from": "model"},
                           lambda s: STEADY[s // 10],
                           lambda s: 0.6))
    from armorlab.analysis.report import build_report

    state = {}
    result = build_report(demo_recipe(dirs), tmp_path / "report", cache=False, lead=headline_section(state),
                          names=group_names)
    html = result.index.read_text()
    assert html.index("<h2>Verdict</h2>") < html.index("Headline: does DAPO over-optimise") < html.index(
        "Results per group")
    # final levels 0.57 (dapo) and 0.783 (armor) in both seeds: no spread, so the difference is exact
    assert result.verdicts == ["armor (π_ref = warm start) vs dapo: +0.213 [+0.213, +0.213] final level of "
                               "val/acc_greedy — better, resolved with 2 seeds per arm"]
    table = state["table"].set_index("group")
    # dapo's levels (means of 3 evals): peak = (0.80 + 0.82 + 0.80)/3 = 0.8067 around step 20, final =
    # (0.58 + 0.57 + 0.56)/3 = 0.57; the windows share no eval, so with n = 400
    # SE² = Σ p(1−p) over the six evals / (9·400) and the drop is 0.2367 / SE standard errors
    assert table.loc["dapo", "peak level (rollout)"] == "0.807 (20)"
    assert table.loc["dapo", "final level"] == "0.570"
    # beside the levels, the raw evals: best 0.82 (rollout 20), last 0.56; from rollout 0: 0.75 − 0.57
    assert (table.loc["dapo", "best eval"], table.loc["dapo", "last eval"]) == ("0.820", "0.560")
    assert table.loc["dapo", "drop from rollout 0"] == "0.180"
    se = math.sqrt(sum(p * (1 - p) for p in (0.80, 0.82, 0.80, 0.58, 0.57, 0.56)) / (9 * 400))
    dapo = state["runs"][state["runs"]["group"].str.contains("dapo")]
    assert dapo["drop_se"].tolist() == pytest.approx([(0.8066667 - 0.57) / se] * 2, rel=1e-4)
    assert table.loc["dapo", "collapsed (rollout)"].startswith("2/2")
    armor = "armor (π_ref = warm start)"
    assert table.loc[armor, "collapsed (rollout)"].startswith("0/2")
    assert table.loc[armor, "P(final > dapo)"] == "1.00"
    assert state["sentences"][0].startswith("dapo: held-out accuracy rose from 0.750 at rollout 0 to a peak level of "
                                            "0.807 (median rollout 20; best single eval 0.820)")
    assert "ended at a final level of 0.570 (last eval 0.560)" in state["sentences"][0]
    assert "ended above dapo in every seed pair, which a rank test cannot resolve with 2 vs 2 seeds" in state["sentences"][1]
    assert (tmp_path / "report" / "tables" / "demo_headline.md").is_file()


def test_printed_headline_opens_with_the_verdicts(capsys):
    from armorlab.commands.demo import print_headline

    table = pd.DataFrame([{"group": "dapo", "final": "0.670"}])
    print_headline({"table": table, "sentences": ["dapo: held-out accuracy rose"]},
                   ["armor vs dapo: −0.031 [−0.093, +0.031] final level of val/acc — not resolved with 3 seeds per arm"])
    out = capsys.readouterr().out
    assert out.index("verdicts against DAPO") < out.index("armor vs dapo: −0.031") < out.index("headline") \
        < out.index("dapo: held-out accuracy rose")


@pytest.mark.slow
def test_demo_runs_both_stages_and_prints_verdicts_headline_and_mechanisms(tmp_path):
    """`armorlab demo` end to end at one rollout per run: stage 1's single DAPO run, then the 12 arms
    continuing from its selected checkpoint, the report of the arms only, the printed verdicts,
    headline and mechanism table. The model skips its warm start and the held-out splits are tiny:
    this checks the plumbing, not the numbers (docs/results.md has those)."""
    import json
    import os
    import subprocess
    import sys

    from tests.trainer_support import model_cache

    env = {**os.environ, "ARMORLAB_CACHE": model_cache(), "HF_HUB_OFFLINE": "1"}
    sets = ["max_rollouts=1", "val_every=1", "task.val_size=8", "task.test_size=8", "kl_probe_prompts=2",
            "model.warm_start_steps=0"]
    args = [sys.executable, "-m", "armorlab.cli", "demo", "--root", str(tmp_path / "runs"), "--out",
            str(tmp_path / "report"), *[x for s in sets for x in ("--set", s)]]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.index("verdicts against DAPO") < out.index("headline") < out.index("did each mechanism act?")
    assert "stage 1 (DAPO from the warm start, seed 0)" in out
    sweep = tmp_path / "runs" / "demo"
    stages = json.loads((sweep / "sweep.json").read_text())["stages"]
    assert sorted(stages.values()).count("dapo") == 1 and sorted(stages.values()).count("continue") == 12
    parent = next(r for r, s in stages.items() if s == "dapo")
    for run, stage in stages.items():
        assert json.loads((sweep / run / "status.json").read_text())["state"] == "completed"
        if stage == "continue":  # every arm started from the checkpoint stage 1 selected
            init = json.loads((sweep / run / "init.json").read_text())
            assert init["run"] == f"demo/{parent}"
    runs = (tmp_path / "report" / "tables" / "runs.csv").read_text().splitlines()
    assert len(runs) == 1 + 12  # the report holds the arms, not stage 1
    assert (tmp_path / "report" / "tables" / "mechanisms.csv").is_file()
