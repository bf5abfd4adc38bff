"""The pieces of a sweep spec every part of it shares: names, config keys, run-config bases, grids,
seeds and point lists, each checked with an error that names the key and the file."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from armorlab.core.config import (
    MODEL_FIELDS_TINY,
    TASK_FIELDS,
    known_keys,
    load_yaml_mapping,
    resolve,
    unknown_key_hint,
)
from armorlab.errors import ArmorLabError, combine

# Sweep names become directory names and Slurm job names: keep them to a shell- and path-safe set.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # fullmatch: `$` would allow a final newline
_SUBKEYS = {
    "task": frozenset({"name"}).union(*(set(f) for f in TASK_FIELDS.values())),
    "model": frozenset({"name"}) | frozenset(MODEL_FIELDS_TINY),
}


def find_relative(value: str, spec_path: Path | None, *, key: str) -> Path:
    """Resolve a path written in a spec: as given if absolute; else next to the spec file, then
    in the spec's ancestor folders (so ``slurm/default.yaml`` in ``sweeps/x.yaml`` finds the repo's
    ``slurm/``), then relative to the working directory."""
    p = Path(value).expanduser()
    if p.is_absolute():
        candidates = [p]
    else:
        candidates = []
        if spec_path is not None:
            here = Path(spec_path).resolve().parent
            candidates += [d / p for d in (here, *here.parents)]
        candidates.append(Path.cwd() / p)
    for c in candidates:
        try:
            if c.is_file():
                return c
        except OSError:  # a name too long for the file system, a symlink loop: not this one
            continue
    raise ArmorLabError("file not found (looked next to the spec, in its parent folders and in the "
                        "working directory)", key=key, value=value,
                        file=str(spec_path) if spec_path is not None else None)


def check_key(key: Any, where: str, file: str) -> str:
    """A point's key must name a config field: a top-level key, or ``task.X`` / ``model.X``."""
    if not isinstance(key, str) or not key:
        raise ArmorLabError("keys must be non-empty strings", key=f"{where}.{key}", value=key, file=file)
    parts = key.split(".")
    top = parts[0]
    ok = top in known_keys() and all(parts)
    if ok and len(parts) > 1:
        ok = top in _SUBKEYS and len(parts) == 2 and parts[1] in _SUBKEYS[top]
    if not ok:
        near = unknown_key_hint(key, [*known_keys(), *(f"{t}.{k}" for t, ks in _SUBKEYS.items() for k in ks)])
        raise ArmorLabError(f"unknown config key (not an armorlab field, a GRPOConfig field, task.X or model.X){near}",
                            key=f"{where}.{key}", value=key, file=file)
    return key


def parse_base(raw: Any, path: Path | None, file: str, *, where: str = "base") -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, str):
        base_path = find_relative(raw, path, key=where)
        raw = load_yaml_mapping(base_path)
    if not isinstance(raw, Mapping):
        raise ArmorLabError("must be a run config mapping or a path to one", key=where, value=raw, file=file)
    problems = []
    for key in raw:
        if not isinstance(key, str) or "." in key:
            problems.append(ArmorLabError("base keys are plain config keys (nest task/model settings)",
                                          key=f"{where}.{key}", value=raw[key], file=file))
            continue
        try:  # a typo here is reported with the grid's, not one round trip later when runs expand
            check_key(key, where, file)
        except ArmorLabError as exc:
            problems.append(exc)
    if problems:  # with the base's value problems too, as resolving it would say them all at once
        typos = {str(p.key).split(".", 1)[-1] for p in problems}  # base.learnign_rate → learnign_rate
        try:
            resolve({k: v for k, v in raw.items() if isinstance(k, str) and "." not in k}, file=file,
                    check_paths=False)
        except ArmorLabError as exc:
            problems += [p for p in exc.problems if p.key not in typos]
        except (TypeError, ValueError, OverflowError):
            pass  # the typos alone; the values are checked again where the runs expand
        raise combine(problems)
    return copy.deepcopy(dict(raw))


def parse_grid(raw: Any, file: str, *, where: str = "grid") -> dict[str, list[Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ArmorLabError("must map config keys to lists of values", key=where, value=raw, file=file)
    grid, problems = {}, []
    for key, values in raw.items():
        try:
            key = check_key(key, where, file)
        except ArmorLabError as exc:
            problems.append(exc)
        if not isinstance(values, list) or not values:
            problems.append(ArmorLabError("a grid axis must be a non-empty list of values", key=f"{where}.{key}",
                                          value=values, file=file))
        grid[key] = copy.deepcopy(values)
    if problems:
        raise combine(problems)
    return grid


def parse_seeds(raw: Any, file: str, *, where: str = "seeds") -> list[int] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise ArmorLabError("must be a non-empty list of seeds", key=where, value=raw, file=file)
    for s in raw:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ArmorLabError("seeds must be non-negative integers", key=where, value=s, file=file)
    return list(raw)


def parse_points(raw: Any, where: str, file: str, *, allow_empty: bool) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ArmorLabError("must be a list of mappings", key=where, value=raw, file=file)
    points, problems = [], []
    for i, point in enumerate(raw):
        if not isinstance(point, Mapping) or (not point and not allow_empty):
            problems.append(ArmorLabError("each entry must be a non-empty mapping of config keys to values",
                                          key=f"{where}[{i}]", value=point, file=file))
            continue
        for k in point:
            try:
                check_key(k, where, file)
            except ArmorLabError as exc:
                problems.append(exc)
        points.append(copy.deepcopy(dict(point)))
    if problems:
        raise combine(problems)
    return points


def check_seed_keys(seeds: list[int] | None, grid: Mapping[str, Any], include: list[dict[str, Any]], where: str,
                     file: str) -> None:
    if seeds is None:
        return
    for key, points in (("grid", [grid]), ("include", include)):
        if any("seed" in p for p in points):
            raise ArmorLabError("set seeds either in `seeds:` or as a key, not both", key=f"{where}{key}.seed",
                                value=seeds, file=file)
