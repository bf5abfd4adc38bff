"""`armorlab sweep`, `armorlab status`, `armorlab cancel`: run ablation grids, watch them, stop them.

Start-up stays light: `status` and `sweep --dry-run` import neither torch, TRL, pandas nor
submitit (the dry run renders the sbatch text itself: armorlab.sweeps.sbatch.render_script).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer

RETRY_CHOICES = ("failed",)


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep(
        spec: Path = typer.Argument(..., help="Sweep spec YAML (see sweeps/*.yaml)."),
        executor: str = typer.Option(None, "--executor", "-e",
                                     help="local (this machine) or slurm; default: the profile's (local)."),
        profile: Path = typer.Option(None, "--profile", "-p", help="Cluster profile YAML (slurm/*.yaml); "
                                     "default: the spec's `profile:`."),
        root: Path = typer.Option(Path("runs"), "--root", help="Runs go to ROOT/<sweep name>/<run id>/."),
        workers: int = typer.Option(None, "--workers", "-w", help="Local executor: parallel trainings."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Show what would run; submit nothing."),
        retry: str = typer.Option(None, "--retry", help="'failed': resubmit runs that failed."),
        wait: bool = typer.Option(False, "--wait", help="Slurm: stay and show progress until all finish."),
        detach: bool = typer.Option(False, "--detach", help="Local: running trainers keep going if this "
                                    "command dies or its terminal closes (default: they checkpoint and stop "
                                    "with it; a re-run resumes them)."),
        set_: list[str] = typer.Option([], "--set", help="Override a base key of every run, once per key, e.g. "
                                       "--set model=tiny --set task.digits=3 (changes the run ids)."),
        until_resolved: bool = typer.Option(False, "--until-resolved", help="Add seeds in looks until every "
                                            "arm of the spec's `compare:` is resolved against its baseline "
                                            "(group-sequential; docs/verdicts.md). Again = where it stands, "
                                            "and resume."),
        max_seeds: int = typer.Option(None, "--max-seeds", help="--until-resolved: at most this many seeds "
                                      "per arm (default 10); then 'not resolved'."),
        seeds_per_look: int = typer.Option(None, "--seeds-per-look", help="--until-resolved: seeds added per "
                                           "look after the first (the spec's seeds); default 2."),
    ) -> None:
        """Run a sweep: every grid point × seed once; again = resume (completed/queued runs are skipped)."""
        from armorlab.core.config import parse_overrides
        from armorlab.errors import ArmorLabError
        from armorlab.sweeps.submit import plan_sweep

        if retry is not None and retry not in RETRY_CHOICES:
            raise ArmorLabError("only failed runs can be retried", key="--retry", value=retry)
        if not until_resolved:
            for flag, value in (("--max-seeds", max_seeds), ("--seeds-per-look", seeds_per_look)):
                if value is not None:
                    raise ArmorLabError("only with --until-resolved", key=flag, value=value)
        else:
            _until_resolved(spec, root=root, executor=executor, profile=profile, overrides=parse_overrides(set_),
                            retry_failed=retry == "failed", max_seeds=max_seeds, seeds_per_look=seeds_per_look,
                            workers=workers, detach=detach, dry_run=dry_run, wait=wait)
            return
        cluster_max = None
        if dry_run and executor == "slurm":  # asked now, answered while the spec expands
            from armorlab.sweeps import slurmctl

            cluster_max = slurmctl.max_array_size_later()
        try:
            from armorlab.sweeps.spec import paths_unchecked

            with paths_unchecked() if dry_run else contextlib.nullcontext([]) as missing:
                plan = plan_sweep(spec, root=root, executor=executor, profile=profile,
                                  retry_failed=retry == "failed", overrides=parse_overrides(set_))
            for problem in missing:  # the script can be read before the weights and data are on disk
                typer.echo(f"warning: {problem} — shown anyway (a dry run); those runs' ids are provisional "
                           "until the path exists, and a real submission refuses it", err=True)
            if dry_run:
                if plan.executor == "slurm" and cluster_max is None:  # the profile chose Slurm
                    from armorlab.sweeps import slurmctl

                    cluster_max = slurmctl.max_array_size_later()
                _print_dry_run(plan, workers, cluster_max)  # a local plan never asks Slurm
                return
        finally:
            if cluster_max is not None:
                cluster_max()  # reaps scontrol whatever happened
        for pair, note in _batch_warnings(plan):
            typer.echo(f"warning: control arm '{pair.arm}' against {pair.baseline}: {note}", err=True)
        if plan.executor == "slurm":
            _submit_slurm(plan, wait)
        else:
            run_plan_locally(plan, workers, detach=detach)

    @app.command("status")
    def status(
        sweep_dir: Path = typer.Argument(..., help="A sweep directory (ROOT/<sweep name>)."),
        watch: bool = typer.Option(False, "--watch", help="Refresh until every run has finished."),
        interval: float = typer.Option(5.0, "--interval", help="Seconds between refreshes with --watch."),
    ) -> None:
        """Show a sweep's runs: state, progress, last val/acc, Slurm state, attempts, failure reasons."""
        if watch:
            _watch(sweep_dir, interval)
        else:
            from armorlab.sweeps.status import collect

            _print_status(collect(sweep_dir))

    @app.command("cancel")
    def cancel(sweep_dir: Path = typer.Argument(..., help="A sweep directory (ROOT/<sweep name>).")) -> None:
        """Cancel a sweep's queued and running jobs (running trainers checkpoint first)."""
        from armorlab.sweeps.status import cancel as cancel_jobs

        cancelled = cancel_jobs(sweep_dir)
        if cancelled:
            typer.echo(f"cancelled {len(cancelled)} job(s): {' '.join(cancelled)}")
        else:
            typer.echo("nothing to cancel: no queued or running job")


# --------------------------------------------------------------------------- sweep
def _summary(plan) -> str:
    counts = plan.counts()
    parts = [f"{counts.get(k, 0)} {label}" for k, label in (
        ("submit", "to run"), ("completed", "completed"), ("queued/running", "queued/running"),
        ("failed", "failed (use --retry failed)"), ("parent failed", "not started: their parent failed"),
        ("waits for parent", "waiting for a parent running elsewhere (run the sweep again later)"))
        if counts.get(k)]
    from armorlab.core.runs import describe_owner

    owned = [f"\n  {run_id} is owned by {describe_owner(owner)}: a live trainer (e.g. of an earlier sweep that was "
             "killed), not started again; run the sweep again once it has exited"
             for run_id, owner in getattr(plan, "owners", {}).items()]
    return f"sweep {plan.spec.name}: {len(plan.runs)} run(s) in {plan.sweep_dir}: {', '.join(parts)}" + "".join(owned)


def _print_dry_run(plan, workers: int | None, cluster_max: Callable[[], int] | None) -> None:
    from armorlab.sweeps.spec import describe_run

    lines = [_summary(plan), ""]
    lines += [f"{r.run_id}  {plan.actions[r.run_id]:<16}  {describe_run(r)}" for r in plan.runs]
    lines.append("")
    lines += _protocol_lines(plan)
    lines += _controls_lines(plan)
    todo = plan.to_submit
    if plan.executor == "slurm":
        from armorlab.sweeps.executors import SlurmSubmitter, n_arrays
        from armorlab.sweeps.submit import dependency_groups

        sub = SlurmSubmitter(plan.sweep_dir, plan.profile, job_name=plan.spec.name)
        chunk = sub.chunk_size(cluster_max())
        groups = dependency_groups(plan, [(r.run_id, None) for r in todo])
        n = sum(n_arrays(len(g), chunk) for _, g in groups)
        lines.append(f"would submit {len(todo)} run(s) as {n} Slurm job array(s) of at most {chunk} (cluster "
                     f"MaxArraySize {cluster_max()}, array_parallelism {plan.profile.array_parallelism})")
        lines += [f"  {len(g)} run(s) after the job of {parent} completes (--dependency=afterok, "
                  "--kill-on-invalid-dep=yes)" for parent, g in groups if parent is not None]
        if todo:
            first_parent, first = groups[0]
            if first_parent is not None:
                sub.dependency = f"<the job of {first_parent}>"
            lines += ["", "# sbatch script of the first array:", sub.sbatch_text(min(len(first), chunk))]
    else:
        waits = sum(1 for r in todo if r.parent is not None and plan.actions.get(r.parent) == "submit")
        lines.append(f"would train {len(todo)} run(s) on this machine, {workers or plan.profile.workers} at a "
                     "time" + (f"; {waits} of them once the run they continue from has completed" if waits else ""))
    if todo and plan.profile.gpu_memory_gb is not None:
        from armorlab.sweeps.memory import plan_runs, summary

        lines.append("")
        lines += [summary(memory, ids) for memory, ids in plan_runs(plan.profile, todo, file=plan.spec.file)]
    if todo:
        from armorlab.sweeps.jobs import train_argv

        argv = train_argv("<run dir>", **{k: v for k, v in plan.profile.launch_options().items() if k != "vllm_servers"})
        if plan.profile.vllm_servers is not None:
            from armorlab.vllm.servers import describe

            lines += ["", *describe(plan.profile.vllm_servers, python=plan.profile.python, trainer_argv=argv)]
        else:  # the sbatch script runs a job runner: say what the job itself starts for each run
            import shlex

            python = plan.profile.python or shlex.quote(argv[0])  # the profile's shell text, as written
            lines += ["", f"each run is trained by: {python} {shlex.join(argv[1:])}"]
    sys.stdout.write("\n".join(lines) + "\n")


def _protocol_lines(plan) -> list[str]:
    """Per stage, how its runs sample anchors and refill, and their horizon, from the resolved configs."""
    from collections import Counter

    from armorlab.sweeps.controls import effective

    lines = []
    for stage in dict.fromkeys(r.stage for r in plan.runs):
        seen: Counter = Counter()
        for r in (r for r in plan.runs if r.stage == stage):
            c = effective(r.config)
            anchors = ("no reference draws" if not (c["anchor"] or c["anchor_gate"]) else
                       "reference draws (anchors, gate) afresh every batch" if c["anchor_cache"] == "off" else
                       "reference draws reused until π_ref resets (anchor_cache: window)")
            refill = ("no refill" if not (c["dynamic_sampling"] or c["anchor_gate"]) else
                      f"refill ≤ {c.get('max_num_gen_batches', 1)} generation batch(es) of "
                      f"{c.get('dynamic_sampling_factor') or 1}× the prompts")
            horizon = (f"{c['max_rollouts']} rollouts" if c.get("max_rollouts") else f"{c['max_steps']} steps")
            seen[f"{anchors}; {refill}; {horizon}"] += 1
        where = f" of stage {stage}" if stage is not None else ""
        lines.append(f"protocol{where} (resolved configs; where each value comes from: the spec's comments, docs/papers.md):")
        lines += [f"  {n} run(s): {text}" for text, n in seen.items()]
    return [*lines, ""] if lines else []


def _controls_lines(plan) -> list[str]:
    """For each compared pair of a sweep declared as controls: the keys in which the arms differ,
    and a warning under a pair whose effective batches differ (``_batch_warnings``)."""
    warned: dict[int, list[str]] = {}
    for pair, note in _batch_warnings(plan):
        warned.setdefault(id(pair), []).append(note)
    lines = []
    for stage, pairs in plan.controls:
        where = f" of stage {stage}" if stage is not None else ""
        lines.append(f"controls{where}: each arm against its baseline, the keys in which they differ")
        for baseline in dict.fromkeys(p.baseline for p in pairs):
            lines.append(f"  baseline {baseline}")
            for p in (p for p in pairs if p.baseline == baseline):
                lines.append(f"    {p.describe()}")
                lines += [f"      warning: {note}" for note in warned.get(id(p), ())]
        lines.append("")
    return lines


def _batch_warnings(plan) -> list:
    """(pair, note) for each compared pair whose effective batches differ: configured, and measured
    on the runs of both arms that have completed (armorlab.sweeps.controls.batch_notes)."""
    from armorlab.sweeps.controls import batch_notes, run_shortfalls

    pairs = [p for _, stage_pairs in plan.controls for p in stage_pairs]
    if not pairs:
        return []
    done = [(r.run_id, r.view) for r in plan.runs if plan.actions.get(r.run_id) == "completed"]
    return batch_notes(pairs, run_shortfalls(plan.sweep_dir, done))


def _submit_slurm(plan, wait: bool) -> None:
    from armorlab.sweeps.submit import submit_slurm

    typer.echo(_summary(plan))
    job_ids = submit_slurm(plan)
    if job_ids:
        arrays = sorted({j.split("_", 1)[0] for j in job_ids}, key=int)
        typer.echo(f"queued {len(job_ids)} run(s) as Slurm job(s) {', '.join(arrays)}; "
                   f"follow with: armorlab status {plan.sweep_dir} --watch")
    else:
        typer.echo("nothing to submit")
    if wait:
        _watch(plan.sweep_dir, 5.0)


def run_plan_locally(plan, workers: int | None, *, detach: bool = False, exit_on_failure: bool = True) -> list[str]:
    """Train a plan's runs here with a progress bar (also used by `armorlab demo`); returns the
    runs that failed (exit 1 when one did, unless not ``exit_on_failure``)."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from armorlab.commands import console as make_console
    from armorlab.sweeps.submit import run_local

    console = make_console(stderr=True)
    console.print(_summary(plan))
    n = len(plan.to_submit)
    if not n:
        console.print("nothing to run")
        return []
    from armorlab.sweeps.executors import thread_note
    from armorlab.sweeps.spec import describe_run

    console.print(thread_note(workers or plan.profile.workers))
    labels = {r.run_id: describe_run(r) for r in plan.runs}
    failed: list[str] = []
    started = done = 0
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task(f"training {plan.spec.name}", total=n)

        def on_event(event: str, run_id: str, payload) -> None:
            # a line per start and end, with the run's stage and point: in a log file the bar shows nothing
            nonlocal started, done
            if event == "start":
                started += 1
                progress.console.print(f"[{started}/{n}] started {run_id} {labels.get(run_id, '')}",
                                       markup=False, highlight=False)
            if event != "done":
                return
            done += 1
            progress.advance(task)
            mark = {"completed": "[green]completed[/]", "stopped": "[green]stopped[/]", "failed": "[red]failed[/]"}.get(
                payload.state, f"[yellow]{payload.state}[/]")
            reason = f": {escape(payload.reason)}" if payload.reason else ""
            progress.console.print(f"[{done}/{n} done] {run_id} {escape(labels.get(run_id, ''))} {mark}{reason}")
            if payload.state == "failed":
                failed.append(run_id)

        try:
            run_local(plan, workers=workers, on_event=on_event, detach=detach)
        except KeyboardInterrupt:
            progress.stop()
            console.print("stopped: running trainers checkpointed; run the same command again to resume")
            raise typer.Exit(130) from None
    console.print(f"results in {plan.sweep_dir}; see: armorlab status {plan.sweep_dir}")
    if failed and exit_on_failure:
        raise typer.Exit(1)
    return failed


# --------------------------------------------------------------------------- until resolved
def _until_resolved(spec: Path, *, root: Path, executor: str | None, profile: Path | None, overrides,
                    retry_failed: bool, max_seeds: int | None, seeds_per_look: int | None, workers: int | None,
                    detach: bool, dry_run: bool, wait: bool) -> None:
    """Seeds in looks until resolved (armorlab.sweeps.until_resolved): locally a foreground loop,
    on Slurm the look's arrays and a decision job that carries the chain on by itself."""
    from armorlab.commands import console as make_console
    from armorlab.sweeps.submit import load_sweep
    from armorlab.sweeps.until_resolved import Chain, advance, describe, look_line

    console = make_console(stderr=True)
    cluster_max = None
    if dry_run:
        from armorlab.sweeps import slurmctl

        cluster_max = slurmctl.max_array_size_later()
    try:
        spec_, prof, executor = load_sweep(spec, executor=executor, profile=profile, overrides=overrides)
        chain = Chain(spec_, prof, executor, root=root, max_seeds=max_seeds, seeds_per_look=seeds_per_look,
                      retry_failed=retry_failed)
        if dry_run:
            st = chain.stand()
            sys.stdout.write("\n".join(describe(st, chain)) + "\n\n")
            if not st.finished:
                _print_dry_run(st.plan, workers, cluster_max)
            return
    finally:
        if cluster_max is not None:
            cluster_max()

    def on_look(look, design) -> None:
        console.print(look_line(look, design), soft_wrap=True)

    if executor == "slurm":
        st = advance(chain, by="armorlab sweep", on_look=on_look)
        typer.echo("\n".join(describe(st, chain)))
        if wait:
            st = _wait_chain(chain, st, on_look)
        if st.stopped:
            raise typer.Exit(1)
        return
    progress = None
    while True:
        st = advance(chain, by="local", on_look=on_look)
        if st.finished or st.stopped:
            typer.echo("\n".join(describe(st, chain)))
            if st.stopped:
                raise typer.Exit(1)
            return
        done = (len(st.looks), sum(a == "completed" for a in st.plan.actions.values()))
        if not st.plan.to_submit or done == progress:
            typer.echo("\n".join(describe(st, chain)))
            typer.echo(f"look {st.look}: its runs are running elsewhere; run this command again once they end"
                       if not st.plan.to_submit else
                       f"look {st.look}: its runs stopped without completing; run this command again to resume them")
            return
        progress = done
        console.print(f"look {st.look}: " + ", ".join(f"{a} {n}" for a, n in st.want.items()) + " seeds per arm")
        run_plan_locally(st.plan, workers, detach=detach, exit_on_failure=False)


def _wait_chain(chain, st, on_look, interval: float = 5.0):
    """--wait on Slurm: show each look as its decision job records it, until the chain ends (or no
    decision job is left to carry it on: then say where it stands)."""
    from armorlab.sweeps import slurmctl
    from armorlab.sweeps.until_resolved import describe

    seen, idle = len(st.looks), 0
    while not (st.finished or st.stopped) and idle < 2:
        time.sleep(interval)
        st = chain.stand()
        for look in st.looks[seen:]:
            on_look(look, st.design)
        seen = len(st.looks)
        jobs = [d["job_id"] for d in st.chain.get("decision_jobs", ())]
        live = jobs and any(slurmctl.is_active(s) for s in slurmctl.squeue_states(jobs).values())
        idle = 0 if live else idle + 1  # twice in a row: one decision job hands over to the next
    typer.echo("\n".join(describe(st, chain)))
    return st


# --------------------------------------------------------------------------- status
def _status_table(st):
    from rich.table import Table

    table = Table(title=f"{st.sweep_dir}  " + "  ".join(f"{k}: {v}" for k, v in sorted(st.counts.items())),
                  title_justify="left")
    for col in ("run", "config", "state", "step", "val/acc", "job", "att.", "procs", "reason"):
        # narrow terminals squeeze config/job/reason, never the short columns
        table.add_column(col, overflow="fold", no_wrap=col in ("run", "state", "step", "val/acc", "att.", "procs"),
                         min_width=14 if col == "config" else None)
    colour = {"completed": "green", "stopped": "green", "failed": "red", "running": "cyan", "queued": "blue", "lost": "magenta"}
    for r in st.rows:
        step = "-" if r.last_step is None else f"{r.last_step}/{r.max_steps if r.max_steps else '?'}"
        table.add_row(r.run_id, r.point, f"[{colour.get(r.state, 'white')}]{r.state}[/]", step,
                      "-" if r.val_acc is None else f"{r.val_acc:.3f}", r.slurm_state or "-", str(r.attempts),
                      "-" if r.world_size is None else str(r.world_size), _clip(r.reason or "", 200))
    return table


def _clip(text: str, limit: int) -> str:
    """A reason as a table or a line shows it: rich lays out every character, and a 100 KB reason
    (a pasted log) took it a minute; the whole text stays in the run's status.json."""
    from rich.markup import escape  # a reason is text, not rich markup

    return escape(text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters; all in status.json)")


def _print_status(st) -> None:
    from armorlab.commands import console as make_console

    console = make_console()
    console.print(_status_table(st))
    for r in st.rows:  # in full: a narrow table folds the reason column
        if r.state == "failed" and r.reason:
            console.print(f"[red]failed[/] {r.run_id}: {_clip(r.reason, 2000)}", soft_wrap=True)
        for w in r.warnings:
            console.print(f"[yellow]warning[/] {r.run_id}: {_clip(w, 2000)}", soft_wrap=True)
    if st.looks:
        console.print(st.looks, soft_wrap=True)
    if st.warning:
        console.print(f"[yellow]{st.warning}[/]")


def _watch(sweep_dir: Path, interval: float) -> None:
    from rich.console import Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from armorlab.sweeps.status import collect

    st = collect(sweep_dir)
    bar = Progress(TextColumn("finished"), BarColumn(), MofNCompleteColumn())
    task = bar.add_task("runs", total=len(st.rows))
    with Live(Group(_status_table(st), bar), refresh_per_second=2) as live:
        while True:
            done = sum(r.state in ("completed", "stopped", "failed") for r in st.rows)
            bar.update(task, completed=done, total=len(st.rows))
            live.update(Group(_status_table(st), bar))
            if st.finished:
                break
            time.sleep(interval)
            st = collect(sweep_dir)
    if st.warning:
        typer.echo(st.warning, err=True)
