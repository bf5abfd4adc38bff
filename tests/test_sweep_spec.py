"""Sweep specs: parsing, validation, expansion (size, dedup, order, ids), the shipped grids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from armorlab.core.config import resolve
from armorlab.core.runs import run_id
from armorlab.errors import ArmorLabError
from armorlab.sweeps.spec import expand, load_spec, parse_spec

REPO = Path(__file__).resolve().parents[1]


def test_grid_seeds_include_exclude_and_inert_dedup(tmp_path):
    spec = parse_spec({
        "name": "t",
        "base": {"objective": "armor", "max_steps": 4},
        "grid": {"alpha": [0.9, 0.8, 0.7], "objective": ["armor", "dapo"]},
        "seeds": [0, 1],
        "include": [{"objective": "up"}],
        "exclude": [{"alpha": 0.7}],
    }, path=tmp_path / "t.yaml")
    plans = expand(spec)
    # armor: α ∈ {0.9, 0.8} (0.7 excluded) × 2 seeds = 4; dapo ignores α, so its three α values
    # are one run × 2 seeds = 2 (α=0.7 for dapo resolves to null and is not excluded); up × 2 = 2.
    assert len(plans) == 8
    got = [(p.config["objective"], p.config["alpha"], p.config["seed"]) for p in plans]
    assert got == [("armor", 0.9, 0), ("armor", 0.9, 1), ("dapo", None, 0), ("dapo", None, 1),
                   ("armor", 0.8, 0), ("armor", 0.8, 1), ("up", None, 0), ("up", None, 1)]
    for p in plans:  # each id is the hash of its resolved config
        assert p.run_id == run_id(p.config)
    assert plans[0].point == {"alpha": 0.9, "objective": "armor", "seed": 0}


def test_seeded_ids_equal_hash_of_full_config_even_when_a_value_holds_the_marker():
    # expand serialises each point once and substitutes the seed; the ids must equal runs.run_id
    # of each run's own config, also when a value contains the substitution marker (fallback)
    from armorlab.sweeps.spec import _SeededRunId

    for extra in ({}, {"hub_model_id": "x" + _SeededRunId._MARK}):
        spec = parse_spec({"name": "t", "base": {"objective": "dapo", "max_steps": 2, **extra},
                           "grid": {"learning_rate": [1e-5, 2e-5]}, "seeds": [0, 7, 2**40]})
        plans = expand(spec)
        assert len(plans) == 6 and len({p.run_id for p in plans}) == 6
        assert all(p.run_id == run_id(p.config) for p in plans)
        assert [p.config["seed"] for p in plans] == [0, 7, 2**40] * 2
        plans[0].config["model"]["name"] = "changed"  # each run owns its config: no shared nesting
        assert plans[1].config["model"]["name"] != "changed"


def test_dotted_keys_short_sections_and_base_file(tmp_path):
    (tmp_path / "base.yaml").write_text("objective: dapo\ntask: arithmetic\nmax_steps: 3\n")
    path = tmp_path / "s.yaml"
    path.write_text("name: d\nbase: base.yaml\ngrid: {task.digits: [1, 3], model.hidden_size: [256]}\n")
    plans = expand(load_spec(path))
    assert [p.config["task"]["digits"] for p in plans] == [1, 3]
    assert all(p.config["model"]["hidden_size"] == 256 and p.config["max_steps"] == 3 for p in plans)
    assert all(p.config["task"]["name"] == "arithmetic" for p in plans)


def test_exclude_compares_resolved_values_and_nested_keys(tmp_path):
    spec = parse_spec({"name": "x", "base": {"objective": "armor"},
                       "grid": {"task.digits": [1, 2], "ref_reset_steps": [0, 10]},
                       "exclude": [{"task.digits": 2, "ref_reset_steps": 0}, {"task": "math"}]})
    pts = [(p.config["task"]["digits"], p.config["ref_reset_steps"]) for p in expand(spec)]
    assert pts == [(1, 0), (1, 10), (2, 10)]
    # a boolean is not the integer 1 here, although True == 1 in Python
    spec = parse_spec({"name": "b", "grid": {"anchor": [True, False]}, "exclude": [{"anchor": 1}]})
    assert len(expand(spec)) == 2


@pytest.mark.parametrize("data, key", [
    ({"name": "a", "grdi": {}}, "grdi"),
    ({"name": "a", "grid": {"alpah": [1]}}, "grid.alpah"),
    ({"name": "a", "grid": {"task.digitz": [1]}}, "grid.task.digitz"),
    ({"name": "a", "grid": {"alpha": []}}, "grid.alpha"),
    ({"name": "a", "grid": {"alpha": 0.5}}, "grid.alpha"),
    ({"name": "a", "include": [{"nope": 1}]}, "include.nope"),
    ({"name": "a", "exclude": [{}]}, "exclude[0]"),
    ({"name": "a", "seeds": [0, -1]}, "seeds"),
    ({"name": "a", "seeds": 3}, "seeds"),
    ({"name": "a/../b"}, "name"),
    ({"name": "$(touch x)"}, "name"),
    ({"name": "a", "profile": 3}, "profile"),
    ({"name": "a", "seeds": [1], "grid": {"seed": [1, 2]}}, "grid.seed"),
])
def test_structure_errors_name_key_and_file(data, key, tmp_path):
    with pytest.raises(ArmorLabError) as err:
        parse_spec(data, path=tmp_path / "bad.yaml")
    assert err.value.key == key and "bad.yaml" in str(err.value)


def test_values_are_validated_by_the_training_config(tmp_path):
    path = tmp_path / "v.yaml"
    path.write_text("name: v\nbase: {objective: armor}\ngrid: {alpha: [0.5, 1.5]}\n")
    with pytest.raises(ArmorLabError) as err:
        expand(load_spec(path))
    assert err.value.key == "alpha" and err.value.value == 1.5 and str(path) in str(err.value)
    path.write_text("name: v\ngrid: {learning_rate: [.nan]}\n")
    with pytest.raises(ArmorLabError, match="learning_rate"):
        expand(load_spec(path))
    path.write_text("name: v\nbase: missing.yaml\n")
    with pytest.raises(ArmorLabError) as err:
        load_spec(path)
    assert err.value.key == "base"


def test_search_section_is_kept_raw_and_profile_resolves_upwards(tmp_path):
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "p.yaml").write_text("executor: slurm\n")
    (tmp_path / "sweeps").mkdir()
    path = tmp_path / "sweeps" / "s.yaml"
    path.write_text("name: s\nprofile: slurm/p.yaml\nsearch: {space: {alpha: {type: float}}}\n")
    spec = load_spec(path)
    assert spec.search == {"space": {"alpha": {"type": "float"}}}
    assert spec.profile_path() == tmp_path / "slurm" / "p.yaml"
    assert spec.to_dict()["search"] == spec.search


# --------------------------------------------------------------------------- hypothesis
AXES = {  # axis → values that never resolve to the same config (none is inert under armor)
    "alpha": [0.5, 0.6, 0.7, 0.9],
    "learning_rate": [1e-4, 2e-4, 3e-4],
    "ref_reset_steps": [0, 5, 10],
    "task.digits": [1, 2, 3],
    "epsilon_high": [0.25, 0.3],
}
DEFAULTS = {"alpha": 0.8, "learning_rate": 5e-4, "ref_reset_steps": 50, "task.digits": 2, "epsilon_high": 0.28}


@st.composite
def grid_specs(draw):
    axes = draw(st.lists(st.sampled_from(sorted(AXES)), min_size=1, max_size=3, unique=True))
    grid = {a: draw(st.lists(st.sampled_from(AXES[a]), min_size=1, max_size=3, unique=True)) for a in axes}
    seeds = draw(st.none() | st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True))
    # includes give every axis a value (drawn from the axis or its default) so that the identity of a
    # point is its tuple of axis values, which the test can compute without resolving anything
    include = [{a: draw(st.sampled_from([*AXES[a], DEFAULTS[a]])) for a in axes}
               for _ in range(draw(st.integers(0, 3)))]
    exclude = [{a: draw(st.sampled_from(grid[a]))} for a in draw(st.lists(st.sampled_from(axes), max_size=2))]
    return {"name": "h", "base": {"objective": "armor"}, "grid": grid, "seeds": seeds,
            "include": include, "exclude": exclude}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grid_specs())
def test_expansion_size_formula(data):
    axes = list(data["grid"])
    seeds = data["seeds"] or [None]
    grid_points = [dict(zip(axes, combo, strict=True)) for combo in product(*data["grid"].values())]
    kept = [p for p in grid_points if not any(all(p[k] == v for k, v in ex.items()) for ex in data["exclude"])]
    product_size = 1
    for values in data["grid"].values():
        product_size *= len(values)
    excluded = len(grid_points) - len(kept)
    assert product_size == len(grid_points)
    identities = [tuple(p[a] for a in axes) for p in kept + data["include"]]
    duplicates = len(identities) - len(set(identities))
    expected = (product_size - excluded + len(data["include"]) - duplicates) * len(seeds)
    plans = expand(parse_spec(data))
    assert len(plans) == expected
    for p in plans:  # each config is exactly what the training config's own resolution gives
        raw = {"objective": "armor", "task": {}}
        for key, value in p.point.items():
            if key.startswith("task."):
                raw["task"][key[5:]] = value
            else:
                raw[key] = value
        assert p.config == resolve(raw)
    assert len({p.run_id for p in plans}) == len(plans)
    # stable order: first occurrence of each identity, seeds innermost
    order = list(dict.fromkeys(identities))
    want = [(ident, s) for ident in order for s in seeds]
    got = [(tuple(p.point[a] for a in axes), p.point.get("seed")) for p in plans]
    assert got == want


_IDS_SCRIPT = """
import json, sys
from armorlab.sweeps.spec import expand, parse_spec
specs = json.load(sys.stdin)
print(json.dumps([[p.run_id for p in expand(parse_spec(s))] for s in specs]))
"""


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(grid_specs(), min_size=8, max_size=8))
def test_ids_are_stable_across_processes(specs):
    here = [[p.run_id for p in expand(parse_spec(s))] for s in specs]
    again = [[p.run_id for p in expand(parse_spec(s))] for s in specs]
    assert here == again
    for hash_seed in ("1", "4242"):  # other processes, other dict/set hash orders
        out = subprocess.run([sys.executable, "-c", _IDS_SCRIPT], input=json.dumps(specs), text=True,
                             capture_output=True, check=True, env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert json.loads(out.stdout) == here


KEYS = ["name", "base", "grid", "seeds", "include", "exclude", "profile", "search", "description", "bogus",
        "alpha", "objective", "task", "task.digits", "model", "model.hidden_size", "seed", "max_steps",
        "ref_reset_schedule", "learning_rate", "anchor", "val_every", "num_generations", "output_dir"]
scalars = (st.none() | st.booleans() | st.integers(-10**30, 10**30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8) | st.sampled_from(
               ["armor", "dapo", "up", "tiny", "arithmetic", "math", "2024-01-01", "$(touch /tmp/x)"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=3),
                      max_leaves=12)
fuzz_specs = st.dictionaries(st.sampled_from(KEYS), values, max_size=6) | values


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzz_specs)
def test_fuzzed_specs_only_raise_armorlab_error(data):
    try:
        plans = expand(parse_spec(data, path=Path("fuzz.yaml")))
    except ArmorLabError:
        return
    for p in plans:  # whatever expands is a hashable training config
        assert p.run_id == run_id(p.config)


# --------------------------------------------------------------------------- shipped grids
SHIPPED = sorted((REPO / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_specs_expand(path):
    spec = load_spec(path)
    if spec.search is not None:
        return  # an `armorlab tune` study spec; tests/test_tune* cover those
    plans = expand(spec)
    assert plans and spec.name == path.stem
    assert len({p.run_id for p in plans}) == len(plans)
    if spec.profile:
        assert spec.profile_path().is_file()
    raw = yaml.safe_load(path.read_text())
    assert set(raw) <= {"name", "description", "base", "grid", "seeds", "include", "exclude", "profile", "controls",
                        "stages", "compare"}


@pytest.mark.parametrize("bad", [-0.05, 0, float("nan"), "0.05", True])
def test_a_bad_equivalence_margin_names_key_value_and_file(tmp_path, bad):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "grid": {"objective": ["dapo", "armor"]}, "seeds": [0, 1],
                                    "compare": {"baseline": {"objective": "dapo"}, "delta": bad}}))
    with pytest.raises(ArmorLabError) as err:
        load_spec(path)
    shown = str(err.value)
    assert err.value.key == "compare.delta" and str(path) in shown and "equivalence margin" in shown
    assert (err.value.value != err.value.value) if bad != bad else err.value.value == bad


def test_a_declared_margin_is_kept_and_none_means_no_margin(tmp_path):
    spec = {"name": "s", "grid": {"objective": ["dapo", "armor"]}, "seeds": [0, 1],
            "compare": {"baseline": {"objective": "dapo"}}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert load_spec(path).compare.delta is None   # no margin is made up
    spec["compare"]["delta"] = 0.05
    path.write_text(yaml.safe_dump(spec))
    assert load_spec(path).compare.delta == 0.05
