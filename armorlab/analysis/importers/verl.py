"""verl's ``file`` logger (verl opens it for writing, not appending: a resumed run's curve starts at the
resume step) and its validation dumps (true val/n and pass@k); docs/importers.md#verl."""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.algos.pass_at_k import pass_at_k
from armorlab.analysis.importers import base as B
from armorlab.analysis.importers import flavours as F
from armorlab.core.fsutil import open_regular
from armorlab.core.runs import valid_step
from armorlab.errors import ArmorLabError

DUMP = re.compile(r"^(\d+)\.jsonl$")
PASS_THRESHOLD = 1.0  # a completion passes at full score (armorlab's anchor_reward_threshold default)


def read_jsonl(path: Path, warnings: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The file logger's lines → per-metric (steps, values)."""
    try:
        data = B.read_source(path)
    except OSError as exc:
        raise ArmorLabError(f"cannot read verl's file log: {exc.strerror or exc}", file=str(path)) from None
    if not data.strip():
        return {}
    if B.shallow(data):  # every line at once, where each is {"step": int ≥ 0, "data": {...}}
        import pyarrow as pa

        try:
            table = B.read_json_bytes(data)
            step, logged = table.column("step"), table.column("data").combine_chunks()
            shaped = pa.types.is_integer(step.type) and not step.null_count and pa.types.is_struct(logged.type)
            if shaped and not ((steps := step.to_numpy().astype(np.int64)) < 0).any():
                columns = B.float_columns([f.name for f in logged.type], logged.flatten())
                return {name: (steps[ok], values[ok]) for name, values in columns.items()  # NaN: not on that line
                        for ok in [~np.isnan(values)]}
        except Exception:  # ArrowInvalid (torn line, mixed types), no step or data key: the line-by-line rules
            pass
    rows = []
    for lineno, row in B.json_lines(data.split(b"\n"), str(path), warnings):
        if isinstance(row, dict) and valid_step(row.get("step")) and isinstance(row.get("data"), dict):
            rows.append((row["step"], {k: v for k, v in row["data"].items() if B.is_metric_value(v)}))
        else:
            warnings.append(f"skipped line {lineno} of {path}: not {{\"step\": int, \"data\": {{...}}}}")
    return B.rows_to_series(rows)


def is_file_log(path: Path) -> bool:
    """A .jsonl whose first line is a file-logger line."""
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    try:
        with os.fdopen(open_regular(path), "rb") as fh:
            first = fh.readline(1 << 20)
        row = json.loads(first)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get("data"), dict)


def is_dump_dir(path: Path) -> bool:
    return path.is_dir() and any(DUMP.match(p.name) for p in path.iterdir())


def dump_metrics(rows: Sequence[dict[str, Any]], threshold: float = PASS_THRESHOLD) -> dict[str, float]:
    """One validation dump → val/n, val/acc (of ``acc`` where given, else ``score``), val/pass@k and the
    unbiased val/pass@<k> for k = 1, 2, 4, ... below the samples per prompt."""
    key = "acc" if any(B.is_metric_value(r.get("acc")) for r in rows) else "score"
    values = [B.as_float(r.get(key)) for r in rows]
    scored = [(v, json.dumps([r.get("input"), r.get("gts")], default=str))
              for r, v in zip(rows, values, strict=True) if not math.isnan(v)]
    if not scored:
        return {}
    seen, passed = Counter(p for _, p in scored), Counter(p for v, p in scored if v >= threshold)
    per_prompt = [(seen[p], passed[p]) for p in seen]
    out = {"val/n": float(len(scored)), "val/acc": float(np.mean([v for v, _ in scored])),
           "val/pass@k": float(np.mean([c > 0 for _, c in per_prompt]))}
    k = 1
    while k < min(seen.values()):
        out[f"val/pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for n, c in per_prompt]))
        k *= 2
    return out


def read_dumps(dump_dir: Path, warnings: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A validation_data_dir → per-metric (steps, values) of dump_metrics, one point per dump."""
    try:
        named = [(m.group(1), p) for p in Path(dump_dir).iterdir() if (m := DUMP.match(p.name))]
    except OSError as exc:
        raise ArmorLabError(f"must be verl's validation_data_dir, a directory: {exc.strerror or exc}",
                            key="val_dumps", value=str(dump_dir)) from None
    # a name past int64 is no step verl wrote (a 249-digit name is a valid file name)
    files = sorted((int(d), p) for d, p in named if len(d) <= 19 and int(d) < B.MAX_STEP)
    if len(files) < len(named):
        warnings.append(f"skipped {len(named) - len(files)} validation dumps in {dump_dir} whose step is past 2**63")
    points = []
    for step, path in files:
        try:
            rows = B.json_lines(B.read_source(path).split(b"\n"), str(path), warnings)
        except OSError as exc:
            warnings.append(f"skipped validation dump {path}: {exc.strerror or exc}")
            continue
        points.append((step, dump_metrics([row for _, row in rows if isinstance(row, dict)])))
    return B.rows_to_series(points)


def read(path: Path, *, name: str | None = None, val_dumps: Path | None = None,
         config: dict[str, Any] | None = None) -> B.ImportedRun:
    """A verl file-logger JSONL (+ its validation dumps, + a config file's contents if given)."""
    path, warnings = Path(path), []
    series = read_jsonl(path, warnings)
    extra = read_dumps(val_dumps, warnings) if val_dumps is not None else {}
    flat = B.flatten(config or {})
    steps = np.unique(np.concatenate([s for s, _ in series.values()])) if series else np.empty(0, np.int64)
    if steps.size:
        extra["rollout"] = (steps, steps.astype(np.float64))
        if steps[0] > 1:
            warnings.append(f"{path.name} starts at step {steps[0]}: verl's file logger rewrites its file when a "
                            "run resumes, so the steps before the resume are not in it")
    cannot = [m for m in F.VERL.cannot if not (val_dumps is not None and m in ("val/n", "val/pass@k"))]
    if not config:
        warnings.append("verl's file logger records no config: give the seed (and a config file) in a runs.yaml "
                        "mapping")
    return F.imported_run(series, F.VERL, flat, warnings, extra=extra, cannot=cannot, name=name or path.stem,
                          path=path, format="verl", project=path.parent.name or None, state="unknown",
                          reason="verl's file logger does not record whether a run finished")
