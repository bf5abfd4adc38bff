"""`armorlab report`: figures, tables and index.html comparing runs (armorlab.analysis.report)."""

from __future__ import annotations

import functools
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        inputs: list[str] = typer.Argument(..., metavar="RECIPE.yaml|RUN_OR_SWEEP_DIR",
                                           help="A recipe (analysis/*.yaml), or run/sweep dirs and globs."),
        out: Path = typer.Option(None, "--out", help="Output dir (default: recipe `out:`, a run's or "
                                 "sweep's report/, else reports/<recipe>)."),
        group_by: list[str] = typer.Option([], "--group-by", help="Config keys to group on, e.g. "
                                           "--group-by objective,alpha (default: the keys that tell runs "
                                           "apart; seeds are always aggregated)."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild everything: re-parse every "
                                      "metrics.jsonl, read and write no cache."),
    ) -> None:
        """Compare runs: seed statistics, collapse metrics, KL, capacity -> PNG, CSV/MD/LaTeX, HTML."""
        from armorlab.analysis.recipe import load_recipe, recipe_for_paths
        from armorlab.errors import ArmorLabError

        keys = [k.strip() for item in group_by for k in item.split(",") if k.strip()] or None
        first = Path(inputs[0])
        if len(inputs) == 1 and first.suffix in (".yaml", ".yml") and not first.is_dir():
            if not first.is_file():
                raise ArmorLabError("recipe file not found", key="recipe", value=str(first))
            recipe = load_recipe(first)
            if keys:
                recipe.group_by = keys
        else:
            recipe = recipe_for_paths(inputs, group_by=keys)
        if recipe.group_by is None:
            recipe.group_by = _study_keys(recipe.runs)
        write_report(recipe, out, cache=not no_cache)
        # every output is renamed into place and the figure worker has exited: the ~0.1 s the
        # interpreter's teardown takes to free the runs' tables would only delay the prompt
        from armorlab.core.process_exit import skip_teardown

        skip_teardown()


def _study_keys(runs: list[str]) -> list[str] | None:
    """An Optuna study's trials grouped by every searched key (not only the fewest keys that tell
    them apart: a continuous alpha alone does, which hid the learning rate searched with it);
    None when no input is a study dir."""
    from armorlab.tune.study import is_study_dir, searched_keys

    studies = [r for r in runs if Path(r).is_dir() and is_study_dir(r)]
    keys = [k for s in studies for k in searched_keys(s)]
    return list(dict.fromkeys(keys)) or None


def _figure_worker(recipe):
    from armorlab.analysis.figure_worker import FigureWorker, wanted

    return FigureWorker(wanted(recipe.runs))


def compose_report(recipe, out: Path | None, *, cache: bool = True, progress=None, lead=None, worker=None):
    """The run report (armorlab.analysis.report) plus an Optuna section per study dir among the
    inputs (armorlab.tune.study): composed here so that analysis never imports tune. ``worker``:
    the figure worker, started by the caller as early as it could (build_report closes it)."""
    # the figure worker first: its interpreter and matplotlib import run on the other core while
    # this process imports pandas (build_report takes it over and closes it)
    worker = _figure_worker(recipe) if worker is None else worker
    try:
        from armorlab.analysis.report import build_report  # pandas: after the cheap checks
        from armorlab.tune.study import is_study_dir  # light: optuna only inside the section builder

        studies = [p for p in recipe.runs if Path(p).is_dir() and is_study_dir(p)]
        extra = None
        if studies:
            from armorlab.tune.study import report_sections

            extra = functools.partial(report_sections, studies)
    except BaseException:
        worker.close()
        raise
    return build_report(recipe, out, cache=cache, progress=progress, extra_sections=extra, lead=lead,
                        figure_worker=worker)


def write_report(recipe, out: Path | None, *, cache: bool = True, lead=None) -> None:
    """Build the report with a progress bar and print where it is (also used by `armorlab demo`).

    With the cache on, a report whose inputs, recipe and code are unchanged since it was written
    (armorlab.analysis.freshness) is left as it is: no pandas, scipy or matplotlib is imported.
    ``lead`` (the demo's headline) needs the per-run scores, so a call with one always builds."""
    from armorlab.analysis import freshness
    from armorlab.analysis.recipe import default_out_dir
    from armorlab.core.fsutil import writable_dir

    target = writable_dir(out if out is not None else default_out_dir(recipe),
                          key="--out" if out is not None else "out",
                          file=None if out is not None or recipe.path is None else str(recipe.path))
    summary = freshness.fresh_summary(recipe, target) if cache and lead is None else None
    if summary is not None:
        _print_summary(summary, note="unchanged: inputs, recipe and code are as when it was written")
        return

    worker = _figure_worker(recipe)  # before rich's import too: every hundredth of a second overlaps
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    except BaseException:
        worker.close()
        raise
    console = Console(stderr=True)
    with Progress(TextColumn("reading runs"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("runs", total=None)
        result = compose_report(recipe, target, cache=cache, lead=lead, worker=worker,
                                progress=lambda done, total: bar.update(task, completed=done, total=total))
    from armorlab.analysis.report import result_summary  # imported by compose_report already

    _print_summary(result_summary(result))


def _print_summary(summary: dict, note: str | None = None) -> None:
    warnings = summary["warnings"]
    typer.echo(f"{summary['index']}  ({summary['n_runs']} runs, {summary['n_groups']} groups, "
               f"{len(summary['plots'])} plots, {len(warnings)} warnings" + (f"; {note})" if note else ")"))
    for w in warnings[:10]:
        typer.echo(f"warning: {w}", err=True)
    if len(warnings) > 10:
        typer.echo(f"... {len(warnings) - 10} more warnings in {summary['index']}", err=True)
