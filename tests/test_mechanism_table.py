"""The mechanisms table: per group, the mean over seeds of each run's mean over steps; the freed
share skips the steps where the plain clip stopped nothing (logged as NaN)."""

import math

import pytest

from armorlab.analysis import load as L
from armorlab.analysis.groups import make_groups
from armorlab.analysis.mechanism_table import mechanism_table
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir


def _run(root, seed, objective, freed, widened):
    rd = RunDir.create(root, resolve({"objective": objective, "seed": seed}))
    for step, (f, w) in enumerate(zip(freed, widened, strict=True)):
        rd.append_metrics(step, {"obj/freed_frac": f, "obj/widened_frac": w})
    rd.write_status("completed")
    return rd


def test_freed_share_is_averaged_over_the_steps_where_something_was_clipped(tmp_path):
    sweep = tmp_path / "sw"
    _run(sweep, 0, "armor", [0.2, math.nan, 0.4], [0.001, 0.0, 0.003])  # run mean 0.3 (NaN step skipped)
    _run(sweep, 1, "armor", [0.1, 0.1, 0.4], [0.002, 0.002, 0.002])     # run mean 0.2
    _run(sweep, 0, "dapo", [0.0, math.nan, 0.0], [0.0, 0.0, 0.0])
    rs = L.load([sweep], cache=False)
    shown, numbers = mechanism_table(rs, make_groups(rs.runs, ["objective"]))
    by_group = numbers.set_index("group")
    armor = next(g for g in by_group.index if "armor" in g)
    dapo = next(g for g in by_group.index if "dapo" in g)
    assert by_group.loc[armor, "obj/freed_frac"] == pytest.approx(0.25)  # (0.3 + 0.2) / 2
    assert by_group.loc[armor, "obj/widened_frac"] == pytest.approx((0.004 / 3 + 0.002) / 2)  # zeros count
    assert by_group.loc[dapo, "obj/freed_frac"] == 0.0
    assert "freed of clipped" in shown.columns


def test_a_group_key_left_at_its_dropped_null_default_groups_every_run_as_null(tmp_path):
    # no run sets ref_from (resolved configs drop it at null): grouping by it is one null value, not an error
    _run(tmp_path / "sw", 0, "armor", [0.2], [0.001])
    _run(tmp_path / "sw", 0, "dapo", [0.0], [0.0])
    rs = L.load([tmp_path / "sw"], cache=False)
    groups = make_groups(rs.runs, ["objective", "ref_from"])
    assert len(groups.labels) == 2 and "ref_from" not in rs.runs.columns
