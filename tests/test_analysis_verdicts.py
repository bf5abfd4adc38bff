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
    sentence = "armor vs dapo: +0.333 [+0.251, +0.416] final level of val/acc — better, resolved with 3 seeds per arm"
    assert result.verdicts == [sentence]
    assert R.result_summary(result)["verdicts"] == [sentence]
    assert sentence in html
    md = (result.out_dir / "tables" / "verdicts.md").read_text()
    assert md.startswith(f"- {sentence}.\n")
    # no margin declared: none is made up from the evaluation noise
    assert "no margin declared: no equivalence verdict (set compare.delta or --delta)" in html and "val/n)" not in html


def test_every_endpoint_is_judged(result):
    rows = pd.read_csv(result.out_dir / "tables" / "verdicts.csv").set_index("endpoint")
    assert list(rows.index) == ["final", "drop", "selected_test"]
    # drop: dapo falls 0.5 + 0.1k − 0.2 from its peak level, armor never falls: smaller is better
    assert rows.loc["drop", "verdict"] == "better" and not rows.loc["drop", "higher_is_better"]
    assert rows.loc["final", "low"] == pytest.approx(0.3333333 - 4.302653 * (1 / 30) / math.sqrt(3), abs=1e-5)
    open_ = rows.loc["selected_test"]   # no margin: nothing to plan seeds for
    assert open_["verdict"] == "not resolved" and math.isnan(open_["seeds_needed"])


def test_unresolved_comparisons_cost_runs_and_hours(sweep, tmp_path):
    res = R.build_report(_recipe(sweep, endpoints=["selected_test"], delta=0.2), tmp_path / "r")
    rows = pd.read_csv(tmp_path / "r" / "tables" / "verdicts.csv")
    need = int(rows.loc[0, "seeds_needed"])
    assert need > 3
    more = 2 * (need - 3)
    hours = (need - 3) * 2 + (need - 3) * 1   # armor runs took two hours, dapo runs one
    assert res.verdicts[0].endswith(f"needs {need} seeds per arm ({more} more runs, ≈ {hours:.1f} h of runs)")
    assert "δ = 0.2 (declared: compare.delta)" in res.index.read_text()


def test_a_baseline_named_by_its_group_label(sweep, tmp_path):
    res = R.build_report(_recipe(sweep, baseline="objective=dapo", endpoints=["final"]), tmp_path / "r")
    assert res.verdicts[0].startswith("armor vs dapo: +0.333")
    with pytest.raises(ArmorLabError, match="compare.baseline"):
        R.build_report(_recipe(sweep, baseline="objective=ppo"), tmp_path / "x")
    for bad in ("nonsense", "run_id", "seed"):   # not a column; a column, but not a score
        with pytest.raises(ArmorLabError, match="compare.endpoints"):
            R.build_report(_recipe(sweep, endpoints=["final", bad]), tmp_path / "y")


def _runs(root, curves, *, val_n=1000):
    """Hand-made runs: {objective: [val/acc curve of each seed]}, one eval per step."""
    for objective, seeds in curves.items():
        for k, curve in enumerate(seeds):
            rd = RunDir.create(root, {"objective": objective, "seed": k, "max_steps": len(curve) - 1})
            for s, v in enumerate(curve):
                rd.append_metrics(s, {"val/acc": v, "val/n": val_n})
            rd.write_status("completed")
    return root


def _said(res) -> str:
    """Every verdict the report states: its sentences, the answer, the tables' verdict cells."""
    tdir = res.out_dir / "tables"
    cells = pd.read_csv(tdir / "verdicts.csv")["verdict"].tolist()
    html = res.index.read_text()
    answer = html[html.index('id="answer"'):html.index("</p>", html.index('id="answer"'))]
    return "\n".join([*res.verdicts, answer, (tdir / "verdicts.md").read_text(), *cells])


def test_a_baseline_that_never_falls_cannot_show_prevention(tmp_path):
    # dapo flat at 0.6 (+0.01 per seed), armor identical: nothing fell, nothing to prevent
    flat = [[0.6 + 0.01 * k] * 20 for k in range(3)]
    root = _runs(tmp_path / "sw", {"dapo": flat, "armor": flat})
    for delta in (None, 0.05):
        res = R.build_report(_recipe(root, endpoints=["final", "drop"], delta=delta), tmp_path / f"r{delta}")
        said = _said(res)
        assert "equivalent" not in said
        assert "dapo did not fall here (0 of 3 seeds collapsed): this cannot show prevention" in said
        assert all("cannot show prevention" in v for v in res.verdicts)
        if delta is None:
            assert "armor is not resolved (no margin declared). dapo did not fall here" in said
    # declared δ: the interval d = 0 ± t·se lies inside ±0.05, but says why it proves nothing
    assert res.verdicts[0].startswith("armor vs dapo: +0.000 [−0.023, +0.023] final level of val/acc — within ±0.050 with "
                                      "3 seeds per arm, but dapo did not fall here")
    rows = pd.read_csv(tmp_path / "r0.05" / "tables" / "verdicts.csv")
    assert set(rows["verdict"]) == {"cannot show prevention"}


def test_a_declared_margin_makes_equivalence_possible_and_none_rules_it_out(tmp_path):
    # both arms rise 0.4 → 0.8 in 8 evals, then fall to 0.3 by eval 20 (val/n 1000: a fall of ~30 SE)
    def curve(k):
        return [0.4 + 0.05 * i + 0.01 * k if i <= 8 else 0.8 - 0.5 * (i - 8) / 11 + 0.01 * k for i in range(20)]
    fell = [curve(k) for k in range(3)]
    root = _runs(tmp_path / "sw", {"dapo": fell, "armor": fell})
    res = R.build_report(_recipe(root, endpoints=["final"], delta=0.1), tmp_path / "declared")
    # Welch: d = 0, se = √(2·10⁻⁴/3), ν = 4, t_{4, 0.975} = 2.7764: ±0.0227, inside ±0.1
    assert res.verdicts == ["armor vs dapo: +0.000 [−0.023, +0.023] final level of val/acc — equivalent within ±0.100, "
                            "resolved with 3 seeds per arm"]
    assert "δ = 0.1 (declared: compare.delta)" in res.index.read_text()
    res = R.build_report(_recipe(root, endpoints=["final"]), tmp_path / "none")
    assert "equivalent" not in _said(res)
    assert res.verdicts == ["armor vs dapo: +0.000 [−0.023, +0.023] final level of val/acc — not resolved with 3 seeds per "
                            "arm: no margin declared (compare.delta or --delta) for equivalence or a seed plan"]
    assert any("no margin declared" in w for w in res.warnings)



def test_the_baseline_fall_counts_only_runs_with_a_curve_to_judge():
    import numpy as np

    from armorlab.analysis.verdict_table import fall_record

    per_run = pd.DataFrame({"final": [0.5, math.nan, 0.6], "collapse_step": [None, None, 30]})
    record = fall_record(per_run, np.arange(3), "dapo", 0.04)
    assert (record["collapsed"], record["n"], record["fell"]) == (1, 2, False)   # 1 − 0.96² = 0.078 > 0.05
    assert fall_record(per_run.drop(columns="collapse_step"), np.arange(3), "dapo", 0.04)["fell"] is None
