"""A sweep's stages: each a grid of its own over the spec's base; a stage with ``from`` continues
from an earlier stage's runs (the ARMOR paper's continual protocol; spec.py expands them).

``from: {stage, select, seeds, optimizer, warmup}``: ``select``, ``optimizer`` and ``warmup`` are
init_from's (armorlab.core.config). A stage's ``ref_from`` sets π_ref apart from where its runs
start: ``model``, ``{checkpoint: <dir>}``, or ``{stage: <name>, select: ...}`` — the selection of
that stage's run on the continued run's own line (the stage it continues from or one before it,
which the run waits for already: Slurm ``afterok`` on the parent covers it)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from armorlab.core.checks import Invalid
from armorlab.core.config import FIELDS
from armorlab.errors import ArmorLabError
from armorlab.sweeps.controls import Controls, parse_controls
from armorlab.sweeps.parsing import (
    NAME_RE,
    check_seed_keys,
    parse_base,
    parse_grid,
    parse_points,
    parse_seeds,
)

STAGE_KEYS = ("name", "description", "base", "grid", "seeds", "include", "exclude", "from", "controls", "ref_from")
FROM_KEYS = ("stage", "select", "seeds", "optimizer", "warmup")
INIT_KEYS = ("optimizer", "warmup")  # `from:` keys passed to init_from as given


@dataclass(frozen=True)
class StageFrom:
    """Where a stage's runs start: the ``stage`` whose runs they continue from, the selection
    rule (init_from's ``select``) and the seed mapping: "same", one seed, or {child: parent}."""
    stage: str
    select: dict[str, Any]
    seeds: str | int | dict[int, int] = "same"
    init: dict[str, Any] = field(default_factory=dict)  # init_from's optimizer and warmup, as checked

    def init_from(self, run: str) -> dict[str, Any]:
        """The init_from of a run continuing from ``run`` ("<sweep>/<run-id>")."""
        return {"run": run, "select": dict(self.select), **self.init}

    def parent_seed(self, seed: int) -> int | None:
        if self.seeds == "same":
            return seed
        if isinstance(self.seeds, int):
            return self.seeds
        return self.seeds.get(seed)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "select": dict(self.select), "seeds": copy.deepcopy(self.seeds),
                **copy.deepcopy(self.init)}


@dataclass(frozen=True)
class RefFrom:
    """A stage's π_ref from an earlier stage's selection (``ref_from: {stage, select}``)."""
    stage: str
    select: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "select": dict(self.select)}


@dataclass(frozen=True)
class Stage:
    """One stage of a sweep: its own grid over the spec's base merged with the stage's."""
    name: str
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int] | None
    include: list[dict[str, Any]]
    exclude: list[dict[str, Any]]
    parent: StageFrom | None = None
    controls: list[Controls] = field(default_factory=list)
    description: str | None = None
    ref: RefFrom | None = None  # π_ref from an earlier stage's selection (its runs' ref_from)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            out["description"] = self.description
        for key in ("base", "grid", "seeds", "include", "exclude"):
            value = getattr(self, key)
            if value not in (None, [], {}):
                out[key] = copy.deepcopy(value)
        if self.parent is not None:
            out["from"] = self.parent.to_dict()
        if self.controls:
            out["controls"] = [c.to_dict() for c in self.controls]
        if self.ref is not None:
            out["ref_from"] = self.ref.to_dict()
        return out


def parse_stages(raw: Any, seeds: list[int] | None, path: Path | None, file: str) -> list[Stage]:
    if not isinstance(raw, list) or not raw:
        raise ArmorLabError("must be a non-empty list of stages ({name: ..., grid/include: ..., from: ...})",
                            key="stages", value=raw, file=file)
    stages: list[Stage] = []
    for i, entry in enumerate(raw):
        where = f"stages[{i}]"
        if not isinstance(entry, Mapping):
            raise ArmorLabError("each stage must be a mapping", key=where, value=entry, file=file)
        for key in entry:
            if key not in STAGE_KEYS:
                raise ArmorLabError(f"unknown stage key (known: {', '.join(STAGE_KEYS)})", key=f"{where}.{key}",
                                    value=entry[key], file=file)
        name = entry.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ArmorLabError("a stage needs a name of 1-100 characters from letters, digits, '_', '.', '-'",
                                key=f"{where}.name", value=name, file=file)
        if any(st.name == name for st in stages):
            raise ArmorLabError("stage names must be unique", key=f"{where}.name", value=name, file=file)
        description = entry.get("description")
        if description is not None and not isinstance(description, str):
            raise ArmorLabError("must be a string", key=f"{where}.description", value=description, file=file)
        base = parse_base(entry.get("base"), path, file, where=f"{where}.base")
        grid = parse_grid(entry.get("grid"), file, where=f"{where}.grid")
        stage_seeds = parse_seeds(entry.get("seeds"), file, where=f"{where}.seeds")
        include = parse_points(entry.get("include"), f"{where}.include", file, allow_empty=True)
        exclude = parse_points(entry.get("exclude"), f"{where}.exclude", file, allow_empty=False)
        check_seed_keys(stage_seeds if stage_seeds is not None else seeds, grid, include, f"{where}.", file)
        if "init_from" in base or "init_from" in grid or any("init_from" in p for p in include):
            raise ArmorLabError("a stage sets init_from through `from:`", key=f"{where}.init_from", value="...",
                                file=file)
        parent = _parse_from(entry.get("from"), stages, where, file)
        ref = None
        if "ref_from" in entry:
            ref, fixed = _parse_ref_from(entry["ref_from"], parent, stages, where, file)
            if fixed is not None:  # model or a checkpoint: a config value like any other
                base = {**base, "ref_from": fixed}
        stages.append(Stage(name, base, grid, stage_seeds, include, exclude, parent,
                            parse_controls(entry.get("controls"), f"{where}.controls", file), description, ref))
    return stages


def _parse_ref_from(raw: Any, parent: StageFrom | None, earlier: list[Stage], where: str,
                    file: str) -> tuple[RefFrom | None, Any]:
    """(an earlier stage's selection, or the config value ``model`` / ``{checkpoint: <dir>}``)."""
    where = f"{where}.ref_from"
    if not (isinstance(raw, Mapping) and "stage" in raw):
        try:
            FIELDS["ref_from"].check(raw)
        except Invalid as exc:
            raise ArmorLabError(f"{exc}; or {{stage: <earlier stage>, select: ...}}", key=where, value=raw,
                                file=file) from None
        return None, raw
    extra = sorted(set(map(str, raw)) - {"stage", "select"})
    if extra:
        raise ArmorLabError("unknown key (known: stage, select)", key=f"{where}.{extra[0]}", value=raw[extra[0]],
                            file=file)
    # the runs wait for their parent, and it for its own: π_ref from any stage on that line is there
    line, by_name = [], {st.name: st for st in earlier}
    name = parent.stage if parent is not None else None
    while name is not None:
        line.append(name)
        up = by_name[name].parent
        name = up.stage if up is not None else None
    if raw["stage"] not in line:
        names = [st.name for st in earlier]
        raise ArmorLabError(f"must name the stage this one continues from (`from:`) or one it continues from in "
                            f"turn (here: {', '.join(line) or 'none, as this stage has no from:'}; stages: "
                            f"{', '.join(names) or 'none'})", key=f"{where}.stage", value=raw["stage"], file=file)
    try:
        select = FIELDS["ref_from"].check({"run": "x/000000000000", "select": raw.get("select")})["select"]
    except Invalid as exc:
        raise ArmorLabError(str(exc), key=f"{where}.select", value=raw.get("select"), file=file) from None
    return RefFrom(raw["stage"], select), None


def _parse_from(raw: Any, earlier: list[Stage], where: str, file: str) -> StageFrom | None:
    if raw is None:
        return None
    where = f"{where}.from"
    if not isinstance(raw, Mapping):
        raise ArmorLabError("must be a mapping {stage: <earlier stage>, select: {metric, mode}, seeds: same}",
                            key=where, value=raw, file=file)
    for key in raw:
        if key not in FROM_KEYS:
            raise ArmorLabError(f"unknown key (known: {', '.join(FROM_KEYS)})", key=f"{where}.{key}", value=raw[key],
                                file=file)
    stage = raw.get("stage")
    names = [st.name for st in earlier]
    if stage not in names:
        raise ArmorLabError(f"must name an earlier stage (earlier: {', '.join(names) or 'none'})",
                            key=f"{where}.stage", value=stage, file=file)
    try:
        select = FIELDS["init_from"].check({"run": "x/000000000000", "select": raw.get("select")})["select"]
    except Invalid as exc:
        raise ArmorLabError(str(exc), key=f"{where}.select", value=raw.get("select"), file=file) from None
    given = {k: raw[k] for k in INIT_KEYS if k in raw}
    try:
        init = FIELDS["init_from"].check({"run": "x/000000000000", **given})
    except Invalid as exc:
        bad = next((k for k in INIT_KEYS if k in str(exc)), "optimizer")
        raise ArmorLabError(str(exc), key=f"{where}.{bad}", value=raw.get(bad), file=file) from None
    init = {k: init[k] for k in INIT_KEYS if k in init}
    seeds = raw.get("seeds", "same")
    ok = seeds == "same" or _is_seed(seeds) or (
        isinstance(seeds, Mapping) and seeds and all(_is_seed(k) and _is_seed(v) for k, v in seeds.items()))
    if not ok:
        raise ArmorLabError("must be `same`, a seed, or a mapping {child seed: parent seed}", key=f"{where}.seeds",
                            value=seeds, file=file)
    return StageFrom(stage, select, dict(seeds) if isinstance(seeds, Mapping) else seeds, init)


def _is_seed(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
