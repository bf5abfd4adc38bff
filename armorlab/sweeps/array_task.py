"""One file per Slurm job array instead of one pickle per task, with submitit's job side unchanged.

submitit's array submission writes each task's pickle (``<A>_<a>_submitted.pkl``) as a file of
its own: 1,000 file creations for 1,000 runs, two thirds of a sweep's submit time on a local
disk and far more on a cluster's NFS/Lustre. armorlab writes ONE file per array,
``<A>_array.pkl``, whose entry ``a`` is task ``a``'s TrainJob with the two numbers submitit's
array submission gives it (the time limit in minutes and the number of requeues left), and
each task runs this module instead of ``submitit.core._submit``:

1. if submitit's ``<A>_<a>_submitted.pkl`` is not there yet, write it from entry ``a``: the
   ``DelayedSubmission`` submitit would have pickled (the same bytes), create-exclusive (hard
   link of a temp file): a requeued task (preemption, time limit) finds the pickle submitit
   checkpointed there and must keep it;
2. hand over to ``submitit.core.submission.process_job``: signals, checkpoint + requeue,
   result pickles and logs are submitit's.

Making the DelayedSubmission on the node keeps submitit out of the submitting process (its
import — asyncio, ssl, importlib.metadata — cost a 1,000-run submit more than its pickles).

The array file is written under a temporary name before sbatch and renamed to ``<A>_array.pkl``
once sbatch has answered with the array id ``A``; a task that starts before the rename waits
for it, as submitit's own tasks wait for their moved pickles. A crash between sbatch and the
rename leaves tasks that find nothing and fail (no run starts twice); the next sweep resubmits.

File format: ``MAGIC``, the entry count and ``count + 1`` offsets (little-endian uint64), then
the entries (pickles of ``(TrainJob, timeout_min, timeout_countdown)``) back to back, so a task
reads its own entry, not the whole array's.

    python -u -m armorlab.sweeps.array_task <submitit folder>     (in the array's sbatch script)
"""


from __future__ import annotations

import os
import pickle
import re
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from armorlab.core.fsutil import atomic_write_bytes

MAGIC = b"armorlab-array-2\n"
_U64 = struct.Struct("<Q")
ARRAY_SUFFIX = "_array.pkl"
ARRAY_FILE = re.compile(r"(\d+)_array\.pkl")  # a published array file: <array job id>_array.pkl
WAIT_S = 60  # for the array file to appear (submitit waits as long for its pickles)


def task_entry(job: Any, timeout_min: int, timeout_countdown: int) -> bytes:
    """One task's entry: its job and what submitit's ``DelayedSubmission.set_timeout`` gets."""
    return pickle.dumps((job, timeout_min, timeout_countdown), pickle.HIGHEST_PROTOCOL)


def entry_job(entry: bytes) -> Any:
    """The job (a TrainJob) of an entry."""
    return pickle.loads(entry)[0]


def submitted_pickle(entry: bytes) -> bytes:
    """The bytes submitit's array submission would have written for this task: its job as a
    ``DelayedSubmission`` with the entry's timeout, cloudpickled (submitit's ``dump``)."""
    import cloudpickle
    from submitit.core.utils import DelayedSubmission

    job, timeout_min, countdown = pickle.loads(entry)
    delayed = DelayedSubmission(job)
    delayed.set_timeout(timeout_min, countdown)
    return cloudpickle.dumps(delayed, pickle.HIGHEST_PROTOCOL)


def array_bytes(entries: Sequence[bytes]) -> bytes:
    offsets, pos = [], 0
    for e in entries:
        offsets.append(pos)
        pos += len(e)
    offsets.append(pos)
    head = MAGIC + _U64.pack(len(entries)) + b"".join(_U64.pack(o) for o in offsets)
    return head + b"".join(entries)


def _table(fh) -> tuple[int, list[int]]:
    if fh.read(len(MAGIC)) != MAGIC:
        raise ValueError(f"{fh.name} is not an armorlab array file")
    (n,) = _U64.unpack(fh.read(_U64.size))
    raw = fh.read(_U64.size * (n + 1))
    if len(raw) != _U64.size * (n + 1):
        raise ValueError(f"{fh.name} is truncated")
    return n, [o for (o,) in _U64.iter_unpack(raw)]


def read_entry(path: str | os.PathLike, index: int) -> bytes:
    """Entry ``index`` of an array file (one seek, one read)."""
    with open(path, "rb") as fh:
        n, offsets = _table(fh)
        if not 0 <= index < n:
            raise IndexError(f"{path} holds {n} tasks, not task {index}")
        fh.seek(offsets[index], os.SEEK_CUR)
        data = fh.read(offsets[index + 1] - offsets[index])
    if len(data) != offsets[index + 1] - offsets[index]:
        raise ValueError(f"{path} is truncated")
    return data


def read_entries(path: str | os.PathLike) -> list[bytes]:
    with open(path, "rb") as fh:
        n, offsets = _table(fh)
        data = fh.read()
    if len(data) != offsets[-1]:
        raise ValueError(f"{path} is truncated")
    return [data[offsets[i]:offsets[i + 1]] for i in range(n)]


def materialise(folder: str | os.PathLike, array_id: str, index: int, *, wait_s: float = WAIT_S) -> Path:
    """Make sure task ``<array_id>_<index>`` has submitit's pickle; never replace one that exists
    (the requeue's checkpoint). Returns its path."""
    from submitit.core.utils import JobPaths


    target = JobPaths(folder, job_id=f"{array_id}_{index}").submitted_pickle
    if target.exists():
        return target
    source = Path(folder).expanduser().absolute() / f"{array_id}{ARRAY_SUFFIX}"
    deadline = time.monotonic() + wait_s
    while not source.exists():
        if time.monotonic() >= deadline:
            raise RuntimeError(f"waited {wait_s:.0f} s for {source}: its sweep did not finish the submission")
        time.sleep(0.5)
    atomic_write_bytes(target, submitted_pickle(read_entry(source, index)), replace=False)
    return target


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Run one task of an armorlab job array (via submitit).")
    ap.add_argument("folder", help="the sweep's submitit folder")
    folder = ap.parse_args(argv).folder
    array_id, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if not array_id or index is None:
        sys.exit("armorlab.sweeps.array_task runs inside a Slurm job array (no SLURM_ARRAY_JOB_ID)")
    materialise(folder, array_id, int(index))
    from submitit.core.submission import process_job

    process_job(folder)


if __name__ == "__main__":
    main()
