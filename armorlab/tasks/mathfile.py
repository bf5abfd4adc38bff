"""Math task from a local JSONL or parquet file of {problem, answer}, scored with math-verify.

The problem text is the prompt verbatim (put any instruction such as "put your final answer in
\\boxed{}" in the file); the answer may be plain (``0.5``), LaTeX (``\\frac{1}{2}``) or boxed.
Rows are shuffled with ``split_seed``: val = first ``val_size``, test = next ``test_size``,
train = the rest (capped at ``train_size``). Nothing is downloaded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.errors import ArmorLabError
from armorlab.tasks.base import Task
from armorlab.tasks.rewards import math_verify_reward, parse_gold

log = logging.getLogger(__name__)

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ArmorLabError(f"line {number} is not valid JSON ({exc.msg})", key="task.path",
                                    value=str(path), file=str(path)) from None
            if not isinstance(row, dict):
                raise ArmorLabError(f"line {number} is not a JSON object", key="task.path",
                                    value=str(path), file=str(path))
            rows.append(row)
    return rows


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise ArmorLabError(f"cannot read parquet: {exc}", key="task.path", value=str(path),
                            file=str(path)) from None


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSONL/parquet file, with clear errors for a missing or unreadable one."""
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix not in JSON_SUFFIXES + PARQUET_SUFFIXES:
        raise ArmorLabError(f"must be a JSONL ({', '.join(JSON_SUFFIXES)}) or parquet file",
                            key="task.path", value=str(path), file=str(path))
    if not path.is_file():
        raise ArmorLabError("file not found", key="task.path", value=str(path), file=str(path))
    try:
        rows = _read_jsonl(path) if suffix in JSON_SUFFIXES else _read_parquet(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ArmorLabError(f"cannot read file: {exc}", key="task.path", value=str(path),
                            file=str(path)) from None
    if not rows:
        raise ArmorLabError("file holds no records", key="task.path", value=str(path), file=str(path))
    return rows


def _column(rows: list[dict[str, Any]], key: str, field: str, path: Path) -> list[str]:
    out = []
    for number, row in enumerate(rows, 1):
        if key not in row:
            raise ArmorLabError(f"record {number} has no column '{key}' (columns: {', '.join(sorted(row))})",
                                key=f"task.{field}", value=key, file=str(path))
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or str(value).strip() == "":
            raise ArmorLabError(f"record {number}: column '{key}' must be a non-empty string or number, "
                                f"got {value!r}", key=f"task.{field}", value=key, file=str(path))
        out.append(str(value))
    return out


def boxed(answer: str) -> str:
    return answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"


def build(cfg: Mapping[str, Any]) -> Task:
    """Math task from the resolved ``task`` section (config.TASK_FIELDS["math"])."""
    from datasets import Dataset

    path = Path(cfg["path"]).expanduser()
    rows = load_rows(path)
    problems = _column(rows, cfg["problem_key"], "problem_key", path)
    answers = _column(rows, cfg["answer_key"], "answer_key", path)
    held = cfg["val_size"] + cfg["test_size"]
    if held >= len(rows):
        raise ArmorLabError(f"val_size + test_size = {held} leaves no training rows in a file of "
                            f"{len(rows)}", key="task.val_size", value=cfg["val_size"], file=str(path))
    unparsable = [a for a in answers if not parse_gold(a)]
    if unparsable:
        log.warning("%d of %d answers in %s cannot be parsed by math-verify and always score 0, e.g. %r",
                    len(unparsable), len(answers), path, unparsable[0])
    order = np.random.default_rng(cfg["split_seed"]).permutation(len(rows)).tolist()
    val_end, test_end = cfg["val_size"], held
    train_idx = order[test_end:]
    if cfg["train_size"] is not None:
        train_idx = train_idx[:cfg["train_size"]]

    def rows_at(idx: list[int]) -> Dataset:
        return Dataset.from_dict({"prompt": [problems[i] for i in idx], "answer": [answers[i] for i in idx]})

    train = rows_at(train_idx)
    return Task(name="math", train=train, val=rows_at(order[:val_end]), test=rows_at(order[val_end:test_end]),
                reward_funcs=[math_verify_reward], warm_start=train, target_completion=boxed,
                completion_chars=None, settings={**cfg, "path": str(path)})
