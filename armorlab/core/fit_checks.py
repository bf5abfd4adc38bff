"""Does a run fit what it trains on? Checked when a config resolves, where the user's file is known:
the held-out sets leave training rows in the data file, and the completions fit the model's positions."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from armorlab.core.identity import data_rows, hub_snapshot
from armorlab.core.model_dir import max_positions
from armorlab.errors import ArmorLabError

TINY_MODEL = "tiny"
TINY_MAX_POSITIONS = 1024  # the tiny model's max_position_embeddings (armorlab.train.models)


def check_held_out(task: dict[str, Any], raw: Mapping[str, Any], file: str | None) -> None:
    """val_size + test_size must leave training rows in the data file: said here, naming the
    config that sets them (or takes their defaults) and the fix, not the data file at job start."""
    rows = data_rows(task["path"])
    held = task["val_size"] + task["test_size"]
    if not rows or held < rows:  # an empty file: the task builder says it holds no records
        return
    given = [k for k in ("val_size", "test_size") if k in raw]
    how = "set" if given else "the defaults,"
    fit = max(1, min(rows // 10, (rows - 1) // 2))
    fix = (f"Set smaller ones in this config, e.g. task: {{val_size: {fit}, test_size: {fit}}}" if rows >= 3 else
           "It needs at least 3 rows (one each for validation, test and training)")
    raise ArmorLabError(f"val_size + test_size = {held} ({how} {task['val_size']} + {task['test_size']}) leave no "
                        f"training rows: {task['path']} holds {rows}. {fix}", key="task.val_size",
                        value=task["val_size"], file=file)


def check_lengths(cfg: dict[str, Any], file: str | None) -> None:
    """A completion longer than the model's positions fails at the first generation: say so now."""
    length = cfg.get("max_completion_length")
    if not isinstance(length, int):
        return
    name = cfg["model"]["name"]
    if name == TINY_MODEL:
        limit = TINY_MAX_POSITIONS
    else:
        root = Path(name) if Path(name).is_dir() else hub_snapshot(name, "model")
        limit = max_positions(root) if root is not None else None
    if limit is not None and length >= limit:
        raise ArmorLabError(f"longer than the model's {limit} positions (max_position_embeddings of {name}), "
                            "which the prompt shares: lower it", key="max_completion_length", value=length,
                            file=file)
