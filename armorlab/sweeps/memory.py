"""The memory plan of a sweep's runs on its profile's GPUs, checked before anything is submitted
(armorlab.core.memory_plan; ``armorlab plan`` prints the tables). A profile without
``gpu_memory_gb`` (CPU, local runs) is not checked; ``ARMORLAB_MEMORY_CHECK=off`` skips it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from armorlab.core.memory_plan import MemoryPlan
from armorlab.core.plan_inputs import (
    gpu_bytes_from_profile,
    memory_check_enabled,
    parallelism_from_profile,
    plan_config,
)
from armorlab.errors import ArmorLabError


def plan_runs(profile: Any, runs: Iterable[Any], *, file: str | None = None) -> list[tuple[MemoryPlan, list[str]]]:
    """[(plan, run ids it covers)]: runs whose plans are equal share one (most grid axes do not
    change memory). Empty when the profile states no GPU memory."""
    gpu = gpu_bytes_from_profile(profile)
    if gpu is None:
        return []
    par = parallelism_from_profile(profile)
    groups: dict[int, tuple[MemoryPlan, list[str]]] = {}
    for run in runs:
        memory = plan_config(run.view, par, gpu, file=file)  # one object per distinct plan (cached)
        groups.setdefault(id(memory), (memory, []))[1].append(run.run_id)
    return list(groups.values())


def check_sweep_memory(profile: Any, runs: Iterable[Any], *, spec_file: str | None = None) -> None:
    """ArmorLabError for the first run whose plan does not fit the profile's GPUs."""
    if not memory_check_enabled():
        return
    for memory, run_ids in plan_runs(profile, runs, file=spec_file):
        why = memory.overflow()
        if why is not None:
            where = str(profile.path) if profile.path is not None else "<profile>"
            raise ArmorLabError(f"run {run_ids[0]} (and {len(run_ids) - 1} more) does not fit: memory plan: {why} "
                                f"(`armorlab plan {spec_file or 'SPEC'} --profile {where}` shows the plan; "
                                "ARMORLAB_MEMORY_CHECK=off skips the check)", key="gpu_memory_gb",
                                value=profile.gpu_memory_gb, file=where)


def summary(memory: MemoryPlan, run_ids: list[str]) -> str:
    peak = memory.peak_phase
    return (f"memory plan of {len(run_ids)} run(s): peak {memory.peak_bytes / 2**30:.1f} of "
            f"{memory.gpu_bytes / 2**30:.0f} GiB per GPU ({peak.label if peak else 'resident'}), "
            f"{memory.shape.name}, {memory.parallel.kind} × {memory.parallel.processes}")
