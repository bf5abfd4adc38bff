"""Fast copies and run ids for sweep expansion: a 1,000-run dry run copies and hashes each point's
resolved config once per seed, and deepcopy/json of ~60 keys per run showed in its profile."""

from __future__ import annotations

import hashlib
import marshal
from collections.abc import Callable, Mapping
from typing import Any

from armorlab.core.config import LOGGING_KEYS
from armorlab.core.runs import canonical_json, identity


class _SeededRunId:
    """runs.run_id of a resolved config for each of its seeds, serialising the config once: the
    canonical JSON is written with a marker string as the seed, and each seed's text is that with
    the marker replaced by the seed's JSON (the same bytes canonical_json writes for the config
    with that seed, so the same id). Returns None where this shortcut does not apply (a logging
    key called seed, the marker already in the config, a value JSON refuses): the caller then
    computes the id the ordinary way."""

    _MARK = "\x00armorlab-seed\x00"

    def __init__(self, resolved: Mapping[str, Any]) -> None:
        self._text: str | None = None
        if "seed" in LOGGING_KEYS:
            return
        try:
            text = canonical_json({**identity(resolved), "seed": self._MARK})
        except (TypeError, ValueError):
            return
        self._mark_json = canonical_json(self._MARK)
        if text.count(self._mark_json) == 1:
            self._text = text

    def __call__(self, seed: Any) -> str | None:
        if self._text is None or type(seed) is not int:
            return None
        text = self._text.replace(self._mark_json, str(seed))  # an int's JSON is its decimal text
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _copy_data(obj: Any) -> Any:
    """deepcopy for plain YAML data (dicts, lists, scalars), several times faster: a marshal round
    trip (C code; keeps dict order and every scalar type) where the data allows it."""
    return _copier(obj)()


def _copier(obj: Any) -> Callable[[], Any]:
    """A function returning a fresh deep copy of plain data ``obj`` at each call (a point's
    configs, one per seed). A mapping's scalars are shared (immutable) and its dicts and lists
    serialised once (marshal), so each copy is a shallow copy plus one load of the nested part."""
    nested = {k: v for k, v in obj.items() if isinstance(v, (dict, list))} if isinstance(obj, dict) else obj
    try:
        blob = marshal.dumps(nested)
    except ValueError:  # something marshal cannot write: copy it by hand
        return lambda: _copy_plain(obj)
    if nested is obj:
        return lambda: marshal.loads(blob)

    def copy_mapping() -> dict[str, Any]:
        out = dict(obj)
        out.update(marshal.loads(blob))  # existing keys: the order stays obj's
        return out

    return copy_mapping


def _copy_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _copy_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy_plain(v) for v in obj]
    return obj
