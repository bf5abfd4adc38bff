"""`armorlab sweep`: spec → run dirs → only the runs that still need a job → executor → manifest.

A run is submitted when it is not completed, has no job queued or running (the manifest's last
job id for it, checked with squeue / the local process table) and — unless ``retry_failed`` — has
not failed. Running the same sweep again therefore submits nothing new, resumes preempted or
lost runs from their run dirs, and never starts a second job for a run.
"""

from __future__ import annotations

import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from armorlab.errors import ArmorLabError
from armorlab.fsutil import atomic_write_yaml
from armorlab.runs import RunDir
from armorlab.sweeps import slurmctl
from armorlab.sweeps.manifest import (
    SPEC_COPY,
    Manifest,
    is_local,
    load_manifest,
    local_job_alive,
    local_job_id,
    locked,
)
from armorlab.sweeps.profile import EXECUTORS, Profile, load_profile
from armorlab.sweeps.spec import RunPlan, SweepSpec, describe_point, expand, load_spec

log = logging.getLogger(__name__)

# Why a run is or is not submitted this time.
SUBMIT, DONE, ACTIVE, FAILED = "submit", "completed", "queued/running", "failed"


@dataclass
class SweepPlan:
    spec: SweepSpec
    profile: Profile
    executor: str
    sweep_dir: Path
    runs: list[RunPlan]
    retry_failed: bool = False
    actions: dict[str, str] = field(default_factory=dict)  # run id → SUBMIT / DONE / ACTIVE / FAILED

    @property
    def to_submit(self) -> list[RunPlan]:
        return [r for r in self.runs if self.actions.get(r.run_id) == SUBMIT]

    def counts(self) -> Counter:
        return Counter(self.actions[r.run_id] for r in self.runs)


def plan_sweep(spec_path: str | Path, *, root: str | Path = "runs", executor: str | None = None,
               profile: str | Path | None = None, retry_failed: bool = False) -> SweepPlan:
    """Load, expand and classify: nothing is written."""
    spec = load_spec(spec_path)
    if spec.search is not None:
        raise ArmorLabError("this spec has a `search:` section: run it with `armorlab tune`", key="search",
                            value="...", file=spec.file)
    prof = load_profile(profile if profile is not None else spec.profile_path())
    executor = executor or prof.executor
    if executor not in EXECUTORS:
        raise ArmorLabError(f"unknown executor (known: {', '.join(EXECUTORS)})", key="--executor",
                            value=executor)
    plan = SweepPlan(spec=spec, profile=prof, executor=executor, sweep_dir=Path(root) / spec.name,
                     runs=expand(spec), retry_failed=retry_failed)
    plan.actions = classify(plan.sweep_dir, plan.runs, retry_failed=retry_failed, executor=executor)
    return plan


def classify(sweep_dir: Path, runs: list[RunPlan], *, retry_failed: bool, executor: str) -> dict[str, str]:
    manifest = load_manifest(sweep_dir)
    last_jobs = {r.run_id: manifest.last_job(r.run_id) for r in runs} if manifest else {}
    active = _active_jobs([j for j in last_jobs.values() if j], executor=executor)
    actions = {}
    for r in runs:
        rd = RunDir(sweep_dir / r.run_id)
        state = rd.read_status()["state"] if rd.status_path.exists() else None
        if state == "completed":
            actions[r.run_id] = DONE
        elif last_jobs.get(r.run_id) in active:
            actions[r.run_id] = ACTIVE
        elif state == "failed" and not retry_failed:
            actions[r.run_id] = FAILED
        else:
            actions[r.run_id] = SUBMIT
    return actions


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


def prepare(plan: SweepPlan) -> Manifest:
    """Write the sweep dir: spec copy, manifest (planned run ids) and the run dirs to submit."""
    plan.sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_yaml(plan.sweep_dir / SPEC_COPY, plan.spec.to_dict())
    manifest = load_manifest(plan.sweep_dir) or Manifest(sweep_dir=plan.sweep_dir, name=plan.spec.name)
    manifest.source = str(plan.spec.path) if plan.spec.path else None
    known = set(manifest.runs)
    manifest.runs += [r.run_id for r in plan.runs if r.run_id not in known]
    manifest.labels.update({r.run_id: describe_point(r.point) for r in plan.runs})
    # Each run dir costs two fsync'd files; done in parallel, their fsyncs overlap.
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda r: RunDir.create(plan.sweep_dir, r.config), plan.to_submit))
    manifest.save()
    return manifest


def submit_slurm(plan: SweepPlan) -> list[str]:
    """Queue the plan's runs as job arrays and record them; returns the job ids (fire-and-forget)."""
    from armorlab.sweeps.executors import SlurmSubmitter

    with locked(plan.sweep_dir):
        # decide again under the lock: another `armorlab sweep` may have queued runs meanwhile
        plan.actions = classify(plan.sweep_dir, plan.runs, retry_failed=plan.retry_failed, executor="slurm")
        manifest = prepare(plan)
        todo = [plan.sweep_dir / r.run_id for r in plan.to_submit]
        if not todo:
            return []
        for rd in todo:
            _reset_failed(RunDir(rd))
        submitter = SlurmSubmitter(plan.sweep_dir, plan.profile, job_name=plan.spec.name)
        return submitter.submit(todo, chunk=submitter.chunk_size(),
                                on_array=lambda rids, jids: manifest.record("slurm", rids, jids))


def run_local(plan: SweepPlan, *, workers: int | None = None, on_event: Any = None) -> dict[str, Any]:
    """Train the plan's runs on this machine (blocking); returns outcomes by run id."""
    from armorlab.sweeps.executors import LocalExecutor

    executor = LocalExecutor(plan.sweep_dir, plan.profile, workers=workers)
    with locked(plan.sweep_dir):
        plan.actions = classify(plan.sweep_dir, plan.runs, retry_failed=plan.retry_failed, executor="local")
        manifest = prepare(plan)
        todo = [plan.sweep_dir / r.run_id for r in plan.to_submit]
        job_ids = [local_job_id(i) for i in range(len(todo))]
        if todo:
            for rd in todo:
                _reset_failed(RunDir(rd))
            manifest.record("local", [rd.name for rd in todo], job_ids)
    if not todo:
        return {}
    return executor.run(todo, job_ids, on_event=on_event)


def _reset_failed(rd: RunDir) -> None:
    """A failed run that is retried goes back to pending (its attempt count and history stay)."""
    status = rd.read_status()
    if status["state"] == "failed":
        rd.write_status("pending", reason=f"retrying after: {status.get('reason')}")

