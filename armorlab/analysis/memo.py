"""Results of the report's expensive pure steps, kept between reports and keyed by their inputs.

``armorlab report`` re-run after one run of a sweep moved re-parses that run only (load's
metrics cache); this module lets it skip the rest that did not change too:
* ``@cached`` on a pure function (a bootstrap CI, a curve band): the result is looked up by
  sha256(function, the source file it lives in, pickled arguments) and computed on a miss;
* ``@rendered`` on a plot function whose ``path`` argument names the PNG it writes: when the
  same arguments last wrote that very file (same size and mtime now), it is not drawn again.

Both only act inside ``using(store_path)`` (build_report opens one per output dir); elsewhere the
functions run as written. A store holds the entries the last report used, so it never grows past
one report's worth; an unreadable store is an empty one, never an error.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import io
import logging
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from armorlab.core.fsutil import atomic_file

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
_VERSION = 1


class _Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.old: dict[str, Any] = {}
        self.new: dict[str, Any] = {}
        self.hits = self.misses = 0
        try:
            with open(path, "rb") as fh:
                data = pickle.load(fh)
            if isinstance(data, dict) and data.get("version") == _VERSION:
                self.old = data["entries"]
        except FileNotFoundError:
            pass
        except Exception as exc:  # a damaged store is a cold one
            log.info("ignoring unreadable report memo %s: %s", path, exc)

    def save(self) -> None:
        try:
            with atomic_file(self.path) as tmp, open(tmp, "wb") as fh:
                pickle.dump({"version": _VERSION, "entries": self.new}, fh, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # read-only output dir, full disk: only a missed speed-up
            log.warning("could not write report memo %s: %s", self.path, exc)


_active: ContextVar[_Store | None] = ContextVar("armorlab_report_memo", default=None)


@contextlib.contextmanager
def using(store_path: str | os.PathLike, *, enabled: bool = True) -> Iterator[_Store | None]:
    """Memoise ``@cached``/``@rendered`` calls in this block through the store at ``store_path``
    (yielded: its ``hits``/``misses`` count the calls); the store is rewritten with the entries
    used here when the block succeeds."""
    if not enabled:
        yield None
        return
    store = _Store(Path(store_path))
    token = _active.set(store)
    try:
        yield store
        store.save()
        log.info("report memo: %d hits, %d misses", store.hits, store.misses)
    finally:
        _active.reset(token)


@functools.cache
def _code_identity(fn: Callable[..., Any]) -> bytes:
    """A function's name and the size + mtime of its source file: editing the module (the function
    or a helper it calls) invalidates its results."""
    try:
        st = os.stat(inspect.getsourcefile(fn) or "")
        stamp = f"{st.st_size}:{st.st_mtime_ns}"
    except (OSError, TypeError):
        stamp = "?"
    libs = ",".join(f"{m}={getattr(sys.modules[m], '__version__', '?')}"
                    for m in ("numpy", "scipy", "matplotlib", "pandas") if m in sys.modules)
    return f"{fn.__module__}.{fn.__qualname__}@{stamp}[{libs}]".encode()


def _key(fn: Callable[..., Any], args: tuple, kwargs: dict) -> str | None:
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    # no pickle memo: with it, equal arguments pickle differently when they share objects
    # differently (a group label that is one string object here and a copy read from the store
    # there), and the figure or statistic was computed again for nothing
    pickler.fast = True
    try:
        pickler.dump((args, sorted(kwargs.items())))
    except Exception:  # an argument that does not pickle (or refers to itself): no memo for this call
        return None
    blob = buf.getvalue()
    h = hashlib.sha256(_code_identity(fn))
    h.update(blob)
    return h.hexdigest()


def cached(fn: F) -> F:
    """Memoise a pure function's result by its arguments (inside ``using``)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        store = _active.get()
        key = _key(fn, args, kwargs) if store is not None else None
        if key is None:
            return fn(*args, **kwargs)
        if key in store.new:
            store.hits += 1
            return store.new[key]
        if key in store.old:
            store.hits += 1
            value = store.new[key] = store.old[key]
            return value
        store.misses += 1
        value = store.new[key] = fn(*args, **kwargs)
        return value

    return wrapper  # type: ignore[return-value]


def _file_state(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class _Done:
    """A result already there, shaped like a future."""
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


def _call_now(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _Done:
    return _Done(fn(*args, **kwargs))


def rendered(fn: F) -> F:
    """Skip drawing a figure whose PNG (the ``path`` argument) the same arguments already wrote.

    ``fn.later(submit, *args, **kwargs)`` is the same call drawn elsewhere: on a miss it calls
    ``submit(plain_fn, *args, **kwargs)``, which returns a future (a worker process runs the
    plain function: armorlab.analysis.report), and returns a function that waits for the PNG and
    records it; on a hit nothing is submitted. Call every returned function before ``using`` ends."""
    signature = inspect.signature(fn)

    def later(submit: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Path]:
        store = _active.get()
        key = _key(fn, args, kwargs) if store is not None else None
        if store is not None and key is not None:
            path = Path(signature.bind(*args, **kwargs).arguments["path"])
            written = store.old.get(key)
            if written is not None and _file_state(path) == written:
                store.hits += 1
                store.new[key] = written
                return lambda: path
            store.misses += 1
        future = submit(fn, *args, **kwargs)

        def result() -> Path:
            out = future.result()
            if store is not None and key is not None:
                store.new[key] = _file_state(Path(out))
            return out

        return result

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return later(_call_now, *args, **kwargs)()

    wrapper.later = later  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
