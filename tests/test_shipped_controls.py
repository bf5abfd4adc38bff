"""The shipped control sweeps differ in one thing: every arm of a spec that declares ``controls:``
differs from its baseline in its named factor and nowhere else, as written and on the tiny model;
and the sweeps that are controls by design declare them (so none can drop the check silently)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.test_shipped_specs import SPECS, TINY, _id, _stand_ins, plan_or_skip

REPO = Path(__file__).resolve().parents[1]
# sweeps whose every arm is a control of one baseline: they must declare it
MUST_DECLARE = {"paper/armor_controls", "paper/armor_table1", "paper/armor_kl", "paper/armor_mixed_alpha",
                "paper/armor_anchor_ratio", "paper/armor_reset", "paper/armor_reset_qwen3", "paper/up_objectives",
                "paper/up_clip_bounds", "armor_anchor_controls"}


def _declares(path: Path) -> bool:
    raw = yaml.safe_load(path.read_text()) or {}
    return "controls" in raw or any("controls" in st for st in raw.get("stages") or [])


CONTROL_SPECS = [p for p in SPECS if _declares(p)]


def test_the_sweeps_that_are_controls_declare_them():
    declared = {str(p.relative_to(REPO / "sweeps").with_suffix("")) for p in CONTROL_SPECS}
    assert declared >= MUST_DECLARE, MUST_DECLARE - declared


@pytest.mark.parametrize("path", CONTROL_SPECS, ids=_id)
@pytest.mark.parametrize("tiny", [False, True], ids=["as-written", "tiny"])
def test_each_control_arm_differs_from_its_baseline_in_its_factor_only(path, tiny, tmp_path):
    from armorlab.sweeps.spec import load_spec

    overrides = TINY if tiny else _stand_ins(load_spec(path), tmp_path)
    plan = plan_or_skip(path, overrides, tmp_path / "runs")  # plan_sweep refuses a pair that differs more
    pairs = [p for _, stage_pairs in plan.controls for p in stage_pairs]
    assert pairs
    for pair in pairs:
        assert set(pair.counted) <= set(pair.factor), pair.describe()
        assert all(k in pair.differs for k in pair.factor), pair.describe()
        # nothing besides the named factor, counted or not, except keys the factor made inert
        assert all(k in pair.factor or k in pair.follows for k in pair.differs), pair.describe()


def test_a_null_selector_value_selects_the_key_left_at_its_null_default():
    from armorlab.sweeps.controls import matches

    peak = {"objective": "armor", "ref_reset_steps": 0}  # ref_from: null is dropped from resolved configs
    warm = {**peak, "ref_from": "model"}
    assert matches(peak, {"objective": "armor", "ref_from": None})
    assert not matches(warm, {"objective": "armor", "ref_from": None})
    assert not matches(peak, {"objective": "armor", "anchor_filter": "correct"})  # a missing key never equals a value
