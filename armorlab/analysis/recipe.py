"""Report recipes (``analysis/*.yaml``): which runs to compare, how to group them, what to show; the keys:
docs/reports.md#recipes (``compare:`` docs/verdicts.md, ``x:`` docs/schedules.md, ``format:``, ``runs_map:``,
``val_n:`` docs/importers.md). Seeds are never a group key: they are what the statistics aggregate."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from armorlab.analysis import importers
from armorlab.core.checks import did_you_mean
from armorlab.core.config import DEFAULT_SELECTION, load_yaml_mapping
from armorlab.errors import ArmorLabError

DEFAULT_CURVES = ("val/acc", "train/reward", "kl/reverse_k3", "kl/forward_k3", "cap/pos_mean",
                  "train/entropy", "val/length", "anchor/rate", "anchor/gate_drop_success",
                  "anchor/gate_keep_success", "obj/beta_kl")
DEFAULT_KL = ("kl/reverse_k3", "kl/forward_k3", "kl/exact_reverse", "kl/exact_forward")
SEED_KEYS = ("seed",)
KEYS = ("title", "runs", "stages", "group_by", "curves", "select", "matched_steps", "scores", "compare",
        "collapse", "kl", "out", "x", "format", "runs_map", "val_n")
X_AXES = ("step", "rollout")  # the counters a metrics line carries (armorlab.core.schedule)
X_OF_STEP_UNIT = {"optimizer": "step", "rollout": "rollout"}  # a run's step_unit → the x that reads it


@dataclass(frozen=True)
class Select:
    metric: str = DEFAULT_SELECTION["metric"]
    mode: str = DEFAULT_SELECTION["mode"]
    report: str = DEFAULT_SELECTION["report"]


@dataclass(frozen=True)
class CollapseParams:
    delta: float = 0.03      # the smallest fall that matters (collapse.py C5)
    patience: int = 3        # evals per level (C1)
    alpha: float = 0.04      # false-alarm rate on a flat curve (C4)
    entropy_frac: float = 0.1
    train: str = "train/reward"
    entropy: str = "train/entropy"
    length: str = "train/length"


DEFAULT_ENDPOINTS = ("final", "drop", "selected_test")


@dataclass(frozen=True)
class Compare:
    """Which groups are compared: a baseline (selector or label) or pairs (both None: automatic); ``endpoints``
    the verdicts' scores, the first primary; ``delta`` the margin declared before the runs (armorlab.stats.margins)."""
    baseline: dict[str, Any] | str | None = None
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] | None = None
    endpoints: list[str] | None = None
    delta: float | None = None
    baseline_from: str | None = None  # the flag that set baseline (``--baseline``; None: the recipe)
    delta_from: str | None = None     # the flag that set delta (``--delta``; None: the recipe)


@dataclass
class Recipe:
    runs: list[str]
    title: str = "armorlab report"
    group_by: list[str] | None = None
    curves: list[str] | None = None
    select: Select = field(default_factory=Select)
    matched_steps: list[int] | None = None
    scores: list[str] | None = None
    compare: Compare = field(default_factory=Compare)
    collapse: CollapseParams = field(default_factory=CollapseParams)
    kl: list[str] = field(default_factory=lambda: list(DEFAULT_KL))
    out: str | None = None
    x: str = "step"
    stages: list[str] | None = None  # only the runs of these stages of their sweeps (sweep.json)
    format: str | None = None        # imported runs (armorlab.analysis.importers): read every path as this
    runs_map: str | None = None      # runs.yaml: imported runs' group, seed, val_n
    val_n: int | None = None         # val/n of imported runs that log val/acc without it
    path: Path | None = None


def _err(msg: str, key: str, value: Any, file: str | None) -> ArmorLabError:
    return ArmorLabError(msg, key=key, value=value, file=file)


def _str_list(raw: Any, key: str, file: str | None) -> list[str]:
    raw = [raw] if isinstance(raw, str) else raw
    if not isinstance(raw, list) or not raw or not all(isinstance(x, str) and x for x in raw):
        raise _err("must be a non-empty list of strings", key, raw, file)
    return list(raw)


def _mapping(raw: Any, key: str, file: str | None, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _err("must be a mapping", key, raw, file)
    for k in raw:
        if k not in known:
            raise _err(f"unknown key{did_you_mean(k, known)} (known: {', '.join(known)})", f"{key}.{k}", raw[k], file)
    return dict(raw)


def _selector(raw: Any, key: str, file: str | None) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or not raw or not all(isinstance(k, str) for k in raw):
        raise _err("a group selector is a mapping {config key: value}", key, raw, file)
    return dict(raw)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# key → (whether a value is right, what it must be otherwise)
_SCALARS = {
    "matched_steps": (lambda v: isinstance(v, list) and v and all(_is_int(s) and s >= 0 for s in v),
                      "must be a non-empty list of step numbers ≥ 0"),
    "x": (lambda v: v in X_AXES, f"must be one of {', '.join(X_AXES)}"),
    "out": (lambda v: isinstance(v, str) and v, "must be a directory path"),
    "format": (lambda v: v in importers.FORMATS, f"must be one of {', '.join(importers.FORMATS)}"),
    "runs_map": (lambda v: isinstance(v, str) and v, "must be the path of a runs.yaml"),
    "val_n": (lambda v: _is_int(v) and v > 0, "must be a positive integer (completions per evaluation)"),
}
_SELECT = {"mode": (lambda v: v in ("max", "min"), "must be max or min")}
_COLLAPSE = {"delta": (lambda v: _is_number(v) and v > 0 and math.isfinite(v), "must be a number > 0"),
             "patience": (lambda v: _is_int(v) and v >= 1, "must be an integer ≥ 1"),
             "alpha": (lambda v: _is_number(v) and 0 < v < 1, "must be a number in (0, 1)"),
             "entropy_frac": (lambda v: _is_number(v) and 0 < v < 1, "must be a number in (0, 1)")}


def _fields(raw: Any, key: str, file: str | None, cls: type, checks: Mapping[str, tuple], metric: str) -> Any:
    """``cls`` from the mapping ``raw`` at ``key``: each field by its check, the others metric names."""
    given = _mapping(raw, key, file, tuple(cls.__dataclass_fields__))
    for k, v in given.items():
        ok, problem = checks.get(k, (lambda name: isinstance(name, str) and "/" in name, metric))
        if not ok(v):
            raise _err(problem, f"{key}.{k}", v, file)
    return cls(**given)


def parse_recipe(raw: Mapping[str, Any], *, file: str | None = None, name: str | None = None) -> Recipe:
    """Validate a recipe mapping (its keys: docs/reports.md#recipes)."""
    if not isinstance(raw, Mapping):
        raise _err("a recipe must be a mapping", "<root>", raw, file)
    for k in raw:
        if k not in KEYS:
            raise _err(f"unknown recipe key{did_you_mean(k, KEYS)} (known: {', '.join(KEYS)})", str(k), raw[k], file)
    if "runs" not in raw and raw.get("runs_map") is None:
        raise _err("a recipe needs `runs:` (run dirs, sweep dirs or globs) or `runs_map:`", "runs", None, file)
    r = Recipe(runs=_str_list(raw["runs"], "runs", file) if "runs" in raw else [])
    r.title = raw.get("title") or name or r.title
    if not isinstance(r.title, str):
        raise _err("must be a string", "title", r.title, file)
    given = {k: v for k, v in raw.items() if v is not None}
    for k in ("group_by", "curves", "kl", "scores", "stages"):
        if k in given:
            setattr(r, k, _str_list(given[k], k, file))
    if seed := next((k for k in r.group_by or () if k in SEED_KEYS), None):
        raise _err("seeds are aggregated, not grouped on", "group_by", seed, file)
    if "select" in given:
        r.select = _fields(given["select"], "select", file, Select, _SELECT, "must be a metric name such as val/acc")
    if "collapse" in given:
        r.collapse = _fields(given["collapse"], "collapse", file, CollapseParams, _COLLAPSE, "must be a metric name")
    if "compare" in given:
        r.compare = _compare(given["compare"], file)
    for k, (ok, problem) in _SCALARS.items():
        if k in given:
            if not ok(given[k]):
                raise _err(problem, k, given[k], file)
            setattr(r, k, sorted(set(given[k])) if k == "matched_steps" else given[k])
    return r


def unit_disagreement(x: str, recipe_file: str | None, units: Mapping[str, str]) -> str | None:
    """The warning when the recipe's ``x`` differs from its sweeps' ``step_unit`` (``units``: sweep → unit):
    step 500 of a rollout-counted sweep is another point of training than its horizons name. None if all agree."""
    other = {where: unit for where, unit in units.items() if X_OF_STEP_UNIT.get(unit, "step") != x}
    if not other:
        return None
    said = "; ".join(f"{where} counts in step_unit: {unit}" for where, unit in sorted(other.items()))
    want = sorted({X_OF_STEP_UNIT.get(u, "step") for u in other.values()})
    return (f"UNIT MISMATCH: {recipe_file or 'this report'} reads x: {x}, but {said}: its matched steps, "
            f"selected steps and curves count another unit than the sweep; set x: {' or '.join(want)}")


def _compare(raw: Any, file: str | None) -> Compare:
    cmp_ = _mapping(raw, "compare", file, ("baseline", "pairs", "endpoints", "delta"))
    if "baseline" in cmp_ and "pairs" in cmp_:
        raise _err("give either baseline or pairs", "compare", cmp_, file)
    baseline = cmp_.get("baseline")
    if "baseline" in cmp_ and not (isinstance(baseline, str) and baseline):  # a text: a group label, as on the page
        baseline = _selector(baseline, "compare.baseline", file)
    if (endpoints := cmp_.get("endpoints")) is not None:
        endpoints = list(dict.fromkeys(_str_list(endpoints, "compare.endpoints", file)))
    delta = cmp_.get("delta")
    if delta is not None and not (_is_number(delta) and math.isfinite(delta) and delta > 0):
        raise _err("must be a number > 0, the equivalence margin (or null: no margin, nothing equivalent)",
                   "compare.delta", delta, file)
    pairs = None
    if "pairs" in cmp_:
        if not isinstance(cmp_["pairs"], list) or not cmp_["pairs"]:
            raise _err("must be a list of [selector, selector] pairs", "compare.pairs", cmp_["pairs"], file)
        pairs = []
        for i, pair in enumerate(cmp_["pairs"]):
            if not isinstance(pair, list) or len(pair) != 2:
                raise _err("each pair is [selector, selector]", f"compare.pairs[{i}]", pair, file)
            pairs.append(tuple(_selector(side, f"compare.pairs[{i}][{j}]", file) for j, side in enumerate(pair)))
    return Compare(baseline, pairs, endpoints, float(delta) if delta is not None else None)


def parse_selector_flag(text: str, key: str = "--baseline") -> dict[str, Any]:
    """``objective=dapo,beta=0.1`` → ``{"objective": "dapo", "beta": 0.1}`` (values read as YAML scalars)."""
    import yaml

    out: dict[str, Any] = {}
    for part in text.split(","):
        name, eq, value = (word.strip() for word in part.partition("="))
        if not eq or not name or not value:
            raise _err("must be KEY=VALUE[,KEY=VALUE], e.g. objective=dapo", key, text, None)
        try:
            out[name] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[name] = value
    return out


def spec_controls(sweep_dirs: Sequence[Path], stages: Sequence[str] | None = None
                  ) -> list[tuple[dict[str, Any], list[dict[str, Any]], str]]:
    """(baseline selector, arm selectors, where) per control group that each sweep dir's spec.yaml (checked
    when the sweep was expanded) declares: ``controls:`` of the spec and of its stages (``stages`` only, when
    given), else its ``compare.baseline`` (a sweep run until resolved)."""
    out = []
    for d in dict.fromkeys(sweep_dirs):
        path = Path(d) / "spec.yaml"
        try:
            spec = load_yaml_mapping(path) if path.is_file() else {}
        except ArmorLabError:
            continue
        parts = [("controls", spec.get("controls"))]
        parts += [(f"stages[{i}].controls", st.get("controls")) for i, st in enumerate(spec.get("stages") or [])
                  if isinstance(st, Mapping) and (stages is None or st.get("name") in stages)]
        found = []
        for where, raw in parts:
            for j, group in enumerate(raw if isinstance(raw, list) else [raw]):
                if isinstance(group, Mapping) and isinstance(group.get("baseline"), Mapping):
                    arms = [a["select"] for a in group.get("arms") or ()
                            if isinstance(a, Mapping) and isinstance(a.get("select"), Mapping)]
                    at = f"[{j}]" if isinstance(raw, list) else ""
                    found.append((dict(group["baseline"]), arms, f"{where}{at}.baseline in {path}"))
        compare = spec.get("compare")
        if not found and isinstance(compare, Mapping) and isinstance(compare.get("baseline"), Mapping):
            found.append((dict(compare["baseline"]), [], f"compare.baseline in {path}"))
        out += found
    return out


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate ``analysis/<name>.yaml``."""
    path = Path(path)
    return replace(parse_recipe(load_yaml_mapping(path), file=str(path), name=path.stem), path=path)


def recipe_for_paths(paths: list[str], *, group_by: list[str] | None = None, format: str | None = None,
                     runs_map: str | None = None, val_n: int | None = None) -> Recipe:
    """The recipe behind ``armorlab report DIR...``: every default, the given dirs as runs."""
    names = [Path(p).name or str(p) for p in paths] or [Path(runs_map).stem if runs_map else "runs"]
    title = names[0] if len(names) == 1 else " vs ".join(names[:3]) + (" …" if len(names) > 3 else "")
    return Recipe(runs=list(paths), title=title, group_by=group_by, format=format, runs_map=runs_map, val_n=val_n)


def default_out_dir(recipe: Recipe) -> Path:
    """recipe ``out:``; else a single run's ``report/`` or sweep's ``<sweep>/report``; else
    ``reports/<recipe name>`` (always so for another library's runs: importing never writes there)."""
    if recipe.out:
        return Path(recipe.out)
    if recipe.path is None and len(recipe.runs) == 1 and (run := Path(recipe.runs[0])).is_dir():
        return Path("reports") / (run.resolve().name or "compare") if importers.holds_imports(run) else run / "report"
    return Path("reports") / (recipe.path.stem if recipe.path else "compare")
