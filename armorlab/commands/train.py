"""`armorlab train`: resolve a config, write its run directory, train in it (resuming if possible).

Exit codes (the process contract sweeps rely on, armorlab.core.exits): 0 completed, 1 failed,
2 user/config error, 73 another process trains this run dir, 74 the disk is full (free space, run
it again to resume), 75 preempted (checkpointed; run it again to resume).
"""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        config: Path = typer.Argument(None, help="YAML run config; omit to train on the defaults."),
        set_: list[str] = typer.Option([], "--set", help="Override a key: --set alpha=0.7 --set task.digits=3"),
        out: Path = typer.Option(Path("runs/train"), "--out", help="Root: the run goes to OUT/<run-id>/."),
        run_dir: Path = typer.Option(None, "--run-dir", help="Train the config already in this run dir "
                                     "(what sweep jobs do); resumes from its last checkpoint."),
    ) -> None:
        """Train one run (TRL GRPOTrainer subclass) and record it in a run directory."""
        from armorlab.train.launch import is_main_process, train_from_config, train_run_dir

        if run_dir is not None:
            if config is not None or set_:
                from armorlab.errors import ArmorLabError

                raise ArmorLabError("--run-dir trains the config stored there; drop CONFIG/--set",
                                    key="--run-dir", value=str(run_dir))
            outcome = train_run_dir(run_dir)
        else:
            outcome = train_from_config(config, set_, out)
        if is_main_process():  # one line per run, not one per process
            typer.echo(str(outcome.path))
            if outcome.already_completed:
                typer.echo(f"already {outcome.state}: {outcome.path} (nothing trained; delete the dir to train it "
                           "again)", err=True)
            if outcome.note:
                typer.echo(f"note: {outcome.note}", err=True)
            if outcome.state != "completed":
                typer.echo(f"{outcome.state}: {outcome.reason}", err=True)
            for warning in outcome.warnings:
                typer.echo(f"warning: {warning}", err=True)
        if outcome.exit_code:
            raise typer.Exit(outcome.exit_code)
