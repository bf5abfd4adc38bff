"""Sweep specs (``sweeps/*.yaml``) → validated ``SweepSpec`` → expanded, deduplicated ``RunPlan``s.

```yaml
name: armor_alpha
base: {objective: armor, max_steps: 200}    # a run config, inline or a path (relative to this file)
grid: {alpha: [0.9, 0.8, 0.7]}              # cartesian product; dotted keys set one sub-key
seeds: [0, 1, 2]                            # every grid/include point is crossed with the seeds
include: [{objective: dapo}]                # extra points (also crossed with the seeds)
exclude: [{alpha: 0.7, ref_reset_steps: 0}] # drops grid points whose resolved config matches
profile: slurm/default.yaml                 # where to run; `armorlab sweep --profile` overrides it
compare: {baseline: {objective: dapo}}      # `--until-resolved`: the baseline arm (armorlab.sweeps.until_resolved_compare)
```
Stages (the ARMOR paper's continual protocol): each stage is a grid of its own (``base`` merged
over the spec's, ``grid``/``include``/``exclude``/``seeds``/``controls``); a stage with ``from``
continues from an earlier stage's runs — each of its runs gets ``init_from`` (the parent run and
the selection rule; armorlab.train.init_from), so it starts from the checkpoint its parent
selected, π_ref included, and its run id follows the parent:
```yaml
base: {objective: dapo}
seeds: [0, 1, 2]
stages:
  - {name: dapo}
  - name: continue
    from: {stage: dapo, select: {metric: val/acc, mode: max}, seeds: same}
    include: [{objective: dapo}, {objective: armor}]
```
``from.seeds``: ``same`` (default: a run continues from the parent run of its own seed), one seed
(every run continues from that parent seed's runs: one shared stage 1), or a mapping child seed →
parent seed. A run continues from every run of the parent stage with its parent seed (one, unless
that stage is a grid). Without ``stages:`` the spec is one stage.
Every expanded point goes through ``armorlab.core.config.resolve`` — the training config's own
validation — so a bad value is reported with its key, value and the spec file before anything
runs. Points are deduplicated by run id (first occurrence kept), in a stable order: grid points
in product order (first axis slowest), then includes, each with its seeds in the given order.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import itertools
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from armorlab.core.checks import Invalid, did_you_mean, within_max_points
from armorlab.core.config import (
    deep_merge,
    load_yaml_mapping,
    resolve,
    set_dotted,
)
from armorlab.core.runs import canonical_json, run_id
from armorlab.errors import ArmorLabError, combine
from armorlab.sweeps.controls import Controls, Pair, check, matches, parse_controls
from armorlab.sweeps.parsing import (
    NAME_RE,
    check_seed_keys,
    find_relative,
    parse_base,
    parse_grid,
    parse_points,
    parse_seeds,
)
from armorlab.sweeps.seed_copies import _copier, _SeededRunId
from armorlab.sweeps.stages import Stage, parse_stages
from armorlab.sweeps.until_resolved_compare import CompareSpec, parse_compare

SPEC_KEYS = ("name", "description", "base", "grid", "seeds", "include", "exclude", "profile", "search", "stages",
             "controls", "compare")


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
    stages: list[Stage] | None = None
    controls: list[Controls] = field(default_factory=list)
    compare: CompareSpec | None = None   # what `--until-resolved` compares (armorlab.sweeps.until_resolved_compare)

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
        if self.controls:
            out["controls"] = [c.to_dict() for c in self.controls]
        if self.stages is not None:
            out["stages"] = [st.to_dict() for st in self.stages]
        if self.compare is not None:
            out["compare"] = self.compare.to_dict()
        return out

    def stage_list(self) -> list[Stage]:
        """The stages; a spec without ``stages:`` is one stage named after the spec."""
        if self.stages is not None:
            return self.stages
        return [Stage(self.name, {}, self.grid, self.seeds, self.include, self.exclude, None, self.controls)]


class RunPlan:
    """One run of a sweep: its id, the grid/include keys (+ seed) that made it, and its fully
    resolved config. ``make`` instead of ``config``: the config is built when first read (a dry
    run of 1,000 runs reads none; a submit reads each once, into its job's pickle); ``view``, the
    same values shallow (nested ones shared with the point's other seeds), is for reading only."""

    __slots__ = ("run_id", "point", "_config", "_make", "_view", "stage", "parent")

    def __init__(self, run_id: str, config: dict[str, Any] | None = None, point: dict[str, Any] | None = None,
                 *, make: Callable[[], dict[str, Any]] | None = None, view: Mapping[str, Any] | None = None,
                 stage: str | None = None, parent: str | None = None) -> None:
        if (config is None) == (make is None):
            raise TypeError("RunPlan needs a config or a function making it")
        self.run_id = run_id
        self.point = {} if point is None else point
        self._config, self._make, self._view = config, make, view
        self.stage = stage    # the stage's name in a spec with `stages:`, else None
        self.parent = parent  # the run id this run continues from (init_from), else None

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
        extra = f", stage={self.stage!r}, parent={self.parent!r}" if self.stage is not None else ""
        return f"RunPlan(run_id={self.run_id!r}, point={self.point!r}{extra})"


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
    problems: list[ArmorLabError] = []  # every problem of the file at once, as the config layer does

    def checked(parse: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        try:
            return parse(*args)
        except ArmorLabError as exc:
            problems.extend(exc.problems)
            return default

    for key in data:
        if key not in SPEC_KEYS:
            problems.append(ArmorLabError(f"unknown sweep spec key{did_you_mean(key, SPEC_KEYS)} (known: "
                                          f"{', '.join(SPEC_KEYS)})", key=str(key), value=data[key], file=file))
    name = data.get("name", path.stem if path is not None else None)
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        problems.append(ArmorLabError("sweep name must be 1-100 characters from letters, digits, '_', '.', '-' "
                                      "(it names a directory and the Slurm jobs)", key="name", value=name,
                                      file=file))
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        problems.append(ArmorLabError("must be a string", key="description", value=description, file=file))
    base = checked(parse_base, data.get("base"), path, file, default={})
    grid = checked(parse_grid, data.get("grid"), file, default={})
    seeds = checked(parse_seeds, data.get("seeds"), file)
    include = checked(lambda: parse_points(data.get("include"), "include", file, allow_empty=True), default=[])
    exclude = checked(lambda: parse_points(data.get("exclude"), "exclude", file, allow_empty=False), default=[])
    checked(check_seed_keys, seeds, grid, include, "", file)
    controls = checked(parse_controls, data.get("controls"), "controls", file, default=[])
    stages = None
    if data.get("stages") is not None:
        for key in ("grid", "include", "exclude", "controls"):
            if data.get(key) is not None:
                problems.append(ArmorLabError("with `stages:`, each stage has its own grid, include, exclude "
                                              "and controls", key=key, value=data[key], file=file))
        stages = checked(parse_stages, data["stages"], seeds, path, file)
    profile = data.get("profile")
    if profile is not None and (not isinstance(profile, str) or not profile):
        problems.append(ArmorLabError("must be a path to a profile YAML", key="profile", value=profile, file=file))
    search = data.get("search")
    if search is not None and not isinstance(search, Mapping):
        problems.append(ArmorLabError("must be a mapping (see `armorlab tune`)", key="search", value=search,
                                      file=file))
    elif search is not None and data.get("stages") is not None:
        problems.append(ArmorLabError("a search (`armorlab tune`) has no stages", key="stages", value="...",
                                      file=file))
    compare = checked(parse_compare, data.get("compare"), file)
    if compare is not None and compare.stage is not None and compare.stage not in [st.name for st in stages or ()]:
        problems.append(ArmorLabError(f"must name a stage of this spec (stages: "
                                      f"{', '.join(st.name for st in stages or ()) or 'none'})",
                                      key="compare.stage", value=compare.stage, file=file))
    if problems:
        raise combine(problems)
    return SweepSpec(name=name, base=base, grid=grid, seeds=seeds, include=include, exclude=exclude,
                     profile=profile, search=dict(search) if search is not None else None, path=path,
                     description=description, stages=stages, controls=controls, compare=compare)


# --------------------------------------------------------------------------- expansion
def points(spec: SweepSpec | Stage) -> list[tuple[str, dict[str, Any]]]:
    """(origin, point) pairs before seeds: the grid product in order, then the includes."""
    keys = list(spec.grid)
    out = [("grid", dict(zip(keys, combo, strict=True))) for combo in itertools.product(*spec.grid.values())]
    out += [("include", dict(p)) for p in spec.include]
    return out


def count_points(spec: SweepSpec) -> int:
    """Runs the spec expands to before deduplication, counted without expanding it (a stage that
    continues runs of a grid counts each of its runs once per parent of its seed: at most the
    parent stage's points)."""
    total, per_seed = 0, {}
    for st in spec.stage_list():
        seeds = st.seeds if st.seeds is not None else spec.seeds
        n_points = math.prod(len(v) for v in st.grid.values()) + len(st.include)
        per_seed[st.name] = n_points * (per_seed[st.parent.stage] if st.parent is not None else 1)
        total += per_seed[st.name] * (len(seeds) if seeds is not None else 1)
    return total


def expand(spec: SweepSpec) -> list[RunPlan]:
    """All runs of the spec, stage by stage: resolved configs, deduplicated by run id, in a stable
    order. Refuses (before expanding) a spec of more than ``checks.max_points()`` runs."""
    try:
        within_max_points(count_points(spec), "the grid × seeds")
    except Invalid as exc:
        sizes = {k: len(v) for k, v in spec.grid.items()} if spec.stages is None else \
            {st.name: {k: len(v) for k, v in st.grid.items()} for st in spec.stages}
        raise ArmorLabError(str(exc), key="grid" if spec.stages is None else "stages", value=sizes,
                            file=spec.file) from None
    plans: list[RunPlan] = []
    seen: set[str] = set()
    by_stage: dict[str, list[RunPlan]] = {}
    for i, st in enumerate(spec.stage_list()):
        base = deep_merge(spec.base, st.base) if st.base else spec.base
        seeds = st.seeds if st.seeds is not None else spec.seeds
        name = st.name if spec.stages is not None else None
        if st.parent is None:
            got = _expand_stage(st, base, seeds, spec.file, seen, name)
        else:
            got = _expand_continuing(spec, i, st, base, seeds, by_stage[st.parent.stage], seen,
                                     {p.run_id: p for p in plans})
        by_stage[st.name] = got
        plans += got
    return plans


def _point_config(base: dict[str, Any], point: dict[str, Any], seed: int | None, file: str) -> dict[str, Any]:
    """The raw run config of one point: the stage's base with the point's keys set (and ``seed``)."""
    raw = copy.deepcopy(base)
    for key, value in point.items():
        set_dotted(raw, key, copy.deepcopy(value), file=file)
    if seed is not None:
        raw["seed"] = seed
    return raw


def _expand_stage(st: Stage, base: dict[str, Any], spec_seeds: list[int] | None, file: str, seen: set[str],
                  name: str | None) -> list[RunPlan]:
    seeds: list[int | None] = list(spec_seeds) if spec_seeds is not None else [None]
    plans: list[RunPlan] = []
    for origin, point in points(st):
        raw = _point_config(base, point, seeds[0], file)
        resolved = _resolve(raw, file, point)
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
            if origin == "grid" and any(matches(view, ex) for ex in st.exclude):
                continue
            rid = (seeded_id(seed) if seeded_id is not None else None) or _run_id(view, file)
            if rid in seen:
                continue
            seen.add(rid)
            if seed is None:
                plans.append(RunPlan(rid, resolved, full_point, stage=name))
            else:
                plans.append(RunPlan(rid, point=full_point, make=_with_seed(copy_resolved, seed), view=view,
                                     stage=name))
    return plans


def _expand_continuing(spec: SweepSpec, index: int, st: Stage, base: dict[str, Any], spec_seeds: list[int] | None,
                       parents: list[RunPlan], seen: set[str], earlier: dict[str, RunPlan]) -> list[RunPlan]:
    """A stage whose runs continue from ``parents`` (the earlier stage's runs): each point × seed
    × parent of that seed, with ``init_from`` naming the parent (so the run id follows it), and
    ``ref_from`` the run of the stage ``st.ref`` names on the parent's line (``earlier``: the runs
    so far by id)."""
    assert st.parent is not None
    file = spec.file
    by_seed: dict[int, list[RunPlan]] = {}
    for par in parents:
        by_seed.setdefault(par.view["seed"], []).append(par)
    seeds: list[int | None] = list(spec_seeds) if spec_seeds is not None else [None]
    plans: list[RunPlan] = []
    for origin, point in points(st):
        raw = _point_config(base, point, seeds[0], file)
        # resolved once per point: init_from and seed are checked as given and nothing derives from them
        raw["init_from"] = st.parent.init_from(f"{spec.name}/{'0' * 12}")
        resolved = _resolve(raw, file, point)
        copy_resolved = _copier(resolved)
        for seed in seeds:
            own = resolved["seed"] if seed is None else seed
            want = st.parent.parent_seed(own)
            if want is None or want not in by_seed:
                why = f"maps no parent seed to seed {own}" if want is None else \
                    f"names seed {want} for seed {own}, but no run of stage {st.parent.stage!r} has it"
                raise ArmorLabError(f"{why} (that stage's seeds: {sorted(by_seed)})",
                                    key=f"stages[{index}].from.seeds", value=st.parent.seeds, file=file)
            for par in by_seed[want]:
                init = resolved["init_from"] | {"run": f"{spec.name}/{par.run_id}"}
                view = {**resolved, "seed": own, "init_from": init}
                if st.ref is not None:
                    view["ref_from"] = {"run": f"{spec.name}/{_on_line(par, st.ref.stage, earlier)}",
                                        "select": dict(st.ref.select)}
                if origin == "grid" and any(matches(view, ex) for ex in st.exclude):
                    continue
                rid = _run_id(view, file)
                if rid in seen:
                    continue
                seen.add(rid)
                full_point = dict(point) if seed is None else {**point, "seed": seed}
                plans.append(RunPlan(rid, point=full_point,
                                     make=_continuing(copy_resolved, own, init, view.get("ref_from")), view=view,
                                     stage=st.name, parent=par.run_id))
    return plans


def _on_line(plan: RunPlan, stage: str, earlier: dict[str, RunPlan]) -> str:
    """The run of ``stage`` that ``plan`` is, or continues from (in one or more steps)."""
    while plan.stage != stage:
        assert plan.parent is not None, "parse_stages admits only stages on the line"
        plan = earlier[plan.parent]
    return plan.run_id


def _continuing(copy_config: Callable[[], dict[str, Any]], seed: int, init: dict[str, Any],
                ref: dict[str, Any] | None = None) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        cfg = copy_config()
        cfg["seed"] = seed
        cfg["init_from"] = copy.deepcopy(init)
        if ref is not None:
            cfg["ref_from"] = copy.deepcopy(ref)
        return cfg

    return make


def _with_seed(copy_config: Callable[[], dict[str, Any]], seed: int) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        cfg = copy_config()
        cfg["seed"] = seed
        return cfg

    return make


# keys whose problems are files not (yet) on disk: model weights, data files, held-out sets, a
# reference checkpoint. A dry run reads the sbatch script before they are copied to the cluster.
_PATH_KEYS = re.compile(r"model(\.name)?|task\.path|eval_sets\.[^.]+\.path|ref_from(\..*)?")
_unchecked_paths: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("unchecked_paths", default=None)


def _not_on_disk_yet(problem: ArmorLabError) -> bool:
    """A path key whose file is not there (yet), or a model dir without its weights: a dry run may
    show it. A path that is there but wrong (a FIFO, a device, unreadable) stays an error."""
    if not (problem.key and _PATH_KEYS.fullmatch(problem.key)):
        return False
    value = problem.value
    return not isinstance(value, str) or not os.path.lexists(value) or "no weights" in str(problem)


@contextlib.contextmanager
def paths_unchecked() -> Iterator[list[str]]:
    """Within it, a point whose only problems are paths not on disk expands anyway (unfingerprinted,
    so its run id is provisional); the yielded list gets one warning per such problem (`sweep --dry-run`)."""
    warnings: list[str] = []
    token = _unchecked_paths.set(warnings)
    try:
        yield warnings
    finally:
        _unchecked_paths.reset(token)


def _resolve(raw: dict[str, Any], file: str, point: Mapping[str, Any] | None = None) -> dict[str, Any]:
    try:
        return resolve(raw, file=file)
    except ArmorLabError as exc:
        warnings = _unchecked_paths.get()
        if warnings is not None and all(_not_on_disk_yet(p) for p in exc.problems):
            for p in exc.problems:
                if str(p) not in warnings:
                    warnings.append(str(p))
            return resolve(raw, file=file, check_paths=False)
        if point:  # which of the spec's points: the file alone does not say
            where = ", ".join(f"{k}={v}" for k, v in point.items())
            raise combine([ArmorLabError(f"point {where}: {p.args[0].split(' [key ')[0]}", key=p.key,
                                         value=p.value, file=p.file) for p in exc.problems]) from None
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


def control_pairs(spec: SweepSpec, plans: list[RunPlan]) -> list[tuple[str | None, list[Pair]]]:
    """For each stage that declares ``controls:``, its compared pairs (armorlab.sweeps.controls.check;
    an arm that differs from its baseline outside its named factor is an ArmorLabError)."""
    out = []
    for st in spec.stage_list():
        if not st.controls:
            continue
        name = st.name if spec.stages is not None else None
        runs = [(describe_point({k: v for k, v in r.point.items() if k != "seed"}), r.view)
                for r in plans if r.stage == name]
        out.append((name, check(st.controls, runs, file=spec.file)))
    return out


def describe_run(plan: RunPlan) -> str:
    """A run's label for tables and the manifest: its point, and in a staged sweep its stage and
    the run it continues from (``continue: objective=armor seed=1 <- 3f2a...``)."""
    text = describe_point(plan.point)
    if plan.stage is None:
        return text
    return f"{plan.stage}: {text}" + (f" <- {plan.parent}" if plan.parent else "")


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
