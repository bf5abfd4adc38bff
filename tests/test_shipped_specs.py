"""Every shipped sweep spec and report recipe validates and dry-runs, as written and on the tiny model.

The paper-scale specs (sweeps/paper/) name a user's model, data and held-out benchmarks; `--set
model=tiny --set task=arithmetic --set eval_sets=null` must turn each into a runnable tiny sweep
without other edits. A recipe is
"dry-run" against the runs its sweep would make: its group keys and comparison selectors must
name config keys those runs have and select at least one of them, and its matched steps must
lie within the runs' budget — otherwise the report would come out empty or silently ungrouped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from model_dirs import fake_model_dir
from typer.testing import CliRunner

from armorlab.analysis.recipe import load_recipe, unit_disagreement
from armorlab.cli import app, main
from armorlab.core.config import DROPPED_AT_DEFAULT, get_dotted, parse_overrides
from armorlab.errors import ArmorLabError
from armorlab.sweeps.spec import load_spec
from armorlab.sweeps.submit import plan_sweep

REPO = Path(__file__).resolve().parents[1]
# the paper specs' 3,072-token completions do not fit the tiny model's 1,024 positions
TINY = ["model=tiny", "task=arithmetic", "eval_sets=null", "max_completion_length=8", "overlong_buffer_len=4"]


def _specs() -> list[Path]:
    files = sorted((REPO / "sweeps").rglob("*.yaml"))
    bases = set()
    for f in files:
        base = (yaml.safe_load(f.read_text()) or {}).get("base")
        if isinstance(base, str):
            bases.add((f.parent / base).resolve())
    return [f for f in files if f.resolve() not in bases] + [REPO / "armorlab" / "demo.yaml"]


SPECS = _specs()
# Keys of the rollout-counted schedules and checkpoint keeping (the training side of the paper
# protocol, merged separately); until they are in this tree, a paper spec that uses them cannot
# resolve, and its checks are skipped saying so. Inert once the keys exist.
TRAIN_SIDE_KEYS = frozenset({"step_unit", "max_rollouts", "anchor_cache", "keep_checkpoints"})


def plan_or_skip(path: Path, overrides: list[str], root: Path):
    try:
        return plan_sweep(path, root=root, overrides=parse_overrides(overrides))
    except ArmorLabError as exc:
        if exc.key in TRAIN_SIDE_KEYS and "unknown config key" in str(exc):
            pytest.skip(f"{path.name} uses {exc.key}, a training-side key this tree does not have yet")
        raise
RECIPES = sorted((REPO / "analysis").rglob("*.yaml"))


def _id(p: Path) -> str:
    return str(p.relative_to(REPO))


@pytest.mark.parametrize("path", SPECS, ids=_id)
@pytest.mark.parametrize("overrides", [[], TINY], ids=["as-written", "tiny"])
def test_spec_validates_and_dry_runs(path, overrides, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative run roots land in the temp dir
    spec = load_spec(path)
    tiny = bool(overrides)
    if not tiny:
        overrides = _stand_ins(spec, tmp_path)
    if spec.search is not None:   # an `armorlab tune` study: its search space checked against its base
        from armorlab.core.config import deep_merge
        from armorlab.tune.space import parse_search

        search = parse_search(spec.search, deep_merge(spec.base, parse_overrides(overrides)), file=str(path))
        assert search.space
        return
    args = ["sweep", str(path), "--dry-run", "--root", str(tmp_path / "runs")]
    for o in overrides:
        args += ["--set", o]
    plan = plan_or_skip(path, overrides, tmp_path / "runs")
    assert plan.runs and len({r.run_id for r in plan.runs}) == len(plan.runs)
    if tiny:
        assert all(r.config["model"]["name"] == "tiny" and r.config["task"]["name"] == "arithmetic"
                   for r in plan.runs)
    elif spec.base.get("eval_sets"):  # the benchmarks' stand-ins resolved into every run
        assert all(set(r.config["eval_sets"]) == set(spec.base["eval_sets"]) for r in plan.runs)
    if spec.profile:
        assert spec.profile_path().is_file()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert not list((tmp_path / "runs").rglob("config.yaml")), "a dry run wrote run dirs"


def _stand_ins(spec, tmp_path: Path) -> list[str]:
    """A paper spec names the user's checkpoint and data file, which must exist (their content is
    part of the run id): stand-ins at those keys let the rest of the spec be checked as written."""
    overrides = []
    model = spec.base.get("model")
    if isinstance(model, str) and model != "tiny":
        from armorlab.core.known_models import known_config

        # the named model's own config.json where armorlab knows it: the dry run plans its memory
        known = known_config(model)
        fake_model_dir(tmp_path / "model", config=known[1] if known else None)
        overrides.append(f"model={tmp_path / 'model'}")
    task = spec.base.get("task")
    if isinstance(task, dict) and task.get("path"):
        data = tmp_path / "data.jsonl"
        data.write_text("".join(f'{{"problem": "{i} + 1 = ?", "answer": "{i + 1}"}}\n' for i in range(1200)))
        overrides.append(f"task.path={data}")
    for name in spec.base.get("eval_sets") or {}:  # benchmarks sharing no problem with the data above
        bench = tmp_path / f"{name}.jsonl"
        bench.write_text("".join(f'{{"problem": "{i} * 7 = ?", "answer": "{7 * i}"}}\n' for i in range(30)))
        overrides.append(f"eval_sets.{name}.path={bench}")
    return overrides


def _spec_for(recipe_runs: list[str]) -> Path | None:
    names = {Path(r).name for r in recipe_runs}
    for path in SPECS:
        if load_spec(path).name in names:
            return path
    return None


@pytest.mark.parametrize("path", RECIPES, ids=_id)
def test_recipe_matches_the_runs_of_its_sweep(path, tmp_path):
    (tmp_path / "as-written").mkdir()
    recipe = load_recipe(path)
    assert recipe.runs and recipe.select.metric.startswith("val/")
    spec_path = _spec_for(recipe.runs)
    if spec_path is None:
        assert path.name == "demo.yaml", f"{path.name} reads runs no shipped sweep makes: {recipe.runs}"
        return
    for overrides in (_stand_ins(load_spec(spec_path), tmp_path / "as-written"), TINY):
        plan = plan_or_skip(spec_path, overrides, tmp_path / "runs")
        configs = [r.config for r in plan.runs]
        missing = object()
        for key in recipe.group_by or ():
            # a key at a default dropped from resolved configs (ref_from: null) is a column once one run sets it
            assert all(get_dotted(c, key, missing) is not missing or key in DROPPED_AT_DEFAULT for c in configs) \
                and any(get_dotted(c, key, missing) is not missing for c in configs), f"group_by {key}"
        selectors = [recipe.compare.baseline] if recipe.compare.baseline else []
        selectors += [s for pair in recipe.compare.pairs or () for s in pair]
        for sel in selectors:
            if overrides:  # --set task=... replaces the task section: task keys no longer tell runs apart
                sel = {k: v for k, v in sel.items() if not k.startswith(("task.", "model."))}
            hits = [c for c in configs if all(get_dotted(c, k, missing) == v for k, v in sel.items())]
            assert hits, f"compare selector {sel} selects no run of {spec_path.name}"
        units = {c.get("step_unit", "optimizer") for c in configs}
        # the recipe reads in the sweep's unit (a disagreement would read "test@500" elsewhere)
        assert unit_disagreement(recipe.x, str(path), {str(spec_path): u for u in units}) is None, \
            f"{_id(path)} reads x: {recipe.x}, {_id(spec_path)} counts in {units}"
        budget = min(c["max_rollouts"] if recipe.x == "rollout" else c["max_steps"] for c in configs)
        assert all(s <= budget for s in recipe.matched_steps or ()), (recipe.matched_steps, budget)


def test_sweep_set_overrides_every_run_and_rejects_bad_items(tmp_path, capsys):
    spec = REPO / "sweeps" / "armor_alpha.yaml"
    plan = plan_sweep(spec, root=tmp_path, overrides=parse_overrides(["max_steps=7", "task.digits=3"]))
    assert {r.config["max_steps"] for r in plan.runs} == {7}
    assert {r.config["task"]["digits"] for r in plan.runs} == {3}
    for item, said in (("max_steps", "key=value"), ("max_stepz=3", "'max_stepz'")):
        with pytest.raises(SystemExit) as exc:
            main(["sweep", str(spec), "--dry-run", "--set", item])
        assert exc.value.code == 2
        assert said in capsys.readouterr().err


PAPER_SPECS = [p for p in SPECS if p.parent.name == "paper"]


@pytest.mark.parametrize("path", PAPER_SPECS, ids=_id)
def test_paper_runs_draw_anchors_afresh_except_the_declared_cache_arm(path, tmp_path):
    """ARMOR Algorithm 1 draws anchors afresh for every batch: every run of a paper sweep that
    samples from π_ref does so (anchor_cache off in effect), but for armor_controls' cost-saving arm."""
    from armorlab.sweeps.controls import effective

    plan = plan_or_skip(path, TINY, tmp_path / "runs")
    sampling = [effective(r.config) for r in plan.runs if r.config["anchor"] or r.config["anchor_gate"]]
    caches = sorted({c["anchor_cache"] for c in sampling})
    if path.name == "armor_controls.yaml":
        assert caches == ["off", "window"]
        assert sum(c["anchor_cache"] == "window" for c in sampling) == len(load_spec(path).seeds)
    else:
        assert caches in ([], ["off"]), f"{path.name}: anchors reused across batches in {caches}"


def test_effective_anchor_cache_spells_out_what_null_means():
    from armorlab.sweeps.controls import diff, effective

    fresh = {"anchor": True, "anchor_gate": True, "ref_reset_steps": 160, "anchor_cache": "off"}
    cached = {"anchor": True, "anchor_gate": True, "ref_reset_steps": 160}  # null with resets: window
    static = {"anchor": True, "anchor_gate": True, "ref_reset_steps": 0}    # null, static π_ref: off
    assert diff(effective(fresh), effective(cached))[0] == {"anchor_cache": ("off", "window")}
    assert diff(effective(fresh), effective(static))[0] == {"ref_reset_steps": (160, 0)}
    assert "anchor_cache" not in effective({"anchor": False, "anchor_gate": False, "ref_reset_steps": 160})


@pytest.mark.parametrize("path", PAPER_SPECS, ids=_id)
def test_paper_dry_run_shows_fresh_anchors_and_bounded_refill(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["sweep", str(path), "--dry-run", "--root", str(tmp_path / "runs")]
    for o in TINY:
        args += ["--set", o]
    out = CliRunner().invoke(app, args).output
    protocol = [line for line in out.splitlines() if line.startswith("  ") and "run(s): " in line and "refill" in line]
    assert protocol, out
    assert all("refill ≤ 10 generation batch(es) of 3× the prompts" in line for line in protocol)
    reused = [line for line in protocol if "reused until π_ref resets" in line]
    assert len(reused) == (1 if path.name == "armor_controls.yaml" else 0)
