"""A sweep run until resolved, on disk and in seeds: its ``looks.json`` (the design, every look,
the chain record; written atomically, strict JSON) and the seeds each look runs — the spec's, then
the next after its largest — with the parent seeds a stage continuing from another needs
(armorlab.sweeps.until_resolved runs the looks)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from armorlab.core.fsutil import SMALL_FILE_BYTES, atomic_write_json, read_regular_text
from armorlab.errors import ArmorLabError
from armorlab.stats.sequential import Design, looks_record, read_looks_record
from armorlab.sweeps.manifest import LOOKS
from armorlab.sweeps.spec import SweepSpec


# --------------------------------------------------------------------------- looks.json
def read_looks(sweep_dir: Path) -> tuple[Design | None, list[dict[str, Any]], dict[str, Any]]:
    """The design, looks and chain record of a sweep dir's looks.json (None, [], {} without one)."""
    path = Path(sweep_dir) / LOOKS
    if not path.exists():
        return None, [], {}
    try:
        data = json.loads(read_regular_text(path, limit=SMALL_FILE_BYTES))
    except (OSError, ValueError) as exc:
        raise ArmorLabError(f"unreadable looks.json: {exc}", file=str(path)) from None
    design, looks = read_looks_record(data, file=str(path))
    chain = data.get("chain") if isinstance(data.get("chain"), dict) else {}
    return design, looks, chain


def _plain(v: Any) -> Any:
    """NaN and infinities as null: looks.json is strict JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def write_looks(sweep_dir: Path, design: Design, looks: Sequence[Mapping[str, Any]], chain: Mapping[str, Any]) -> None:
    record = {**looks_record(design, looks), "chain": dict(chain)}
    atomic_write_json(Path(sweep_dir) / LOOKS, _plain(record))


# --------------------------------------------------------------------------- the plan
def extended_seeds(seeds: Sequence[int], n: int) -> list[int]:
    """The first ``n`` seeds of the looks: the spec's, then the next after its largest."""
    out = list(seeds)
    nxt = max(out) + 1
    while len(out) < n:
        out.append(nxt)
        nxt += 1
    return out[:max(n, len(seeds))]


def extend_spec(spec: SweepSpec, stage: str, n: int) -> tuple[SweepSpec, list[int], int]:
    """The spec with the compared stage's seeds extended to ``n`` and every stage it continues
    from given the parent seeds those need; returns it, the compared stage's seed list and how
    many of those the spec gives (the first look's)."""
    stages = spec.stage_list()
    by_name = {st.name: st for st in stages}

    def seeds_of(name: str) -> list[int] | None:
        st = by_name[name]
        return st.seeds if st.seeds is not None else spec.seeds

    first = seeds_of(stage)
    if first is None:
        raise ArmorLabError("--until-resolved starts from the spec's seeds (the first look's): add e.g. "
                            "`seeds: [0, 1, 2]`", key="seeds", value=None, file=spec.file)
    seeds = {stage: extended_seeds(first, n)}
    st = by_name[stage]
    while st.parent is not None:
        want = []
        for s in seeds[st.name]:
            p = st.parent.parent_seed(s)
            if p is None:
                raise ArmorLabError(f"--until-resolved adds seed {s} to stage {st.name!r}, but `from.seeds` maps no "
                                    "parent seed to it: use `same` or one seed, or map every seed up to "
                                    "--max-seeds", key=f"stages.{st.name}.from.seeds", value=st.parent.seeds,
                                    file=spec.file)
            want.append(p)
        have = seeds_of(st.parent.stage) or []
        seeds[st.parent.stage] = list(have) + sorted(set(want) - set(have))
        st = by_name[st.parent.stage]
    if spec.stages is None:
        return dataclasses.replace(spec, seeds=seeds[stage]), seeds[stage], len(first)
    new = [dataclasses.replace(s, seeds=seeds[s.name]) if s.name in seeds else s for s in spec.stages]
    return dataclasses.replace(spec, stages=new), seeds[stage], len(first)
