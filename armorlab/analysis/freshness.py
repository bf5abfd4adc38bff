"""Is a written report still what ``armorlab report`` would write now (docs/reports.md#re-running-a-report)?
Stdlib only. The key (sha256 of recipe, out dir, version, code and every input file's size + mtime_ns) is
taken *before* anything is read, so a run growing meanwhile makes the stamp stale, never wrongly fresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from armorlab._version import __version__
from armorlab.core.fsutil import SMALL_FILE_BYTES, atomic_write_json, read_regular_text, remove_file
from armorlab.core.runs import expand_globs, find_run_dirs
from armorlab.errors import ArmorLabError

STAMP = ".armorlab-report.json"
STAMP_VERSION = 1
_RUN_FILES = ("config.yaml", "status.json", "metrics.jsonl")
_CODE_DIR = Path(__file__).resolve().parent
_CODE_FILES = sorted(_CODE_DIR.glob("*.py")) + [_CODE_DIR.parent / "core" / "runs.py",
                                              _CODE_DIR.parent / "algos" / "kl.py"]


def file_stat(path: str | os.PathLike) -> tuple[int, int] | None:
    """(size, mtime_ns), None where it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _plain_files(directory: Path) -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of the regular, non-hidden files directly in ``directory``."""
    try:
        return sorted((p.name, *st) for p in directory.iterdir() if not p.name.startswith(".")
                      and p.is_file() and not p.is_symlink() and (st := file_stat(p)) is not None)
    except OSError:
        return []


def _tree_files(directory: Path) -> list[tuple[str, int, int]]:
    # a missing dir (no tokens/) has none
    return [(str(p.relative_to(directory)), *st) for p in sorted(directory.rglob("*"))
            if p.is_file() and (st := file_stat(p)) is not None]


def input_key(recipe: Any, out_dir: str | os.PathLike) -> str | None:
    """The report's input key; None when the inputs cannot be listed (the report will say why)."""
    recipe_state = {k: v for k, v in dataclasses.asdict(recipe).items() if k != "path"}
    if getattr(recipe, "format", None) or getattr(recipe, "runs_map", None) or not recipe.runs:
        return None  # imported runs (armorlab.analysis.importers): their files are not tracked here
    try:
        inputs = expand_globs(recipe.runs)
        run_dirs: dict[Path, Path] = {}  # resolved → as found
        for p in inputs:
            found = [] if p.is_file() else find_run_dirs([p])
            if not found:  # another library's logs (or nothing): always rebuilt
                return None
            for rd in found:
                run_dirs.setdefault(rd.path.resolve(), rd.path)
    except ArmorLabError:
        return None
    runs = [[str(resolved), [(n, file_stat(path / n)) for n in _RUN_FILES], _tree_files(path / "tokens")]
            for resolved, path in run_dirs.items()]
    dirs = [[str(p), _plain_files(p)] for p in inputs if p.is_dir()]
    code = [__version__, [(f.name, file_stat(f)) for f in _CODE_FILES]]
    state = [STAMP_VERSION, recipe_state, str(Path(out_dir).resolve()), code, dirs, runs]
    return hashlib.sha256(json.dumps(state, default=str, sort_keys=True).encode()).hexdigest()


def write_stamp(out_dir: str | os.PathLike, key: str | None, summary: dict[str, Any],
                outputs: Iterable[str | os.PathLike]) -> None:
    """Record that ``out_dir`` holds the report of the inputs with ``key`` (no key: no stamp)."""
    out_dir = Path(out_dir)
    if key is None:
        return forget(out_dir)
    rel = sorted({str(Path(p).resolve().relative_to(out_dir.resolve())) for p in outputs})
    # no fsync here or for the outputs: after a machine crash a file may be empty, and the sizes
    # recorded here then differ from it, so the next report rebuilds instead of trusting it
    atomic_write_json(out_dir / STAMP, {"version": STAMP_VERSION, "key": key, "summary": summary,
                                        "outputs": {f: file_stat(out_dir / f) for f in rel}}, durable=False)


def fresh_summary(recipe: Any, out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The stamped summary when ``out_dir`` holds this recipe's report of unchanged inputs and outputs, else None."""
    out_dir = Path(out_dir)
    try:
        stamp = json.loads(read_regular_text(out_dir / STAMP, limit=SMALL_FILE_BYTES))
        outputs = stamp["outputs"]
        unchanged = stamp.get("version") == STAMP_VERSION and outputs and all(
            list(file_stat(out_dir / f) or [None]) == list(v or ()) for f, v in outputs.items())
        return dict(stamp["summary"]) if unchanged and stamp["key"] == input_key(recipe, out_dir) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def forget(out_dir: str | os.PathLike) -> None:
    """Drop the stamp (before rewriting a report: a half-written one must not look fresh)."""
    remove_file(Path(out_dir) / STAMP)
