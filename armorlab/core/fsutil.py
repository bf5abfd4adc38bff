"""Crash-safe file writes: a reader sees the old file or the new one, never half of one.

And one rule for every file armorlab writes or deletes in a run dir, sweep dir, cache or report dir:
never through a symbolic link. A link planted in a shared run dir (``metrics.jsonl`` → a user's
``authorized_keys``, ``checkpoints/`` → another tree) would make armorlab append to, truncate or
delete what the link points to. So the file itself and the directories armorlab made on the way to
it (everything below ``within``, else the file's own directory) must not be links: refused with an
ArmorLabError naming the path. Files are opened with O_NOFOLLOW; replaced ones are renamed over
(a rename replaces a link, never its target). A sweep's ``--root`` (and the dirs above a run dir)
may be a link; a report's out dir may not: armorlab writes and deletes files directly in it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from armorlab.errors import ArmorLabError


def refuse_symlinks(path: str | os.PathLike, *, within: str | os.PathLike | None = None) -> Path:
    """``path``, or an ArmorLabError when it or a directory between it and ``within`` (exclusive;
    default: its own directory) is a symbolic link."""
    path = Path(path)
    stop = Path(within) if within is not None else path.parent.parent
    for p in (path, *path.parents):
        if p == stop or p == p.parent:
            break
        if p.is_symlink():
            raise ArmorLabError(f"is a symbolic link (to {os.readlink(p)}): armorlab never writes or deletes "
                                "through one in a run, sweep, cache or report dir; remove the link",
                                file=str(p))
    return path


def remove_tree(path: str | os.PathLike, *, within: str | os.PathLike | None = None) -> None:
    """Delete the directory ``path`` (a checkpoint) and what it holds, never through a link
    (refuse_symlinks; shutil.rmtree itself does not follow links inside it)."""
    import shutil

    shutil.rmtree(refuse_symlinks(path, within=within), ignore_errors=True)


def remove_file(path: str | os.PathLike, *, within: str | os.PathLike | None = None) -> None:
    """Unlink ``path`` if it exists, never in a linked directory (a link itself is removed)."""
    path = Path(path)
    refuse_symlinks(path.parent, within=path.parent.parent if within is None else within)
    path.unlink(missing_ok=True)


def _written_temp(path: Path, data: bytes, *, durable: bool, mode: int = 0o666) -> Path:
    """``data`` in a new file beside ``path`` (fsync'd when ``durable``), under a name unique
    across processes (the tasks of a multi-node job may write the same path at once)."""
    import uuid  # here: a dry run writes nothing and starts faster without it

    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    # 0o666 less the umask, the permissions open() gives (run dirs are shared with group members
    # on clusters; mkstemp's 0600 would lock them out)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def atomic_write_text(path: str | os.PathLike, text: str, *, durable: bool = True,
                      within: str | os.PathLike | None = None, mode: int = 0o666) -> None:
    """Write ``text`` to ``path`` via temp file + fsync + rename in the same directory.

    ``durable=False`` skips the fsync: readers still see the old file or the new one, but a
    machine crash may leave an empty file. For files that something else makes crash-safe (run
    dirs a sweep has not submitted yet: the manifest says to rewrite them)."""
    path = refuse_symlinks(path, within=within)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable, within=within, mode=mode)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, replace: bool = True,
                       durable: bool = True, within: str | os.PathLike | None = None, mode: int = 0o666) -> bool:
    """Write ``data`` to ``path`` via temp file + fsync + rename (``replace``), or, with
    ``replace=False``, + hard link: then ``path`` is written only if it does not exist yet, and
    the answer says whether it was (a file someone else put there first is kept). ``durable``:
    as for atomic_write_text; ``within``: refuse_symlinks; ``mode``: the new file's permissions
    (less the umask; 0o600: its owner's only)."""
    path = refuse_symlinks(path, within=within)
    tmp = _written_temp(path, data, durable=durable, mode=mode)
    try:
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, *, within: str | os.PathLike | None = None) -> Iterator[Path]:
    """For writers that take a file name (pyarrow): yield a temp path beside ``path``, rename it
    over ``path`` when the block succeeds, remove it when it fails. The temp name is unguessable
    (a link planted at it would redirect the writer)."""
    import uuid

    path = refuse_symlinks(path, within=within)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, durable: bool = True,
                      within: str | os.PathLike | None = None, mode: int = 0o666) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", durable=durable, within=within,
                      mode=mode)


_ENTRY_CACHE: dict[tuple[str, type, str], str] = {}


def yaml_text(obj: Any) -> str:
    """``yaml.safe_dump(obj, sort_keys=True)`` in block style. A mapping with string keys is
    emitted entry by entry, each ``key: value`` block looked up by (key, type, repr) first: a
    sweep's 1,000 configs share most entries, and PyYAML's representer (pure Python even with
    libyaml) costs more than the rest of writing a run dir. The text is the same as one dump
    of the whole mapping (a block mapping is the concatenation of its entries), except that an
    object shared between two entries is written twice instead of as an anchor and an alias."""
    import yaml  # here: the report's figure processes write files but no YAML

    # libyaml's emitter when present, ~4x faster (a sweep writes 1000s): the same data as
    # safe_dump writes, not always the same text (an empty-string key is `'': x`, not `? ''`)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        return yaml.dump(obj, Dumper=dumper, sort_keys=True, default_flow_style=False)
    if not obj:
        return "{}\n"
    if len(_ENTRY_CACHE) > 50_000:
        _ENTRY_CACHE.clear()
    parts = []
    for key in sorted(obj):
        value = obj[key]
        tag = (key, type(value), repr(value))
        text = _ENTRY_CACHE.get(tag)
        if text is None:
            text = _ENTRY_CACHE[tag] = yaml.dump({key: value}, Dumper=dumper, sort_keys=True,
                                                 default_flow_style=False)
        parts.append(text)
    return "".join(parts)


def atomic_write_yaml(path: str | os.PathLike, obj: Any, *, durable: bool = True,
                      within: str | os.PathLike | None = None, mode: int = 0o666) -> None:
    atomic_write_text(path, yaml_text(obj), durable=durable, within=within, mode=mode)


def append_line(path: str | os.PathLike, line: str, *, within: str | os.PathLike | None = None) -> None:
    """Append one line and flush it to the OS, so a crash loses at most the line being written.

    A file that does not end in a newline was torn by a crash mid-write; appending to it would
    glue this line onto the torn one and lose both. Its tail is mended first (``mend_torn_tail``).
    Never through a link (refuse_symlinks; O_NOFOLLOW against one planted in between), nor into a
    FIFO or device.
    """
    with open_append(path, within=within, read=True) as fh:
        mend_torn_tail(fh)
        fh.write(line.rstrip("\n").encode("utf-8") + b"\n")
        fh.flush()


def open_append(path: str | os.PathLike, *, within: str | os.PathLike | None = None, read: bool = False) -> Any:
    """A file opened to append bytes (``open(path, "ab")``; ``"a+b"`` with ``read``), never through a
    link (refuse_symlinks, O_NOFOLLOW) nor into a FIFO or device."""
    path = refuse_symlinks(path, within=within)
    try:
        fd = open_regular(path, (os.O_RDWR if read else os.O_WRONLY) | os.O_APPEND | os.O_CREAT,
                          follow_symlinks=False)
    except NotRegularFile as exc:
        raise ArmorLabError(f"cannot append to it: {exc}", file=str(path)) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refuse_symlinks(path, within=within)  # names the link
        raise
    return os.fdopen(fd, "a+b" if read else "ab")


def mend_torn_tail(fh: Any, chunk: int = 1 << 16) -> None:
    """Make a line-oriented file opened ``a+b`` end in a newline: an unterminated last line that
    still parses as one JSON value (only its newline was lost) is terminated; anything else is a
    half-written line and is truncated away (the resumed writer logs that step again)."""
    end = fh.seek(0, os.SEEK_END)
    if end == 0:
        return
    fh.seek(end - 1)
    if fh.read(1) == b"\n":
        return
    start = end
    while start > 0:  # find the start of the torn line: just after the previous newline
        lo = max(0, start - chunk)
        fh.seek(lo)
        nl = fh.read(start - lo).rfind(b"\n")
        if nl >= 0:
            start = lo + nl + 1
            break
        start = lo
    fh.seek(start)
    tail = fh.read(end - start)
    try:
        json.loads(tail.decode("utf-8"))
        complete = True
    except ValueError:  # UnicodeDecodeError is a ValueError
        complete = False
    if complete:
        fh.write(b"\n")
    else:
        fh.truncate(start)
    fh.flush()


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where armorlab caches what it builds (tiny models, null thresholds): ``cache_dir``, else
    ``$ARMORLAB_CACHE``, else ``~/.cache/armorlab``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("ARMORLAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "armorlab"


class NotRegularFile(OSError):
    """A path that must be a plain file is a FIFO, socket, device or directory: opening it to
    read could block forever (a FIFO with no writer) or read an endless stream (a device)."""


def _kind(mode: int) -> str:
    import stat

    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike, flags: int = os.O_RDONLY, mode: int = 0o666, *,
                 follow_symlinks: bool = True) -> int:
    """``os.open`` that never blocks on, or hands back, anything but a regular file: the open is
    non-blocking (a FIFO opens at once instead of waiting for a writer), and a FIFO, socket,
    device or directory raises NotRegularFile naming what it is. ``follow_symlinks=False`` refuses
    a symlink too (O_NOFOLLOW: ELOOP). The returned descriptor is blocking again."""
    import stat

    extra = os.O_NONBLOCK | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags | extra, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{_kind(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


# the cap for the small JSON files armorlab keeps beside runs (selected.json, looks.json, a
# report's stamp, a stop request): far above any real one, far below what a planted link fills
SMALL_FILE_BYTES = 16 * 1024 * 1024


def read_regular(path: str | os.PathLike, *, limit: int | None = None) -> bytes:
    """The bytes of a regular file (see open_regular; a directory raises NotRegularFile too);
    more than ``limit`` bytes raises NotRegularFile (an OSError) instead of filling memory."""
    try:
        fd = open_regular(path)
    except IsADirectoryError:
        raise NotRegularFile("a directory, not a regular file") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read() if limit is None else fh.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise NotRegularFile(f"larger than {limit:,} bytes: not a file armorlab wrote")
    return data


def read_regular_text(path: str | os.PathLike, *, limit: int | None = None) -> str:
    """read_regular decoded as UTF-8 (UnicodeDecodeError as ``Path.read_text`` raises it)."""
    return read_regular(path, limit=limit).decode("utf-8")


def writable_dir(path: str | os.PathLike, *, key: str, file: str | None = None) -> Path:
    """``path`` as a directory armorlab can write in (it need not exist yet), or an ArmorLabError
    naming ``key`` (``--out``, ``--root``, a recipe's ``out``) when it, or the first of its
    parents that exists, is a file or cannot be written: said before anything runs."""
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return path
    if not existing.is_dir():
        raise ArmorLabError("must be a directory, and it is a file" if existing == path else
                            f"cannot be created: {existing} is a file", key=key, value=str(path), file=file)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ArmorLabError(f"cannot be written: no permission in {existing}", key=key, value=str(path), file=file)
    return path
