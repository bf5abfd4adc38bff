"""A tune worker: loop ask → train → tell until the study has ``n_trials`` finished trials.

Each trial is one run directory per seed under the study dir, trained by ``armorlab train
--run-dir DIR`` in a subprocess (the run-dir contract C3). While it trains, the worker tails the
run's ``metrics.jsonl`` and reports the objective metric to the trial at every validation step;
when the pruner says so it writes ``DIR/stop_request`` and the trainer stops after its step.

Decisions (see docs/tune.md):
- finished = COMPLETE + PRUNED. A worker asks for a new trial only while finished + running <
  n_trials (checked and asked under one lock), so the study ends with exactly n_trials finished
  trials however many workers run; FAIL trials don't count and their params are re-enqueued.
- Same params (+ seed) ⇒ same run id ⇒ a finished run is reused without training.
- Seeds run one after another; the first seed's curve is reported for pruning and the trial's
  value is the mean of the per-seed summaries.
- A run that stops on a non-finite loss is told PRUNED (with outcome "diverged"): the sampler
  then learns the region is bad, which it would not from a FAIL.
- Idle workers wait (rather than exit) while other trials run, so they can take over a trial
  whose worker died.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from armorlab.core.config import resolve
from armorlab.core.exits import EXIT_BUSY, EXIT_PREEMPTED
from armorlab.core.fsutil import SMALL_FILE_BYTES, atomic_write_json, open_append, read_regular_text
from armorlab.core.runs import FINAL_STATES, RunDir
from armorlab.errors import ArmorLabError
from armorlab.stats.collapse import curve_auc
from armorlab.sweeps.jobs import describe_exit, train_argv, wrapped_argv
from armorlab.tune.backend import (
    BEAT_INTERVAL_S,
    TUNE_DIR,
    DatabaseUnavailable,
    fail_and_requeue,
    open_storage,
    open_study,
    quiet_optuna,
    reconcile,
    state_counts,
    storage_has_heartbeat,
    storage_options,
    study_lock,
    touch_beat,
    worker_identity,
)
from armorlab.tune.pruners import EVAL_N_ATTR
from armorlab.tune.space import ObjectiveSpec, SearchSpec, parse_search, suggest_params, trial_config

log = logging.getLogger(__name__)

STUDY_FILE = "study.json"
STOP_REQUEST = "stop_request"
MAX_CONSECUTIVE_FAILURES = 3
def _checkpoint_signal() -> int:
    """submitit's checkpoint signal when running under its Slurm executor, else 0."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return 0
    name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return int(getattr(signal, name, signal.SIGUSR2))


# --------------------------------------------------------------------------- the study dir
@dataclass
class StudyContext:
    """What every worker reads from ``<study>/.tune/study.json`` (written by ``armorlab tune``)."""

    study_dir: Path
    name: str
    base: dict[str, Any]
    seeds: list[int]
    search: SearchSpec
    search_raw: dict[str, Any]
    storage_url: str | None
    spec_file: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tune_dir(self) -> Path:
        return self.study_dir / TUNE_DIR

    @property
    def base_resolved(self) -> dict[str, Any]:
        return resolve(self.base, file=self.spec_file)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "base": self.base, "seeds": self.seeds, "search": self.search_raw,
                "storage": self.storage_url, "spec_file": self.spec_file, **self.extra}

    def write(self) -> None:
        # its owner's only: it names the database and how to reach it
        atomic_write_json(self.tune_dir / STUDY_FILE, self.to_json(), mode=0o600)

    @classmethod
    def load(cls, study_dir: str | os.PathLike) -> StudyContext:
        study_dir = Path(study_dir)
        path = study_dir / TUNE_DIR / STUDY_FILE
        try:
            data = json.loads(read_regular_text(path, limit=SMALL_FILE_BYTES))
        except OSError:
            raise ArmorLabError("not a study directory (no .tune/study.json); start it with "
                                "`armorlab tune SPEC`", key="study_dir", value=str(study_dir)) from None
        except ValueError as exc:
            raise ArmorLabError(f"corrupt study file: {exc}", file=str(path)) from None
        search = parse_search(data["search"], data["base"], file=data.get("spec_file") or str(path))
        known = {"name", "base", "seeds", "search", "storage", "spec_file"}
        return cls(study_dir=study_dir, name=data["name"], base=data["base"], seeds=list(data["seeds"]),
                   search=search, search_raw=data["search"], storage_url=data.get("storage"),
                   spec_file=data.get("spec_file"), extra={k: v for k, v in data.items() if k not in known})


# --------------------------------------------------------------------------- objective values
def _series(rows: Sequence[Mapping[str, Any]], metric: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["step"], float(r[metric])) for r in rows if r.get(metric) is not None]
    steps = np.array([p[0] for p in pts], dtype=float)
    values = np.array([p[1] for p in pts], dtype=float)
    return steps, values


def summarize(rows: Sequence[Mapping[str, Any]], objective: ObjectiveSpec, direction: str) -> float:
    """One run's objective value from its merged metric rows (``RunDir.read_metrics``)."""
    steps, values = _series(rows, objective.metric)
    if len(steps) == 0:
        raise ValueError(f"metric {objective.metric} was never logged")
    if objective.summary == "final":
        return float(values[-1])
    better = np.argmax if direction == "maximize" else np.argmin
    if objective.summary == "peak":
        return float(values[better(values)])
    if objective.summary == "auc":
        return float(curve_auc(steps, values))
    # test-at-val-best: the report metric read at the step where the selection metric is best
    # (the earliest such step on ties); the step must have logged both.
    best_step = int(steps[better(values)])
    row = next(r for r in rows if r["step"] == best_step)
    if row.get(objective.report) is None:
        raise ValueError(f"metric {objective.report} was not logged at step {best_step}, where "
                         f"{objective.metric} is best (log test metrics at every validation step)")
    return float(row[objective.report])


def trial_values(run_dirs: Sequence[RunDir], search: SearchSpec) -> list[float]:
    """Per objective, the mean over seeds of each run's summary."""
    rows = [rd.read_metrics() for rd in run_dirs]
    out = []
    for obj, direction in zip(search.objectives, search.directions, strict=True):
        per_seed = [summarize(r, obj, direction) for r in rows]
        out.append(float(np.mean(per_seed)))
    return out


# --------------------------------------------------------------------------- one run
@dataclass
class RunOutcome:
    kind: str  # completed | reused | pruned | diverged | crashed | config_error | interrupted | preempted | lost
    reason: str | None = None
    step: int | None = None


class _MetricsTail:
    """New complete lines of a growing metrics.jsonl (a torn last line waits for its newline)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        rows = []
        for line in data[:end + 1].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
        return rows


class _Heartbeat:
    """Keep a trial visibly alive while it runs: Optuna's RDB heartbeat (study.optimize would
    start it for us; ask/tell does not), or the journal's beat file (backend.BEATS)."""

    def __init__(self, storage: Any, trial: optuna.Trial, study_dir: Path) -> None:
        self.storage, self.trial, self.study_dir = storage, trial, study_dir
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def _beat(self) -> None:
        if storage_has_heartbeat(self.storage):
            self.storage.record_heartbeat(self.trial._trial_id)
        else:
            touch_beat(self.study_dir, self.trial.number)

    def __enter__(self) -> _Heartbeat:
        interval = (self.storage.get_heartbeat_interval() if storage_has_heartbeat(self.storage)
                    else BEAT_INTERVAL_S)
        self._beat()

        def beat() -> None:
            while not self.stop.wait(interval):
                with contextlib.suppress(Exception):
                    self._beat()

        self.thread = threading.Thread(target=beat, daemon=True, name="tune-heartbeat")
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)


class Worker:
    """One worker process's loop. ``interrupt()`` (signal handlers) stops it at the next safe point."""

    def __init__(self, study_dir: str | os.PathLike, *, index: int = 0, launcher: str = "python",
                 accelerate_config: str | None = None, poll_s: float = 0.5) -> None:
        self.study_dir = Path(study_dir)
        self.index = index
        # how the trainer is launched (a profile's launch_options); ARMORLAB_TRAIN_COMMAND, the
        # sweep layer's stand-in hook, replaces it in tests
        self.launch = {"launcher": launcher, "accelerate_config": accelerate_config}
        self.poll_s = poll_s
        self.interrupted = False
        self.proc: subprocess.Popen | None = None
        self.current: optuna.Trial | None = None
        self.trials_run: list[int] = []
        self.ctx: StudyContext | None = None
        self.study: optuna.Study | None = None

    # ---------------------------------------------------------------- control
    def interrupt(self, *_: object) -> None:
        """Stop after the current step: the trainer checkpoints and the trial is re-queued."""
        self.interrupted = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def _stop_trainer(self, wait_s: float = 90.0) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                proc.kill()

    def abandon_current(self, reason: str, wait_s: float = 90.0) -> None:
        """For submitit's checkpoint (runs in the signal handler, the process exits right after):
        stop the trainer (it checkpoints), fail the running trial and re-queue its params."""
        self.interrupted = True
        self._stop_trainer(wait_s)
        trial, study = self.current, self.study
        if trial is None or study is None or self.ctx is None:
            return
        self.current = None
        frozen = study._storage.get_trial(trial._trial_id)
        if frozen.state != TrialState.RUNNING:
            return
        with study_lock(self.study_dir):
            fail_and_requeue(study, frozen, reason, self.ctx.search.max_retries, count_retry=False)

    # ---------------------------------------------------------------- loop
    def run(self) -> dict[str, Any]:
        ctx = self.ctx = StudyContext.load(self.study_dir)
        search = ctx.search
        base_cfg = ctx.base_resolved
        storage = open_storage(ctx.study_dir, ctx.storage_url, **storage_options(search))
        me = worker_identity(self.index)
        with study_lock(ctx.study_dir):
            probe = optuna.load_study(study_name=ctx.name, storage=storage)
            n_before = len(probe.get_trials(deepcopy=False))
        # Distinct workers and restarts must not replay one random stream: seed from
        # (spec seed, worker index, trials so far). Not the grid sampler: its seed shuffles the
        # grid, and grid ids must mean the same point in every worker.
        seed = search.sampler.get("seed")
        if seed is not None and search.sampler["type"] != "grid":
            seed = int(np.random.SeedSequence([seed, self.index, n_before]).generate_state(1)[0])
        study = self.study = open_study(ctx.study_dir, ctx.name, search, storage, base_cfg=base_cfg, seed=seed)
        failures, last_reason = 0, None
        stop_reason = "n_trials reached"
        while not self.interrupted:
            trial = None
            with study_lock(ctx.study_dir):
                reconcile(study, me, search.max_retries, study_dir=ctx.study_dir)
                counts = state_counts(study)
                if counts["finished"] >= search.n_trials:
                    break
                if counts["finished"] + counts["running"] < search.n_trials:
                    with quiet_optuna():
                        trial = study.ask()
                    trial.set_user_attr("worker", me)
                    if storage_has_heartbeat(storage):  # stale-checkable from the first moment
                        storage.record_heartbeat(trial._trial_id)
                    else:
                        touch_beat(ctx.study_dir, trial.number)
            if trial is None:
                time.sleep(self.poll_s)
                continue
            outcome = self._run_trial(ctx, study, trial)
            self.trials_run.append(trial.number)
            if outcome.kind in ("crashed", "config_error"):
                failures += 1
                last_reason = outcome.reason
                if failures >= MAX_CONSECUTIVE_FAILURES:
                    stop_reason = f"{failures} trials in a row failed; last: {last_reason}"
                    log.error("worker %d stops: %s", self.index, stop_reason)
                    break
            else:
                failures = 0
        if self.interrupted:
            stop_reason = "interrupted"
        return {"worker": self.index, "trials": self.trials_run, "stop_reason": stop_reason}

    # ---------------------------------------------------------------- one trial
    def _run_trial(self, ctx: StudyContext, study: optuna.Study, trial: optuna.Trial) -> RunOutcome:
        search = ctx.search
        self.current = trial
        try:
            try:
                params = suggest_params(trial, search)
                run_dirs = [RunDir.create(ctx.study_dir, trial_config(ctx.base, params, seed, file=ctx.spec_file))
                            for seed in ctx.seeds]
            except ValueError as exc:  # ArmorLabError: e.g. a re-queued point the edited space no longer allows
                return self._tell(study, trial, [], RunOutcome("config_error", str(exc)), [])
            trial.set_user_attr("runs", [rd.id for rd in run_dirs])
            log.info("trial %d: %s → runs %s", trial.number, params, ", ".join(rd.id for rd in run_dirs))
            report = not search.multi_objective
            outcome = RunOutcome("completed")
            kinds = []
            with _Heartbeat(study._storage, trial, self.study_dir):
                for i, rd in enumerate(run_dirs):
                    outcome = self._train_or_reuse(ctx, trial, rd, report=report and i == 0)
                    kinds.append(outcome.kind)
                    if outcome.kind not in ("completed", "reused"):
                        break
            return self._tell(study, trial, run_dirs, outcome, kinds)
        except optuna.exceptions.UpdateFinishedTrialError:
            # another worker failed this trial as stale (its heartbeats stopped reaching the
            # database for longer than the grace): its retry owns the run now, so let go of it
            self._stop_trainer()
            log.warning("trial %d was failed by another worker (heartbeat judged stale); its retry "
                        "resumes the run", trial.number)
            return RunOutcome("lost", "failed by another worker as stale")
        except DatabaseUnavailable:
            # nothing can be told now: stop the trainer (it checkpoints) and end this worker; the
            # trial stays RUNNING until its missing heartbeat fails and re-queues it
            self._stop_trainer()
            raise
        except Exception as exc:
            # a bug or an I/O error in this worker: leave the study consistent, then die loudly
            frozen = study._storage.get_trial(trial._trial_id)
            if frozen.state == TrialState.RUNNING:
                with study_lock(self.study_dir):
                    fail_and_requeue(study, frozen, f"worker error: {exc!r}", search.max_retries)
            raise
        finally:
            self.current = None

    def _tell(self, study: optuna.Study, trial: optuna.Trial, run_dirs: Sequence[RunDir],
              outcome: RunOutcome, kinds: Sequence[str]) -> RunOutcome:
        if outcome.kind in ("completed", "reused"):
            try:
                values = trial_values(run_dirs, self.ctx.search)
            except (ValueError, OSError) as exc:
                trial.set_user_attr("outcome", "failed")
                trial.set_user_attr("fail_reason", str(exc))
                study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                return RunOutcome("config_error", str(exc))
            if not all(math.isfinite(v) for v in values):
                trial.set_user_attr("outcome", "failed")
                trial.set_user_attr("fail_reason", f"non-finite objective {values}")
                study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                return RunOutcome("config_error", f"non-finite objective {values}")
            trial.set_user_attr("outcome", "reused" if all(k == "reused" for k in kinds) else "completed")
            study.tell(trial, values, skip_if_finished=True)
            return outcome
        if outcome.kind in ("pruned", "diverged"):
            trial.set_user_attr("outcome", outcome.kind)
            if outcome.reason:
                trial.set_user_attr("prune_reason", outcome.reason)
            study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
            return outcome
        # failures: re-queue what may succeed on a second try (crash, preemption), not config errors
        frozen = study._storage.get_trial(trial._trial_id)
        if frozen.state != TrialState.RUNNING:
            return outcome  # already failed and re-queued (abandon_current on a checkpoint signal)
        with study_lock(self.study_dir):
            if outcome.kind == "config_error":
                trial.set_user_attr("fail_reason", outcome.reason)
                trial.set_user_attr("outcome", "failed")
                study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            else:
                trial.set_user_attr("outcome", outcome.kind)
                fail_and_requeue(study, frozen, outcome.reason or outcome.kind, self.ctx.search.max_retries,
                                 count_retry=outcome.kind not in ("interrupted", "preempted"))
        return outcome

    def _lock_path(self, rd: RunDir) -> Path:
        path = self.study_dir / TUNE_DIR / "locks" / f"{rd.id}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _acquire_run_lock(self, rd: RunDir) -> int | None:
        """flock the run, waiting while another trial (or a dying orphan trainer) holds it."""
        fd = os.open(self._lock_path(rd), os.O_RDWR | os.O_CREAT, 0o644)
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
            if self.interrupted:
                os.close(fd)
                return None
            if not waited:
                log.info("run %s is in use by another process; waiting", rd.id)
                waited = True
            time.sleep(self.poll_s)

    def _train_or_reuse(self, ctx: StudyContext, trial: optuna.Trial, rd: RunDir, *, report: bool) -> RunOutcome:
        fd = self._acquire_run_lock(rd)
        if fd is None:
            return RunOutcome("interrupted", "worker interrupted")
        try:
            status = rd.read_status()
            reason = status.get("reason") or ""
            if status["state"] in FINAL_STATES:  # stopped on collapse: final too, its curve is reused
                pruned = "pruned by optuna" in reason
                if report:
                    self._replay(trial, rd)
                return RunOutcome("pruned" if pruned else "reused", reason or None, rd.last_step())
            if status["state"] == "failed" and reason.startswith("non-finite"):
                if report:
                    self._replay(trial, rd)
                return RunOutcome("diverged", reason, rd.last_step())
            return self._train(ctx, trial, rd, fd, report=report)
        finally:
            os.close(fd)

    def _replay(self, trial: optuna.Trial, rd: RunDir) -> None:
        metric = self.ctx.search.objectives[0].metric
        for row in rd.read_metrics():
            if row.get(metric) is not None:
                trial.report(float(row[metric]), row["step"])

    def _train(self, ctx: StudyContext, trial: optuna.Trial, rd: RunDir, lock_fd: int, *,
               report: bool) -> RunOutcome:
        stop_path = rd.path / STOP_REQUEST
        stop_path.unlink(missing_ok=True)  # a leftover would stop the resumed run at once

        # the trainer gets SIGTERM (checkpoint, exit 75) if its worker dies, so an orphan never keeps
        # writing a run dir that a retry is about to resume; it ignores submitit's checkpoint
        # signal, which Slurm sends to every process of the step: the worker forwards SIGTERM
        cmd = wrapped_argv(train_argv(str(rd.path.absolute()), **self.launch), ignore_signal=_checkpoint_signal())
        env = dict(os.environ)
        if not env.get("SLURM_JOB_ID"):
            env["ARMORLAB_JOB_ID"] = f"tune-w{self.index}-t{trial.number}"
        log_dir = self.study_dir / TUNE_DIR / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{rd.id}.log"
        metric = self.ctx.search.objectives[0].metric
        # completions behind each eval of an avg@k objective: the collapse pruner's binomial noise
        ns, _, name = metric.rpartition("/")
        n_key = f"{ns}/n" if name == "acc" and ns else None
        tail = _MetricsTail(rd.metrics_path)
        reported: set[int] = set()
        pruned_at: int | None = None
        with open_append(log_path) as log_fh:
            log_fh.write(f"--- trial {trial.number} worker {self.index} pid {os.getpid()}\n".encode())
            log_fh.flush()
            self.proc = subprocess.Popen(cmd, stdout=log_fh, stderr=subprocess.STDOUT, env=env,
                                         pass_fds=(lock_fd,), stdin=subprocess.DEVNULL,
                                         # a terminal's Ctrl-C reaches the worker, which forwards SIGTERM
                                         start_new_session=True)
            if self.interrupted:  # a signal that came while we were launching
                self.interrupt()
            while True:
                rc = self.proc.poll()
                for row in tail.read():
                    step, value = row["step"], row.get(metric)
                    if not report or value is None or step in reported:
                        continue
                    reported.add(step)
                    if n_key and row.get(n_key) and EVAL_N_ATTR not in trial.user_attrs:
                        trial.set_user_attr(EVAL_N_ATTR, float(row[n_key]))
                    trial.report(float(value), step)
                    if pruned_at is None and trial.should_prune():
                        pruned_at = step
                        atomic_write_json(stop_path, {"reason": f"pruned by optuna at step {step}"})
                        log.info("trial %d pruned at step %d", trial.number, step)
                if rc is not None:
                    break
                time.sleep(self.poll_s)
        self.proc = None
        status = rd.read_status()
        if self.interrupted and rc == -signal.SIGTERM and status["state"] in ("running", "pending"):
            # our SIGTERM came before the trainer had its handler up (still starting): a
            # preemption like any other, not a crash of the trial; nothing to checkpoint yet
            status = rd.write_status("pending", reason="preempted during start-up (SIGTERM before the "
                                     "trainer could checkpoint)")
            rc = EXIT_PREEMPTED
        if rc == EXIT_BUSY:  # another live process trains this run dir: not this trial's failure
            return RunOutcome("preempted", f"run dir busy: owned by another live process (log {log_path})")
        if rc not in (0, EXIT_PREEMPTED) and status["state"] in ("running", "pending") and rd.owner() is None:
            # killed, out of memory, crashed on start: say so in the run dir as a sweep job would

            status = rd.write_status("failed", reason=f"training process ended with {describe_exit(rc)}")
        reason = status.get("reason") or ""
        if rc == 0:
            if pruned_at is not None:
                return RunOutcome("pruned", f"pruned by optuna at step {pruned_at}", pruned_at)
            return RunOutcome("completed", reason or None, rd.last_step())
        if rc == EXIT_PREEMPTED:
            # our own interrupt, or a signal that reached the trainer directly (scancel signals
            # every process of the job): not the trial's fault, re-queued without counting
            kind = "interrupted" if self.interrupted else "preempted"
            return RunOutcome(kind, f"trainer preempted ({reason or 'exit 75'})")
        if rc == 2:
            return RunOutcome("config_error", f"config error: {reason or 'exit 2'} (log {log_path})")
        if rc == 1 and reason.startswith("non-finite"):
            return RunOutcome("diverged", reason, rd.last_step())
        return RunOutcome("crashed", f"trainer exited {rc}: {reason or 'no reason'} (log {log_path})")


# --------------------------------------------------------------------------- entry points
def run_worker(study_dir: str | os.PathLike, *, index: int = 0, launcher: str = "python",
               accelerate_config: str | None = None, poll_s: float = 0.5,
               handle_signals: bool = True) -> dict[str, Any]:
    """Run one worker to the end in this process (SIGTERM/SIGINT/SIGUSR1 stop it cleanly)."""
    worker = Worker(study_dir, index=index, launcher=launcher, accelerate_config=accelerate_config,
                    poll_s=poll_s)
    if handle_signals:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, worker.interrupt)
    return worker.run()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m armorlab.tune.worker", description=__doc__.split("\n")[0])
    parser.add_argument("study_dir")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--launcher", default="python", choices=("python", "accelerate"))
    parser.add_argument("--accelerate-config", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s w{args.index} %(levelname)s %(message)s")

    try:
        summary = run_worker(args.study_dir, index=args.index, poll_s=args.poll, launcher=args.launcher,
                             accelerate_config=args.accelerate_config)
    except ArmorLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DatabaseUnavailable as exc:
        print(f"error: {exc}; the worker stops (its trial is failed and re-queued once its heartbeat "
              "is stale: run `armorlab tune SPEC` again when the database is back)", file=sys.stderr)
        return 3
    log.info("worker done: %s", summary)
    return EXIT_PREEMPTED if summary["stop_reason"] == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main())
