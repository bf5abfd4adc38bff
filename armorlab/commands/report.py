"""`armorlab report`: figures, tables and index.html comparing runs (armorlab.analysis.report)."""

from __future__ import annotations

import functools
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        ctx: typer.Context,
        inputs: list[str] = typer.Argument(None, metavar="RECIPE.yaml|PATH...",
                                           help="A recipe (analysis/*.yaml), or paths and globs: armorlab "
                                           "run/sweep dirs, TRL output dirs, W&B run folders, TensorBoard log dirs, "
                                           "verl JSONL files, trackio .db files (detected per path)."),
        out: Path = typer.Option(None, "--out", help="Output dir (default: recipe `out:`, a run's or "
                                 "sweep's report/, else reports/<recipe or dir name>)."),
        group_by: list[str] = typer.Option([], "--group-by", help="Config keys to group on, e.g. "
                                           "--group-by objective,alpha, or keys an imported run's source recorded "
                                           "(--group-by beta,learning_rate) (default: the keys that tell runs "
                                           "apart, or run_group from --map; seeds are always aggregated)."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild everything: re-parse every "
                                      "metrics.jsonl, read and write no cache."),
        format: str = typer.Option(None, "--format", help="Read every PATH as this format: armorlab, trl, "
                                   "wandb, tensorboard, verl, trackio (default: detected per path)."),
        runs_map: Path = typer.Option(None, "--map", help="runs.yaml: imported runs' group, seed and val_n by "
                                      "path (its paths are the inputs when no PATH is given)."),
        val_n: int = typer.Option(None, "--val-n", min=1, help="Completions behind each validation of "
                                  "imported runs that do not log val/n (the binomial noise of val/acc)."),
        baseline: str = typer.Option(None, "--baseline", metavar="KEY=VALUE[,KEY=VALUE]", help="The group every "
                                     "other is compared with, e.g. --baseline objective=dapo (as compare.baseline; "
                                     "default: the sweep spec's controls baseline, else the first group)."),
        delta: float = typer.Option(None, "--delta", help="The equivalence margin declared before the runs "
                                    "(as compare.delta; default: none, nothing is called equivalent)."),
    ) -> None:
        """Compare runs: seed statistics, collapse metrics, KL, capacity -> PNG, CSV/MD/LaTeX, HTML."""
        from armorlab.analysis.recipe import load_recipe, recipe_for_paths
        from armorlab.errors import ArmorLabError

        inputs = list(inputs or [])
        keys = [k.strip() for item in group_by for k in item.split(",") if k.strip()] or None
        if not inputs and runs_map is None:
            raise typer.BadParameter("Missing argument 'RECIPE.yaml|PATH...' (or --map runs.yaml).", ctx=ctx)
        if runs_map is not None and not runs_map.is_file():
            raise ArmorLabError("mapping file not found", key="--map", value=str(runs_map))
        if format is not None:
            from armorlab.analysis.importers import FORMATS

            if format not in FORMATS:
                raise ArmorLabError(f"unknown format (known: {', '.join(FORMATS)})", key="--format", value=format)
        first = Path(inputs[0]) if inputs else None
        if first is not None and len(inputs) == 1 and first.suffix in (".yaml", ".yml") and not first.is_dir():
            if not first.is_file():
                raise ArmorLabError("recipe file not found", key="recipe", value=str(first))
            recipe = load_recipe(first)
            if keys:
                recipe.group_by = keys
            recipe.format = format or recipe.format
            recipe.runs_map = str(runs_map) if runs_map is not None else recipe.runs_map
            recipe.val_n = val_n or recipe.val_n
        else:
            recipe = recipe_for_paths(inputs, group_by=keys, format=format,
                                      runs_map=str(runs_map) if runs_map is not None else None, val_n=val_n)
        recipe.compare = _compare_flags(recipe.compare, baseline, delta)
        if recipe.group_by is None and recipe.runs_map is not None:
            from armorlab.analysis import importers

            if any(e.group is not None for e in importers.load_mapping(recipe.runs_map).entries):
                recipe.group_by = [importers.GROUP_KEY]
        if recipe.group_by is None:
            recipe.group_by = _study_keys(recipe.runs)
        write_report(recipe, out, cache=not no_cache)


def _compare_flags(compare, baseline: str | None, delta: float | None):
    """The recipe's ``compare`` with ``--baseline`` and ``--delta`` over it (a flag wins over the file)."""
    import dataclasses
    import math

    from armorlab.analysis.recipe import parse_selector_flag
    from armorlab.errors import ArmorLabError

    if baseline is not None:
        compare = dataclasses.replace(compare, baseline=parse_selector_flag(baseline), pairs=None,
                                      baseline_from="--baseline")
    if delta is not None:
        if not (math.isfinite(delta) and delta > 0):
            raise ArmorLabError("must be a number > 0, the equivalence margin", key="--delta", value=delta)
        compare = dataclasses.replace(compare, delta=float(delta), delta_from="--delta")
    return compare


def _study_keys(runs: list[str]) -> list[str] | None:
    """An Optuna study's trials grouped by every searched key (not only the fewest keys that tell
    them apart: a continuous alpha alone does, which hid the learning rate searched with it);
    None when no input is a study dir."""
    from armorlab.tune.study import is_study_dir, searched_keys

    studies = [r for r in runs if Path(r).is_dir() and is_study_dir(r)]
    keys = [k for s in studies for k in searched_keys(s)]
    return list(dict.fromkeys(keys)) or None


def compose_report(recipe, out: Path | None, *, cache: bool = True, progress=None, lead=None, names=None):
    """The run report (armorlab.analysis.report) plus an Optuna section per study dir among the
    inputs (armorlab.tune.study): composed here so that analysis never imports tune."""
    from armorlab.analysis.report import build_report  # pandas: after the cheap checks
    from armorlab.tune.study import is_study_dir  # light: optuna only inside the section builder

    studies = [p for p in recipe.runs if Path(p).is_dir() and is_study_dir(p)]
    extra = None
    if studies:
        from armorlab.tune.study import report_sections

        extra = functools.partial(report_sections, studies)
    return build_report(recipe, out, cache=cache, progress=progress, extra_sections=extra, lead=lead,
                        names=names)


def write_report(recipe, out: Path | None, *, cache: bool = True, lead=None, verdicts: bool = True,
                 names=None) -> dict:
    """Build the report with a progress bar and print its verdicts (unless ``verdicts`` is false:
    the demo prints them in its headline) and where it is (also used by `armorlab demo`); returns
    the summary (armorlab.analysis.report.result_summary).

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
        _print_summary(summary, note="unchanged: inputs, recipe and code are as when it was written",
                       verdicts=verdicts)
        return summary

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from armorlab.commands import console as make_console

    console = make_console(stderr=True)
    with Progress(TextColumn("reading runs"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("runs", total=None)
        result = compose_report(recipe, target, cache=cache, lead=lead, names=names,
                                progress=lambda done, total: bar.update(task, completed=done, total=total))
    from armorlab.analysis.report import result_summary  # imported by compose_report already

    summary = result_summary(result)
    _print_summary(summary, verdicts=verdicts)
    return summary


def _print_summary(summary: dict, note: str | None = None, verdicts: bool = True) -> None:
    if verdicts:
        for sentence in summary.get("verdicts", ()):  # a stamp from before verdicts has none
            typer.echo(sentence)
    warnings = summary["warnings"]
    typer.echo(f"{summary['index']}  ({summary['n_runs']} runs, {summary['n_groups']} groups, "
               f"{len(summary['plots'])} plots, {len(warnings)} warnings" + (f"; {note})" if note else ")"))
    for w in warnings[:10]:
        typer.echo(f"warning: {w}", err=True)
    if len(warnings) > 10:
        typer.echo(f"... {len(warnings) - 10} more warnings in {summary['index']}", err=True)
