"""`armorlab evaluate RUN_DIR...`: score each run's kept checkpoints on its val and test splits (evaluation.json)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("evaluate")
    def evaluate(
        run_dirs: list[Path] = typer.Argument(..., help="Run directories (each keeps its checkpoints)."),
        samples: int = typer.Option(None, "--samples", help="Completions per prompt (avg@k); default: the "
                                    "run's val_samples, which reproduces its logged test/acc."),
    ) -> None:
        """Score the kept checkpoints (selected, best, last) of finished runs; writes RUN_DIR/evaluation.json."""
        from armorlab.train.evaluate_kept import evaluate_kept

        for run_dir in run_dirs:
            record = evaluate_kept(run_dir, samples=samples)
            typer.echo(f"{run_dir}: avg@{record['samples']}")
            for row in record["checkpoints"]:
                mark = " (selected)" if row["selected"] else ""
                scores = "  ".join(f"{k} {row[k]:.4f}" for k in ("val/acc", "test/acc", "test/pass@k") if k in row)
                typer.echo(f"  {row['checkpoint']:<28} step {row['step']:>6}  rollout {row['rollout']:>5}  "
                           f"{scores}  test/n {row.get('test/n', 0):.0f}{mark}")
