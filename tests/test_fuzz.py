"""Fuzzing as tests (issue 13 §4): generated configs, specs, profiles, recipes and damaged run dirs
must end in exit 0 or 2, never a traceback. CI runs a small sample; benchmarks/fuzz.py runs
≥ 10,000 cases of the same strategies (tests/fuzz_cases.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")
from fuzz_cases import (  # noqa: E402
    Tally,
    Workspace,
    case_recipe,
    case_run_dir,
    case_spec,
    config_dicts,
    mutations,
    profile_dicts,
    recipe_dicts,
    run_cli,
    run_damage,
    spec_dicts,
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FAST = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
SLOW = settings(FAST, max_examples=6)


@pytest.fixture(scope="module")
def ws():
    w = Workspace()
    yield w
    w.close()


def _check(ws_tally: Tally, kind: str, argv_case: tuple[list[str], str]) -> None:
    argv, case = argv_case
    rc, _ = run_cli(argv)
    ws_tally.add(kind, rc, case)
    assert rc in (0, 2), f"{kind}: {rc}\n{case}"


def test_generated_configs_never_traceback(ws):
    tally = Tally()

    @FAST
    @given(cfg=config_dicts, mutation=mutations)
    def run(cfg, mutation):
        _check(tally, "config", case_spec(ws, {"name": "fz", "base": cfg}, mutation, None))

    run()
    assert tally.n >= 30 and tally.counts[("config", 0)] > 0  # some configs are valid: it went deep


def test_generated_specs_and_profiles_never_traceback(ws):
    tally = Tally()

    @FAST
    @given(spec=spec_dicts, mutation=mutations, profile=st.one_of(st.none(), profile_dicts))
    def run(spec, mutation, profile):
        _check(tally, "spec", case_spec(ws, spec, mutation, profile))

    run()
    assert tally.n >= 30


@pytest.mark.slow
def test_generated_recipes_never_traceback(ws):
    tally = Tally()

    @SLOW
    @given(recipe=recipe_dicts, mutation=mutations)
    def run(recipe, mutation):
        _check(tally, "recipe", case_recipe(ws, recipe, mutation))

    run()


@pytest.mark.parametrize("command, cfg", [("status", FAST), pytest.param("report", SLOW, marks=pytest.mark.slow)])
def test_damaged_run_dirs_never_traceback(ws, command, cfg):
    tally = Tally()

    @cfg
    @given(damage=run_damage)
    def run(damage):
        _check(tally, command, case_run_dir(ws, damage, command))

    run()
