"""The report's verdict table: first on the page, in tables/verdicts.*, in what the CLI prints; values
worked out by hand on the known curves of test_analysis_report."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from armorlab.analysis import report as R
from armorlab.analysis.recipe import Compare, Recipe, Select
from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError
from tests.test_analysis_report import armor_val, dapo_val, write_run


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("verdicts") / "sw"
    for k in range(3):
        for objective, val, offset in (("dapo", dapo_val(k), 0.05), ("armor", armor_val(k), 0.1)):
            rd = write_run(root, objective, k, val, offset)
            status = rd.read_status()   # one hour a dapo run, two an armor run; one damaged time
            status.update(started="2026-01-01T00:00:00+00:00",
                          ended=f"2026-01-01T0{1 if objective == 'dapo' else 2}:00:00+00:00")
            if (objective, k) == ("dapo", 2):   # naive against aware: left out of the mean, not an error
                status["ended"] = "2026-01-01T01:00:00"
            (rd.path / "status.json").write_text(json.dumps(status))
    return root


def _recipe(sweep, **compare):
    return Recipe(runs=[str(sweep)], title="verdicts", matched_steps=[20, 50],
                  select=Select("val/acc", "max", "test/acc"),
                  compare=Compare(**{"baseline": {"objective": "dapo"}, **compare}))


@pytest.fixture(scope="module")
def result(sweep, tmp_path_factory):
    return R.build_report(_recipe(sweep), tmp_path_factory.mktemp("out") / "report")


def test_verdicts_open_the_page_and_the_summary(result):
    html = result.index.read_text()
    assert html.index("<h2>Verdict</h2>") < html.index("<h2>Warnings</h2>") < html.index("Results per group")
    # final levels (mean of the last 3 evals): dapo 0.2 in every seed; armor 0.5 + k/30, k = 0, 1, 2.
    # Welch: d = 0.3333, se = s_armor/√3 = (1/30)/√3, ν = 2 (dapo has no spread), t_{2, 0.975} = 4.3027
    half = 4.302653 * (1 / 30) / math.sqrt(3)
    assert 0.3333 - half == pytest.approx(0.2505, abs=1e-4)
    sentence = "armor vs dapo: +0.333 [+0.251, +0.416] final val/acc — better, resolved with 3 seeds per arm"
    assert result.verdicts == [sentence]
    assert R.result_summary(result)["verdicts"] == [sentence]
    assert sentence in html
    md = (result.out_dir / "tables" / "verdicts.md").read_text()
    assert md.startswith(f"- {sentence}.\n")
    # default δ: 2·√(p(1 − p)/1000) at the mean final of the compared runs, (0.6 + 1.6)/6
    p = (0.6 + 1.6) / 6
    assert f"δ = {2 * math.sqrt(p * (1 - p) / 1000):.3f}" in html and "val/n" in html


def test_every_endpoint_is_judged(result):
    rows = pd.read_csv(result.out_dir / "tables" / "verdicts.csv").set_index("endpoint")
    assert list(rows.index) == ["final", "drop", "selected_test"]
    # drop: dapo falls 0.5 + 0.1k − 0.2 from its peak level, armor never falls: smaller is better
    assert rows.loc["drop", "verdict"] == "better" and not rows.loc["drop", "higher_is_better"]
    assert rows.loc["final", "low"] == pytest.approx(0.3333333 - 4.302653 * (1 / 30) / math.sqrt(3), abs=1e-5)
    open_ = rows.loc["selected_test"]
    assert open_["verdict"] == "not resolved" and open_["seeds_needed"] > 3


def test_unresolved_comparisons_cost_runs_and_hours(sweep, tmp_path):
    res = R.build_report(_recipe(sweep, endpoints=["selected_test"], delta=0.2), tmp_path / "r")
    rows = pd.read_csv(tmp_path / "r" / "tables" / "verdicts.csv")
    need = int(rows.loc[0, "seeds_needed"])
    assert need > 3
    more = 2 * (need - 3)
    hours = (need - 3) * 2 + (need - 3) * 1   # armor runs took two hours, dapo runs one
    assert res.verdicts[0].endswith(f"needs {need} seeds per arm ({more} more runs, ≈ {hours:.1f} h of runs)")
    assert "δ = 0.200 (compare.delta)" in res.index.read_text()


def test_a_baseline_named_by_its_group_label(sweep, tmp_path):
    res = R.build_report(_recipe(sweep, baseline="objective=dapo", endpoints=["final"]), tmp_path / "r")
    assert res.verdicts[0].startswith("armor vs dapo: +0.333")
    with pytest.raises(ArmorLabError, match="compare.baseline"):
        R.build_report(_recipe(sweep, baseline="objective=ppo"), tmp_path / "x")
    for bad in ("nonsense", "run_id", "seed"):   # not a column; a column, but not a score
        with pytest.raises(ArmorLabError, match="compare.endpoints"):
            R.build_report(_recipe(sweep, endpoints=["final", bad]), tmp_path / "y")


def test_no_eval_size_means_no_default_delta(tmp_path):
    root = tmp_path / "sw"
    for objective, finals in (("dapo", (0.50, 0.56)), ("armor", (0.52, 0.55))):
        for k, level in enumerate(finals):
            rd = RunDir.create(root, {"objective": objective, "seed": k, "max_steps": 4})
            for s in range(5):   # no val/n logged
                rd.append_metrics(s, {"val/acc": level})
            rd.write_status("completed")
    res = R.build_report(_recipe(root, endpoints=["final"]), tmp_path / "r")
    assert any("no δ" in w and "compare.delta" in w for w in res.warnings)
    assert res.verdicts == ["armor vs dapo: +0.005 [−0.203, +0.213] final val/acc — not "
                            "resolved with 2 seeds per arm (no δ: set compare.delta to plan seeds)"]
