"""Fuzzing as tests (issues 13 §4 and 30): generated configs, specs, profiles, recipes and damaged run
dirs must end in exit 0 or 2, never a traceback; and a sample of the campaign's named cases over the
surfaces added since (tests/fuzz_surfaces.py) end as each expects. CI runs these samples;
benchmarks/fuzz.py runs ≥ 10,000 generated cases and every named one."""

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


# --------------------------------------------------------------------------- issue 30: named cases
# A sample of tests/fuzz_surfaces.py (benchmarks/fuzz.py runs them all), one or two per surface, each
# in a child process: a hang is a timeout and a crash a signal, not the end of the test session.
SAMPLE = (
    "owner.lock symlink (completed run)", "owner.lock FIFO: status of a running run",
    "storage password holding '@'", "sbatch export BASH_ENV (dry run)", "NUL in vllm_servers args",
    "vllm_servers env BASH_ENV", "a FIFO inside a save_to_disk dir", "task.path is a FIFO",
    "model path is a symlink loop", "deep nesting in metrics.jsonl: report", "a 100 KB reason: status",
    "one server named twice (localhost vs 127.0.0.1)", "scale_rewards: false", "three problems at once",
    "a 5,000-digit int", "--root is a file: sweep", "status of the run dir train prints",
    "a local dry run with a hanging scontrol",
    # issue 41
    "planted metrics.jsonl link: train", "planted checkpoints link: train", "looks.json is a FIFO: status",
    "storage user@server:password@host", "search.storage of the wrong type", "sbatch export-f",
    "sbatch export PYTHONPATH", "plan: config.json -28 layers", "a chat template that raises", "a YAML alias bomb",
    "--max-seeds 1000000000", "vllm-serve --port 70000",
    "verl: one deep line among 20,000", "trackio: one deep line among 20,000", "trackio: trainer step 1e300",
    "verl: a dump is a FIFO", "wandb: history record of the wrong type", "tensorboard: DT_HALF past 16 bits",
)


@pytest.fixture(scope="module")
def surfaces():
    from fuzz_surfaces import Workspace

    w = Workspace()
    yield w
    w.close()


def test_generated_storage_urls_never_show_their_password():
    from fuzz_cases import STORAGE_FORMS, storage_passwords, storage_secret_shown

    shown = []

    @settings(FAST, max_examples=300)
    @given(form=st.sampled_from(STORAGE_FORMS), password=storage_passwords)
    def run(form, password):
        where = storage_secret_shown(form, password)
        if where:
            shown.append((form, password, where))

    run()
    assert not shown, shown[:5]


@pytest.mark.parametrize("name", SAMPLE)
def test_named_case_ends_as_expected(surfaces, name):
    from fuzz_surfaces import CASES, run_case

    case = next(c for c in CASES if c.name == name)
    result = run_case(surfaces, case)
    assert result.outcome == case.expect if case.expect == "ok" else result.outcome == "error", \
        f"{case.surface}: {name}: {result.outcome} (exit {result.rc})\n{result.tail}"


def test_every_surface_of_the_campaign_has_cases_and_the_sample_covers_them():
    from fuzz_surfaces import CASES, SURFACES

    assert set(SURFACES) >= {"security", "data", "model", "run_dir", "vllm", "values", "disk", "new_user"}
    assert len(CASES) >= 100 and len({c.name for c in CASES}) == len(CASES)
    sampled = {c.surface for c in CASES if c.name in SAMPLE}
    assert sampled >= set(SURFACES) - {"disk"}  # the full disk: tests/test_full_disk.py


def test_generated_importer_rows_never_traceback_or_misplace_a_step(ws):
    from fuzz_cases import case_importer, importer_kinds, importer_rows

    tally = Tally()

    @settings(FAST, max_examples=80)
    @given(kind=importer_kinds, rows=importer_rows, tail=st.sampled_from([b"", b"\n", b"{", b"\xff\n", b"[" * 70]))
    def run(kind, rows, tail):
        rc, case = case_importer(ws, kind, rows, tail)
        tally.add(kind, rc, case)
        assert rc in (0, 2), f"{rc}\n{case}"

    run()
    assert tally.counts[("verl", 0)] > 0 and tally.counts[("trackio", 0)] > 0  # some imports went through
