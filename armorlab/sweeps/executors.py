"""Executors: where a sweep's TrainJobs run.

- ``LocalExecutor``: this machine, ``workers`` training processes at a time, blocking until all
  finish (what a laptop user expects). Ctrl-C / SIGTERM / SIGHUP forwards SIGTERM to the trainers,
  which checkpoint and stop; running the sweep again resumes them. A trainer also gets SIGTERM
  when the sweep process dies any other way (kill -9), unless ``detach``.
- ``SlurmSubmitter``: one job array per chunk of at most the cluster's MaxArraySize runs,
  fire-and-forget; each task runs through submitit's job side. The sbatch script is the same
  for every array task and holds no run name or config value: each task unpickles a TrainJob
  holding its run dir (and the run's config, which the job writes there, when the sweep left
  the run dir to the job). An array's tasks go into one file, not one pickle each
  (armorlab.sweeps.array_task), and its script is the one ``--dry-run`` shows. An array of a
  later stage's runs waits for the job of the run they continue from: ``--dependency=afterok:<job>``
  (``<array>_<task>`` for one task of an array) with ``--kill-on-invalid-dep=yes``, so Slurm
  cancels it when that job fails instead of leaving it pending forever.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from armorlab.core.exits import EXIT_FAILED
from armorlab.core.fsutil import atomic_write_bytes
from armorlab.core.runs import FINAL_STATES, RunDir
from armorlab.errors import ArmorLabError
from armorlab.sweeps import slurmctl
from armorlab.sweeps.array_task import ARRAY_SUFFIX, array_bytes, task_entry
from armorlab.sweeps.manifest import LOGS_DIR, SUBMITIT_DIR, parent_failed_reason
from armorlab.sweeps.profile import Profile
from armorlab.sweeps.sbatch import (
    check_names,
    check_script,
    checked_executor,
    executor_folder,
    render_script,
    submit_command,
)

if TYPE_CHECKING:
    from armorlab.sweeps.jobs import JobOutcome

log = logging.getLogger(__name__)

OnEvent = Callable[[str, str, Any], None]  # (event, run_id, payload): "start" | "done"


class Interrupted(KeyboardInterrupt):
    """The local sweep was asked to stop (Ctrl-C, SIGTERM from `armorlab cancel`)."""


def local_thread_env(workers: int) -> dict[str, str]:
    """Split this machine's cores between ``workers`` local trainers: N trainers each using every
    core run slower than N trainers on a share each. A thread count the user exported wins."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


class LocalExecutor:
    name = "local"

    def __init__(self, sweep_dir: Path, profile: Profile, *, workers: int | None = None,
                 detach: bool = False) -> None:
        self.sweep_dir = Path(sweep_dir)
        self.profile = profile
        self.workers = workers or profile.workers
        self.detach = detach  # trainers outlive this process (else SIGTERM when it dies)
        if self.workers < 1:
            raise ArmorLabError("need at least one worker", key="--workers", value=self.workers)

    def thread_env(self) -> dict[str, str]:
        return local_thread_env(self.workers)

    def run(self, run_dirs: Sequence[Path], job_ids: Sequence[str], *,
            on_event: OnEvent | None = None, after: Mapping[str, str] | None = None) -> dict[str, JobOutcome]:
        """Train every run dir, ``workers`` at a time; returns each run's outcome by run id.

        ``after`` maps a run id to the run id of this batch it continues from (a later stage): the
        run starts once that one has completed; if it ends failed, the run is marked failed with
        the reason instead of starting (and so are the runs that continue from it)."""
        from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

        from armorlab.sweeps.jobs import TrainJob  # lazy: it loads the vLLM server machinery

        on_event = on_event or (lambda *_: None)
        stopping = threading.Event()
        active: dict[str, TrainJob] = {}
        lock = threading.Lock()

        def one(run_dir: Path, job_id: str) -> JobOutcome | None:
            rid = run_dir.name
            job = TrainJob(run_dir, **self.profile.launch_options(), detach=self.detach)
            with lock:
                if stopping.is_set():
                    return None
                active[rid] = job
            on_event("start", rid, job_id)
            try:
                outcome = job.run(env={"ARMORLAB_JOB_ID": job_id, **self.thread_env()},
                                  log_path=self.sweep_dir / LOGS_DIR / f"{rid}.log")
            finally:
                with lock:
                    active.pop(rid, None)
            on_event("done", rid, outcome)
            return outcome

        results: dict[str, JobOutcome] = {}
        after = dict(after or {})
        batch = {Path(rd).name: (Path(rd), jid) for rd, jid in zip(run_dirs, job_ids, strict=True)}
        waiting: dict[str, list[str]] = {}  # parent run id → runs of this batch waiting for it
        for rid, parent in after.items():
            if rid in batch and parent in batch:
                waiting.setdefault(parent, []).append(rid)
        restore = _raise_on_sigterm()
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="armorlab-job")
        futures: dict[Future, str] = {}

        def start(rid: str) -> None:
            futures[pool.submit(one, *batch[rid])] = rid

        def settle(rid: str, outcome: JobOutcome) -> None:
            """Start the runs that waited for ``rid``, or fail them (and theirs) if it failed."""
            for child in waiting.pop(rid, []):
                if outcome.state in FINAL_STATES:  # a stopped parent's selection is final too
                    start(child)
                elif outcome.state == "failed":
                    failed = _fail_for_parent(batch[child][0], rid, outcome.reason)
                    results[child] = failed
                    on_event("done", child, failed)
                    settle(child, failed)
                # else (preempted): it stays pending for the next run of the sweep

        for rid in batch:
            if after.get(rid) not in batch:
                start(rid)
        try:
            seen: set[Future] = set()
            while len(seen) < len(futures):  # settle() may start more
                done, _ = wait([f for f in futures if f not in seen], timeout=0.5, return_when=FIRST_COMPLETED)
                for fut in done:
                    seen.add(fut)
                    outcome = fut.result()
                    if outcome is not None:
                        results[futures[fut]] = outcome
                        settle(futures[fut], outcome)
        except KeyboardInterrupt:
            log.warning("stopping: asking %d running trainer(s) to checkpoint", len(active))
            with lock:
                stopping.set()
            signalled: set[str] = set()
            running = [f for f in futures if not f.cancel()]
            while running:
                # a job may have been between its start and its Popen: look again until all are done
                with lock:
                    jobs = [(rid, job) for rid, job in active.items() if rid not in signalled]
                for rid, job in jobs:
                    if job.interrupt(signal.SIGTERM):
                        signalled.add(rid)
                _, not_done = wait(running, timeout=0.5)
                running = list(not_done)
            raise
        finally:
            pool.shutdown(wait=True)
            restore()
        return results


def _fail_for_parent(run_dir: Path, parent: str, reason: str | None) -> JobOutcome:
    """Mark a run that will not start because the run it continues from failed."""
    from armorlab.sweeps.jobs import JobOutcome  # lazy: it loads the vLLM server machinery

    why = parent_failed_reason(parent, reason)
    RunDir(run_dir).write_status("failed", reason=why)
    return JobOutcome(str(run_dir), EXIT_FAILED, "failed", why)


def _raise_on_sigterm() -> Callable[[], None]:
    """While a local sweep runs, SIGTERM (`armorlab cancel`) and SIGHUP (its ssh session closed)
    stop it like Ctrl-C does: the trainers checkpoint, the runs stay resumable."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted()

    signals = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    previous = {s: signal.signal(s, handler) for s in signals}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


class SlurmSubmitter:
    name = "slurm"

    def __init__(self, sweep_dir: Path, profile: Profile, *, job_name: str) -> None:
        self.sweep_dir = Path(sweep_dir)
        self.profile = profile
        self.job_name = job_name
        self.folder = self.sweep_dir / SUBMITIT_DIR
        self.dependency: str | None = None  # the job the next arrays wait for (afterok), if any

    def parameters(self) -> dict[str, Any]:
        """The profile's submitit parameters, plus the dependency of the arrays being queued."""
        params = self.profile.submitit_parameters(job_name=self.job_name)
        if self.dependency is not None:
            params["additional_parameters"] = {**params.get("additional_parameters", {}),
                                               **dependency_parameters(self.dependency)}
        return params

    def chunk_size(self, cluster_max: int | None = None) -> int:
        """Runs per array: the cluster's MaxArraySize, capped by the profile's max_array_size."""
        size = cluster_max if cluster_max is not None else slurmctl.max_array_size()
        if self.profile.max_array_size is not None:
            size = min(size, self.profile.max_array_size)
        return max(1, size)

    def _executor(self, *, dry_run: bool = False) -> Any:
        return checked_executor(self.folder, self.profile, job_name=self.job_name, dry_run=dry_run)

    def _rendered(self, n_runs: int) -> str | None:
        check_names(self.folder, self.job_name)
        return render_script(self.folder, self.parameters(), python=self.profile.python,
                             map_count=n_runs if n_runs > 1 else None)

    def sbatch_text(self, n_runs: int) -> str:
        """The sbatch script submitit writes for an array of ``n_runs`` (what --dry-run shows),
        rendered without importing submitit where the profile allows (sbatch.render_script)."""
        text = self._rendered(n_runs)
        if text is None:
            return self._submitit_text(self._executor(dry_run=True), n_runs)
        check_script(text, self.profile.setup)
        return text

    @staticmethod
    def _command(ex: Any, n_runs: int) -> str:
        """What each task runs: submitit's own entry for a single job, armorlab's array entry
        (armorlab.sweeps.array_task: one pickle file per array) for an array."""
        return ex._submitit_command_str if n_runs == 1 else submit_command(ex.folder, ex.python, array=True)

    def _submitit_text(self, ex: Any, n_runs: int) -> str:
        """The script submitit writes for ``n_runs`` tasks: an array's renders the executor's
        parameters plus ``map_count``, as submitit's array submission does (and ``_submit_array``)."""
        params = self._with_dependency(ex.parameters)
        if n_runs > 1:
            params = {**params, "map_count": n_runs}
        saved, ex.parameters = ex.parameters, params
        try:
            return ex._make_submission_file_text(self._command(ex, n_runs), "dry-run")
        finally:
            ex.parameters = saved

    def _refused(self, why: str) -> ArmorLabError:
        where = str(self.profile.path) if self.profile.path else None
        return ArmorLabError(f"sbatch refused the job array: {why}", key="profile", value=where, file=where)

    def _sbatch(self, text: str, folder: Path) -> str:
        """Queue the script ``text`` as submitit's ``_submit_command`` does — the same files: the
        script as ``<A>_submission.sh``, its first name a link to it — without importing submitit
        (a third of a 1,000-run submit). Returns the job id."""
        import re
        import subprocess
        import uuid

        first = folder / f".submission_file_{uuid.uuid4().hex}.sh"
        first.write_text(text, encoding="utf-8")
        try:
            out = subprocess.run(["sbatch", str(first)], capture_output=True, text=True)
        except OSError as exc:
            first.unlink(missing_ok=True)
            raise self._refused(f"cannot run sbatch ({exc})") from None
        m = re.search(r"job (?P<id>[0-9]+)", out.stdout) if out.returncode == 0 else None
        if m is None:  # submitit's pattern for sbatch's answer
            first.unlink(missing_ok=True)
            raise self._refused((out.stderr or out.stdout).strip() or f"exit status {out.returncode}")
        final = folder / f"{m.group('id')}_submission.sh"
        first.rename(final)
        first.symlink_to(final)
        return m.group("id")

    def _submit_array(self, jobs: Sequence[Any], text: str, ex: Any) -> list[str]:
        """Queue ``jobs`` (TrainJobs) as one array running the script ``text``: the tasks' entries
        go into one file, published as ``<array id>_array.pkl`` once sbatch has answered (the
        tasks wait for it; armorlab.sweeps.array_task). sbatch is called here, or by submitit's
        ``_submit_command`` when the script is submitit's own rendering (``ex``, a profile
        render_script does not model)."""
        import uuid


        params = self.parameters()
        timeout_min, countdown = params.get("time", 5), self.profile.max_num_timeout  # as submitit sets them
        folder = executor_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        unqueued = folder / f"unqueued-{uuid.uuid4().hex}{ARRAY_SUFFIX}"
        atomic_write_bytes(unqueued, array_bytes([task_entry(job, timeout_min, countdown) for job in jobs]))
        try:
            if ex is None:
                array_id = self._sbatch(text, folder)
            else:
                import submitit

                saved, ex.parameters = ex.parameters, {**self._with_dependency(ex.parameters), "map_count": len(jobs)}
                try:
                    ex._throttle()
                    array_id = ex._submit_command(self._command(ex, len(jobs))).job_id
                except submitit.core.utils.FailedJobError as exc:
                    raise self._refused(str(exc).strip()) from None
                finally:
                    ex.parameters = saved
            os.replace(unqueued, folder / f"{array_id}{ARRAY_SUFFIX}")
        finally:
            unqueued.unlink(missing_ok=True)  # sbatch failed: nothing refers to it
        return [f"{array_id}_{a}" for a in range(len(jobs))]

    def submit(self, runs: Sequence[str | Path | tuple[str | Path, dict[str, Any] | None]], *, chunk: int,
               on_array: Callable[[list[str], list[str]], None],
               before_array: Callable[[list[str]], None] | None = None,
               dependency: str | None = None) -> list[str]:
        """Queue run dirs (or ``(run dir, config)`` pairs) as arrays of at most ``chunk``; a config
        (not None) is written to its run dir by the job (TrainJob.config). ``before_array(run_ids)`` is
        called before each sbatch and ``on_array(run_ids, job_ids)`` right after it, so the
        manifest knows about each array before and after it is queued. Returns job ids.

        An array is queued with the script ``--dry-run`` shows (sbatch.render_script, byte for
        byte submitit's; tests hold them equal), without importing submitit. submitit queues a
        single run (its plain job) and an array whose profile render_script does not model;
        then its script is checked against the dry run's and a difference is logged.

        ``dependency``: a job id every array of this call waits for (``dependency_parameters``)."""
        self.dependency = dependency
        try:
            return self._submit(runs, chunk=chunk, on_array=on_array, before_array=before_array)
        finally:
            self.dependency = None

    def _submit(self, runs: Sequence[str | Path | tuple[str | Path, dict[str, Any] | None]], *, chunk: int,
                on_array: Callable[[list[str], list[str]], None],
                before_array: Callable[[list[str]], None] | None) -> list[str]:
        from armorlab.sweeps.jobs import TrainJob  # lazy: it loads the vLLM server machinery

        runs = [r if isinstance(r, tuple) else (r, None) for r in runs]
        launch = self.profile.launch_options()
        ex = None
        job_ids: list[str] = []
        for start in range(0, len(runs), chunk):
            part = runs[start:start + chunk]
            names = [os.path.basename(rd) for rd, _ in part]
            rendered = text = self._rendered(len(part))
            if len(part) == 1 or rendered is None:
                ex = ex if ex is not None else self._executor()
                text = self._submitit_text(ex, len(part))
                if rendered is not None and text != rendered:
                    import submitit

                    log.warning("`armorlab sweep --dry-run` shows a different sbatch script than submitit %s "
                                "writes; the job is submitted with submitit's", submitit.__version__)
            check_script(text, self.profile.setup)
            if before_array is not None:
                before_array(names)
            jobs = [TrainJob(rd, **launch, config=cfg) for rd, cfg in part]
            if len(jobs) == 1:
                ids = [self._submit_single(ex, jobs[0])]
            else:
                ids = self._submit_array(jobs, text, None if rendered is not None else ex)
            on_array(names, ids)
            job_ids += ids
            log.info("queued %d run(s) as Slurm job %s", len(part), ids[0].split("_", 1)[0])
        return job_ids

    def _submit_single(self, ex: Any, job: Any) -> str:
        import submitit

        saved, ex.parameters = ex.parameters, self._with_dependency(ex.parameters)
        try:
            return ex.submit(job).job_id
        except submitit.core.utils.FailedJobError as exc:
            raise self._refused(str(exc).strip()) from None
        finally:
            ex.parameters = saved

    def _with_dependency(self, params: dict[str, Any]) -> dict[str, Any]:
        """submitit's executor parameters with this submission's dependency among its sbatch options."""
        if self.dependency is None:
            return params
        extra = {**(params.get("additional_parameters") or {}), **dependency_parameters(self.dependency)}
        return {**params, "additional_parameters": extra}


def dependency_parameters(job_id: str) -> dict[str, str]:
    """sbatch options making a job wait for ``job_id`` to complete successfully, and be cancelled
    by Slurm when it cannot (its parent failed, was cancelled or timed out for good)."""
    return {"dependency": f"afterok:{job_id}", "kill_on_invalid_dep": "yes"}


def n_arrays(n_runs: int, chunk: int) -> int:
    return math.ceil(n_runs / chunk) if n_runs else 0
