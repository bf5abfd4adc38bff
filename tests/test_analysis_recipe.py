"""Report recipes: defaults, and bad input named by key, value and file."""

import math

import pytest
import yaml

from armorlab.analysis.recipe import Compare, Select, load_recipe, parse_recipe, recipe_for_paths
from armorlab.errors import ArmorLabError


def test_design_example_parses(tmp_path):
    path = tmp_path / "armor.yaml"
    path.write_text("""
runs: [runs/armor_alpha, runs/dapo_baseline]
group_by: [objective, alpha]
curves: [val/acc, train/reward, kl/forward_k3, kl/reverse_k3, cap/pos_mean, train/entropy]
select: {metric: val/acc, mode: max, report: test/acc}
matched_steps: [400, 100, 200]
compare: {pairs: [[{objective: armor}, {objective: dapo}]]}
collapse: {delta: 0.1, patience: 2}
""")
    r = load_recipe(path)
    assert r.title == "armor" and r.path == path
    assert r.group_by == ["objective", "alpha"] and r.matched_steps == [100, 200, 400]
    assert r.select == Select("val/acc", "max", "test/acc")
    assert r.compare == Compare(None, [({"objective": "armor"}, {"objective": "dapo"})])
    assert (r.collapse.delta, r.collapse.patience, r.collapse.alpha) == (0.1, 2, 0.04)


def test_defaults_for_directories():
    r = recipe_for_paths(["runs/a"], group_by=["alpha"])
    assert r.runs == ["runs/a"] and r.group_by == ["alpha"] and r.title == "a"
    assert r.curves is None and r.matched_steps is None and r.select.report == "test/acc"


@pytest.mark.parametrize("raw, key", [
    ({"group_by": ["objective"]}, "runs"),
    ({"runs": ["x"], "colour": "red"}, "colour"),
    ({"runs": []}, "runs"),
    ({"runs": ["x"], "group_by": ["seed"]}, "group_by"),
    ({"runs": ["x"], "select": {"metric": "acc"}}, "select.metric"),
    ({"runs": ["x"], "select": {"mode": "best"}}, "select.mode"),
    ({"runs": ["x"], "select": {"metrc": "val/acc"}}, "select.metrc"),
    ({"runs": ["x"], "matched_steps": [100, -5]}, "matched_steps"),
    ({"runs": ["x"], "matched_steps": [1.5]}, "matched_steps"),
    ({"runs": ["x"], "collapse": {"delta": 0}}, "collapse.delta"),
    ({"runs": ["x"], "collapse": {"patience": 0}}, "collapse.patience"),
    ({"runs": ["x"], "collapse": {"alpha": 1.5}}, "collapse.alpha"),
    ({"runs": ["x"], "collapse": {"train": 3}}, "collapse.train"),
    ({"runs": ["x"], "compare": {"baseline": {"objective": "dapo"}, "pairs": []}}, "compare"),
    ({"runs": ["x"], "compare": {"pairs": [[{"objective": "armor"}]]}}, "compare.pairs[0]"),
    ({"runs": ["x"], "compare": {"baseline": 3}}, "compare.baseline"),
    ({"runs": ["x"], "compare": {"baseline": ""}}, "compare.baseline"),
    ({"runs": ["x"], "compare": {"endpoints": []}}, "compare.endpoints"),
    ({"runs": ["x"], "compare": {"endpoints": ["final", 3]}}, "compare.endpoints"),
    ({"runs": ["x"], "compare": {"delta": 0}}, "compare.delta"),
    ({"runs": ["x"], "compare": {"delta": True}}, "compare.delta"),
    ({"runs": ["x"], "compare": {"delta": "0.03"}}, "compare.delta"),
    ({"runs": ["x"], "compare": {"alpha": 0.1}}, "compare.alpha"),
])
def test_bad_recipes_name_key_value_and_file(raw, key):
    with pytest.raises(ArmorLabError) as exc:
        parse_recipe(raw, file="analysis/x.yaml")
    assert f"'{key}'" in str(exc.value) and "analysis/x.yaml" in str(exc.value)


def test_compare_names_a_baseline_group_its_endpoints_and_delta():
    r = parse_recipe({"runs": ["x"], "compare": {"baseline": "objective=dapo", "endpoints": ["final", "auc", "final"],
                                                 "delta": 0.02}})
    assert r.compare == Compare("objective=dapo", None, ["final", "auc"], 0.02)
    r = parse_recipe({"runs": ["x"], "compare": {"baseline": {"objective": "dapo"}, "endpoints": "drop", "delta": None}})
    assert r.compare == Compare({"objective": "dapo"}, None, ["drop"], None)
    assert parse_recipe({"runs": ["x"]}).compare == Compare()


@pytest.mark.parametrize("bad", [-0.05, 0, float("nan"), "0.05", True])
def test_a_bad_margin_names_key_value_and_file(tmp_path, bad):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"runs": ["x"], "compare": {"baseline": {"objective": "dapo"}, "delta": bad}}))
    with pytest.raises(ArmorLabError) as err:
        load_recipe(path)
    shown = str(err.value)
    assert err.value.key == "compare.delta" and str(path) in shown and "equivalence margin" in shown
    assert (math.isnan(err.value.value) if bad != bad else err.value.value == bad)
