"""Report recipes (``analysis/*.yaml``): which runs to compare, how to group them, what to show.

```yaml
title: ARMOR vs DAPO                    # optional; default: the file name
runs: [runs/armor_alpha, runs/dapo_*]   # run dirs, sweep dirs or globs (relative to the cwd)
stages: [continue]                      # only the runs of these stages (sweep.json); default: all
group_by: [objective, alpha]            # config keys (dotted ok); default: the keys that tell runs apart
curves: [val/acc, train/reward, kl/forward_k3, kl/reverse_k3, cap/pos_mean, train/entropy]
select: {metric: val/acc, mode: max, report: test/acc}   # (R1) best on val, reported on test
matched_steps: [100, 200, 400]          # (R2); default: ¼, ½, 1 of the shortest run
x: step                                 # the x axis of curves and steps: step (optimizer) or rollout
scores: [selected_test, test@400, auc]  # headline scores: probability of improvement + bar charts
compare: {baseline: {objective: dapo},  # a selector or a group label; or pairs: [[{objective: armor}, {objective: dapo}]]
          endpoints: [final, drop, selected_test],   # verdicts (verdicts.py): the first is primary
          delta: 0.05}                  # equivalence margin, fixed before the runs; none: nothing is equivalent
collapse: {delta: 0.03, patience: 3, alpha: 0.04, entropy_frac: 0.1,   # collapse.py (C1)–(C7)
           train: train/reward, entropy: train/entropy, length: train/length}
kl: [kl/reverse_k3, kl/forward_k3]      # the KL figure (default: these and kl/exact_*, if logged)
out: reports/armor_vs_dapo              # default: reports/<recipe name>
format: tensorboard                     # read every path as this format (default: detected per path)
runs_map: runs.yaml                     # imported runs' group, seed, val_n (armorlab.analysis.importers.mapping)
val_n: 500                              # val/n of imported runs that log val/acc without it
```
Every key but ``runs`` is optional; unknown keys and bad values are errors naming the key, the
value and the file. Seeds are never a group key: they are what the statistics aggregate.
With ``x: rollout`` every step of the report (curves, matched_steps, peak, collapse and selected
steps) counts rollouts, the metrics lines' ``rollout`` counter; lines of one rollout are averaged.
A recipe reads in the unit its sweep counts in (the runs' ``step_unit``): ``x: rollout`` for a sweep
with ``step_unit: rollout``; a report whose ``x`` disagrees warns, naming the recipe and the sweep.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


def _str_list(raw: Any, key: str, file: str | None, *, allow_str: bool = True) -> list[str]:
    if allow_str and isinstance(raw, str):
        raw = [raw]
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


def _one_of(raw: Mapping[str, Any], key: str, options: Sequence[str], file: str | None) -> str:
    if raw[key] not in options:
        raise _err(f"must be one of {', '.join(options)}", key, raw[key], file)
    return raw[key]


def _path(raw: Mapping[str, Any], key: str, problem: str, file: str | None) -> str:
    if not isinstance(raw[key], str) or not raw[key]:
        raise _err(problem, key, raw[key], file)
    return raw[key]


def parse_recipe(raw: Mapping[str, Any], *, file: str | None = None, name: str | None = None) -> Recipe:
    """Validate a recipe mapping (see the module docstring)."""
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
    if raw.get("group_by") is not None:
        r.group_by = _str_list(raw["group_by"], "group_by", file)
        for k in r.group_by:
            if k in SEED_KEYS:
                raise _err("seeds are aggregated, not grouped on", "group_by", k, file)
    for k in ("curves", "kl", "scores", "stages"):
        if raw.get(k) is not None:
            setattr(r, k, _str_list(raw[k], k, file))
    if raw.get("select") is not None:
        sel = _mapping(raw["select"], "select", file, ("metric", "mode", "report"))
        for k in ("metric", "report"):
            if k in sel and (not isinstance(sel[k], str) or "/" not in sel[k]):
                raise _err("must be a metric name such as val/acc", f"select.{k}", sel[k], file)
        if sel.get("mode", "max") not in ("max", "min"):
            raise _err("must be max or min", "select.mode", sel["mode"], file)
        r.select = Select(**sel)
    if raw.get("matched_steps") is not None:
        steps = raw["matched_steps"]
        if (not isinstance(steps, list) or not steps
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)):
            raise _err("must be a non-empty list of step numbers ≥ 0", "matched_steps", steps, file)
        r.matched_steps = sorted(set(steps))
    if raw.get("collapse") is not None:
        r.collapse = _collapse(raw["collapse"], file)
    if raw.get("compare") is not None:
        r.compare = _compare(raw["compare"], file)
    if raw.get("x") is not None:
        r.x = _one_of(raw, "x", X_AXES, file)
    if raw.get("out") is not None:
        r.out = _path(raw, "out", "must be a directory path", file)
    if raw.get("format") is not None:
        r.format = _one_of(raw, "format", importers.FORMATS, file)
    if raw.get("runs_map") is not None:
        r.runs_map = _path(raw, "runs_map", "must be the path of a runs.yaml", file)
    if raw.get("val_n") is not None:
        v = raw["val_n"]
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise _err("must be a positive integer (completions per evaluation)", "val_n", v, file)
        r.val_n = v
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


def _collapse(raw: Any, file: str | None) -> CollapseParams:
    known = tuple(CollapseParams.__dataclass_fields__)
    col = _mapping(raw, "collapse", file, known)
    def num(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    checks = {"delta": lambda v: num(v) and v > 0 and math.isfinite(v),
              "patience": lambda v: num(v) and isinstance(v, int) and v >= 1,
              "alpha": lambda v: num(v) and 0 < v < 1, "entropy_frac": lambda v: num(v) and 0 < v < 1}
    hints = {"delta": "a number > 0", "patience": "an integer ≥ 1", "alpha": "a number in (0, 1)",
             "entropy_frac": "a number in (0, 1)"}
    for k, v in col.items():
        if k in checks and not checks[k](v):
            raise _err(f"must be {hints[k]}", f"collapse.{k}", v, file)
        if k not in checks and (not isinstance(v, str) or "/" not in v):
            raise _err("must be a metric name", f"collapse.{k}", v, file)
    return CollapseParams(**col)


def _compare(raw: Any, file: str | None) -> Compare:
    cmp_ = _mapping(raw, "compare", file, ("baseline", "pairs", "endpoints", "delta"))
    if "baseline" in cmp_ and "pairs" in cmp_:
        raise _err("give either baseline or pairs", "compare", cmp_, file)
    baseline = None
    if isinstance(cmp_.get("baseline"), str) and cmp_["baseline"]:
        baseline = cmp_["baseline"]  # a group label, as the report names groups
    elif "baseline" in cmp_:
        baseline = _selector(cmp_["baseline"], "compare.baseline", file)
    endpoints = (_str_list(cmp_["endpoints"], "compare.endpoints", file)
                 if cmp_.get("endpoints") is not None else None)
    delta = cmp_.get("delta")
    if delta is not None and (isinstance(delta, bool) or not isinstance(delta, (int, float))
                              or not math.isfinite(delta) or delta <= 0):
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
            pairs.append((_selector(pair[0], f"compare.pairs[{i}][0]", file),
                          _selector(pair[1], f"compare.pairs[{i}][1]", file)))
    return Compare(baseline, pairs, list(dict.fromkeys(endpoints)) if endpoints else None,
                   float(delta) if delta is not None else None)


def parse_selector_flag(text: str, key: str = "--baseline") -> dict[str, Any]:
    """``objective=dapo,beta=0.1`` → ``{"objective": "dapo", "beta": 0.1}`` (values read as YAML scalars)."""
    import yaml

    out: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        name, eq, value = part.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise _err("must be KEY=VALUE[,KEY=VALUE], e.g. objective=dapo", key, text, None)
        try:
            out[name.strip()] = yaml.safe_load(value.strip())
        except yaml.YAMLError:
            out[name.strip()] = value.strip()
    return out


def spec_controls(sweep_dirs: Sequence[Path], stages: Sequence[str] | None = None
                  ) -> list[tuple[dict[str, Any], list[dict[str, Any]], str]]:
    """The controls the specs behind the runs declare: (baseline selector, arm selectors, where) per
    control group, from each sweep dir's spec copy (spec.yaml, checked when the sweep was expanded):
    ``controls:`` of the spec and of its stages (of ``stages`` only, when given), else its
    ``compare.baseline`` (a sweep run until resolved)."""
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
    recipe = parse_recipe(load_yaml_mapping(path), file=str(path), name=path.stem)
    recipe.path = path
    return recipe


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
    if recipe.path is None and len(recipe.runs) == 1:
        p = Path(recipe.runs[0])
        if (p / "config.yaml").is_file() or p.is_dir():
            if not importers.holds_imports(p):
                return p / "report"
            return Path("reports") / (p.resolve().name or "compare")
    name = recipe.path.stem if recipe.path else "compare"
    return Path("reports") / name
