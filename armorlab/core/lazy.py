"""One lazy import for the modules that must load fast: an object whose attributes are those of heavy
modules (scipy, matplotlib), imported at first use. Each place that makes one says why."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class Lazy:
    """``Lazy("scipy.special", "scipy.optimize").erf`` imports scipy.special (then scipy.optimize, if
    the first lacks the name) at the first access and keeps each name found; a source may also be a
    function returning the object that holds the names."""

    def __init__(self, *sources: str | Callable[[], Any]) -> None:
        self._sources = sources

    def __getattr__(self, name: str) -> Any:
        for source in self._sources:
            holder = source() if callable(source) else importlib.import_module(source)
            if hasattr(holder, name):
                value = getattr(holder, name)
                setattr(self, name, value)  # the next access is a plain attribute
                return value
        raise AttributeError(f"none of {self._sources} has {name!r}")
