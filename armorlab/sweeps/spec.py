"""Sweep specs (``sweeps/*.yaml``) → validated ``SweepSpec`` → expanded, deduplicated ``RunPlan``s.

```yaml
name: armor_alpha
base: {objective: armor, max_steps: 200}    # a run config, inline or a path (relative to this file)
grid: {alpha: [0.9, 0.8, 0.7]}              # cartesian product; dotted keys set one sub-key
seeds: [0, 1, 2]                            # every grid/include point is crossed with the seeds
include: [{objective: dapo}]                # extra points (also crossed with the seeds)
exclude: [{alpha: 0.7, ref_reset_steps: 0}] # drops grid points whose resolved config matches
profile: slurm/default.yaml                 # where to run; `armorlab sweep --profile` overrides it
```
Every expanded point goes through ``armorlab.core.config.resolve`` — the training config's own
validation — so a bad value is reported with its key, value and the spec file before anything
runs. Points are deduplicated by run id (first occurrence kept), in a stable order: grid points
in product order (first axis slowest), then includes, each with its seeds in the given order.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import marshal
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from armorlab.core.checks import Invalid, did_you_mean, within_max_points
from armorlab.core.config import (
    LOGGING_KEYS,
    MODEL_FIELDS_TINY,
    TASK_FIELDS,
    get_dotted,
    known_keys,
    load_yaml_mapping,
    resolve,
    set_dotted,
)
from armorlab.core.runs import canonical_json, identity, run_id
from armorlab.errors import ArmorLabError

SPEC_KEYS = ("name", "description", "base", "grid", "seeds", "include", "exclude", "profile", "search")
# Sweep names become directory names and Slurm job names: keep them to a shell- and path-safe set.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # fullmatch: `$` would allow a final newline
_SUBKEYS = {
    "task": frozenset({"name"}).union(*(set(f) for f in TASK_FIELDS.values())),
    "model": frozenset({"name"}) | frozenset(MODEL_FIELDS_TINY),
}
_MISSING = object()


@dataclass(frozen=True)
class SweepSpec:
    name: str
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int] | None
    include: list[dict[str, Any]]
    exclude: list[dict[str, Any]]
    profile: str | None
    search: dict[str, Any] | None
    path: Path | None
    description: str | None = None

    @property
    def file(self) -> str:
        """How errors name this spec."""
        return str(self.path) if self.path is not None else "<sweep spec>"

    def profile_path(self) -> Path | None:
        """The spec's ``profile:`` as an existing file (see ``find_relative``), or None if unset."""
        if self.profile is None:
            return None
        return find_relative(self.profile, self.path, key="profile")

    def to_dict(self) -> dict[str, Any]:
        """Self-contained form (base inlined) written as the sweep dir's spec copy."""
        out: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            out["description"] = self.description
        out["base"] = copy.deepcopy(self.base)
        for key in ("grid", "seeds", "include", "exclude", "profile", "search"):
            value = getattr(self, key)
            if value not in (None, [], {}):
                out[key] = copy.deepcopy(value)
        return out


class RunPlan:
    """One run of a sweep: its id, the grid/include keys (+ seed) that made it, and its fully
    resolved config. ``make`` instead of ``config``: the config is built when first read (a dry
    run of 1,000 runs reads none; a submit reads each once, into its job's pickle); ``view``, the
    same values shallow (nested ones shared with the point's other seeds), is for reading only."""

    __slots__ = ("run_id", "point", "_config", "_make", "_view")

    def __init__(self, run_id: str, config: dict[str, Any] | None = None, point: dict[str, Any] | None = None,
                 *, make: Callable[[], dict[str, Any]] | None = None, view: Mapping[str, Any] | None = None) -> None:
        if (config is None) == (make is None):
            raise TypeError("RunPlan needs a config or a function making it")
        self.run_id = run_id
        self.point = {} if point is None else point
        self._config, self._make, self._view = config, make, view

    @property
    def view(self) -> Mapping[str, Any]:
        """The config's values without a copy: never modify it."""
        if self._config is not None or self._view is None:
            return self.config
        return self._view

    @property
    def config(self) -> dict[str, Any]:
        if self._config is None:
            self._config, self._make = self._make(), None
        return self._config

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunPlan):
            return NotImplemented
        return (self.run_id, self.point, self.config) == (other.run_id, other.point, other.config)

    __hash__ = None  # the frozen dataclass it replaces could not hash its dicts either

    def __repr__(self) -> str:
        return f"RunPlan(run_id={self.run_id!r}, point={self.point!r})"


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


# --------------------------------------------------------------------------- parsing
def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec file (values are checked when it is expanded)."""
    path = Path(path)
    return parse_spec(load_yaml_mapping(path), path=path)


def parse_spec(data: Mapping[str, Any], *, path: str | Path | None = None) -> SweepSpec:
    """Validate the spec's structure; unknown keys anywhere are errors naming key and file."""
    path = Path(path) if path is not None else None
    file = str(path) if path is not None else "<sweep spec>"
    if not isinstance(data, Mapping):
        raise ArmorLabError("a sweep spec must be a mapping", key="<root>", value=type(data).__name__,
                            file=file)
    for key in data:
        if key not in SPEC_KEYS:
            raise ArmorLabError(f"unknown sweep spec key{did_you_mean(key, SPEC_KEYS)} (known: {', '.join(SPEC_KEYS)})",
                                key=str(key),
                                value=data[key], file=file)
    name = data.get("name", path.stem if path is not None else None)
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ArmorLabError("sweep name must be 1-100 characters from letters, digits, '_', '.', '-' "
                            "(it names a directory and the Slurm jobs)", key="name", value=name, file=file)
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        raise ArmorLabError("must be a string", key="description", value=description, file=file)
    base = _parse_base(data.get("base"), path, file)
    grid = _parse_grid(data.get("grid"), file)
    seeds = _parse_seeds(data.get("seeds"), file)
    include = _parse_points(data.get("include"), "include", file, allow_empty=True)
    exclude = _parse_points(data.get("exclude"), "exclude", file, allow_empty=False)
    if seeds is not None:
        for where, points in (("grid", [grid]), ("include", include)):
            if any("seed" in p for p in points):
                raise ArmorLabError("set seeds either in `seeds:` or as a key, not both", key=f"{where}.seed",
                                    value=seeds, file=file)
    profile = data.get("profile")
    if profile is not None and (not isinstance(profile, str) or not profile):
        raise ArmorLabError("must be a path to a profile YAML", key="profile", value=profile, file=file)
    search = data.get("search")
    if search is not None and not isinstance(search, Mapping):
        raise ArmorLabError("must be a mapping (see `armorlab tune`)", key="search", value=search, file=file)
    return SweepSpec(name=name, base=base, grid=grid, seeds=seeds, include=include, exclude=exclude,
                     profile=profile, search=dict(search) if search is not None else None, path=path,
                     description=description)


def _check_key(key: Any, where: str, file: str) -> str:
    """A point's key must name a config field: a top-level key, or ``task.X`` / ``model.X``."""
    if not isinstance(key, str) or not key:
        raise ArmorLabError("keys must be non-empty strings", key=f"{where}.{key}", value=key, file=file)
    parts = key.split(".")
    top = parts[0]
    ok = top in known_keys() and all(parts)
    if ok and len(parts) > 1:
        ok = top in _SUBKEYS and len(parts) == 2 and parts[1] in _SUBKEYS[top]
    if not ok:
        near = did_you_mean(key, [*known_keys(), *(f"{t}.{k}" for t, ks in _SUBKEYS.items() for k in ks)])
        raise ArmorLabError(f"unknown config key (not an armorlab field, a GRPOConfig field, task.X or model.X){near}",
                            key=f"{where}.{key}", value=key, file=file)
    return key


def _parse_base(raw: Any, path: Path | None, file: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, str):
        base_path = find_relative(raw, path, key="base")
        raw = load_yaml_mapping(base_path)
    if not isinstance(raw, Mapping):
        raise ArmorLabError("must be a run config mapping or a path to one", key="base", value=raw, file=file)
    for key in raw:
        if not isinstance(key, str) or "." in key:
            raise ArmorLabError("base keys are plain config keys (nest task/model settings)",
                                key=f"base.{key}", value=raw[key], file=file)
    return copy.deepcopy(dict(raw))


def _parse_grid(raw: Any, file: str) -> dict[str, list[Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ArmorLabError("must map config keys to lists of values", key="grid", value=raw, file=file)
    grid = {}
    for key, values in raw.items():
        key = _check_key(key, "grid", file)
        if not isinstance(values, list) or not values:
            raise ArmorLabError("a grid axis must be a non-empty list of values", key=f"grid.{key}",
                                value=values, file=file)
        grid[key] = copy.deepcopy(values)
    return grid


def _parse_seeds(raw: Any, file: str) -> list[int] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise ArmorLabError("must be a non-empty list of seeds", key="seeds", value=raw, file=file)
    for s in raw:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ArmorLabError("seeds must be non-negative integers", key="seeds", value=s, file=file)
    return list(raw)


def _parse_points(raw: Any, where: str, file: str, *, allow_empty: bool) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ArmorLabError("must be a list of mappings", key=where, value=raw, file=file)
    points = []
    for i, point in enumerate(raw):
        if not isinstance(point, Mapping) or (not point and not allow_empty):
            raise ArmorLabError("each entry must be a non-empty mapping of config keys to values",
                                key=f"{where}[{i}]", value=point, file=file)
        points.append({_check_key(k, where, file): copy.deepcopy(v) for k, v in point.items()})
    return points


# --------------------------------------------------------------------------- expansion
def points(spec: SweepSpec) -> list[tuple[str, dict[str, Any]]]:
    """(origin, point) pairs before seeds: the grid product in order, then the includes."""
    keys = list(spec.grid)
    out = [("grid", dict(zip(keys, combo, strict=True))) for combo in itertools.product(*spec.grid.values())]
    out += [("include", dict(p)) for p in spec.include]
    return out


def count_points(spec: SweepSpec) -> int:
    """Runs the spec expands to before deduplication, counted without expanding it."""
    n_seeds = len(spec.seeds) if spec.seeds is not None else 1
    return (math.prod(len(v) for v in spec.grid.values()) + len(spec.include)) * n_seeds


def expand(spec: SweepSpec) -> list[RunPlan]:
    """All runs of the spec: resolved configs, deduplicated by run id, in a stable order.
    Refuses (before expanding) a spec of more than ``checks.max_points()`` runs."""
    try:
        within_max_points(count_points(spec), "the grid × seeds")
    except Invalid as exc:
        raise ArmorLabError(str(exc), key="grid", value={k: len(v) for k, v in spec.grid.items()},
                            file=spec.file) from None
    seeds: list[int | None] = list(spec.seeds) if spec.seeds is not None else [None]
    plans: list[RunPlan] = []
    seen: set[str] = set()
    for origin, point in points(spec):
        raw = copy.deepcopy(spec.base)
        for key, value in point.items():
            set_dotted(raw, key, copy.deepcopy(value), file=spec.file)
        if seeds != [None]:
            raw["seed"] = seeds[0]
        resolved = _resolve(raw, spec.file)
        seeded_id = _SeededRunId(resolved) if seeds != [None] else None
        copy_resolved = _copier(resolved)
        for seed in seeds:
            # resolve() checks `seed` as a plain non-negative int and derives nothing from it, and
            # parse_spec checked the seeds the same way: resolve each point once, not once per seed
            full_point = dict(point)
            if seed is not None:
                full_point["seed"] = seed
                view = {**resolved, "seed": seed}  # read-only here; each plan makes its own copy
            else:
                view = resolved
            if origin == "grid" and any(_matches(view, ex) for ex in spec.exclude):
                continue
            rid = (seeded_id(seed) if seeded_id is not None else None) or _run_id(view, spec.file)
            if rid in seen:
                continue
            seen.add(rid)
            if seed is None:
                plans.append(RunPlan(rid, resolved, full_point))
            else:
                plans.append(RunPlan(rid, point=full_point, make=_with_seed(copy_resolved, seed), view=view))
    return plans


def _with_seed(copy_config: Callable[[], dict[str, Any]], seed: int) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        cfg = copy_config()
        cfg["seed"] = seed
        return cfg

    return make


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


def _resolve(raw: dict[str, Any], file: str) -> dict[str, Any]:
    try:
        return resolve(raw, file=file)
    except ArmorLabError:
        raise
    except (TypeError, OverflowError) as exc:  # e.g. an integer too large for a float field
        raise ArmorLabError(f"invalid value: {exc}", file=file) from None


def _run_id(cfg: dict[str, Any], file: str) -> str:
    try:
        return run_id(cfg)
    except (TypeError, ValueError):
        # a YAML date or a NaN in a TRL key: find the key to name it
        for key, value in cfg.items():
            try:
                canonical_json({key: value})
            except (TypeError, ValueError):
                raise ArmorLabError("values must be plain data (finite numbers, strings, booleans, null, "
                                    "lists, mappings)", key=key, value=value, file=file) from None
        raise


def _matches(cfg: Mapping[str, Any], exclude: Mapping[str, Any]) -> bool:
    """True when every key of the exclude entry equals the resolved config's value."""
    for key, want in exclude.items():
        have = get_dotted(cfg, key, _MISSING)
        if key in ("task", "model") and isinstance(want, str) and isinstance(have, Mapping):
            have = have.get("name")  # `task: arithmetic` is the short form of {name: arithmetic}
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            if not _matches(have, want):
                return False
        elif have is _MISSING or not _same(have, want):
            return False
    return True


def _same(a: Any, b: Any) -> bool:
    # bool is an int in Python: `anchor: 1` must not match `anchor: true`
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def describe_point(point: Mapping[str, Any]) -> str:
    """``alpha=0.7 seed=1`` for tables; values shown as YAML would write them, a float with more
    than 6 significant digits rounded to 4 (``learning_rate=3.162e-06``: the run id tells runs apart)."""
    return " ".join(f"{k}={short_value(v)}" for k, v in point.items()) or "(base)"


def short_value(v: Any) -> str:
    """One value of a grid point as a table shows it (see describe_point)."""
    if type(v) is int:
        if abs(v) < 10**12:
            return repr(v)
        # str() of an int past 4,300 digits raises; a table cell needs no more than its size
        return f"{v:.4g}" if v.bit_length() < 1000 else f"<{int(v.bit_length() * 0.30103) + 1}-digit int>"
    if type(v) is float and math.isfinite(v):
        text = repr(v)
        digits = text.split("e")[0].replace("-", "").replace(".", "").strip("0")
        return text if len(digits) <= 6 else f"{v:.4g}"
    try:
        text = canonical_json(v) if not isinstance(v, str) else v
    except ValueError:  # NaN, or an int too long for str()
        text = type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."
