"""`armorlab tune`: an Optuna study whose trials are runs, on local worker processes or Slurm."""

from __future__ import annotations

from pathlib import Path

import typer


def _print_status(status: dict, console) -> None:
    from rich.table import Table

    from armorlab.tune.study import best_value_summary, status_table_rows

    header, cells = status_table_rows(status)
    title = "Pareto front" if len(status["directions"]) > 1 else f"best trials ({status['directions'][0]})"
    table = Table(title=f"{status['name']}: {title}", title_justify="left")
    for i, h in enumerate(header):
        table.add_column(h, justify="right" if 0 < i < len(header) - 2 else "left", no_wrap=(h != "runs"))
    for row in cells:
        table.add_row(*row)
    console.print(f"study {status['name']}  ({status['study_dir']}, storage {status['storage']})")
    console.print(best_value_summary(status))
    if cells:
        console.print(table)
    else:
        console.print("no complete trials yet")
    if status.get("pruned"):
        console.print("pruned: " + "; ".join(
            f"#{p['number']} at step {p['step']} ({p['outcome']})" for p in status["pruned"]))
    if status.get("dashboard"):
        console.print(f"dashboard: {status['dashboard']}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune(
        spec: Path = typer.Argument(..., help="Study spec: a sweep spec with a `search:` section (with "
                                    "--status, a study dir works too)."),
        executor: str = typer.Option(None, "--executor", help="local | slurm (default: the profile's)."),
        workers: int = typer.Option(None, "--workers", "-w", help="Parallel workers (local processes or "
                                    "Slurm array tasks); default: the profile's `workers`."),
        storage: str = typer.Option(None, "--storage", help="Optuna RDB URL (postgresql://..., sqlite:///...);"
                                    " default: a journal file in the study dir."),
        root: Path = typer.Option(Path("runs"), "--root", help="The study dir is ROOT/<name>/."),
        profile: Path = typer.Option(None, "--profile", help="Cluster profile (overrides the spec's)."),
        status: bool = typer.Option(False, "--status", help="Print the best trials and exit."),
        top: int = typer.Option(10, "--top", help="Rows of the --status table."),
        wait: bool = typer.Option(False, "--wait/--no-wait", help="Slurm: wait for the workers to end."),
    ) -> None:
        """Search hyperparameters with Optuna; every trial is an ordinary run dir (resumable)."""
        import logging

        import optuna

        from armorlab.commands import console as make_console
        from armorlab.errors import ArmorLabError
        from armorlab.sweeps.executors import thread_note
        from armorlab.tune.study import (
            is_study_dir,
            load_study_spec,
            prepare_study,
            run_local,
            study_status,
            submit_slurm,
            wait_slurm,
        )

        # Optuna logs every trial at INFO to stderr; the progress bar and table say it better.
        if not logging.getLogger().isEnabledFor(logging.INFO):
            optuna.logging.set_verbosity(optuna.logging.WARNING)

        # piped or logged output gets rich's 80-column default: too narrow for params + run ids
        console = make_console()
        if status:
            if spec.is_dir():
                study_dir = spec
            else:
                sweep, _ = load_study_spec(spec)
                study_dir = root / sweep.name
            if not is_study_dir(study_dir):
                raise ArmorLabError("no study here yet: run `armorlab tune SPEC` first", key="study_dir",
                                    value=str(study_dir), file=str(spec))
            _print_status(study_status(study_dir, top=top), console)
            return

        from armorlab.sweeps.profile import load_profile

        ctx = prepare_study(spec, root=root, storage=storage)
        prof_path = profile if profile is not None else ctx.extra.get("profile")
        prof = load_profile(prof_path)
        prof.refuse_vllm_servers("armorlab tune")
        kind = executor or prof.executor
        if kind not in ("local", "slurm"):
            raise ArmorLabError("must be local or slurm", key="--executor", value=kind)
        n_workers = workers if workers is not None else prof.workers
        if n_workers < 1:
            raise ArmorLabError("must be ≥ 1", key="--workers", value=n_workers)
        if kind == "slurm" and ctx.storage_url is None:
            from armorlab.tune.backend import fs_type

            console.print(f"note: journal storage in {ctx.tune_dir} (file system {fs_type(ctx.tune_dir)}); "
                          "on NFS prefer --storage postgresql://...", style="yellow")

        n_trials = ctx.search.n_trials
        current = study_status(ctx.study_dir)
        if current["counts"]["finished"] >= n_trials:
            _print_status(current, console)
            console.print(f"the study already has {n_trials} finished trials; raise search.n_trials to "
                          "continue it")
            return
        if kind == "local":
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[extra]}"), TimeElapsedColumn(), console=console,
                          transient=False) as bar:
                task = bar.add_task(f"{ctx.name} trials", total=n_trials, extra="")
                bar.console.print(thread_note(n_workers), markup=False, highlight=False)
                seen: list[tuple[int, ...]] = []

                def progress(c: dict) -> None:
                    bar.update(task, completed=min(c["finished"], n_trials),
                               extra=f"{c['running']} running, {c['pruned']} pruned, {c['fail']} failed")
                    # a line whenever a trial starts or ends: in a log file the bar shows nothing
                    key = (c["running"], c["complete"], c["pruned"], c["fail"])
                    if seen and seen[-1] == key or not any(key):
                        return
                    seen.append(key)
                    started = c["running"] + c["finished"] + c["fail"]
                    bar.console.print(f"trials: {started} started, {c['finished']}/{n_trials} finished "
                                      f"({c['pruned']} pruned), {c['fail']} failed; best so far: "
                                      f"{best_so_far(ctx.study_dir)}", markup=False, highlight=False)

                try:
                    result = run_local(ctx, n_workers, launch=prof.launch_options(), on_progress=progress)
                except KeyboardInterrupt:
                    console.print("interrupted; run the same command again to resume the study")
                    raise typer.Exit(130) from None
            _print_status(study_status(ctx.study_dir), console)
            if result["counts"]["finished"] < n_trials:
                console.print(f"the workers stopped before {n_trials} trials finished; see "
                              f"{', '.join(result['logs'])}", style="red")
                raise typer.Exit(1)
            return

        jobs = submit_slurm(ctx, n_workers, prof)
        console.print(f"submitted {len(jobs)} tune workers ({', '.join(j.job_id for j in jobs)}); "
                      f"`armorlab tune {spec} --status` shows progress")
        if wait:
            result = wait_slurm(ctx, jobs, on_progress=None)
            _print_status(study_status(ctx.study_dir), console)
            if result["counts"]["finished"] < n_trials:
                console.print(f"the workers ended before {n_trials} trials finished (job states: "
                              f"{', '.join(result['job_states'])}); logs in {ctx.study_dir / '.submitit'}",
                              style="red")
                raise typer.Exit(1)


def best_so_far(study_dir) -> str:
    """``0.412 (trial 3: alpha=0.7)``, or ``none yet`` before a trial completes."""
    from armorlab.tune.study import study_status

    best = study_status(study_dir, top=1)["best"]
    if not best:
        return "none yet"
    b = best[0]
    values = ", ".join(f"{v:.4g}" for v in b["values"])
    params = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in b["params"].items())
    return f"{values} (trial {b['number']}: {params})"
