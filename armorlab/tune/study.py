"""Optuna studies whose trials are runs: ``armorlab tune`` and what reports need from a study.

A study spec is a sweep spec with a ``search:`` section (armorlab.tune.space). Its study dir is
``<root>/<name>/``: one run dir per trial seed (ordinary runs: ``armorlab status`` and ``armorlab
report`` work on them) plus ``.tune/`` (study.json, spec copy, journal storage, locks, logs) and
``.submitit/`` for Slurm workers. Hidden dirs are skipped by run-dir discovery.

Public API::

    load_study_spec(path) -> (SweepSpec, SearchSpec)
    prepare_study(spec_path, root="runs", storage=None) -> StudyContext     # creates or resumes
    run_local(ctx, workers) -> dict                                         # N worker processes
    submit_slurm(ctx, workers, profile) -> list[submitit.Job]               # job array of workers
    study_status(study_dir, top=10) -> dict                                 # the --status table
    write_study_plots(study_dir, out_dir) -> list[Path]                     # for `armorlab report`
    is_study_dir(path) -> bool

Module import stays light (no optuna, submitit or pandas, so ``armorlab report``, which asks
``is_study_dir``, and ``--help`` do not pay for them): the functions import the modules that load
them where they need them, each marked ``# lazy``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from armorlab.core.config import resolve
from armorlab.core.fsutil import (
    SMALL_FILE_BYTES,
    atomic_write_json,
    atomic_write_yaml,
    open_append,
    read_regular_text,
    writable_dir,
)
from armorlab.errors import ArmorLabError
from armorlab.sweeps.sbatch import checked_executor
from armorlab.sweeps.spec import load_spec
from armorlab.tune.secrets import redact, remember, split_password, ssl_password, worker_env
from armorlab.tune.space import parse_search

log = logging.getLogger(__name__)

TUNE_DIR = ".tune"  # == backend.TUNE_DIR (not imported: that module imports optuna)
STUDY_FILE = "study.json"


def is_study_dir(path: str | os.PathLike) -> bool:
    """True for a directory made by ``armorlab tune`` (it holds ``.tune/study.json``)."""
    return (Path(path) / TUNE_DIR / STUDY_FILE).is_file()


def searched_keys(study_dir: str | os.PathLike) -> list[str]:
    """The config keys a study searches (its search.space), read from .tune/study.json alone."""
    import json

    try:
        data = json.loads(read_regular_text(Path(study_dir) / TUNE_DIR / STUDY_FILE, limit=SMALL_FILE_BYTES))
        space = data["search"]["space"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [k for k in space if isinstance(k, str)] if isinstance(space, dict) else []


# --------------------------------------------------------------------------- spec → study dir
def load_study_spec(path: str | os.PathLike) -> tuple[Any, Any]:
    """Read a study spec: the sweep spec part (armorlab.sweeps.spec) plus its validated search."""

    spec = load_spec(path)
    if spec.search is None:
        raise ArmorLabError("a study spec needs a `search:` section (for a grid use `armorlab sweep`)",
                            key="search", value=None, file=spec.file)
    for key in ("grid", "include", "exclude"):
        if getattr(spec, key):
            raise ArmorLabError(f"`{key}:` does not mix with `search:`; put fixed values in `base:` and "
                                "searched ones in search.space (categorical for a list)", key=key,
                                value=getattr(spec, key), file=spec.file)
    base_cfg = resolve(spec.base, file=spec.file)
    search = parse_search(spec.search, spec.base, file=spec.file)
    for obj in search.objectives:
        if obj.metric.split("/")[0] in ("val", "test") and not base_cfg["val_every"]:
            raise ArmorLabError(f"objective metric {obj.metric} needs validation: set base.val_every > 0",
                                key="base.val_every", value=base_cfg["val_every"], file=spec.file)
    return spec, search


def prepare_study(spec_path: str | os.PathLike, *, root: str | os.PathLike = "runs",
                  storage: str | None = None) -> Any:
    """Validate the spec, write ``<root>/<name>/.tune/`` and create (or load) the study.

    Storage precedence: ``storage`` (--storage) > the spec's ``search.storage`` > the storage
    this study dir was created with > the journal file. Running it again resumes the study.
    """
    # lazy: optuna
    from armorlab.tune.backend import open_storage, open_study, rdb_url, storage_options

    # lazy: optuna
    from armorlab.tune.worker import StudyContext

    spec, search = load_study_spec(spec_path)
    study_dir = writable_dir(root, key="--root") / spec.name
    prior = StudyContext.load(study_dir) if is_study_dir(study_dir) else None
    url = storage or search.storage or (prior.storage_url if prior else None)
    if url is not None:
        url = keep_password_out(url, key="--storage" if storage else "search.storage", file=spec.file)
        rdb_url(url)  # a missing driver fails here, before the study dir or any worker exists
        if search.storage:
            spec.search["storage"] = split_password(search.storage)[0]
            search = dataclasses.replace(search, storage=split_password(search.storage)[0])
    if prior is not None and prior.storage_url != url:
        log.warning("study %s was stored in %s; now using %s", spec.name,
                    redact(prior.storage_url) if prior.storage_url else "its journal",
                    redact(url) if url else "the journal file")
    seeds = list(spec.seeds) if spec.seeds is not None else [None]
    if seeds == [None]:

        seeds = [resolve(spec.base, file=spec.file)["seed"]]
    study_dir.mkdir(parents=True, exist_ok=True)
    ctx = StudyContext(study_dir=study_dir, name=spec.name, base=spec.base, seeds=seeds, search=search,
                       search_raw=spec.search, storage_url=url, spec_file=spec.file,
                       extra={"profile": str(spec.profile_path()) if spec.profile else None})
    ctx.write()
    atomic_write_yaml(ctx.tune_dir / "spec.yaml", spec.to_dict(), mode=0o600)  # as study.json
    st = open_storage(study_dir, url, **storage_options(search))
    open_study(study_dir, spec.name, search, st, base_cfg=ctx.base_resolved)
    return ctx


def keep_password_out(url: str, *, key: str, file: str | None) -> str:
    """The storage URL to store and show: a literal password taken out of it and handed to this
    process's driver and to its workers as ``PGPASSWORD`` (armorlab.tune.secrets); later commands
    read it from ``PGPASSWORD`` or ``~/.pgpass``. A ``$VAR`` password stays (it is expanded when the
    database is opened)."""
    if "://" not in url:  # a libpq key=value string: SQLAlchemy cannot open it, and it would be stored
        raise ArmorLabError("must be a database URL such as postgresql://user@host/db (a libpq key=value string "
                            "is not one)", key=key, value=redact(url), file=file)
    clean, password = split_password(url)
    passphrase = ssl_password(url)
    if passphrase is not None and "$" not in passphrase:
        raise ArmorLabError("a literal sslpassword would be stored in the study dir; write it as $VAR (read from "
                            "the environment when the database is opened)", key=key, value=redact(url), file=file)
    if password is None or "$" in password:
        return url
    dialect = url.partition("://")[0].partition("+")[0]
    if dialect not in ("postgresql", "postgres"):
        raise ArmorLabError("a password written into the URL would be stored in the study dir; write it as "
                            "$VAR (read from the environment when the database is opened)", key=key,
                            value=redact(url), file=file)
    remember(clean, password)  # in memory: this process's connections and its workers' PGPASSWORD
    return clean


def load_study(study_dir: str | os.PathLike) -> tuple[Any, Any]:
    """(StudyContext, optuna.Study) of an existing study dir, for status and reports."""
    import optuna

    # lazy: optuna
    from armorlab.tune.backend import open_storage, storage_options

    # lazy: optuna
    from armorlab.tune.worker import StudyContext

    ctx = StudyContext.load(study_dir)
    storage = open_storage(ctx.study_dir, ctx.storage_url, **storage_options(ctx.search))
    try:
        study = optuna.load_study(study_name=ctx.name, storage=storage)
    except KeyError:
        raise ArmorLabError("the study is not in its storage (was it deleted?)", key="storage",
                            value=redact(ctx.storage_url) if ctx.storage_url else "journal",
                            file=str(ctx.tune_dir / STUDY_FILE)) from None
    return ctx, study


def counts_of(study: Any) -> dict[str, int]:
    # lazy: optuna
    from armorlab.tune.backend import state_counts

    return state_counts(study)


# --------------------------------------------------------------------------- local workers
def run_local(ctx: Any, workers: int = 1, *, launch: dict[str, Any] | None = None,
              on_progress: Callable[[dict[str, int]], None] | None = None, poll_s: float = 1.0,
              worker_poll_s: float = 0.5) -> dict[str, Any]:
    """Start ``workers`` worker processes on this machine and wait for them.

    Ctrl-C (or SIGTERM to this process) stops the workers cleanly: their trainers checkpoint and
    the interrupted trials are re-queued for the next ``armorlab tune``.
    """
    import optuna

    # lazy: submitit
    from armorlab.sweeps.executors import local_thread_env

    # lazy: optuna
    from armorlab.tune.backend import DatabaseUnavailable, open_storage, storage_options

    if workers < 1:
        raise ArmorLabError("must be ≥ 1", key="--workers", value=workers)
    log_dir = ctx.tune_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    launch = launch or {}
    launch_args = ["--launcher", launch.get("launcher") or "python"]
    if launch.get("accelerate_config"):
        launch_args += ["--accelerate-config", str(launch["accelerate_config"])]
    procs: list[subprocess.Popen] = []
    storage = open_storage(ctx.study_dir, ctx.storage_url, **storage_options(ctx.search))
    study = optuna.load_study(study_name=ctx.name, storage=storage)
    old_term = signal.getsignal(signal.SIGTERM)

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        for i in range(workers):
            fh = open_append(log_dir / f"worker-{i}.log")  # lives as long as the worker
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "armorlab.tune.worker", str(ctx.study_dir), "--index", str(i),
                 "--poll", str(worker_poll_s), *launch_args], stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **local_thread_env(workers), **worker_env(ctx.storage_url)},
                start_new_session=True))  # Ctrl-C reaches this launcher only; it forwards SIGTERM
            fh.close()
        while any(p.poll() is None for p in procs):
            if on_progress is not None:
                try:
                    on_progress(counts_of(study))
                except DatabaseUnavailable as exc:  # the workers decide whether to go on
                    log.warning("%s", exc)
            time.sleep(poll_s)
    except KeyboardInterrupt:
        log.warning("interrupted: stopping %d workers (their trials are re-queued)", len(procs))
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                p.kill()
        raise
    finally:
        signal.signal(signal.SIGTERM, old_term)
    counts = counts_of(study)
    if on_progress is not None:
        on_progress(counts)
    return {"counts": counts, "worker_exit_codes": [p.returncode for p in procs],
            "logs": [str(log_dir / f"worker-{i}.log") for i in range(workers)]}


# --------------------------------------------------------------------------- Slurm workers
class TuneWorkerJob:
    """Picklable submitit callable: one tune worker in a Slurm array task.

    On the preemption/time-out signal submitit calls ``checkpoint``: the trainer gets SIGTERM
    (it checkpoints), the running trial is failed and re-queued (not counted as a retry), and the
    worker itself is requeued to carry on with the study.
    """

    def __init__(self, study_dir: str | os.PathLike, index: int, launch: dict[str, Any] | None = None,
                 poll_s: float = 2.0) -> None:
        self.study_dir = str(Path(study_dir).absolute())
        self.index = index
        self.launch = dict(launch or {})
        self.poll_s = poll_s
        self._worker: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_worker"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._worker = None

    def __call__(self) -> dict[str, Any]:
        # lazy: optuna
        from armorlab.tune.worker import Worker

        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s w{self.index} %(levelname)s %(message)s")
        self._worker = Worker(self.study_dir, index=self.index, poll_s=self.poll_s, **self.launch)
        # scancel sends SIGTERM: stop cleanly too (submitit's own handler would only log it).
        signal.signal(signal.SIGTERM, self._worker.interrupt)
        return self._worker.run()

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        if self._worker is not None:
            self._worker.abandon_current("worker preempted")
        return submitit.helpers.DelayedSubmission(TuneWorkerJob(self.study_dir, self.index, self.launch,
                                                                self.poll_s))


@contextlib.contextmanager
def _environment(extra: dict[str, str]):
    """``os.environ`` with ``extra`` set inside the block, as it was after it."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def submit_slurm(ctx: Any, workers: int, profile: Any) -> list[Any]:
    """Submit ``workers`` tune workers as one Slurm job array (submitit, the sweep profile)."""

    if workers < 1:
        raise ArmorLabError("must be ≥ 1", key="--workers", value=workers)
    executor = checked_executor(ctx.study_dir / ".submitit", profile, job_name=f"tune-{ctx.name}")
    # sbatch hands its environment to the job: the password goes there, never into a file
    with _environment(worker_env(ctx.storage_url)), executor.batch():
        jobs = [executor.submit(TuneWorkerJob(ctx.study_dir, i, profile.launch_options()))
                for i in range(workers)]
    atomic_write_json(ctx.tune_dir / "slurm_jobs.json", {"jobs": [j.job_id for j in jobs]})
    log.info("submitted %d tune workers: %s", len(jobs), ", ".join(j.job_id for j in jobs))
    return jobs


def wait_slurm(ctx: Any, jobs: Sequence[Any], *, on_progress: Callable[[dict[str, int]], None] | None = None,
               poll_s: float = 5.0, timeout_s: float | None = None) -> dict[str, Any]:
    """Wait until every worker job has ended; report study progress meanwhile."""
    _, study = load_study(ctx.study_dir)
    t0 = time.monotonic()
    while not all(j.done() for j in jobs):
        if on_progress is not None:
            on_progress(counts_of(study))
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"tune workers still running after {timeout_s:.0f}s")
        time.sleep(poll_s)
    counts = counts_of(study)
    if on_progress is not None:
        on_progress(counts)
    return {"counts": counts, "job_states": [j.state for j in jobs]}


# --------------------------------------------------------------------------- status
def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def study_status(study_dir: str | os.PathLike, *, top: int = 10) -> dict[str, Any]:
    """Counts per state and the best trials (Pareto front for several objectives)."""
    from optuna.trial import TrialState

    ctx, study = load_study(study_dir)
    search = ctx.search
    counts = counts_of(study)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if search.multi_objective:
        best = sorted(study.best_trials, key=lambda t: t.number) if complete else []
    else:
        sign = -1.0 if search.directions[0] == "maximize" else 1.0
        best = sorted(complete, key=lambda t: (sign * t.values[0], t.number))
    pruned = [{"number": t.number, "params": dict(t.params), "step": t.last_step,
               "outcome": t.user_attrs.get("outcome"),
               "reason": t.user_attrs.get("prune_reason")}
              for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))][-top:]
    rows = []
    for t in best[:top]:
        dur = t.duration.total_seconds() if t.duration is not None else None
        rows.append({"number": t.number, "values": list(t.values), "params": dict(t.params),
                     "runs": list(t.user_attrs.get("runs", [])), "outcome": t.user_attrs.get("outcome"),
                     "duration_s": dur})
    return {"name": ctx.name, "study_dir": str(ctx.study_dir),
            "storage": redact(ctx.storage_url) if ctx.storage_url else str(ctx.tune_dir / "journal.log"),
            "n_trials": search.n_trials, "counts": counts, "directions": list(search.directions),
            "objectives": [o.label for o in search.objectives], "params": list(search.space),
            "best": rows, "pruned": pruned, "dashboard": dashboard_command(ctx)}


def dashboard_command(ctx: Any) -> str:
    """The shell command that opens this study's storage in optuna-dashboard (the ``dashboard``
    extra), single-quoted: nothing in it is expanded by the shell that runs it. An RDB URL names
    its driver and has ``$VARS`` expanded and no password (libpq reads ``PGPASSWORD`` or
    ``~/.pgpass``)."""
    import shlex

    if ctx.storage_url is None:
        return f"optuna-dashboard {shlex.quote(str((ctx.tune_dir / 'journal.log').absolute()))}"
    # lazy: optuna
    from armorlab.tune.backend import with_driver

    url = split_password(with_driver(os.path.expandvars(ctx.storage_url)))[0]
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        url = "sqlite:///" + str(Path(url[len("sqlite:///"):]).absolute())
    return f"optuna-dashboard {_single_quoted(url)}"


def _single_quoted(text: str) -> str:
    """``text`` as one single-quoted shell word (shlex.quote leaves safe words bare)."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def status_table_rows(status: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the best-trials table (the CLI renders them with rich)."""
    header = ["#", *status["objectives"], *status["params"], "runs", "outcome"]
    cells = []
    for r in status["best"]:
        cells.append([str(r["number"]), *(_fmt(v) for v in r["values"]),
                      *(_fmt(r["params"].get(p, "")) for p in status["params"]),
                      " ".join(r["runs"]), r["outcome"] or ""])
    return header, cells


# --------------------------------------------------------------------------- plots
def write_study_plots(study_dir: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """Optuna's matplotlib plots of a study: history, importances, slice, contour (+ curves).

    Plots that the study cannot support yet (too few complete trials, one parameter for a
    contour) are skipped with a log line, never an error: a report of a young study still works.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.trial import TrialState
    from optuna.visualization import matplotlib as ovm

    ctx, study = load_study(study_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    names = list(ctx.search.objectives)
    targets: list[tuple[str, Any, str]] = []  # (file suffix, target fn or None, target name)
    if ctx.search.multi_objective:
        for i, obj in enumerate(names):
            targets.append((f"_obj{i}", (lambda t, i=i: t.values[i]), obj.label))
    else:
        targets.append(("", None, names[0].label))
    n_params = len(ctx.search.space)
    written: list[Path] = []

    def save(name: str, make: Callable[[], Any], size: tuple[float, float] = (7, 5)) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.simplefilter("ignore", UserWarning)
                ax = make()
        except (ValueError, RuntimeError, ZeroDivisionError, IndexError) as exc:
            log.info("skipping plot %s: %s", name, exc)
            plt.close("all")
            return
        fig = ax.flat[0].figure if hasattr(ax, "flat") else ax.figure
        fig.set_size_inches(max(fig.get_size_inches()[0], size[0]), max(fig.get_size_inches()[1], size[1]))
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)

    # Optuna's plot functions switch the whole process to the ggplot style (plt.style.use): keep
    # that inside, so report figures drawn later in this process look as in a fresh one.
    with matplotlib.rc_context():
        for suffix, target, tname in targets:
            kw = {"target": target, "target_name": tname} if target is not None else {"target_name": tname}
            if complete:
                save(f"optuna_history{suffix}", lambda kw=kw: ovm.plot_optimization_history(study, **kw))
                save(f"optuna_slice{suffix}", lambda kw=kw: ovm.plot_slice(study, **kw))
            if len(complete) >= 2 and n_params >= 1:
                save(f"optuna_importances{suffix}", lambda kw=kw: ovm.plot_param_importances(study, **kw))
            else:
                log.info("skipping parameter importances: needs ≥ 2 complete trials (have %d)", len(complete))
            if len(complete) >= 2 and n_params >= 2:
                side = min(4.0 * n_params, 16.0)  # one readable panel per parameter pair
                save(f"optuna_contour{suffix}", lambda kw=kw: ovm.plot_contour(study, **kw), (side + 1, side))
        if not ctx.search.multi_objective and any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
            save("optuna_intermediate", lambda: ovm.plot_intermediate_values(study))
    return written


def best_value_summary(status: dict[str, Any]) -> str:
    """One line for the CLI: finished/n_trials and the best value."""
    c = status["counts"]
    parts = [f"{c['finished']}/{status['n_trials']} finished ({c['complete']} complete, {c['pruned']} pruned)"]
    for key in ("running", "waiting", "fail"):
        if c.get(key):
            parts.append(f"{c[key]} {key}")
    if status["best"] and len(status["directions"]) == 1:
        v = status["best"][0]["values"][0]
        if not math.isnan(v):
            parts.append(f"best {status['objectives'][0]} = {v:.4g} (trial {status['best'][0]['number']})")
    return ", ".join(parts)


# --------------------------------------------------------------------------- report section
def report_sections(dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike,
                    warn: Callable[[str], None]) -> list[Any]:
    """One ``armorlab report`` section per study dir among ``dirs``: best-trials table and Optuna
    plots under ``out_dir/plots/study_<name>/``. The report command composes it with the run report
    (armorlab.commands.report), so analysis never imports tune. A study this layer cannot read is
    a warning, never the end of the report."""
    import pandas as pd

    # lazy: pandas
    from armorlab.analysis.html import Figure, Section, esc

    out = Path(out_dir)
    sections = []
    for d in (Path(p) for p in dirs):
        if not (d.is_dir() and is_study_dir(d)):
            continue
        sec = Section(f"Optuna study {d.name}")
        try:
            status = study_status(d)
            head, cells = status_table_rows(status)
            sec.intro = f"<p>{esc(best_value_summary(status))}</p>"
            sec.tables.append(("best trials", pd.DataFrame(cells, columns=head)))
            for p in write_study_plots(d, out / "plots" / f"study_{d.name}"):
                sec.figures.append(Figure(str(p.relative_to(out)), p.stem.replace("_", " ")))
        except Exception as exc:  # noqa: BLE001 - a damaged study must not sink the run report
            warn(f"study {d}: optuna section skipped ({exc})")
            continue
        sections.append(sec)
    return sections
