"""`armorlab sweep`: spec → run dirs → only the runs that still need a job → executor → manifest.

A run is submitted when it is not completed, has no job queued or running (the manifest's last
job id for it, checked with squeue / the local process table) and — unless ``retry_failed`` — has
not failed. Running the same sweep again therefore submits nothing new, resumes preempted or
lost runs from their run dirs, and never starts a second job for a run.

Stages: a run of a later stage continues from a run of an earlier one (its parent). On Slurm it
is queued at once, its array waiting for the parent's job (``afterok``; none when the parent has
completed); locally it starts when its parent completes. A run whose parent failed is not
submitted: it is marked failed with the reason (``--retry failed`` retries both). A run whose
parent is running outside this sweep's reach (a live trainer with no Slurm job) waits for the
next `armorlab sweep`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from armorlab.core.config import deep_merge
from armorlab.core.fsutil import atomic_write_yaml, writable_dir
from armorlab.core.runs import FINAL_STATES, RunDir
from armorlab.core.vllm_config import check_vllm_installed
from armorlab.errors import ArmorLabError
from armorlab.sweeps import slurmctl
from armorlab.sweeps.controls import Pair
from armorlab.sweeps.manifest import (
    SPEC_COPY,
    Manifest,
    is_local,
    load_manifest,
    local_job_alive,
    local_job_id,
    locked,
    parent_failed_reason,
)
from armorlab.sweeps.memory import check_sweep_memory
from armorlab.sweeps.profile import EXECUTORS, Profile, load_profile
from armorlab.sweeps.spec import RunPlan, SweepSpec, control_pairs, describe_run, expand, load_spec
from armorlab.vllm.server_checks import check_runs

log = logging.getLogger(__name__)

# Why a run is or is not submitted this time.
SUBMIT, DONE, ACTIVE, FAILED = "submit", "completed", "queued/running", "failed"
BLOCKED, WAIT = "parent failed", "waits for parent"


@dataclass
class SweepPlan:
    spec: SweepSpec
    profile: Profile
    executor: str
    sweep_dir: Path
    runs: list[RunPlan]
    retry_failed: bool = False
    actions: dict[str, str] = field(default_factory=dict)  # run id → SUBMIT / DONE / ACTIVE / FAILED / ...
    controls: list[tuple[str | None, list[Pair]]] = field(default_factory=list)  # stage → compared pairs

    @property
    def to_submit(self) -> list[RunPlan]:
        return [r for r in self.runs if self.actions.get(r.run_id) == SUBMIT]

    def counts(self) -> Counter:
        return Counter(self.actions[r.run_id] for r in self.runs)


def plan_sweep(spec_path: str | Path, *, root: str | Path = "runs", executor: str | None = None,
               profile: str | Path | None = None, retry_failed: bool = False,
               overrides: Mapping[str, Any] | None = None) -> SweepPlan:
    """Load, expand and classify: nothing is written. ``overrides`` (nested, as from
    ``config.parse_overrides``) replace keys of the spec's base in every run."""
    spec, prof, executor = load_sweep(spec_path, executor=executor, profile=profile, overrides=overrides)
    runs = expand(spec)
    return plan_runs(spec, runs, root=root, profile=prof, executor=executor, retry_failed=retry_failed,
                     controls=control_pairs(spec, runs))


def load_sweep(spec_path: str | Path, *, executor: str | None = None, profile: str | Path | None = None,
               overrides: Mapping[str, Any] | None = None) -> tuple[SweepSpec, Profile, str]:
    """The spec (``overrides`` applied), its profile and the executor to use."""
    spec = load_spec(spec_path)
    if overrides:  # over every stage's base too: an override wins over what the spec says
        stages = None if spec.stages is None else \
            [dataclasses.replace(st, base=deep_merge(st.base, overrides)) for st in spec.stages]
        spec = dataclasses.replace(spec, base=deep_merge(spec.base, overrides), stages=stages)
    if spec.search is not None:
        raise ArmorLabError("this spec has a `search:` section: run it with `armorlab tune`", key="search",
                            value="...", file=spec.file)
    prof = load_profile(profile if profile is not None else spec.profile_path())
    executor = executor or prof.executor
    if executor not in EXECUTORS:
        raise ArmorLabError(f"unknown executor (known: {', '.join(EXECUTORS)})", key="--executor",
                            value=executor)
    return spec, prof, executor


def plan_runs(spec: SweepSpec, runs: list[RunPlan], *, root: str | Path, profile: Profile, executor: str,
              retry_failed: bool = False, controls: list[tuple[str | None, list[Pair]]] | None = None) -> SweepPlan:
    """A plan of ``runs`` (the spec's, or some of them): checked against the profile and classified."""
    plan = SweepPlan(spec=spec, profile=profile, executor=executor, sweep_dir=writable_dir(root, key="--root") / spec.name,
                     runs=runs, retry_failed=retry_failed)
    plan.controls = list(controls or [])
    check_runs(profile.vllm_servers, plan.runs, profile_file=str(profile.path) if profile.path else "<profile>",
               spec_file=spec.file, executor=executor)
    if executor == "local" and profile.python is None:  # this Python trains them: vLLM must be here
        for r in plan.runs:
            check_vllm_installed(r.config, spec.file)
    plan.actions = classify(plan.sweep_dir, plan.runs, retry_failed=retry_failed, executor=executor)
    check_sweep_memory(profile, [r for r in plan.runs if plan.actions[r.run_id] == SUBMIT], spec_file=spec.file)
    return plan


def classify(sweep_dir: Path, runs: list[RunPlan], *, retry_failed: bool, executor: str) -> dict[str, str]:
    manifest = load_manifest(sweep_dir)
    last_jobs = {r.run_id: manifest.last_job(r.run_id) for r in runs} if manifest else {}
    active = _active_jobs([j for j in last_jobs.values() if j], executor=executor)
    actions = {}
    # one listing instead of a stat per run: a fresh sweep (or a dry run of one) has no run dirs
    present = set(os.listdir(sweep_dir)) if sweep_dir.is_dir() else set()
    for r in runs:
        rd = RunDir(sweep_dir / r.run_id) if r.run_id in present else None
        state = rd.read_status()["state"] if rd is not None and rd.status_path.exists() else None
        if state in FINAL_STATES:  # stopped (stop_on_collapse) is final: never restarted
            actions[r.run_id] = DONE
        elif last_jobs.get(r.run_id) in active or (state == "running" and rd.owner() is not None):
            actions[r.run_id] = ACTIVE  # a live job, or a live trainer (the orphan of a killed sweep)
        elif state == "failed" and not retry_failed:
            actions[r.run_id] = FAILED
        else:
            actions[r.run_id] = SUBMIT
        if r.parent is not None and actions[r.run_id] == SUBMIT:  # parents come first in plan order
            parent = actions.get(r.parent)
            if parent in (FAILED, BLOCKED):
                actions[r.run_id] = BLOCKED
            elif parent == WAIT or (parent == ACTIVE and not _waitable(last_jobs.get(r.parent), active, executor)):
                actions[r.run_id] = WAIT
    return actions


def _waitable(job_id: str | None, active: set[str], executor: str) -> bool:
    """Whether a queued/running parent's job is a live Slurm job another Slurm job can wait for
    (not when the parent is a trainer outside Slurm, or the sweep runs locally)."""
    return executor == "slurm" and job_id is not None and not is_local(job_id) and job_id in active


def _active_jobs(job_ids: list[str], *, executor: str) -> set[str]:
    local = {j for j in job_ids if is_local(j) and local_job_alive(j)}
    slurm_ids = [j for j in job_ids if not is_local(j)]
    if not slurm_ids:
        return local
    if not slurmctl.available() and executor == "local":
        log.warning("the manifest lists Slurm jobs but this machine has no Slurm: assuming none is live")
        return local
    try:
        live = slurmctl.squeue_states(slurm_ids)
    except slurmctl.SlurmUnavailable as exc:
        # guessing "not queued" could start a second job for a run: refuse instead
        raise ArmorLabError(f"cannot tell which of this sweep's Slurm jobs are still queued ({exc})",
                            key="sweep", value=None) from None
    return local | {j for j in slurm_ids if slurmctl.is_active(live.get(j))}


def prepare(plan: SweepPlan, *, defer_new: bool = False,
            save: bool = True) -> tuple[Manifest, list[tuple[str, dict[str, Any] | None]]]:
    """Write the sweep dir: spec copy, manifest (planned run ids) and the run dirs to submit;
    returns the manifest and, for each run to submit, its dir (an absolute path) and the config
    its job must write there (None when the dir is written already).

    ``defer_new`` (Slurm): a run that has no dir yet gets none here; its job carries its config
    and writes the dir when it starts (TrainJob.config), so submitting 1,000 fresh runs writes
    no run dir at all. Otherwise run dirs that never had a job are written without fsync: until
    a job for them is recorded nothing reads them, and a crash that tears one leaves the run
    unsubmitted, so the next sweep rewrites it (RunDir.create(durable=False)). Run dirs that had
    a job (retries, lost runs) keep their files and their fsync'd status updates. ``save=False``
    leaves saving the manifest to the caller (a submission saves it in ``Manifest.begin``)."""
    plan.sweep_dir.mkdir(parents=True, exist_ok=True)
    # no fsync: the spec copy is for reading; every sweep of this dir writes it again
    atomic_write_yaml(plan.sweep_dir / SPEC_COPY, plan.spec.to_dict(), durable=False)
    manifest = load_manifest(plan.sweep_dir) or Manifest(sweep_dir=plan.sweep_dir, name=plan.spec.name)
    if plan.spec.path is None or Path(plan.spec.path).resolve() != (plan.sweep_dir / SPEC_COPY).resolve():
        manifest.source = str(plan.spec.path) if plan.spec.path else None  # not the copy a decision job reads
    known = set(manifest.runs)
    manifest.runs += [r.run_id for r in plan.runs if r.run_id not in known]
    manifest.labels.update({r.run_id: describe_run(r) for r in plan.runs})
    manifest.stages.update({r.run_id: r.stage for r in plan.runs if r.stage is not None})
    manifest.parents.update({r.run_id: r.parent for r in plan.runs if r.parent is not None})
    if save:
        manifest.save()
    present = set(os.listdir(plan.sweep_dir))
    base = str(plan.sweep_dir.absolute())
    todo: list[tuple[str, dict[str, Any] | None]] = []
    for r in plan.to_submit:
        if defer_new and r.run_id not in present:
            todo.append((f"{base}/{r.run_id}", r.config))
            continue
        RunDir.create(plan.sweep_dir, r.config, durable=bool(manifest.jobs.get(r.run_id)))
        todo.append((f"{base}/{r.run_id}", None))
        if r.run_id in present:
            _reset_failed(RunDir(plan.sweep_dir / r.run_id))
    _mark_blocked(plan, present)
    return manifest, todo


def _mark_blocked(plan: SweepPlan, present: set[str]) -> None:
    """Runs whose parent failed are failed too, with the reason (status shows it; --retry failed
    retries parent and child)."""
    for r in plan.runs:
        if plan.actions.get(r.run_id) != BLOCKED:
            continue
        parent = RunDir(plan.sweep_dir / r.parent).read_status()
        why = parent_failed_reason(r.parent, parent.get("reason"))
        rd = RunDir(plan.sweep_dir / r.run_id) if r.run_id in present else RunDir.create(plan.sweep_dir, r.config)
        status = rd.read_status()
        if status["state"] != "failed" or status.get("reason") != why:
            rd.write_status("failed", reason=why)


def recover_submitted(manifest: Manifest) -> int:
    """After a crash between sbatch and the manifest's record: find the jobs queued for the
    manifest's ``pending`` runs and record them, so the next sweep sees them as queued instead of
    submitting the runs twice. A queued array is a ``.submitit/<A>_array.pkl`` (task ``a``'s
    TrainJob names its run dir, its job id is ``<A>_<a>``); a single job, or an array queued by an
    armorlab before one-file arrays, a ``<job id>_submitted.pkl``. Job ids the manifest knows are
    skipped; array files that were never published are removed. Returns how many were found."""
    if not manifest.pending:
        return 0
    import pickle

    # lazy: submitit and the job machinery (vLLM servers included) load only when a sweep submits
    from armorlab.sweeps.array_task import ARRAY_FILE, ARRAY_SUFFIX, entry_job, read_entries

    pending = set(manifest.pending)
    known = {j for ids in manifest.jobs.values() for j in ids}
    found: dict[str, str] = {}

    def take(job_id: str, load: Callable[[], Any], where: Path) -> None:
        try:
            run_dir = Path(load().run_dir)  # load: the TrainJob
        except Exception as exc:  # not ours, or torn: it cannot have started a run of ours either
            log.info("skipping unreadable submitit pickle %s: %s", where, exc)
            return
        if run_dir.name in pending and run_dir.parent.resolve() == manifest.sweep_dir.resolve():
            found[run_dir.name] = job_id

    folder = manifest.submitit_folder
    for pkl in sorted(folder.glob(f"*{ARRAY_SUFFIX}")):
        m = ARRAY_FILE.fullmatch(pkl.name)
        if m is None:  # an array file sbatch never answered for (the lock says its sweep is dead):
            pkl.unlink(missing_ok=True)  # no task reads it
            continue
        try:
            entries = read_entries(pkl)
        except (OSError, ValueError) as exc:
            log.info("skipping unreadable array file %s: %s", pkl, exc)
            continue
        for a, entry in enumerate(entries):
            if f"{m.group(1)}_{a}" not in known:
                take(f"{m.group(1)}_{a}", lambda entry=entry: entry_job(entry), pkl)
    suffix = "_submitted.pkl"
    for pkl in sorted(folder.glob(f"*{suffix}")):
        job_id = pkl.name[:-len(suffix)]
        if job_id not in known:
            take(job_id, lambda pkl=pkl: pickle.loads(pkl.read_bytes()).function, pkl)
    if found:
        log.warning("recovered %d job(s) queued by an interrupted sweep", len(found))
        manifest.record("slurm", list(found), list(found.values()), recovered=True)
    manifest.pending = []
    manifest.save()
    return len(found)


def submit_slurm(plan: SweepPlan) -> list[str]:
    """Queue the plan's runs as job arrays and record them; returns the job ids (fire-and-forget)."""
    from armorlab.sweeps.executors import SlurmSubmitter  # lazy: see recover_submitted

    cluster_max = slurmctl.max_array_size_later()  # asked now, read when the arrays are cut
    try:
        with locked(plan.sweep_dir):
            manifest = load_manifest(plan.sweep_dir)
            if manifest is not None:
                recover_submitted(manifest)
            # decide again under the lock: another `armorlab sweep` may have queued runs meanwhile
            plan.actions = classify(plan.sweep_dir, plan.runs, retry_failed=plan.retry_failed, executor="slurm")
            _cancel_never_satisfied(plan)
            manifest, todo = prepare(plan, defer_new=True, save=False)
            if not todo:
                manifest.save()
                return []
            # the first ``begin`` saves the manifest (planned runs and the array's pending ids) before sbatch
            submitter = SlurmSubmitter(plan.sweep_dir, plan.profile, job_name=plan.spec.name)
            chunk = submitter.chunk_size(cluster_max())
            job_ids: list[str] = []
            for parent, group in dependency_groups(plan, todo):
                # a parent's job is known by now: it was queued before (ACTIVE) or by an earlier group
                after = manifest.last_job(parent) if parent is not None else None
                job_ids += submitter.submit(group, chunk=chunk, before_array=manifest.begin, dependency=after,
                                            on_array=lambda rids, jids: manifest.record("slurm", rids, jids))
            return job_ids
    finally:
        cluster_max()  # reaps scontrol when no array was cut


def _cancel_never_satisfied(plan: SweepPlan) -> None:
    """A run about to be queued again may still have a job pending for a dependency that can never
    be satisfied (a cluster that ignored --kill-on-invalid-dep): cancel it, it would never run."""
    manifest = load_manifest(plan.sweep_dir)
    if manifest is None:
        return
    last = [j for r in plan.to_submit if (j := manifest.last_job(r.run_id)) and not is_local(j)]
    if not last:
        return
    states = slurmctl.squeue_states(last)
    stale = [j for j in last if states.get(j) == slurmctl.NEVER_SATISFIED]
    if stale:
        log.info("cancelling %d job(s) whose dependency can never be satisfied", len(stale))
        slurmctl.scancel(stale)


def dependency_groups(plan: SweepPlan, todo: list[tuple[str, dict[str, Any] | None]]
                      ) -> list[tuple[str | None, list[tuple[str, dict[str, Any] | None]]]]:
    """The runs to queue, grouped by the run whose job they wait for (None: none, their parent has
    completed or they have none), in the order a group's job ids become known: runs without a wait
    first, then each parent's children (parents come before children in plan order)."""
    by_id = {r.run_id: r for r in plan.runs}
    groups: dict[str | None, list[tuple[str, dict[str, Any] | None]]] = {None: []}
    for item in todo:
        r = by_id[os.path.basename(item[0])]
        waits = r.parent is not None and plan.actions.get(r.parent) in (SUBMIT, ACTIVE)
        groups.setdefault(r.parent if waits else None, []).append(item)
    return [(parent, group) for parent, group in groups.items() if group]


def run_local(plan: SweepPlan, *, workers: int | None = None, on_event: Any = None,
              detach: bool = False) -> dict[str, Any]:
    """Train the plan's runs on this machine (blocking); returns outcomes by run id. The trainers
    die with this process (they checkpoint on the SIGTERM) unless ``detach``."""
    from armorlab.sweeps.executors import LocalExecutor  # lazy: see recover_submitted

    executor = LocalExecutor(plan.sweep_dir, plan.profile, workers=workers, detach=detach)
    with locked(plan.sweep_dir):
        plan.actions = classify(plan.sweep_dir, plan.runs, retry_failed=plan.retry_failed, executor="local")
        manifest, prepared = prepare(plan)
        todo = [Path(rd) for rd, _ in prepared]
        job_ids = [local_job_id(i) for i in range(len(todo))]
        if todo:
            manifest.record("local", [rd.name for rd in todo], job_ids)
    if not todo:
        return {}
    # a run starts when the run it continues from has completed here (none: it had before)
    after = {r.run_id: r.parent for r in plan.to_submit if r.parent is not None}
    return executor.run(todo, job_ids, on_event=on_event, after=after)


def _reset_failed(rd: RunDir) -> None:
    """A failed run that is retried goes back to pending (its attempt count and history stay)."""
    status = rd.read_status()
    if status["state"] == "failed":
        rd.write_status("pending", reason=f"retrying after: {status.get('reason')}")

