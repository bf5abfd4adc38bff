"""The sweep directory's manifest: what was planned and which jobs were submitted for which run.

```
<root>/<name>/sweep.json    this manifest (atomic JSON)
              spec.yaml     the spec as expanded (base inlined)
              .submitit/    submitit's sbatch files, pickles and job logs; one <A>_array.pkl per job array
              .logs/        local executor: one log per run
              .lock         held while a command decides and records submissions
              looks.json    `--until-resolved`: the design, every look, the decision jobs
              <run-id>/     run directories (runs.py)
```
``jobs`` maps each run id to the job ids of its submissions, oldest first; the last one is the
job that may still be queued or running. In a sweep with stages, ``stages`` maps each run id to
its stage and ``parents`` a later stage's run to the run it continues from (its job waits for
that run's job: afterok). ``pending`` lists the runs of a submission in flight:
saved (fsync'd) before sbatch, emptied when the job ids are recorded. It is what makes a sweep
crash-safe without fsyncing every run dir: a crash leaves it non-empty, and the next `armorlab
sweep` first recovers the jobs queued for those runs (their entries in ``.submitit`` array files
and pickles name the run dir), then rewrites whatever run dirs are still unsubmitted. Local jobs are named ``local:<host>:<pid>:<n>`` (pid =
the `armorlab sweep` process that runs them).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from armorlab.core.fsutil import atomic_write_text, open_append, read_regular_text
from armorlab.core.runs import now_iso
from armorlab.errors import ArmorLabError

MANIFEST, SPEC_COPY, SUBMITIT_DIR, LOGS_DIR, LOCK = "sweep.json", "spec.yaml", ".submitit", ".logs", ".lock"
LOOKS = "looks.json"  # a sweep run until resolved (armorlab.sweeps.until_resolved)
VERSION = 1


@dataclass
class Manifest:
    sweep_dir: Path
    name: str
    runs: list[str] = field(default_factory=list)
    jobs: dict[str, list[str]] = field(default_factory=dict)
    submissions: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)  # run id → its grid point, e.g. "alpha=0.7 seed=1"
    created: str = field(default_factory=now_iso)
    source: str | None = None
    pending: list[str] = field(default_factory=list)  # runs of a submission not yet recorded
    stages: dict[str, str] = field(default_factory=dict)   # run id → its stage (sweeps with stages)
    parents: dict[str, str] = field(default_factory=dict)  # run id → the run id it continues from

    @property
    def path(self) -> Path:
        return self.sweep_dir / MANIFEST

    @property
    def submitit_folder(self) -> Path:
        return self.sweep_dir / SUBMITIT_DIR

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "name": self.name, "created": self.created, "updated": now_iso(),
                "source": self.source, "spec": SPEC_COPY, "submitit_folder": SUBMITIT_DIR,
                "runs": self.runs, "labels": self.labels, "jobs": self.jobs, "submissions": self.submissions,
                "pending": self.pending, "stages": self.stages, "parents": self.parents}

    def save(self) -> None:
        atomic_write_text(self.path, manifest_text(self.to_dict()))

    def last_job(self, run_id: str) -> str | None:
        ids = self.jobs.get(run_id)
        return ids[-1] if ids else None

    def begin(self, run_ids: Sequence[str]) -> None:
        """Before sbatch: save which runs are about to be queued (see ``pending``)."""
        self.pending = list(dict.fromkeys([*self.pending, *run_ids]))
        self.save()

    def record(self, executor: str, run_ids: Sequence[str], job_ids: Sequence[str], *,
               recovered: bool = False) -> None:
        """Remember one submission (one Slurm array, or one local batch) and save at once, so a
        crash right after submitting cannot lose track of queued jobs."""
        if len(run_ids) != len(job_ids):
            raise ValueError("one job id per run")
        for rid, jid in zip(run_ids, job_ids, strict=True):
            self.jobs.setdefault(rid, []).append(jid)
        array = sorted({jid.split("_", 1)[0] for jid in job_ids}) if executor == "slurm" else []
        entry = {"executor": executor, "submitted": now_iso(), "n_runs": len(run_ids), "slurm_job_ids": array}
        if recovered:
            entry["recovered"] = True  # found after a crash between sbatch and this record
        self.submissions.append(entry)
        done = set(run_ids)
        self.pending = [r for r in self.pending if r not in done]
        self.save()


def manifest_text(data: dict[str, Any]) -> str:
    """JSON with one top-level key per line, each value compact: ``indent=`` would make json use
    its pure-Python encoder, ~10x slower on a 1,000-run manifest, which a submit saves twice."""
    body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(data.items()))
    return "{\n" + body + "\n}\n"


def load_manifest(sweep_dir: str | os.PathLike) -> Manifest | None:
    """The manifest of a sweep dir, or None when there is none (never submitted)."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / MANIFEST
    if not path.exists():
        return None
    try:
        data = json.loads(read_regular_text(path))
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError("not a manifest object")
        return Manifest(sweep_dir=sweep_dir, name=data["name"], runs=list(data.get("runs", [])),
                        labels=dict(data.get("labels", {})),
                        jobs={k: list(v) for k, v in data.get("jobs", {}).items()},
                        submissions=list(data.get("submissions", [])),
                        created=data.get("created") or now_iso(), source=data.get("source"),
                        pending=list(data.get("pending", [])), stages=dict(data.get("stages", {})),
                        parents=dict(data.get("parents", {})))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ArmorLabError(f"unreadable sweep manifest: {exc}", file=str(path)) from None
    except RecursionError:
        raise ArmorLabError("unreadable sweep manifest: nested too deeply", file=str(path)) from None


def parent_failed_reason(parent: str, reason: str | None) -> str:
    """Why a run of a later stage did not (and will not) start: the run it continues from failed."""
    return f"not started: the run it continues from ({parent}) failed" + (f": {reason}" if reason else "")


@contextlib.contextmanager
def locked(sweep_dir: str | os.PathLike) -> Iterator[None]:
    """Exclusive lock on the sweep dir, so two `armorlab sweep` calls cannot both submit a run."""
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open_append(sweep_dir / LOCK) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- local job ids
def local_job_id(n: int) -> str:
    import socket  # here: start-up of `sweep --dry-run` and `status`

    return f"local:{socket.gethostname()}:{os.getpid()}:{n}"


def is_local(job_id: str) -> bool:
    return job_id.startswith("local:")


def local_job_alive(job_id: str) -> bool:
    """True while the `armorlab sweep` process that owns a local job still runs on this host."""
    try:
        _, host, pid, _ = job_id.split(":", 3)
        pid_i = int(pid)
    except ValueError:
        return False
    import socket

    if host != socket.gethostname():
        return False  # another machine's process: we cannot tell, and cannot be running it here
    if pid_i == os.getpid():
        return False  # this very process: the jobs it recorded earlier are finished
    try:
        with open(f"/proc/{pid_i}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return False
        with open(f"/proc/{pid_i}/cmdline", "rb") as fh:
            return b"armorlab" in fh.read()  # a recycled pid belongs to some other program
    except OSError:
        pass
    try:
        os.kill(pid_i, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return not Path("/proc").is_dir()  # /proc exists but had no entry: gone
