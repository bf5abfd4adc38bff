"""`armorlab demo`: over-optimisation and its remedies on embedded defaults, then the report.

The spec ships with the package (armorlab/demo.yaml), so the demo runs from any install: local
executor, the tiny warm-started model, the synthetic scratchpad task, CPU, offline. It follows the
ARMOR paper's continual protocol in two stages: one DAPO run from the warm start (stage ``dapo``)
selects its greedy held-out peak (selected.json), and every arm of stage ``continue`` — DAPO,
ARMOR with π_ref = that peak, ARMOR and DAPO + KL with π_ref = the warm start, three seeds each —
starts from that checkpoint. While it trains, a live table shows every run's stage, rollout and
held-out accuracy. Running it again resumes: completed runs are kept, interrupted ones continue from their
checkpoints, and the report is rendered again. The report (of the continuing arms) and the printed
headline open with the verdicts (armorlab.stats.verdicts: each remedy better, worse, equivalent
or not resolved against continued DAPO, with the seeds that would resolve it), then the headline
(armorlab.analysis.headline): stage 1's rise to the selected peak, DAPO's fall from it in standard
errors, and each remedy against DAPO, in plain sentences; then whether each remedy's mechanism
acted (armorlab.analysis.mechanism_table).
"""

from __future__ import annotations

import contextlib
import math
import threading
from pathlib import Path
from typing import Any

import typer

DEMO_SPEC = Path(__file__).resolve().parent.parent / "demo.yaml"
EFFECTIVE_SPEC = "demo-spec.yaml"
GROUP_BY = ["objective", "beta", "anchor_gate", "ref_from"]
METRIC, REPORT_METRIC = "val/acc_greedy", "test/acc_greedy"  # greedy held-out accuracy: selection and verdicts
# The equivalence margin, declared before the demo's arms ran (docs/verdicts.md#margins): half the fall
# that continued DAPO showed in a 2-seed pilot of this setting (greedy held-out accuracy 0.79 at its
# start → final levels 0.630 and 0.613: a mean fall of 0.17). analysis/demo.yaml and
# sweeps/toy_collapse.yaml declare the same.
DELTA = 0.085
BASELINE = {"objective": "dapo", "beta": 0.0, "anchor_gate": False}
HEADLINE_FILE = "headline"
FIRST_STAGE = "dapo"  # the spec's stage 1: one DAPO run whose selected checkpoint every arm continues from


def effective_spec(root: Path, overrides: list[str]) -> Path:
    """The packaged spec with ``--set`` overrides merged into its base and every stage's base (an
    override wins over what a stage sets), written to ROOT/demo-spec.yaml."""
    from armorlab.core.config import deep_merge, load_yaml_mapping, parse_overrides
    from armorlab.core.fsutil import atomic_write_yaml

    spec = load_yaml_mapping(DEMO_SPEC)
    over = parse_overrides(overrides)
    spec["base"] = deep_merge(spec["base"], over)
    for stage in spec.get("stages") or ():
        if over and stage.get("base") is not None:
            stage["base"] = deep_merge(stage["base"], over)
    path = root / EFFECTIVE_SPEC
    atomic_write_yaml(path, spec)
    return path


def demo_name(cfg: Any) -> str:
    """Short name of a demo run from its (flattened or nested) config: dapo, dapo + KL β=0.1, up,
    armor, gate only; with where π_ref is when it is not where the arm starts (the selected peak)."""
    get = cfg.get
    objective, beta = get("objective"), get("beta") or 0.0
    if objective == "dapo" and not get("anchor") and get("anchor_gate"):
        name = "gate only"
    else:
        name = f"{objective} + KL β={beta:g}" if beta else str(objective)
    ref = get("ref_from")
    if ref == "model":
        return f"{name} (π_ref = warm start)"
    if objective == "armor" or beta or get("anchor_gate"):
        return f"{name} (π_ref = peak)"
    return name


def demo_recipe(run_dirs: list[Path]):
    """The arms continuing from stage 1 over seeds, in rollouts: greedy held-out accuracy selected on
    val and reported on test, verdicts against DAPO at the declared margin and P(X > DAPO)."""
    from armorlab.analysis.recipe import parse_recipe
    return parse_recipe({
        "title": "armorlab demo: DAPO over-optimises 32 training prompts; which remedy prevents it? "
                 "(tiny model, scratchpad sums)",
        "runs": [str(p) for p in run_dirs],
        "group_by": GROUP_BY,
        "x": "rollout",
        "curves": ["val/acc_greedy", "val/acc", "train/reward", "train/correct_distinct", "train/correct_entropy",
                   "train/entropy", "kl/reverse_k3", "kl/exact_reverse", "obj/clip_frac", "obj/widened_frac", "obj/freed_frac",
                   "obj/anchor_grad_share", "obj/kl_grad_share", "anchor/gate_drop", "train/grad_norm"],
        "select": {"metric": METRIC, "mode": "max", "report": REPORT_METRIC},
        "compare": {"baseline": BASELINE, "endpoints": ["final", "drop", "selected_test"], "delta": DELTA},
    }, name="demo")


def stage_one_sentence(run_dirs: list[Path]) -> str | None:
    """Stage 1 in words: where DAPO's held-out accuracy started, the peak it selected (selected.json)
    and where it ended, in rollouts; None when no stage-1 run has metrics yet."""
    import json

    from armorlab.core.runs import RunDir

    parts = []
    for path in run_dirs:
        rd = RunDir(path)
        if not rd.metrics_path.exists():
            continue
        evals = [(row.get("rollout"), row[METRIC]) for row in rd.read_metrics() if row.get(METRIC) is not None]
        if not evals:
            continue
        text = f"stage 1 (DAPO from the warm start, seed {rd.read_config().get('seed')}): {METRIC} {evals[0][1]:.3f}"
        selected = path / "selected.json"
        if selected.is_file():
            from armorlab.core.fsutil import SMALL_FILE_BYTES, read_regular_text

            pick = json.loads(read_regular_text(selected, limit=SMALL_FILE_BYTES))
            text += f" → selected peak level {pick['value']:.3f} at rollout {pick.get('rollout')}"
        text += f" → {evals[-1][1]:.3f} at rollout {evals[-1][0]}"
        parts.append(text)
    if not parts:
        return None
    return "; ".join(parts) + (". Every arm below continues from the selected checkpoint, with π_ref = that "
                               "checkpoint (rollout 0 of their curves).")


def group_names(per_run, rs) -> dict[str, str]:
    """Each group's short demo name (demo_name of its first run's config)."""
    by_run = rs.runs.set_index("run_id")
    return {g: demo_name(by_run.loc[per_run.loc[per_run["group"] == g, "run_id"].iloc[0]])
            for g in dict.fromkeys(per_run["group"])}


def headline_section(state: dict[str, Any]):
    """``lead`` for build_report: the headline table + verdict, also kept in ``state`` for the terminal."""
    from armorlab.analysis import headline as H
    from armorlab.analysis import tables
    from armorlab.analysis.groups import fmt_value
    from armorlab.analysis.html import Section, esc

    def lead(per_run, rs, out: Path):
        runs = H.run_rows(per_run, rs.curve, val_metric=METRIC)
        by_run = rs.runs.set_index("run_id")
        names = group_names(per_run, rs)
        state["names"] = names
        baseline = None
        for g in names:
            cfg = by_run.loc[per_run.loc[per_run["group"] == g, "run_id"].iloc[0]]
            if all(fmt_value(cfg.get(k)) == fmt_value(v) for k, v in BASELINE.items()):
                baseline = g
        table = H.group_rows(runs, list(names), baseline)
        shown = H.display(table, baseline, unit=rs.counter)
        shown["group"] = shown["group"].map(names)
        shown = shown.rename(columns={f"P(final > {baseline})": f"P(final > {names.get(baseline, 'dapo')})"})
        sentences = H.verdict(table, baseline, names, unit=rs.counter)
        if state.get("stage_one"):
            sentences.insert(0, state["stage_one"])
        tables.write_table(shown, out / "tables" / HEADLINE_FILE.replace("headline", "demo_headline"),
                           formats=("md", "csv"), caption="demo headline: means over seeds")
        runs.to_csv(out / "tables" / "demo_runs.csv", index=False)
        state.update(table=shown, sentences=sentences, runs=runs)
        intro = ("<p>Held-out accuracy (<code>val/acc_greedy</code>, one greedy completion per prompt) of each "
                 "arm continuing from stage 1's selected checkpoint: where it starts (that checkpoint), "
                 "its peak and where it ends (levels: means of 3 evals), and the drop from the peak in standard "
                 "errors of the eval noise (binomial, from <code>val/n_greedy</code>); collapsed: seeds whose fall the "
                 "noise cannot explain (see Results per group). P(final &gt; dapo): the chance that a seed of "
                 "the row ends above a seed of DAPO (ties ½).</p>" + "".join(f"<p>{esc(s)}</p>" for s in sentences))
        return Section("Headline: does DAPO over-optimise, and which remedy prevents it?", intro=intro,
                       tables=[("", shown)])

    return lead


def _progress(r, rows: list[dict]) -> str:
    """``rollout/max_rollouts`` (or ``step/max_steps`` for a run counted in optimizer steps)."""
    last = rows[-1] if rows else {}
    if r.config.get("max_rollouts"):
        return f"{last.get('rollout', 0)}/{r.config['max_rollouts']}"
    return f"{last.get('step', 0)}/{r.config['max_steps']}"


def _live_table(plan, root: Path):
    """A rich renderable: one row per run with its stage, progress, last and best held-out accuracy."""
    from rich.table import Table

    from armorlab.core.runs import RunDir

    def render():
        t = Table(title=f"armorlab demo — {len(plan.runs)} runs in {root / plan.spec.name}", expand=False)
        for col in ("run", "stage", "arm", "seed", "state", "rollout", "greedy acc now", "peak", "train reward"):
            t.add_column(col, justify="right" if col not in ("run", "stage", "arm", "state") else "left")
        for r in plan.runs:
            rd = RunDir(plan.sweep_dir / r.run_id)
            state = rd.read_status()["state"] if rd.status_path.exists() else "pending"
            progress, val, peak, reward = "", "", "", ""
            if rd.metrics_path.exists():
                rows = rd.read_metrics()
                vals = [x[METRIC] for x in rows if x.get(METRIC) is not None]
                rewards = [x["train/reward"] for x in rows if x.get("train/reward") is not None]
                progress = _progress(r, rows)
                if vals:
                    val, peak = f"{vals[-1]:.3f}", f"{max(vals):.3f}"
                if rewards:
                    reward = f"{sum(rewards[-10:]) / len(rewards[-10:]):.2f}"
            color = {"completed": "green", "failed": "red", "running": "yellow"}.get(state, "dim")
            t.add_row(r.run_id, r.stage or "", demo_name(r.config), str(r.config.get("seed")),
                      f"[{color}]{state}[/]", progress, val, peak, reward)
        return t

    return render


def run_with_live_table(plan, workers: int, root: Path) -> list[str]:
    """Train the plan's pending runs with a live per-run table; returns the ids of failed runs."""
    from rich.live import Live

    from armorlab.commands import console as cli_console
    from armorlab.sweeps.submit import run_local

    console = cli_console(stderr=True)
    failed: list[str] = []
    render = _live_table(plan, root)
    if not plan.to_submit:
        console.print(render())
        console.print("all runs already completed: re-rendering the report")
        return failed

    names = {r.run_id: f"{demo_name(r.config)} seed {r.config.get('seed')}" for r in plan.runs}
    done = [len(plan.runs) - len(plan.to_submit)]

    def on_event(event: str, run_id: str, payload) -> None:
        # one line per finished run, above the live table: the progress a log file (CI) keeps
        if event != "done":
            return
        done[0] += 1
        reason = f": {payload.reason}" if payload.reason else ""
        console.print(f"[{done[0]}/{len(plan.runs)}] {run_id} {names.get(run_id, '')} {payload.state}{reason}",
                      highlight=False)
        if payload.state == "failed":
            failed.append(f"{run_id}: {payload.reason}")

    stop = threading.Event()
    with Live(render(), console=console, refresh_per_second=1, transient=False) as live:
        def refresh():
            while not stop.wait(2.0):
                with contextlib.suppress(Exception):  # a torn status file must not stop the display
                    live.update(render())
        thread = threading.Thread(target=refresh, daemon=True)
        thread.start()
        try:
            run_local(plan, workers=workers, on_event=on_event)
        except KeyboardInterrupt:
            stop.set()
            console.print("stopped: running trainers checkpointed; run the same command again to resume")
            raise typer.Exit(130) from None
        finally:
            stop.set()
            thread.join(timeout=5)
        live.update(render())
    return failed


def print_headline(state: dict[str, Any], verdicts: list[str] | tuple[str, ...] = ()) -> None:
    """The verdicts (one sentence per remedy against DAPO), then the headline table and its sentences."""
    from rich.table import Table

    from armorlab.commands import console as cli_console

    console = cli_console()
    if verdicts:
        console.print("verdicts against DAPO (Welch interval, Holm-adjusted over the remedies):",
                      highlight=False)
        for v in verdicts:
            console.print(f"  {v}", highlight=False)
    table = state.get("table")
    if table is None:
        return
    t = Table(title="headline (means over seeds; val/acc_greedy = accuracy of one greedy completion per held-out "
                    "prompt)")
    for col in table.columns:
        t.add_column(str(col))
    for row in table.itertuples(index=False):
        t.add_row(*[str(v) for v in row])
    console.print(t)
    for s in state.get("sentences", []):
        console.print(s, highlight=False)


MECHANISM_COLUMNS = {  # tables/mechanisms.csv column → the terminal's short header
    "obj/clip_frac": "clipped", "obj/widened_frac": "widened", "obj/freed_frac": "freed of clipped",
    "obj/narrowed_frac": "narrowed",
    "anchor/gate_drop": "gate drop", "obj/anchor_grad_share": "anchor grad", "obj/kl_grad_share": "KL grad",
    "obj/kl_grad_cos": "cos(KL, pg)", "grad_clipped": "grad clipped",
}


def print_mechanisms(out: Path, names: dict[str, str]) -> None:
    """Whether each remedy's mechanism acted (the report's tables/mechanisms.csv: means over seeds of
    each run's mean over steps), one row per arm."""
    import csv

    from rich.table import Table

    from armorlab.commands import console as cli_console

    path = out / "tables" / "mechanisms.csv"
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        return
    cols = [c for c in MECHANISM_COLUMNS if c in rows[0]]
    t = Table(title="did each mechanism act? (share of tokens / steps; means over seeds and steps; docs/metrics.md)")
    for col in ["arm", *(MECHANISM_COLUMNS[c] for c in cols), "distinct correct"]:
        t.add_column(col)

    def f(v: str | None) -> str:
        try:
            x = float(v) if v not in (None, "") else math.nan
        except ValueError:
            return str(v)
        return "—" if math.isnan(x) else f"{x:.3f}"

    for r in rows:
        diversity = (f"{f(r.get('correct_distinct_start'))} → {f(r.get('correct_distinct_end'))}"
                     if r.get("correct_distinct_start") else "—")
        t.add_row(names.get(r["group"], r["group"]), *(f(r.get(c)) for c in cols), diversity)
    cli_console().print(t)


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        root: Path = typer.Option(Path("demo-runs"), "--root", help="Runs go to ROOT/demo/<run id>/."),
        out: Path = typer.Option(Path("reports/demo"), "--out", help="Where the report is written."),
        workers: int = typer.Option(2, "--workers", "-w", help="Parallel trainings (they split the cores)."),
        set_: list[str] = typer.Option([], "--set", help="Override a base key of every run, e.g. "
                                       "--set max_rollouts=6 (changes the run ids)."),
    ) -> None:
        """Run the over-optimisation demo (one DAPO run to its selected peak, then dapo, armor with
        π_ref = that peak, armor and dapo + KL with π_ref = the warm start × 3 seeds continuing from
        it; tiny model, CPU), then write its report and print the verdicts and the headline."""
        import time

        from armorlab.commands.report import write_report
        from armorlab.sweeps.submit import plan_sweep

        started = time.perf_counter()
        plan = plan_sweep(effective_spec(root, set_), root=root, executor="local")
        failed = run_with_live_table(plan, workers, root)
        first = [plan.sweep_dir / r.run_id for r in plan.runs if r.stage == FIRST_STAGE]
        arms = [plan.sweep_dir / r.run_id for r in plan.runs if r.stage != FIRST_STAGE]
        state: dict[str, Any] = {"stage_one": stage_one_sentence(first)}
        summary = write_report(demo_recipe(arms), out, lead=headline_section(state), verdicts=False,
                               names=group_names)
        print_headline(state, summary.get("verdicts", ()))
        print_mechanisms(out, state.get("names", {}))
        minutes = (time.perf_counter() - started) / 60
        typer.echo(f"demo finished in {minutes:.1f} min" if not math.isnan(minutes) else "demo finished")
        if failed:
            for f in failed:
                typer.echo(f"failed: {f}", err=True)
            raise typer.Exit(1)
