"""What `armorlab status` and `armorlab cancel` need: one row per run of a sweep dir.

A run's state comes from its status.json (written by the trainer) combined with its last job's
state (squeue, plus sacct when the cluster has accounting; the local process table for local
jobs) and whether a live process holds the run dir's lock (RunDir.owner). Shown states: queued,
running, completed, failed, pending (not submitted, or preempted and waiting to be resubmitted),
lost (status says running but neither its job nor any trainer is alive: resubmit it).

A run of a later stage (it continues from a parent run: the manifest's ``parents``) that has not
started shows failed, with the reason, once its parent has failed — on Slurm its job was waiting
for the parent's (afterok) and is cancelled or left pending with DependencyNeverSatisfied — and
queued, "waits for <parent>", while its job waits.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from armorlab.core.config import LOGGING_KEYS
from armorlab.core.fsutil import SMALL_FILE_BYTES, read_regular_text
from armorlab.core.runs import RunDir, canonical_json
from armorlab.errors import ArmorLabError
from armorlab.sweeps import slurmctl
from armorlab.sweeps.manifest import (
    LOOKS,
    MANIFEST,
    Manifest,
    is_local,
    load_manifest,
    local_job_alive,
    parent_failed_reason,
)
from armorlab.sweeps.spec import short_value

log = logging.getLogger(__name__)

TERMINAL = ("completed", "stopped", "failed")
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class RunRow:
    run_id: str
    state: str
    last_step: int | None
    max_steps: int | None
    val_acc: float | None
    slurm_state: str | None
    attempts: int
    reason: str | None
    job_id: str | None
    point: str = ""
    warnings: list[str] = field(default_factory=list)  # status.json's (armorlab.core.health)
    world_size: int | None = None  # training processes of the last attempt


@dataclass
class SweepStatus:
    sweep_dir: Path
    manifest: Manifest | None
    rows: list[RunRow]
    warning: str | None = None
    counts: Counter = field(default_factory=Counter)
    looks: str | None = None  # a sweep run until resolved: where its looks stand (looks_summary)

    @property
    def finished(self) -> bool:
        """Nothing queued or running any more."""
        return not any(r.state in ("queued", "running") for r in self.rows)


def collect(sweep_dir: str | Path) -> SweepStatus:
    """The rows of a sweep dir, or of one run dir (the path `armorlab train` prints)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ArmorLabError("not a sweep or run directory", key="SWEEP_DIR", value=str(sweep_dir))
    only = None
    if (sweep_dir / "config.yaml").is_file() and not (sweep_dir / MANIFEST).exists():
        only, sweep_dir = sweep_dir.name, sweep_dir.parent  # a run dir: its sweep's view of it
    manifest = load_manifest(sweep_dir)
    run_ids = [r for r in manifest.runs if only in (None, r)] if manifest else []
    seen = set(run_ids)
    for cfg in [sweep_dir / only / "config.yaml"] if only else sorted(sweep_dir.glob("*/config.yaml")):
        rid = cfg.parent.name
        if not rid.startswith(".") and rid not in seen:
            run_ids.append(rid)
            seen.add(rid)
    if manifest is None and not run_ids:
        raise ArmorLabError("not a sweep directory (no sweep.json and no run dirs)", key="SWEEP_DIR",
                            value=str(sweep_dir))
    jobs = {rid: manifest.last_job(rid) for rid in run_ids} if manifest else {}
    slurm_states, warning = _slurm_states([j for j in jobs.values() if j and not is_local(j)])
    configs = {rid: _read_config(sweep_dir / rid) for rid in run_ids}
    points = _varying(configs)
    if manifest:
        points.update(manifest.labels)
    rows = []
    for rid in run_ids:
        rd = RunDir(sweep_dir / rid)
        status = rd.read_status()
        job = jobs.get(rid)
        if job is None:
            job_state, active = None, False
        elif is_local(job):
            active = local_job_alive(job)
            job_state = "local:running" if active else "local"
        else:
            job_state = slurm_states.get(job, "?" if warning else None)
            active = slurmctl.is_active(job_state)
        last_step, val_acc = _progress(rd)
        cfg = configs[rid]
        owned = status["state"] == "running" and rd.owner() is not None
        rows.append(RunRow(
            run_id=rid, state=_display_state(status["state"], job_state, active, owned), last_step=last_step,
            max_steps=cfg.get("max_steps") if cfg else None, val_acc=val_acc, slurm_state=job_state,
            attempts=int(status.get("attempt") or 0), reason=status.get("reason"), job_id=job,
            point=points.get(rid, ""), warnings=list(status.get("warnings") or []),
            world_size=status.get("world_size")))
    parents = dict(manifest.parents) if manifest else {}
    for rid, cfg in configs.items():  # a run dir a manifest does not know of names its parent itself
        run = (cfg.get("init_from") or {}).get("run") if isinstance(cfg.get("init_from"), Mapping) else None
        if isinstance(run, str) and run.startswith(f"{sweep_dir.name}/"):
            parents.setdefault(rid, run.split("/", 1)[1])
    _follow_parents(rows, parents)
    return SweepStatus(sweep_dir=sweep_dir, manifest=manifest, rows=rows, warning=warning,
                       counts=Counter(r.state for r in rows), looks=looks_summary(sweep_dir))


def read_looks_json(sweep_dir: Path) -> dict[str, Any] | None:
    """looks.json as plain JSON (armorlab.sweeps.until_resolved reads it with its design): status stays light."""
    try:
        data = json.loads(read_regular_text(Path(sweep_dir) / LOOKS, limit=SMALL_FILE_BYTES))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("looks"), list) else None


def looks_summary(sweep_dir: Path) -> str | None:
    """One line on a sweep run until resolved: each arm's verdict and the look it came at, the
    look in progress and its decision job, or why the chain stopped (`armorlab sweep
    --until-resolved` on the spec tells more)."""
    data = read_looks_json(sweep_dir)
    if data is None:
        return None
    looks = [x for x in data["looks"] if isinstance(x, dict)]
    chain = data.get("chain") if isinstance(data.get("chain"), dict) else {}
    verdicts: dict[str, str] = {}
    for look in looks:
        for c in look.get("comparisons") or ():
            if isinstance(c, dict) and c.get("verdict") not in (None, "continue") and not c.get("carried"):
                verdicts[str(c.get("arm"))] = f"{c['verdict']} at look {look.get('look')}"
    arms = (data.get("design") or {}).get("arms") or []
    parts = [f"{a}: {verdicts.get(a, 'open')}" for a in arms]
    done = bool(looks) and bool(looks[-1].get("done"))
    text = f"until resolved: {len(looks)} look(s) decided; " + "; ".join(parts)
    if done:
        return text + "; finished"
    current = len(looks) + 1
    jobs = [d.get("job_id") for d in chain.get("decision_jobs") or () if isinstance(d, dict) and d.get("look") == current]
    if jobs:
        text += f"; look {current} in progress, its decision job {jobs[-1]} runs after its jobs"
    stopped = chain.get("stopped")
    if isinstance(stopped, dict) and stopped.get("look") == current:
        text += f"; stopped: {stopped.get('reason')}"
    return text


def decision_jobs(sweep_dir: Path) -> list[str]:
    """Every Slurm decision job a sweep run until resolved has queued."""
    data = read_looks_json(sweep_dir) or {}
    chain = data.get("chain") if isinstance(data.get("chain"), dict) else {}
    return [str(d["job_id"]) for d in chain.get("decision_jobs") or () if isinstance(d, dict) and d.get("job_id")]


def _follow_parents(rows: list[RunRow], parents: Mapping[str, str]) -> None:
    """A later stage's run that has not started: failed with the reason once its parent has
    failed (or its job can never start), "waits for <parent>" while queued. Rows come in plan
    order, parents first, so a failure reaches grandchildren too."""
    by_id = {r.run_id: r for r in rows}
    for row in rows:
        parent = by_id.get(parents.get(row.run_id, ""))
        if parent is None or row.state in (*TERMINAL, "running"):
            continue
        if parent.state == "failed":
            row.state, row.reason = "failed", parent_failed_reason(parent.run_id, parent.reason)
        elif row.slurm_state == slurmctl.NEVER_SATISFIED:
            row.state = "failed"
            row.reason = (f"its job waits for a job of {parent.run_id} that did not complete "
                          "(DependencyNeverSatisfied): run the sweep again")
        elif row.state == "queued" and parent.state not in TERMINAL:
            row.reason = row.reason or f"waits for {parent.run_id}"


def _display_state(state: str, job_state: str | None, active: bool, owned: bool = False) -> str:
    """``owned``: a live process holds the run dir's lock (RunDir.owner), whatever the job says —
    e.g. the orphan of a killed sweep. A run that says running with no live owner and no live job
    is dead: "lost" (a killed trainer no longer shows as running forever)."""
    if owned:
        return "running"
    if active:
        if state in TERMINAL:
            return state
        if state == "running" or job_state in ("RUNNING", "local:running", "COMPLETING"):
            return "running"
        return "queued"
    if state == "running":
        return "running" if job_state == "?" else "lost"  # "?": Slurm did not answer, cannot tell
    return state


def _slurm_states(job_ids: list[str]) -> tuple[dict[str, str], str | None]:
    if not job_ids:
        return {}, None
    try:
        return slurmctl.job_states(job_ids), None
    except slurmctl.SlurmUnavailable as exc:
        return {}, f"Slurm state unknown: {exc}"


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(read_regular_text(path / "config.yaml"), Loader=_Loader)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: not UTF-8
        log.warning("ignoring unreadable %s: %s", path / "config.yaml", (str(exc).splitlines() or [""])[0])
        return {}
    except RecursionError:
        log.warning("ignoring %s: nested too deeply", path / "config.yaml")
        return {}
    return data if isinstance(data, dict) else {}


def _progress(rd: RunDir) -> tuple[int | None, float | None]:
    last_step, val_acc, val_step = None, None, -1
    for row in rd.iter_metrics():
        step = row["step"]
        last_step = step if last_step is None else max(last_step, step)
        acc = row.get("val/acc")
        if isinstance(acc, (int, float)) and not isinstance(acc, bool) and step >= val_step:
            val_acc, val_step = float(acc), step
    return last_step, val_acc


def _flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in cfg.items():
        if not prefix and key in LOGGING_KEYS:
            continue  # how a run logs is not what it is
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            try:
                out[f"{prefix}{key}"] = short_value(value) if isinstance(value, (int, float)) and \
                    not isinstance(value, bool) else value if isinstance(value, str) else canonical_json(value)
            except (TypeError, ValueError):  # a damaged config.yaml (dates, NaN): show, don't crash
                out[f"{prefix}{key}"] = repr(value)
    return out


def _varying(configs: Mapping[str, Mapping[str, Any]], limit: int = 4) -> dict[str, str]:
    """Per run, the config keys that differ across the sweep (``objective=up seed=1``)."""
    flat = {rid: _flatten(cfg) for rid, cfg in configs.items() if cfg}
    if len(flat) < 2:
        return {}
    keys = sorted({k for f in flat.values() for k in f})
    varying = [k for k in keys if len({f.get(k) for f in flat.values()}) > 1]
    # seed last: it is the least telling
    varying = sorted(varying, key=lambda k: (k == "seed", k))
    return {rid: " ".join(f"{k}={f.get(k)}" for k in varying[:limit]) for rid, f in flat.items()}


# --------------------------------------------------------------------------- cancel
def cancel(sweep_dir: str | Path) -> list[str]:
    """Cancel the sweep's queued and running jobs; returns the job ids (or local pids) signalled.

    Running trainers get SIGTERM, checkpoint and stop (status pending, "preempted at step N"), so
    `armorlab sweep` later resumes them.
    """
    sweep_dir = Path(sweep_dir)
    manifest = load_manifest(sweep_dir)
    if manifest is None:
        raise ArmorLabError("no sweep manifest here: nothing was submitted", key="SWEEP_DIR",
                            value=str(sweep_dir))
    last = [j for j in (manifest.last_job(r) for r in manifest.jobs) if j]
    # the decision jobs first: one that started meanwhile would queue the next look's runs
    slurm_ids = [*decision_jobs(sweep_dir), *(j for j in last if not is_local(j))]
    cancelled: list[str] = []
    if slurm_ids:
        live = slurmctl.squeue_states(slurm_ids)
        targets = [j for j in slurm_ids if slurmctl.is_active(live.get(j))]
        slurmctl.scancel(targets)
        cancelled += targets
    pids = {int(j.split(":")[2]) for j in last if is_local(j) and local_job_alive(j)}
    for pid in sorted(pids):
        try:
            os.kill(pid, signal.SIGTERM)  # the local sweep forwards it to its trainers
            cancelled.append(f"local pid {pid}")
        except ProcessLookupError:
            pass
    return cancelled
