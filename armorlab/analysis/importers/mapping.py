"""``runs.yaml``: what the sources do not record about imported runs (group, seed, val_n, ...), keyed
by path; the format: docs/importers.md#runsyaml. Unknown keys and bad values name the key and file."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from armorlab.analysis.importers.flavours import FLAVOURS
from armorlab.core.config import load_yaml_mapping
from armorlab.errors import ArmorLabError

ENTRY_KEYS = ("group", "seed", "val_n", "format", "flavour", "name", "val_dumps", "config", "runs")
TOP_KEYS = ("runs", "val_n")
FORMATS = ("armorlab", "trl", "wandb", "tensorboard", "verl", "trackio")


@dataclass
class Entry:
    pattern: str                      # as written, made absolute against the file's dir
    paths: list[Path] = field(default_factory=list)
    group: str | None = None
    seed: Any = None
    val_n: int | None = None
    format: str | None = None
    flavour: str | None = None
    name: str | None = None
    val_dumps: Path | None = None
    config: Path | None = None
    runs: list[str] | None = None


@dataclass
class RunsMap:
    file: Path
    entries: list[Entry]
    val_n: int | None = None

    def entry_for(self, path: str | os.PathLike) -> Entry | None:
        """Every entry at ``path`` or an ancestor, the more specific overriding."""
        p = Path(path).resolve()
        hits = sorted(((d, e) for e in self.entries
                       if (d := max((len(q.parts) for q in e.paths if p == q or q in p.parents), default=-1)) >= 0),
                      key=lambda t: t[0])
        if not hits:
            return None
        merged = {k: getattr(e, k) for _, e in hits for k in ENTRY_KEYS if getattr(e, k) is not None}
        return Entry(hits[-1][1].pattern, list(hits[-1][1].paths), **merged)


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _label(v: Any, types: tuple[type, ...]) -> bool:
    return isinstance(v, types) and not isinstance(v, bool)


# an entry's key → (its check, what it must be, how it is kept)
_VALUES = {
    "group": (lambda v: _label(v, (str, int, float)), "must be a group label", str),
    "seed": (lambda v: _label(v, (int, str)), "must be an integer or a label", lambda v: v),
    "val_n": (_positive_int, "must be a positive integer (completions per evaluation)", int),
    "format": (lambda v: v in FORMATS, f"must be one of {', '.join(FORMATS)}", str),
    "flavour": (lambda v: v in FLAVOURS, f"must be one of {', '.join(FLAVOURS)}", str),
    "runs": (lambda r: isinstance(r, list) and bool(r) and all(isinstance(x, (str, int)) for x in r),
             "must be a list of run names or ids", lambda r: [str(x) for x in r]),
}


def load(path: str | os.PathLike) -> RunsMap:
    path = Path(path)
    raw, file = load_yaml_mapping(path), str(path)

    def err(problem: str, key: str, value: Any) -> ArmorLabError:
        return ArmorLabError(problem, key=key, value=value, file=file)

    if unknown := [k for k in raw if k not in TOP_KEYS]:
        raise err(f"unknown key (known: {', '.join(TOP_KEYS)})", str(unknown[0]), raw[unknown[0]])
    val_n = raw.get("val_n")
    if val_n is not None and not _positive_int(val_n):
        raise err("must be a positive integer (completions per evaluation)", "val_n", val_n)
    runs = raw.get("runs")
    if not isinstance(runs, dict) or not runs:
        raise err("must be a mapping {path: {group: ..., seed: ..., val_n: ...}}", "runs", runs)
    base = path.resolve().parent
    entries = []
    for pattern, spec in runs.items():
        key, spec = f"runs.{pattern}", {} if spec is None else spec
        if not isinstance(pattern, str) or not isinstance(spec, dict):
            raise err("each entry is path: {group: ..., seed: ..., val_n: ...}", key, spec)
        if unknown := [k for k in spec if k not in ENTRY_KEYS]:
            raise err(f"unknown key (known: {', '.join(ENTRY_KEYS)})", f"{key}.{unknown[0]}", spec[unknown[0]])
        full = os.path.join(base, os.path.expanduser(pattern))
        matches = sorted(glob.glob(full)) if glob.has_magic(full) else ([full] if os.path.exists(full) else [])
        if not matches:
            raise err("path not found", key, pattern)
        e = Entry(full, [Path(m).resolve() for m in matches])
        for k, value in spec.items():
            if value is None:
                continue
            ok, want, convert = _VALUES.get(k, (None, "", str))
            if ok is not None and not ok(value):
                raise err(want, f"{key}.{k}", value)
            if k in ("val_dumps", "config"):
                value = Path(base, os.path.expanduser(str(value)))
                if not value.exists():
                    raise err("path not found", f"{key}.{k}", spec[k])
                if k == "val_dumps" and not value.is_dir():
                    raise err("must be a directory (verl's validation_data_dir)", f"{key}.{k}", spec[k])
            setattr(e, k, value if k in ("val_dumps", "config") else convert(value))
        e.val_n = e.val_n or val_n
        entries.append(e)
    return RunsMap(path, entries, val_n)
