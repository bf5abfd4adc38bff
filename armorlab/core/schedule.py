"""The two step counters and the schedules counted in them, as pure functions (no torch).

A run counts **optimizer steps** (TRL's ``global_step``, the metrics' ``step``) and **rollouts**
(generation batches: one batch sampled by the policy and every update trained on it; verl's
``global_steps`` and the papers' unit for τ, reset schedules and horizons, the metrics' ``rollout``).
TRL samples a new batch every ``steps_per_generation × num_iterations`` micro-steps and updates
the weights every ``gradient_accumulation_steps`` micro-steps, so one rollout holds

    U = steps_per_generation · num_iterations / gradient_accumulation_steps   optimizer steps.

``step_unit: rollout`` counts ``ref_reset_steps``, ``ref_reset_schedule`` and ``val_every`` in
rollouts and needs a whole U (every rollout then ends at the end of an optimizer step); "after
rollout r" means at the end of optimizer step r·U, once all of rollout r's updates are done,
before rollout r + 1 is sampled. docs/schedules.md lists the boundary cases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from armorlab.errors import ArmorLabError

STEP_UNITS = ("optimizer", "rollout")


def updates_per_rollout(steps_per_generation: int, num_iterations: int = 1,
                        gradient_accumulation_steps: int = 1) -> Fraction:
    """U = steps_per_generation · num_iterations / gradient_accumulation_steps: optimizer steps
    trained on one rollout (a fraction when the accumulation does not divide the generation)."""
    return Fraction(int(steps_per_generation) * int(num_iterations), int(gradient_accumulation_steps))


def rollout_at(step: int, per_rollout: Fraction | int) -> int:
    """The rollout (1-based; 0 before training) whose updates optimizer step ``step`` completes
    or is part of: ⌈step / U⌉. At a boundary, step = r·U, it is r: the line logged after
    rollout r's last update says rollout r."""
    return math.ceil(Fraction(int(step)) / Fraction(per_rollout)) if step > 0 else 0


def unit_count(step: int, unit: str, per_rollout: Fraction | int) -> int | None:
    """The schedule count that ends with optimizer step ``step``: ``step`` itself in optimizer
    steps; in rollouts r when step = r·U, else None (rollout ⌈step/U⌉ still has updates to run,
    so nothing counted in rollouts happens after this step)."""
    if unit == "optimizer":
        return int(step)
    if unit != "rollout":
        raise ValueError(f"step_unit must be one of {STEP_UNITS}, got {unit!r}")
    count = Fraction(int(step)) / Fraction(per_rollout)
    return int(count) if count.denominator == 1 else None


def optimizer_steps(count: int, unit: str, per_rollout: Fraction | int) -> int:
    """Optimizer steps in ``count`` units: ``count``, or count·U rollouts (U whole)."""
    if unit == "optimizer":
        return int(count)
    total = int(count) * Fraction(per_rollout)
    if total.denominator != 1:
        raise ValueError(f"{count} rollouts of {per_rollout} optimizer steps are not a whole number of steps")
    return int(total)


def every_due(step: int, every: int, unit: str, per_rollout: Fraction | int) -> bool:
    """Something done "every N units" (``val_every``) is due at the end of optimizer step ``step``:
    a unit ends there and its count is a multiple of N (N = 0: never; step 0 is the caller's)."""
    count = unit_count(step, unit, per_rollout)
    return bool(every) and count is not None and count > 0 and count % int(every) == 0


def config_per_rollout(cfg: Mapping[str, Any]) -> Fraction | None:
    """U of a resolved run config (TRL's defaults for absent keys: GA 1, steps_per_generation =
    GA, num_iterations 1); None when only ``generation_batch_size`` fixes the generation, whose
    steps then depend on the number of processes."""
    ga = int(cfg.get("gradient_accumulation_steps") or 1)
    spg = cfg.get("steps_per_generation")
    if spg is None and cfg.get("generation_batch_size") is not None:
        return None
    return updates_per_rollout(int(spg or ga), int(cfg.get("num_iterations") or 1), ga)


def config_val_every_steps(cfg: Mapping[str, Any]) -> int | None:
    """``val_every`` of a resolved config in optimizer steps (None when it does not validate)."""
    every = cfg.get("val_every")
    if not every:
        return None
    if cfg.get("step_unit", "optimizer") != "rollout":
        return int(every)
    per = config_per_rollout(cfg)
    return None if per is None else optimizer_steps(int(every), "rollout", per)


def planned_evals(cfg: Mapping[str, Any]) -> int | None:
    """Evals a run of ``cfg`` will log: step 0, every ``val_every`` steps (in optimizer steps, also
    when ``step_unit: rollout`` counts it in rollouts), and the last step."""
    every, total = config_val_every_steps(cfg), cfg.get("max_steps")
    if not every or not total or every <= 0 or total <= 0:
        return None
    return int(total) // int(every) + 1 + (1 if int(total) % int(every) else 0)


def rollout_horizon(step_unit: str, max_rollouts: int | None, max_steps: int, per_rollout: Fraction | None, *,
                    max_steps_given: bool, file: str | None = None) -> int | None:
    """Check the rollout-counted settings of a config; the max_steps ``max_rollouts`` sets (None when
    it is not set). Counting in rollouts needs a whole U (None: only ``generation_batch_size`` is
    known, U depends on the processes); a given max_steps must agree (then resolving a resolved
    config changes nothing)."""
    if step_unit != "rollout" and max_rollouts is None:
        return None
    key, value = ("max_rollouts", max_rollouts) if max_rollouts is not None else ("step_unit", step_unit)
    if per_rollout is None:
        raise ArmorLabError("counting in rollouts needs steps_per_generation (with generation_batch_size "
                            "alone the optimizer steps per rollout depend on the number of processes)",
                            key=key, value=value, file=file)
    if Fraction(per_rollout).denominator != 1:
        raise ArmorLabError(f"counting in rollouts needs whole optimizer steps per rollout: steps_per_generation "
                            f"× num_iterations / gradient_accumulation_steps = {per_rollout}", key=key, value=value,
                            file=file)
    if max_rollouts is None:
        return None
    steps = int(max_rollouts) * int(per_rollout)
    if max_steps_given and max_steps != steps:
        raise ArmorLabError(f"give max_steps or max_rollouts, not both (max_rollouts: {max_rollouts} is {steps} "
                            f"optimizer steps at {per_rollout} per rollout)", key="max_steps", value=max_steps,
                            file=file)
    return steps
