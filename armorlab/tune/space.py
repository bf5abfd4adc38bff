"""The ``search:`` section of a study spec: parsed, validated, and turned into run configs.

Optuna-free at import time (the spec is checked by ``armorlab tune --status`` and by tests that
must stay cheap); the distributions are built lazily from the validated ``ParamSpec``.

A study spec is a sweep spec (name, base, seeds, profile) plus::
    search:
      space:      {<config key, dotted ok>: {type: float|int|categorical, low, high, log, step, choices}}
      objective:  {metric: val/acc, summary: auc|final|peak|test-at-val-best}   # or a list of them
      direction:  maximize | minimize | [one per objective]
      sampler:    {type: tpe|gp|cmaes|random|grid|bruteforce, seed: 0, ...}
      pruner:     {type: none|median|hyperband|collapse, ...}
      n_trials:   40
      max_retries: 2       # re-runs of a trial whose worker died or whose trainer crashed
      storage:    null     # journal file in the study dir; or an RDB URL
      heartbeat:  {interval: 60, grace: 180}   # RDB storage: seconds between beats; silence that fails a trial
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from armorlab.core import config as cfgmod
from armorlab.core.checks import Invalid, count_text, did_you_mean, within_max_points
from armorlab.errors import ArmorLabError
from armorlab.tune.secrets import redact_value

PARAM_TYPES = ("float", "int", "categorical")
SUMMARIES = ("auc", "final", "peak", "test-at-val-best")
DIRECTIONS = ("maximize", "minimize")
SEARCH_KEYS = ("space", "objective", "direction", "sampler", "pruner", "n_trials", "max_retries", "storage",
               "heartbeat")
HEARTBEAT_DEFAULT = {"interval": 60, "grace": 180}

# Options each sampler/pruner type accepts besides `type`, with their checks. Anything else is an
# error naming the key: a typo in `n_startup_trials` must not silently fall back to a default.
_SEED = ("seed", "int≥0")
SAMPLER_OPTIONS: dict[str, dict[str, str]] = {
    "tpe": dict([_SEED, ("n_startup_trials", "int≥0"), ("multivariate", "bool"), ("constant_liar", "bool")]),
    "gp": dict([_SEED, ("n_startup_trials", "int≥0")]),
    "cmaes": dict([_SEED, ("n_startup_trials", "int≥0"), ("sigma0", "float>0")]),
    "random": dict([_SEED]),
    "grid": dict([_SEED]),
    "bruteforce": dict([_SEED]),
}
PRUNER_OPTIONS: dict[str, dict[str, str]] = {
    "none": {},
    "median": {"warmup_steps": "int≥0", "n_startup_trials": "int≥0", "n_min_trials": "int≥1",
               "interval_steps": "int≥1"},
    "hyperband": {"min_resource": "int≥1", "max_resource": "int≥1", "reduction_factor": "int≥2"},
    "collapse": {"delta": "float>0", "patience": "int≥1", "alpha": "float(0,1)", "warmup_steps": "int≥0"},
}
EXHAUSTIVE_SAMPLERS = ("grid", "bruteforce")
# Keys the search cannot own: the run directory decides these, and seeds come from `seeds:`.
RESERVED_KEYS = frozenset(cfgmod.MANAGED_KEYS | {"seed"})


@dataclass(frozen=True)
class ParamSpec:
    """One searched config key. ``name`` is the config key (``task.digits`` style dotted ok)."""

    name: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def distribution(self) -> Any:
        """The matching ``optuna.distributions`` object (imports optuna)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.type == "categorical":
            return CategoricalDistribution(list(self.choices))
        if self.type == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def suggest(self, trial: Any) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log,
                                     step=int(self.step or 1))
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log, step=self.step)

    def boundary_values(self) -> list[Any]:
        """The values that bound what a sampler can produce: checked against the config up front."""
        if self.type == "categorical":
            return list(self.choices)
        return [self.low, self.high] if self.low != self.high else [self.low]

    def n_values(self) -> int | None:
        """How many values ``grid_values`` lists, counted without listing them; None when infinite."""
        if self.type == "categorical":
            return len(self.choices)
        if self.type == "int":
            return (int(self.high) - int(self.low)) // int(self.step or 1) + 1
        if self.step is None:
            return None
        q = (self.high - self.low) / self.step  # inf for a denormal step: cap, it is refused anyway
        return int(math.floor(min(q, 1e18) + 1e-9)) + 1

    def grid_values(self) -> list[Any] | None:
        """Every value of a finite space (categorical, int, stepped float); None when infinite.
        Refuses (before listing) more than ``checks.max_points()`` values."""
        n = self.n_values()
        if n is not None:
            within_max_points(n, f"search.space.{self.name}")
        if self.type == "categorical":
            return list(self.choices)
        if self.type == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step is None:
            return None
        n = int(math.floor((self.high - self.low) / self.step + 1e-9))
        return [round(self.low + i * self.step, 12) for i in range(n + 1)]


@dataclass(frozen=True)
class ObjectiveSpec:
    """What a trial is scored on: a summary of one metric's curve over the run."""

    metric: str
    summary: str
    report: str | None = None  # test-at-val-best: the metric read at the best `metric` step

    @property
    def label(self) -> str:
        if self.summary == "test-at-val-best":
            return f"{self.report}@best({self.metric})"
        return f"{self.summary}({self.metric})"


@dataclass(frozen=True)
class SearchSpec:
    space: dict[str, ParamSpec]
    objectives: tuple[ObjectiveSpec, ...]
    directions: tuple[str, ...]
    sampler: dict[str, Any]
    pruner: dict[str, Any]
    n_trials: int
    max_retries: int = 2
    storage: str | None = None
    heartbeat_interval: int = HEARTBEAT_DEFAULT["interval"]
    heartbeat_grace: int = HEARTBEAT_DEFAULT["grace"]
    file: str | None = field(default=None, compare=False)

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    def grid(self) -> dict[str, list[Any]] | None:
        """The search space as lists (for grid/bruteforce); None when a dimension is continuous."""
        out = {}
        for name, p in self.space.items():
            values = p.grid_values()
            if values is None:
                return None
            out[name] = values
        return out


# --------------------------------------------------------------------------- small checks
def _err(msg: str, key: str, value: Any, file: str | None) -> ArmorLabError:
    return ArmorLabError(msg, key=key, value=value, file=file)


def _number(v: Any, key: str, file: str | None) -> float | int:
    # YAML reads "1e-6" (no dot) as a string; accept it, as users write learning rates that way.
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise _err("must be a number", key, v, file) from None
    try:
        finite = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    except OverflowError:  # an int with hundreds of digits
        finite = False
    if not finite:
        raise _err("must be a finite number", key, v, file)
    return v


def _option(kind: str, v: Any, key: str, file: str | None) -> Any:
    if kind == "bool":
        if not isinstance(v, bool):
            raise _err("must be true or false", key, v, file)
        return v
    if kind.startswith("int"):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _err("must be an integer", key, v, file)
        lo = int(kind[len("int≥"):])
        if v < lo:
            raise _err(f"must be ≥ {lo}", key, v, file)
        return v
    v = _number(v, key, file)
    if v <= 0:
        raise _err("must be > 0", key, v, file)
    if kind == "float(0,1)" and v >= 1:
        raise _err("must be < 1", key, v, file)
    return float(v)


def _mapping(v: Any, key: str, file: str | None) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise _err("must be a mapping", key, v, file)
    return v


def _typed_section(raw: Any, key: str, options: Mapping[str, Mapping[str, str]], file: str | None,
                   default_type: str) -> dict[str, Any]:
    """``{type: X, **opts}`` (or just ``X``) checked against the options table of its type."""
    if raw is None:
        raw = {"type": default_type}
    if isinstance(raw, str):
        raw = {"type": raw}
    raw = _mapping(raw, key, file)
    kind = raw.get("type", default_type)
    if kind not in options:
        raise _err(f"unknown type (known: {', '.join(options)})", f"{key}.type", kind, file)
    out: dict[str, Any] = {"type": kind}
    for opt, value in raw.items():
        if opt == "type":
            continue
        if opt not in options[kind]:
            known = ", ".join(options[kind]) or "none"
            raise _err(f"unknown option for {key} type '{kind}' (known: {known})", f"{key}.{opt}", value, file)
        out[opt] = _option(options[kind][opt], value, f"{key}.{opt}", file)
    return out


# --------------------------------------------------------------------------- the space
def _parse_param(name: str, raw: Any, file: str | None) -> ParamSpec:
    key = f"search.space.{name}"
    if isinstance(raw, list):  # short form: a plain list means categorical choices
        raw = {"type": "categorical", "choices": raw}
    raw = _mapping(raw, key, file)
    kind = raw.get("type")
    if kind not in PARAM_TYPES:
        raise _err(f"type must be one of {', '.join(PARAM_TYPES)}", f"{key}.type", kind, file)
    allowed = {"categorical": {"type", "choices"},
               "int": {"type", "low", "high", "log", "step"},
               "float": {"type", "low", "high", "log", "step"}}[kind]
    for opt in raw:
        if opt not in allowed:
            raise _err(f"unknown key for a {kind} parameter (known: {', '.join(sorted(allowed))})",
                       f"{key}.{opt}", raw[opt], file)
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _err("choices must be a non-empty list", f"{key}.choices", choices, file)
        for c in choices:
            if not (c is None or isinstance(c, (bool, int, float, str))):
                raise _err("choices must be scalars (null, bool, number, string)", f"{key}.choices", c, file)
        if len({repr(c) for c in choices}) != len(choices):
            raise _err("choices must be distinct", f"{key}.choices", choices, file)
        return ParamSpec(name, kind, choices=tuple(choices))
    for opt in ("low", "high"):
        if opt not in raw:
            raise _err(f"a {kind} parameter needs '{opt}'", f"{key}.{opt}", None, file)
    low, high = _number(raw["low"], f"{key}.low", file), _number(raw["high"], f"{key}.high", file)
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise _err("must be true or false", f"{key}.log", log, file)
    step = raw.get("step")
    if kind == "int":
        for opt, v in (("low", low), ("high", high), ("step", step)):
            if v is not None and not float(v).is_integer():
                raise _err("must be an integer for an int parameter", f"{key}.{opt}", v, file)
        low, high = int(low), int(high)
        step = None if step is None else int(step)
    if low > high:
        raise _err(f"low must be ≤ high (high is {high})", f"{key}.low", low, file)
    if log and low <= 0:
        raise _err("log scale needs low > 0", f"{key}.low", low, file)
    if step is not None:
        step = _number(step, f"{key}.step", file)
        if step <= 0:
            raise _err("step must be > 0", f"{key}.step", step, file)
        if log and (kind == "float" or step != 1):
            raise _err("step cannot be combined with log: true", f"{key}.step", step, file)
        span = (high - low) / step
        if not math.isfinite(span):
            raise _err("step is too small for this range", f"{key}.step", step, file)
        if abs(span - round(span)) > 1e-9:
            raise _err(f"high - low must be a multiple of step ({low}..{high})", f"{key}.step", step, file)
    return ParamSpec(name, kind, low=low, high=high, log=log, step=step)


def _check_param_key(name: str, file: str | None) -> None:
    key = f"search.space.{name}"
    if not isinstance(name, str) or not name or any(not part for part in name.split(".")):
        raise _err("malformed config key", key, name, file)
    top = name.split(".")[0]
    if name in RESERVED_KEYS:
        hint = "list seeds under `seeds:`" if name == "seed" else "the run directory sets it"
        raise _err(f"cannot be searched ({hint})", key, name, file)
    if top not in cfgmod.known_keys():
        raise _err("unknown config key (not an armorlab field nor a GRPOConfig field)", key, name, file)
    if "." in name and top not in ("task", "model"):
        raise _err("only task.* and model.* keys may be dotted", key, name, file)


# --------------------------------------------------------------------------- objectives
def _parse_objective(raw: Any, i: int | None, file: str | None) -> ObjectiveSpec:
    key = "search.objective" + (f"[{i}]" if i is not None else "")
    raw = _mapping(raw, key, file)
    for opt in raw:
        if opt not in ("metric", "summary", "report"):
            raise _err("unknown key (known: metric, summary, report)", f"{key}.{opt}", raw[opt], file)
    metric = raw.get("metric")
    if not isinstance(metric, str) or "/" not in metric:
        raise _err("metric must be a namespaced metric name such as val/acc", f"{key}.metric", metric, file)
    summary = raw.get("summary", "auc")
    if summary not in SUMMARIES:
        raise _err(f"summary must be one of {', '.join(SUMMARIES)}", f"{key}.summary", summary, file)
    report = raw.get("report")
    if summary == "test-at-val-best":
        if not metric.startswith("val/") and report is None:
            raise _err("test-at-val-best selects on a val/ metric (or give `report:`)", f"{key}.metric",
                       metric, file)
        report = report or "test/" + metric.split("/", 1)[1]
        if not isinstance(report, str) or "/" not in report:
            raise _err("report must be a namespaced metric name such as test/acc", f"{key}.report", report, file)
    elif report is not None:
        raise _err("report is only used with summary test-at-val-best", f"{key}.report", report, file)
    return ObjectiveSpec(metric, summary, report)


def _parse_directions(raw: Any, n: int, file: str | None) -> tuple[str, ...]:
    if raw is None:
        raw = "maximize"
    if isinstance(raw, str):
        raw = [raw] * n
    if not isinstance(raw, list) or len(raw) != n:
        raise _err(f"must be maximize/minimize or a list of {n} of them (one per objective)",
                   "search.direction", raw, file)
    for d in raw:
        if d not in DIRECTIONS:
            raise _err("must be maximize or minimize", "search.direction", d, file)
    return tuple(raw)


# --------------------------------------------------------------------------- configs
def trial_config(base: Mapping[str, Any], params: Mapping[str, Any], seed: int, *,
                 file: str | None = None) -> dict[str, Any]:
    """Fully resolved run config of one trial seed: base ⊕ params (dotted keys) ⊕ seed."""
    raw = copy.deepcopy(dict(base))
    for key, value in params.items():
        cfgmod.set_dotted(raw, key, value, file=file)
    raw["seed"] = seed
    return cfgmod.resolve(raw, file=file)


def _check_points_resolve(space: Mapping[str, ParamSpec], base: Mapping[str, Any], file: str | None) -> None:
    """Every value a sampler can produce, one parameter at a time, must give a valid run config."""
    anchor = {name: p.boundary_values()[0] for name, p in space.items()}
    for name, p in space.items():
        for value in p.boundary_values():
            point = {**anchor, name: value}
            try:
                trial_config(base, point, 0, file=file)
            except ArmorLabError as exc:
                raise _err(f"this value does not give a valid run config: {exc}", f"search.space.{name}",
                           value, file) from None


def parse_search(raw: Any, base: Mapping[str, Any], *, file: str | None = None) -> SearchSpec:
    """Validate a raw ``search:`` mapping against the spec's ``base`` config."""
    raw = _mapping(raw, "search", file)
    for key in raw:
        if key not in SEARCH_KEYS:
            raise _err(f"unknown key{did_you_mean(key, SEARCH_KEYS)} (known: {', '.join(SEARCH_KEYS)})",
                       f"search.{key}", raw[key], file)
    space_raw = _mapping(raw.get("space"), "search.space", file)
    if not space_raw:
        raise _err("the search space is empty", "search.space", space_raw, file)
    space: dict[str, ParamSpec] = {}
    for name, praw in space_raw.items():
        _check_param_key(name, file)
        space[name] = _parse_param(name, praw, file)
    _check_points_resolve(space, base, file)

    obj_raw = raw.get("objective", {"metric": cfgmod.DEFAULT_SELECT["metric"], "summary": "auc"})
    if isinstance(obj_raw, list):
        if not obj_raw:
            raise _err("objective list is empty", "search.objective", obj_raw, file)
        objectives = tuple(_parse_objective(o, i, file) for i, o in enumerate(obj_raw))
    else:
        objectives = (_parse_objective(obj_raw, None, file),)
    directions = _parse_directions(raw.get("direction"), len(objectives), file)

    sampler = _typed_section(raw.get("sampler"), "search.sampler", SAMPLER_OPTIONS, file, "tpe")
    pruner = _typed_section(raw.get("pruner"), "search.pruner", PRUNER_OPTIONS, file, "none")
    if len(objectives) > 1 and pruner["type"] != "none":
        raise _err("pruning needs a single objective (Optuna cannot prune multi-objective trials)",
                   "search.pruner.type", pruner["type"], file)
    if len(objectives) > 1 and sampler["type"] == "cmaes":
        raise _err("cmaes handles a single objective only", "search.sampler.type", "cmaes", file)
    grid_size = None
    if sampler["type"] in EXHAUSTIVE_SAMPLERS or sampler["type"] == "cmaes":
        sizes = {n: p.n_values() for n, p in space.items()}
        if sampler["type"] in EXHAUSTIVE_SAMPLERS:
            for name, size in sizes.items():
                if size is None:
                    raise _err(f"{sampler['type']} needs a finite space: give this float a step",
                               f"search.space.{name}", space_raw[name], file)
            grid_size = math.prod(sizes.values())
            try:  # the sampler lists every point: count them first
                within_max_points(grid_size, f"the {sampler['type']} sampler's space")
            except Invalid as exc:
                raise _err(str(exc), "search.space", {n: f"{count_text(s)} values" for n, s in sizes.items()},
                           file) from None
        elif all(p.type == "categorical" for p in space.values()):
            raise _err("cmaes needs at least one float or int parameter", "search.sampler.type", "cmaes", file)

    n_trials = raw.get("n_trials", grid_size)
    if n_trials is None:
        raise _err("required (only grid and bruteforce default it to the number of grid points)",
                   "search.n_trials", None, file)
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise _err("must be a positive integer", "search.n_trials", n_trials, file)
    if grid_size is not None and n_trials > grid_size:
        raise _err(f"{sampler['type']} has only {grid_size} points", "search.n_trials", n_trials, file)
    max_retries = raw.get("max_retries", 2)
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise _err("must be an integer ≥ 0", "search.max_retries", max_retries, file)
    storage = raw.get("storage")
    if storage is not None and (not isinstance(storage, str) or "://" not in storage):
        raise _err("must be null (journal file in the study dir) or a database URL such as "
                   "postgresql://host/db or sqlite:///path.db", "search.storage",
                   redact_value(storage), file)
    beat = _heartbeat(raw.get("heartbeat"), file)
    return SearchSpec(space=space, objectives=objectives, directions=directions, sampler=sampler,
                      pruner=pruner, n_trials=n_trials, max_retries=max_retries, storage=storage,
                      heartbeat_interval=beat["interval"], heartbeat_grace=beat["grace"], file=file)


def _heartbeat(raw: Any, file: str | None) -> dict[str, int]:
    """``search.heartbeat``: Optuna's RDB heartbeat period and the silence after which a RUNNING
    trial is failed and re-queued. The grace must cover a few missed beats (a busy node, a
    database restart), else a live worker's trial would be run twice."""
    beat = dict(HEARTBEAT_DEFAULT)
    for key, value in _mapping(raw if raw is not None else {}, "search.heartbeat", file).items():
        if key not in beat:
            raise _err(f"unknown key (known: {', '.join(beat)})", f"search.heartbeat.{key}", value, file)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _err("must be a whole number of seconds ≥ 1", f"search.heartbeat.{key}", value, file)
        beat[key] = value
    if beat["grace"] < 2 * beat["interval"]:
        raise _err(f"must be at least twice the interval ({beat['interval']} s), so one late beat "
                   "does not fail a live trial", "search.heartbeat.grace", beat["grace"], file)
    return beat


def suggest_params(trial: Any, search: SearchSpec) -> dict[str, Any]:
    """Ask the trial for every parameter of the space (define-by-run, in spec order)."""
    return {name: p.suggest(trial) for name, p in search.space.items()}
