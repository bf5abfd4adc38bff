"""`armorlab demo`: the demo ablation on embedded defaults, then its report.

The spec ships with the package (armorlab/demo.yaml), so the demo runs from any install: local
executor, the tiny warm-started model, the synthetic arithmetic task, CPU, offline. Running it
again resumes: completed runs are kept, interrupted ones continue from their checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import typer

DEMO_SPEC = Path(__file__).resolve().parent.parent / "demo.yaml"
EFFECTIVE_SPEC = "demo-spec.yaml"


def effective_spec(root: Path, overrides: list[str]) -> Path:
    """The packaged spec with ``--set`` overrides merged into its base, written to ROOT/demo-spec.yaml."""
    from armorlab.config import deep_merge, load_yaml_mapping, parse_overrides
    from armorlab.fsutil import atomic_write_yaml

    spec = load_yaml_mapping(DEMO_SPEC)
    spec["base"] = deep_merge(spec["base"], parse_overrides(overrides))
    path = root / EFFECTIVE_SPEC
    atomic_write_yaml(path, spec)
    return path


def demo_recipe(run_dirs: list[Path]):
    """ARMOR vs UP vs DAPO over seeds: val selected on val and reported on test, probability of
    improvement of each objective over DAPO."""
    from armorlab.analysis.recipe import parse_recipe

    return parse_recipe({
        "title": "armorlab demo: DAPO vs UP vs ARMOR, tiny model, 16 training prompts",
        "runs": [str(p) for p in run_dirs],
        "group_by": ["objective"],
        "select": {"metric": "val/acc", "mode": "max", "report": "test/acc"},
        "compare": {"baseline": {"objective": "dapo"}},
    }, name="demo")


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        root: Path = typer.Option(Path("demo-runs"), "--root", help="Runs go to ROOT/demo/<run id>/."),
        out: Path = typer.Option(Path("reports/demo"), "--out", help="Where the report is written."),
        workers: int = typer.Option(2, "--workers", "-w", help="Parallel trainings (they split the cores)."),
        set_: list[str] = typer.Option([], "--set", help="Override a base key of every run, e.g. "
                                       "--set max_steps=30 (changes the run ids)."),
    ) -> None:
        """Run the demo ablation (DAPO vs UP vs ARMOR × 3 seeds, tiny model, CPU) and write its report."""
        from armorlab.commands.report import write_report
        from armorlab.commands.sweep import run_plan_locally
        from armorlab.sweeps.submit import plan_sweep

        plan = plan_sweep(effective_spec(root, set_), root=root, executor="local")
        failed = None
        try:
            run_plan_locally(plan, workers)
        except typer.Exit as exc:
            if exc.exit_code != 1:  # interrupted: no report of half-finished runs
                raise
            failed = exc  # some runs failed: the report still shows the rest, and says which
        write_report(demo_recipe([plan.sweep_dir / r.run_id for r in plan.runs]), out)
        if failed is not None:
            raise failed
