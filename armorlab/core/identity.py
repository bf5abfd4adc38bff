"""What a run trains on, as cheap fingerprints: the model and the data file enter the run id.

A config names its model and data by path (or hub id); the run id must change when what lies
there changes, or a re-run after rebuilding the weights or editing the data silently reuses
the old run. Fingerprints are computed from what a ``stat`` and small reads give, so resolving
1,000 sweep points over a 15 GB checkpoint stays fast and torch-free:

- a directory (a model, a ``save_to_disk`` dataset): every file's name and size; small files
  (configs, tokenizers, ``state.json``) by content, large ones (weights, arrow shards) by size
  and modification time — rewriting weights changes the mtime even when the shapes (and so a
  safetensors header) stay the same;
- a data file: its content (sha256);
- a hub id: the commit the local Hugging Face cache resolves it to (nothing is downloaded).

Content hashes are cached per (path, size, mtime) within a process.
"""

from __future__ import annotations

import hashlib
import os
import re
from functools import lru_cache
from pathlib import Path

from armorlab.core.fsutil import open_regular
from armorlab.core.model_dir import ModelDirProblem, check_model_dir, entry_problem
from armorlab.errors import ArmorLabError

CONTENT_LIMIT = 32 * 1024 * 1024  # files up to this size are hashed by content
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@lru_cache(maxsize=4096)
def _content_digest(path: str, size: int, mtime_ns: int) -> str:  # noqa: ARG001 - cache key
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as fh:  # never a FIFO: its open would wait for a writer
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_fingerprint(path: str | os.PathLike) -> str:
    """sha256 of the file's bytes (first 16 hex digits), cached while size and mtime stay."""
    st = os.stat(path)
    return _content_digest(os.fspath(path), st.st_size, st.st_mtime_ns)[:16]


def tree_fingerprint(root: str | os.PathLike, *, recursive: bool) -> str:
    """Fingerprint of a directory's visible files (see the module docstring for what counts).

    Subdirectories reached through a symlink are not walked (a link to a parent would never end);
    an entry that is a FIFO, socket or device, a symlink loop or a dangling link raises
    ModelDirProblem naming it (its content cannot be part of the fingerprint, and opening a FIFO
    would wait forever)."""
    root = Path(root)
    h = hashlib.sha256()
    stack = [root]
    entries: list[tuple[str, os.DirEntry]] = []
    while stack:
        top = stack.pop()
        with os.scandir(top) as it:
            for entry in it:
                if entry.name.startswith("."):
                    continue  # .cache/, editor files, in-progress temp files
                problem = entry_problem(Path(entry.path))
                if problem:
                    raise ModelDirProblem(f"{os.path.relpath(entry.path, root)} {problem}", entry.path)
                if entry.is_dir():
                    if recursive and not entry.is_symlink():
                        stack.append(Path(entry.path))
                    continue
                entries.append((os.path.relpath(entry.path, root), entry))
    for rel, entry in sorted(entries, key=lambda e: e[0]):
        st = entry.stat()
        if st.st_size <= CONTENT_LIMIT:
            part = _content_digest(entry.path, st.st_size, st.st_mtime_ns)
        else:
            part = f"{st.st_size}:{st.st_mtime_ns}"
        h.update(f"{rel}\0{st.st_size}\0{part}\n".encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- hub cache
def hub_snapshot(repo_id: str, repo_type: str) -> Path | None:
    """The local HF cache's snapshot directory of ``repo_id`` at the revision ``refs/main``
    points to, or None when the cache does not hold it. Never touches the network."""
    if not _HUB_ID.match(repo_id):
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        return None


def _hub_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or not _HUB_ID.match(name)


# --------------------------------------------------------------------------- model
def model_identity(name: str, *, file: str | None = None) -> dict[str, str]:
    """``{"name": absolute dir or hub id, "fingerprint": ...}`` of a model the trainer will load.

    A directory needs a ``config.json``; a hub id must be in the local HF cache. Anything else
    is an ArmorLabError naming ``model`` — raised before a run dir or a job exists.
    """
    path = Path(name).expanduser()
    problem = _path_problem(path)
    if problem:
        raise ArmorLabError(f"the model path {problem}", key="model", value=name, file=file)
    if path.is_dir():
        try:
            check_model_dir(path)
            return {"name": str(path.resolve()), "fingerprint": tree_fingerprint(path, recursive=False)}
        except ModelDirProblem as exc:
            raise ArmorLabError(f"not a loadable model directory: {exc} ({exc.file})", key="model", value=name,
                                file=file) from None
    if path.exists():
        raise ArmorLabError("must be a model directory or a hub id, not a file", key="model", value=name,
                            file=file)
    if not _looks_like_path(name):
        snapshot = hub_snapshot(name, "model")
        if snapshot is not None:
            try:
                check_model_dir(snapshot)
            except ModelDirProblem as exc:
                raise ArmorLabError(f"the cached hub model is not loadable: {exc} ({exc.file})", key="model",
                                    value=name, file=file) from None
            return {"name": name, "fingerprint": f"rev:{snapshot.name}"}
        raise ArmorLabError(f"no such directory, and the hub id is not in the local Hugging Face cache "
                            f"({_hub_cache_dir()}); armorlab never downloads: fetch it first "
                            f"(`hf download {name}`) or give a directory", key="model", value=name, file=file)
    raise ArmorLabError("no such model directory", key="model", value=name, file=file)


def _path_problem(path: Path) -> str | None:
    """Why a model or data path that exists cannot be used (a FIFO, a symlink loop, a dangling
    link, no permission), None when it is a file, a directory or not there at all."""
    return entry_problem(path) if os.path.lexists(path) else None


# --------------------------------------------------------------------------- data
DATA_FILE_SUFFIXES = (".jsonl", ".json", ".ndjson", ".parquet", ".pq")


def data_identity(name: str, *, key: str = "task.path", file: str | None = None) -> dict[str, str]:
    """``{"path": absolute file/dir or hub id, "fingerprint": ...}`` of a math task's data.

    Accepted: a JSONL/parquet file, a ``datasets`` ``save_to_disk`` directory, a hub dataset id
    in the local HF cache.
    """
    path = Path(name).expanduser()
    problem = _path_problem(path)
    if problem:
        raise ArmorLabError(f"the data path {problem}", key=key, value=name, file=file)
    if path.is_file():
        if path.suffix.lower() not in DATA_FILE_SUFFIXES:
            raise ArmorLabError(f"must be a JSONL ({', '.join(DATA_FILE_SUFFIXES[:3])}) or parquet file, "
                                "a save_to_disk directory or a hub dataset id", key=key, value=name, file=file)
        return {"path": str(path.resolve()), "fingerprint": file_fingerprint(path)}
    if path.is_dir():
        if not any((path / f).is_file() for f in ("dataset_dict.json", "state.json", "dataset_info.json")):
            raise ArmorLabError("not a dataset directory saved with datasets' save_to_disk (no "
                                "dataset_dict.json or state.json)", key=key, value=name, file=file)
        try:
            return {"path": str(path.resolve()), "fingerprint": tree_fingerprint(path, recursive=True)}
        except ModelDirProblem as exc:
            raise ArmorLabError(f"cannot read the dataset directory: {exc}", key=key, value=name,
                                file=exc.file) from None
    if not _looks_like_path(name):
        snapshot = hub_snapshot(name, "dataset")
        if snapshot is not None:
            return {"path": name, "fingerprint": f"rev:{snapshot.name}"}
        raise ArmorLabError(f"no such file, and the hub dataset id is not in the local Hugging Face cache "
                            f"({_hub_cache_dir()}); armorlab never downloads", key=key, value=name, file=file)
    raise ArmorLabError("file not found", key=key, value=name, file=file)


@lru_cache(maxsize=256)
def _counted_rows(path: str, size: int, mtime_ns: int) -> int | None:  # noqa: ARG001 - cache key
    suffix = Path(path).suffix.lower()
    if suffix in (".parquet", ".pq"):
        try:
            import pyarrow.parquet as pq  # here: only a parquet data file needs it

            return pq.ParquetFile(path).metadata.num_rows
        except Exception:  # noqa: BLE001 - a damaged file: the task builder names the problem
            return None
    with os.fdopen(open_regular(path), "rb") as fh:
        return sum(1 for line in fh if line.strip())


def data_rows(path: str) -> int | None:
    """Records in a JSONL/parquet data file (non-blank lines, the parquet's row count); None for a
    directory, a hub id or a file that cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not os.path.isfile(path):
        return None
    try:
        return _counted_rows(path, st.st_size, st.st_mtime_ns)
    except OSError:
        return None
