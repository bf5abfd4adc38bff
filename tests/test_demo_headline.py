"""The demo's headline: drop in standard errors, per-group rows, plain verdicts, the demo's report."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from armorlab.analysis import headline as H
from armorlab.commands.demo import BASELINE, demo_name, demo_recipe, headline_section
from armorlab.config import load_yaml_mapping, resolve
from armorlab.runs import RunDir


def test_drop_in_se_by_hand():
    # peak 0.8, final 0.6, n = 400: var = (0.16 + 0.24)/400 = 0.001 → SE 0.0316228; 0.2 / 0.0316228 = 6.3246
    assert H.drop_in_se(0.8, 0.6, 400) == pytest.approx(0.2 / math.sqrt(0.001))
    assert H.drop_in_se(0.5, 0.5, 100) == 0.0
    assert math.isnan(H.drop_in_se(1.0, 1.0, 100))      # no variance: undefined, not infinite
    assert math.isnan(H.drop_in_se(0.8, 0.6, 0))


def _runs():
    # two groups × two seeds; per run: start, peak, final, collapse step
    rows = [("dapo", 0, 0.75, 0.80, 0.60, 30), ("dapo", 1, 0.75, 0.82, 0.62, 40),
            ("armor", 0, 0.75, 0.80, 0.70, None), ("armor", 1, 0.75, 0.78, 0.58, 50)]
    return pd.DataFrame([{"run_id": f"{g}{s}", "group": g, "seed": s, "start": st, "peak": p, "peak_step": 10,
                          "final": f, "drop": p - f, "drop_se": H.drop_in_se(p, f, 400), "collapse_step": c,
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
    assert lines[0].startswith("DAPO: held-out accuracy rose from 0.750 at step 0 to a peak of 0.810")
    assert "ended at 0.610" in lines[0] and "0.60 → 0.90" in lines[0] and "2/2 seeds" in lines[0]
    assert "no consistent difference from DAPO" in lines[1]
    assert "2 seed(s) per group" in lines[-1]
    better = _runs()
    better.loc[better["group"] == "armor", "final"] = [0.70, 0.65]
    t = H.group_rows(better, ["dapo", "armor"], "dapo")
    assert "ended above DAPO in every seed pair" in H.verdict(t, "dapo", {"dapo": "DAPO"})[1]


def test_demo_names_and_baseline_match_the_shipped_spec():
    from importlib import resources

    spec = load_yaml_mapping(resources.files("armorlab").joinpath("demo.yaml"))
    cfgs = [resolve({**spec["base"], **point}) for point in spec["include"]]
    assert [demo_name(c) for c in cfgs] == ["dapo", "dapo + KL β=0.1", "up", "armor", "gate only (dapo)"]
    assert [all(c[k] == v for k, v in BASELINE.items()) for c in cfgs] == [True, False, False, False, False]
    assert len(spec["seeds"]) >= 2


def _write(root, cfg, val, reward, *, n_steps=40):
    rd = RunDir.create(root, resolve(cfg))
    rd.write_status("completed")
    for step in range(0, n_steps + 1):
        row = {"train/reward": reward(step)} if step else {}
        if step % 10 == 0:
            row.update({"val/acc": val(step), "test/acc": val(step)})
        rd.append_metrics(step, row)
    return rd.path


def test_demo_report_leads_with_the_headline(tmp_path):
    base = {"max_steps": 40, "task": {"name": "arithmetic", "val_size": 400}, "val_samples": 1}
    collapse = {0: 0.75, 10: 0.80, 20: 0.70, 30: 0.60, 40: 0.55}
    steady = {0: 0.75, 10: 0.78, 20: 0.78, 30: 0.77, 40: 0.77}
    dirs = []
    for seed in (0, 1):
        dirs.append(_write(tmp_path, {**base, "objective": "dapo", "seed": seed}, collapse.get,
                           lambda s: 0.6 + s / 200))
        dirs.append(_write(tmp_path, {**base, "objective": "armor", "seed": seed}, steady.get, lambda s: 0.6))
    from armorlab.analysis.report import build_report

    state = {}
    result = build_report(demo_recipe(dirs), tmp_path / "report", cache=False, lead=headline_section(state))
    html = result.index.read_text()
    assert html.index("Headline: does validation collapse") < html.index("Results per group")
    table = state["table"].set_index("group")
    # dapo: peak 0.80 at step 10, final 0.55, n = 400 → (0.25) / sqrt((0.16 + 0.2475)/400) = 7.83 SEs
    assert table.loc["dapo", "drop (SEs)"] == "0.250 (7.8)"
    assert table.loc["armor", "P(final > dapo)"] == "1.00"
    assert state["sentences"][0].startswith("dapo: held-out accuracy rose from 0.750")
    assert (tmp_path / "report" / "tables" / "demo_headline.md").is_file()
