"""Thin wrappers over Slurm's client commands (scontrol, squeue, sacct, scancel).

Every call passes argv lists (no shell) and honours ``SLURM_CONF`` from the environment. Job ids
are Slurm's strings: ``"123"`` for a single job, ``"123_4"`` for task 4 of array 123.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

DEFAULT_MAX_ARRAY_SIZE = 1000
# States in which a job still holds (or will take) a slot: a run in one must not be resubmitted.
ACTIVE_STATES = frozenset({
    "PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
    "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED",
})
_TIMEOUT_S = 30
# A pending job whose dependency can never be satisfied (the job it waits for failed): squeue
# says PENDING, reason DependencyNeverSatisfied. It will never run, so armorlab treats it as
# ended (not active) under this name; with --kill-on-invalid-dep=yes Slurm cancels it anyway.
NEVER_SATISFIED = "DEPENDENCY_NEVER_SATISFIED"


class SlurmUnavailable(RuntimeError):
    """A Slurm client command is missing or the controller did not answer."""


def available() -> bool:
    return shutil.which("sbatch") is not None and shutil.which("squeue") is not None


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise SlurmUnavailable(f"{argv[0]} not found")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{argv[0]} did not answer within {_TIMEOUT_S}s") from None


def reachable() -> bool:
    """True when the controller answers (`scontrol ping`)."""
    try:
        out = _run(["scontrol", "ping"])
    except SlurmUnavailable:
        return False
    return out.returncode == 0 and "UP" in out.stdout


def max_array_size(default: int = DEFAULT_MAX_ARRAY_SIZE) -> int:
    """The cluster's MaxArraySize (array indices run 0..MaxArraySize-1); ``default`` if unknown."""
    return max_array_size_later(default)()


def max_array_size_later(default: int = DEFAULT_MAX_ARRAY_SIZE) -> Callable[[], int]:
    """``max_array_size`` asked now and read later: `scontrol` runs while the caller does other
    work (a submit plans and prepares meanwhile); the returned function waits for its answer."""
    if shutil.which("scontrol") is None:
        return lambda: default
    proc = subprocess.Popen(["scontrol", "show", "config"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)

    got: list[int] = []

    def answer() -> int:  # waits once; later calls repeat the answer
        if not got:
            try:
                stdout, _ = proc.communicate(timeout=_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                stdout = ""
            got.append(_parse_max_array_size(stdout, proc.returncode, default))
        return got[0]

    return answer


def _parse_max_array_size(stdout: str, returncode: int, default: int) -> int:
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", stdout, re.MULTILINE)
    if returncode != 0 or m is None:
        log.warning("could not read MaxArraySize from `scontrol show config`; assuming %d", default)
        return default
    return max(1, int(m.group(1)))


def base_id(job_id: str) -> str:
    return job_id.split("_", 1)[0]


def _expand(job_id: str) -> list[str]:
    """``123_[0-2,5%4]`` → 123_0, 123_1, 123_2, 123_5; other ids unchanged."""
    m = re.fullmatch(r"(\d+)_\[([^\]]+)\]", job_id)
    if not m:
        return [job_id]
    out = []
    for part in m.group(2).split("%", 1)[0].split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += [f"{m.group(1)}_{i}" for i in range(int(lo), int(hi) + 1)]
        elif part:
            out.append(f"{m.group(1)}_{part}")
    return out


def _parse(text: str) -> dict[str, str]:
    states: dict[str, str] = {}
    for line in text.splitlines():
        if "|" not in line:
            continue
        jid, state, *reason = line.split("|", 2)
        jid = jid.strip()
        if not jid or "." in jid:  # job steps (123.batch) are not jobs
            continue
        state = state.strip().split(" ", 1)[0]  # "CANCELLED by 0" → CANCELLED
        if state == "PENDING" and reason and reason[0].strip() == "DependencyNeverSatisfied":
            state = NEVER_SATISFIED
        for one in _expand(jid):
            states[one] = state
    return states


def squeue_states(job_ids: Iterable[str]) -> dict[str, str]:
    """Live jobs among ``job_ids`` (queued, running, completing) → state. Raises SlurmUnavailable
    when squeue cannot answer: callers must not mistake that for "nothing is queued"."""
    bases = sorted({base_id(j) for j in job_ids})
    if not bases:
        return {}
    out = _run(["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", ",".join(bases)])
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            # every id is gone from the controller's memory (finished long ago): none is live
            return {}
        raise SlurmUnavailable(f"squeue failed: {out.stderr.strip()}")
    return _parse(out.stdout)


def sacct_states(job_ids: Iterable[str]) -> dict[str, str] | None:
    """Accounting states (finished jobs too), or None where sacct is missing or has no database."""
    bases = sorted({base_id(j) for j in job_ids})
    if not bases:
        return {}
    try:
        out = _run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(bases)])
    except SlurmUnavailable:
        return None
    if out.returncode != 0:
        log.info("sacct unavailable: %s", out.stderr.strip())
        return None
    return _parse(out.stdout)


def job_states(job_ids: Iterable[str]) -> dict[str, str]:
    """Best knowledge of each job's state: squeue's live view, else sacct's history, else "ENDED".
    Works without sacct."""
    job_ids = list(job_ids)
    history = sacct_states(job_ids) or {}
    live = squeue_states(job_ids)
    states = {}
    for j in job_ids:
        if j in live:
            states[j] = live[j]
        elif j in history and not is_active(history[j]):
            states[j] = history[j]
        else:
            # squeue no longer lists it, and accounting is missing or lags behind: it has ended
            states[j] = "ENDED"
    return states


def is_active(state: str | None) -> bool:
    return state in ACTIVE_STATES


def scancel(job_ids: Iterable[str]) -> None:
    ids = sorted(set(job_ids))
    if not ids:
        return
    out = _run(["scancel", *ids])
    if out.returncode != 0:
        raise SlurmUnavailable(f"scancel failed: {out.stderr.strip()}")
