"""Importers of other libraries' runs into the RunSet an armorlab run gives (docs/importers.md):
``plan(paths)`` finds what each path holds, ``read(plan)`` imports it. Importing never writes into a source.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from armorlab.analysis.importers import tensorboard_events, trackio_db, trl, verl, wandb_local
from armorlab.analysis.importers.base import ImportedRun
from armorlab.analysis.importers.mapping import FORMATS, Entry, RunsMap
from armorlab.analysis.importers.mapping import load as load_mapping  # noqa: F401 (the package's face)
from armorlab.core.config import load_yaml_mapping
from armorlab.core.runs import CONFIG, METRICS, STATUS, RunDir, expand_globs, find_run_dirs
from armorlab.errors import ArmorLabError

# the config column a runs.yaml's ``group`` goes to ("group" is the report's own column of labels)
GROUP_KEY = "run_group"
MAX_DEPTH = 6  # how deep below a given dir sources are looked for
_SKIP_DIRS = {"checkpoints", "tokens", "report", "node_modules", "__pycache__", "media", "artifacts"}


@dataclass
class Source:
    """Something to import: ``format`` and what to read (a W&B run may span several folders)."""
    format: str
    paths: list[Path]
    entry: Entry | None = None


@dataclass
class Plan:
    native: list[RunDir]
    sources: list[Source]


def is_native_run(path: Path) -> bool:
    """An armorlab run dir; not a W&B ``files/`` folder, which also holds a config.yaml."""
    if not (path / CONFIG).is_file() or (path / "wandb-metadata.json").exists():
        return False
    return (path / STATUS).exists() or (path / METRICS).exists() or (path.parent / "sweep.json").exists()


# (format, test) in the order tried: the first test that holds names the format of a file or a directory
_FILE_TESTS = (("wandb", lambda p: p.name.endswith(".wandb")),
               ("tensorboard", lambda p: p.name.startswith("events.out.tfevents.")),
               ("trl", lambda p: p.name == trl.STATE),
               ("verl", lambda p: p.name.endswith(".jsonl") and verl.is_file_log(p)),
               ("trackio", trackio_db.is_project_db))
_DIR_TESTS = (("armorlab", is_native_run), ("trl", lambda p: bool(trl.state_files(p))), ("wandb", wandb_local.is_run_dir),
              (None, verl.is_dump_dir),  # a validation_data_dir: read with its JSONL (runs.yaml val_dumps)
              ("tensorboard", lambda p: any(p.glob(tensorboard_events.PATTERN))))


def file_format(path: Path) -> str | None:
    return next((fmt for fmt, test in _FILE_TESTS if test(path)), None)


def dir_format(path: Path) -> str | None:
    """The format a directory *is* (not what it holds further down)."""
    return next((fmt for fmt, test in _DIR_TESTS if test(path)), None)


def detect(path: str | os.PathLike) -> str | None:
    """The format of ``path`` itself: one of FORMATS, or None (a dir that may hold sources)."""
    path = Path(path)
    if path.is_file():
        return file_format(path)
    if path.is_dir():
        return dir_format(path) or ("armorlab" if find_native(path) else None)
    return None


def holds_imports(path: str | os.PathLike) -> bool:
    """Whether ``path`` is or holds another library's runs (where armorlab must write nothing)."""
    path = Path(path)
    return detect(path) not in (None, "armorlab") or (
        path.is_dir() and any(kind != "armorlab" for kind, _ in _walk(path, 0, set())))


def find_native(path: Path) -> list[RunDir]:
    try:
        return [rd for rd in find_run_dirs([path]) if is_native_run(rd.path)]
    except ArmorLabError:
        return []


def _walk(path: Path, depth: int, skip: Container[Path]) -> Iterator[tuple[str, Path]]:
    """(format, path) of every source at or below the dir ``path`` (armorlab runs in ``skip`` left out)."""
    kind = dir_format(path)
    if kind is not None and not (kind == "armorlab" and path.resolve() in skip):
        yield kind, path
    if kind in ("armorlab", "trl", "wandb"):  # a tensorboard dir's subdirs may hold more runs
        return
    try:
        children = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return
    for e in children:
        if e.name.startswith(".") or e.is_symlink():
            continue
        if e.is_file():
            f = None if e.name.startswith("events.out.tfevents.") else file_format(Path(e.path))
            if f in ("verl", "trackio", "wandb"):
                yield f, Path(e.path)
        elif e.is_dir() and depth < MAX_DEPTH and e.name not in _SKIP_DIRS:
            yield from _walk(Path(e.path), depth + 1, skip)


def _sources(path: Path, fmt: str | None, skip: Container[Path]) -> list[tuple[str, Path]]:
    """(format, path) of every source at or below ``path`` (only ``fmt`` when given)."""
    if path.is_file():
        kind = fmt or file_format(path)
        if kind is None:
            raise ArmorLabError("not a file armorlab can import (a .wandb, events.out.tfevents.*, verl .jsonl, "
                                "trackio .db or trainer_state.json)", key="path", value=str(path))
        return [(kind, path.parent if kind == "trl" and path.name == trl.STATE else path)]
    if fmt in ("tensorboard", "wandb"):
        return [(fmt, d) for d in (tensorboard_events if fmt == "tensorboard" else wandb_local).run_dirs(path)]
    return [(k, p) for k, p in _walk(path, 0, skip) if fmt is None or k == fmt]


def plan(paths: Iterable[str | os.PathLike], *, format: str | None = None, mapping: RunsMap | None = None) -> Plan:
    """What to load from ``paths`` (run/sweep dirs, sources, globs; a runs.yaml's paths too); the folders of
    one W&B run (resumed: one per attempt) are one source."""
    if format is not None and format not in FORMATS:
        raise ArmorLabError(f"unknown format (known: {', '.join(FORMATS)})", key="format", value=format)
    given = list(paths) or ([e.pattern for e in mapping.entries] if mapping is not None else [])
    native, sources = {}, {}  # resolved path → RunDir; (format, path or W&B run id) → Source
    for p in expand_globs(given):
        if not p.exists():
            raise ArmorLabError("path not found", key="path", value=str(p))
        entry = mapping.entry_for(p) if mapping else None
        fmt = (entry.format if entry and entry.format else None) or format
        if fmt in (None, "armorlab") and p.is_dir():
            for rd in find_native(p):
                native.setdefault(rd.path.resolve(), rd)
        if fmt == "armorlab":
            continue
        for kind, src in _sources(p, fmt, native):
            if kind == "armorlab":
                native.setdefault(src.resolve(), RunDir(src))
                continue
            e = (mapping.entry_for(src) if mapping else None) or entry
            key: tuple[str, str | Path] = (kind, src.resolve())  # named twice: a glob and its match, ...
            if kind == "wandb":
                src = src.parent if src.is_file() else src
                m = wandb_local.RUN_DIR.match(src.name)
                key = (kind, m.group("id") if m else str(src.resolve()))
            if key not in sources:
                sources[key] = Source(kind, [src], e)
            elif kind == "wandb" and src.resolve() not in {q.resolve() for q in sources[key].paths}:
                sources[key].paths.append(src)
    for s in sources.values():
        s.paths.sort(key=lambda q: q.name.removeprefix("offline-"))
    return Plan(list(native.values()), list(sources.values()))


def read_source(src: Source, val_n: int | None = None) -> list[ImportedRun]:
    """A source's runs with its runs.yaml entry's group (as ``run_group``), seed and val_n (else ``val_n``)."""
    e, path = src.entry or Entry(""), src.paths[0]
    readers = {"trackio": lambda: trackio_db.read_project(path, flavour=e.flavour, only=set(e.runs or ()) or None),
               "verl": lambda: [verl.read(path, name=e.name, val_dumps=e.val_dumps,
                                          config=load_yaml_mapping(e.config) if e.config else None)],
               "trl": lambda: [trl.read(path, name=e.name)],
               "wandb": lambda: [wandb_local.read(src.paths, name=e.name, flavour=e.flavour)],
               "tensorboard": lambda: [tensorboard_events.read(path, name=e.name, flavour=e.flavour)]}
    runs = readers[src.format]()
    n = e.val_n or val_n
    for run in runs:
        run.config.update({k: v for k, v in ((GROUP_KEY, e.group), ("seed", e.seed)) if v is not None})
        if n is not None and "val/acc" in run.metrics and "val/n" not in run.metrics:  # n wherever val/acc is
            import pyarrow as pa
            import pyarrow.compute as pc

            given = pc.if_else(pc.is_valid(run.table.column("val/acc")), float(n), pa.scalar(None, pa.float64()))
            run.table = run.table.append_column("val/n", given)
            run.unavailable = [m for m in run.unavailable if m != "val/n"]
    return runs


def read(p: Plan, *, val_n: int | None = None) -> list[ImportedRun]:
    """Import every source of the plan (``val_n``: val/n for runs that log val/acc without it)."""
    return [run for src in p.sources for run in read_source(src, val_n)]
