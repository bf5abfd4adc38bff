"""Verifiable tasks: datasets with ``prompt``/``answer`` columns and TRL reward functions.

``build_task(config["task"])`` → :class:`Task` (contract C2). Three tasks: ``arithmetic``
(synthetic, exact match, see arithmetic.py), ``scratchpad`` (synthetic sums written as a
derivation whose every step is checked, several correct per prompt, see scratchpad.py) and ``math`` (the user's data and prompts, math-verify, see
mathfile.py). Importing this package is cheap; ``datasets`` loads when a task is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from armorlab.core.config import resolve
from armorlab.errors import ArmorLabError
from armorlab.tasks import arithmetic, mathfile, scratchpad
from armorlab.tasks.base import Task
from armorlab.tasks.rewards import exact_match_reward, math_verify_reward
from armorlab.tasks.scratchpad import derivation_reward

__all__ = ["Task", "build_task", "derivation_reward", "exact_match_reward", "math_verify_reward"]


def build_task(task_cfg: Mapping[str, Any], *, chat: bool = False) -> Task:
    """Build the task described by a *resolved* ``task`` section (config.resolve fills it).

    ``chat``: whether the model has a chat template (the math task's default for ``task.chat``).

    A partial section (``{"name": "arithmetic", "digits": 3}`` or just ``"math"``) is resolved
    here too, so library users need not call config.resolve first.
    """

    # Resolving a resolved section is the identity; an unresolved one gets defaults + checks.
    task_cfg = resolve({"task": dict(task_cfg) if isinstance(task_cfg, Mapping) else task_cfg})["task"]
    name = task_cfg["name"]
    if name == "arithmetic":
        return arithmetic.build(task_cfg)
    if name == "scratchpad":
        return scratchpad.build(task_cfg)
    if name == "math":
        return mathfile.build(task_cfg, chat=chat)
    # config validation lists the same names; this guards a hand-built dict
    raise ArmorLabError("unknown task", key="task.name", value=name)
