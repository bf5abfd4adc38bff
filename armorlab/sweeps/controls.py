"""Controls that differ in one thing: a sweep (or one of its stages) declares which arm is the
baseline and, for every other arm, the factor it changes; expansion then checks that each arm's
resolved config differs from the baseline's in the factor's keys and nowhere else.

```yaml
controls:
  baseline: {objective: armor, anchor_gate: true}      # selects exactly one arm
  arms:
    - {name: gate only, select: {objective: dapo, anchor_gate: true}, factor: [objective, anchor]}
    - {name: no gate, select: {anchor_gate: false}, factor: [anchor_gate]}
```
An *arm* is a distinct resolved config once the seed and ``init_from`` (the run a later stage
continues from) are set aside. Selectors compare resolved values (as ``exclude:`` does); factor
keys are config keys (``task.digits`` for a section's key). Several groups (a list under
``controls:``) may share a stage, e.g. one per baseline; then every arm of the stage is a baseline
or an arm of one group. Differences that follow from the factor are shown but not counted: a key
the config resolves to null because it is inert in one arm (``config.INERT_KEYS``: ``alpha``
outside ARMOR, the anchor options without anchors, ``kl_estimator`` at β = 0, ...).

``armorlab sweep --dry-run`` prints every pair with the keys in which the two arms differ; a pair
that differs in a key outside its factor — or not in its factor at all — is an error naming the
arm, the keys and the file.

Two arms that filter groups differently can train on different effective batches (ARMOR's
anchors give an all-wrong group reward spread, so it keeps groups DAPO drops), a confound that
no key names. Each pair is also compared on its effective batch: from the configs
(``configured_batch``: rows per step, the groups each drops, how far each refills) and, once runs
of both arms have finished, from their measured ``train/refill_shortfall``
(``armorlab.stats.effective_batch``, the report's rule and tolerance). A difference is a warning.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from armorlab.core.config import INERT_KEYS, LOGGING_KEYS, default_anchor_cache, get_dotted, known_keys
from armorlab.core.runs import RunDir, canonical_json
from armorlab.errors import ArmorLabError
from armorlab.stats.effective_batch import EFFECTIVE_BATCH_TOLERANCE, effective_batch_gap

CONTROLS_KEYS = ("baseline", "arms")
ARM_KEYS = ("name", "select", "factor")
# what sets runs of one arm apart without being the arm: its seed, the run it continues from
NOT_THE_ARM = frozenset({"seed", "init_from"})
_MISSING = object()


@dataclass(frozen=True)
class Arm:
    select: dict[str, Any]
    factor: tuple[str, ...]
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name} if self.name is not None else {}
        return {**out, "select": copy.deepcopy(self.select), "factor": list(self.factor)}


@dataclass(frozen=True)
class Controls:
    baseline: dict[str, Any]
    arms: tuple[Arm, ...]
    where: str = "controls"

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": copy.deepcopy(self.baseline), "arms": [a.to_dict() for a in self.arms]}


@dataclass
class Pair:
    """One compared pair: the baseline and an arm, the keys they differ in (key → (baseline's,
    arm's)), which of those follow the factor (inert in one arm), and what the check found."""
    group: str
    baseline: str
    arm: str
    factor: tuple[str, ...]
    differs: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    follows: list[str] = field(default_factory=list)
    keys: tuple[str, str] = ("", "")   # (baseline's, arm's) ``arm_key``: which runs belong to each side
    batch_note: str | None = None       # the configured effective batches differ (``configured_batch_note``)

    @property
    def counted(self) -> list[str]:
        return [k for k in self.differs if k not in self.follows]

    @property
    def extra(self) -> list[str]:
        return [k for k in self.counted if k not in self.factor]

    @property
    def missing(self) -> list[str]:
        return [k for k in self.factor if k not in self.differs]

    def describe(self) -> str:
        shown = ", ".join(f"{k} {_text(a)} -> {_text(b)}" for k, (a, b) in self.differs.items()
                          if k not in self.follows) or "nothing"
        text = f"{self.arm} [factor: {', '.join(self.factor)}]: {shown}"
        if self.follows:
            text += f"; inert in one arm: {', '.join(self.follows)}"
        return text


# --------------------------------------------------------------------------- selectors
def matches(cfg: Mapping[str, Any], selector: Mapping[str, Any]) -> bool:
    """True when every key of the selector (dotted keys allowed) equals the resolved config's value;
    ``null`` also selects a key the resolved config leaves out (a null default is dropped from it)."""
    for key, want in selector.items():
        have = get_dotted(cfg, key, _MISSING)
        if have is _MISSING and want is None:
            continue
        if key in ("task", "model") and isinstance(want, str) and isinstance(have, Mapping):
            have = have.get("name")  # `task: arithmetic` is the short form of {name: arithmetic}
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            if not matches(have, want):
                return False
        elif have is _MISSING or not same(have, want):
            return False
    return True


def same(a: Any, b: Any) -> bool:
    # bool is an int in Python: `anchor: 1` must not match `anchor: true`
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


# --------------------------------------------------------------------------- parsing
def parse_controls(raw: Any, where: str, file: str) -> list[Controls]:
    """``controls:`` (one group or a list of groups) → Controls; unknown keys are errors."""
    if raw is None:
        return []
    groups = raw if isinstance(raw, list) else [raw]
    out = []
    for i, group in enumerate(groups):
        here = f"{where}[{i}]" if isinstance(raw, list) else where
        if not isinstance(group, Mapping):
            raise ArmorLabError("must be a mapping {baseline: <selector>, arms: [...]}", key=here, value=group,
                                file=file)
        _known(group, CONTROLS_KEYS, here, file)
        baseline = _selector(group.get("baseline"), f"{here}.baseline", file)
        arms_raw = group.get("arms")
        if not isinstance(arms_raw, list) or not arms_raw:
            raise ArmorLabError("must be a non-empty list of {name, select, factor}", key=f"{here}.arms",
                                value=arms_raw, file=file)
        arms = []
        for j, arm in enumerate(arms_raw):
            at = f"{here}.arms[{j}]"
            if not isinstance(arm, Mapping):
                raise ArmorLabError("must be a mapping {name, select, factor}", key=at, value=arm, file=file)
            _known(arm, ARM_KEYS, at, file)
            name = arm.get("name")
            if name is not None and (not isinstance(name, str) or not name):
                raise ArmorLabError("must be a non-empty string", key=f"{at}.name", value=name, file=file)
            factor = arm.get("factor")
            if isinstance(factor, str):
                factor = [factor]
            if not isinstance(factor, list) or not factor:
                raise ArmorLabError("must name the config key(s) this arm changes", key=f"{at}.factor",
                                    value=factor, file=file)
            for key in factor:
                _config_key(key, f"{at}.factor", file)
            arms.append(Arm(_selector(arm.get("select"), f"{at}.select", file), tuple(factor), name))
        out.append(Controls(baseline, tuple(arms), here))
    return out


def _known(raw: Mapping[str, Any], keys: Sequence[str], where: str, file: str) -> None:
    for key in raw:
        if key not in keys:
            raise ArmorLabError(f"unknown key (known: {', '.join(keys)})", key=f"{where}.{key}", value=raw[key],
                                file=file)


def _config_key(key: Any, where: str, file: str) -> None:
    if not isinstance(key, str) or key.split(".")[0] not in known_keys() or not all(key.split(".")):
        raise ArmorLabError("not a config key", key=where, value=key, file=file)


def _selector(raw: Any, where: str, file: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or not raw:
        raise ArmorLabError("must be a non-empty mapping of config keys to values", key=where, value=raw, file=file)
    for key in raw:
        _config_key(key, where, file)
    return copy.deepcopy(dict(raw))


# --------------------------------------------------------------------------- the check
def arm_key(cfg: Mapping[str, Any]) -> str:
    return canonical_json(flatten(cfg))


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The config as ``{dotted key: value}`` without what does not make an arm (seed, init_from,
    logging settings)."""
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if not prefix and (key in NOT_THE_ARM or key in LOGGING_KEYS):
            continue
        if isinstance(value, Mapping) and key in ("task", "model") and not prefix:
            out.update(flatten(value, f"{key}."))
        elif key == "ref_from" and isinstance(value, Mapping) and "run" in value and not prefix:
            out[key] = {"select": value["select"]}  # its run follows the seed, as init_from's does
        else:
            out[f"{prefix}{key}"] = value
    return out


def effective(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config with the values a null stands for spelled out where the comparison needs them:
    ``anchor_cache`` with anchors or the gate on (window when π_ref resets, else off), so fresh
    anchors and the cache arm differ visibly instead of as a key one of them lacks."""
    if not (cfg.get("anchor") or cfg.get("anchor_gate")) or cfg.get("anchor_cache") is not None:
        return cfg
    return {**cfg, "anchor_cache": default_anchor_cache(cfg.get("ref_reset_steps", 0), cfg.get("ref_reset_schedule"))}


def diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[dict[str, tuple[Any, Any]], list[str]]:
    """Keys in which two configs differ ((a's, b's); a key one lacks shows as None) and, among them,
    those that are inert in one of the two (resolved to null there)."""
    fa, fb = flatten(a), flatten(b)
    differs = {}
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        if not same(va, vb):
            differs[key] = (va, vb)
    follows = [k for k, (va, vb) in differs.items() if k in INERT_KEYS and (va is None or vb is None)]
    return differs, follows


def check(groups: Sequence[Controls], configs: Sequence[tuple[str, Mapping[str, Any]]], *,
          file: str) -> list[Pair]:
    """Every pair of ``groups`` among ``configs`` (label, resolved config; one per run of a stage):
    baseline against each arm. Raises ArmorLabError on a pair that differs outside its factor or
    not in it, a selector that picks no arm (or the baseline's, more than one), or an arm no group
    names."""
    arms: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for label, cfg in configs:
        arms.setdefault(arm_key(cfg), (label, effective(cfg)))
    covered: set[str] = set()
    pairs: list[Pair] = []
    for group in groups:
        base_keys = [k for k, (_, cfg) in arms.items() if matches(cfg, group.baseline)]
        if len(base_keys) != 1:
            raise ArmorLabError(f"the baseline selects {len(base_keys)} arms, not one "
                                f"({'; '.join(arms[k][0] for k in base_keys) or 'none'})",
                                key=f"{group.where}.baseline", value=group.baseline, file=file)
        base_label, base_cfg = arms[base_keys[0]]
        covered.add(base_keys[0])
        for j, arm in enumerate(group.arms):
            hits = [k for k, (_, cfg) in arms.items() if matches(cfg, arm.select) and k != base_keys[0]]
            if not hits:
                raise ArmorLabError("selects no arm of this sweep besides the baseline",
                                    key=f"{group.where}.arms[{j}].select", value=arm.select, file=file)
            for k in hits:
                covered.add(k)
                label, cfg = arms[k]
                differs, follows = diff(base_cfg, cfg)
                name = label if arm.name is None else arm.name if len(hits) == 1 else f"{arm.name} ({label})"
                pair = Pair(group.where, base_label, name, arm.factor, differs, follows, (base_keys[0], k),
                            configured_batch_note(base_cfg, cfg))
                if pair.extra or pair.missing:
                    what = (f"also differs in {', '.join(f'{x} ({_text(differs[x][0])} -> {_text(differs[x][1])})' for x in pair.extra)}"
                            if pair.extra else f"does not differ in {', '.join(pair.missing)}")
                    raise ArmorLabError(f"control arm '{pair.arm}' {what}: a control must differ from the baseline "
                                        f"({base_label}) in its named factor ({', '.join(arm.factor)}) only",
                                        key=f"{group.where}.arms[{j}]", value=arm.select, file=file)
                pairs.append(pair)
    stray = [arms[k][0] for k in arms if k not in covered]
    if groups and stray:
        raise ArmorLabError(f"arms that no control group names (a baseline or an arm): {'; '.join(stray)}",
                            key=groups[0].where, value=None, file=file)
    return pairs


# --------------------------------------------------------------------------- effective batch
@dataclass(frozen=True)
class ConfiguredBatch:
    """What a config sets about the rows that train per optimizer step on each process: ``rows``
    when the batch is full, the groups it ``drops`` (empty: none) and ``draws``, how many times the
    prompts its refill may generate to fill the batch (dynamic_sampling_factor × max_num_gen_batches;
    1 = what the filters drop stays missing)."""
    rows: int
    drops: tuple[str, ...]
    draws: int

    def describe(self) -> str:
        if not self.drops:
            return f"{self.rows} rows/step, every group trains"
        refill = "no refill" if self.draws == 1 else f"refill up to {self.draws}× the prompts"
        return f"{self.rows} rows/step, drops {' and '.join(self.drops)}, {refill}"


def configured_batch(cfg: Mapping[str, Any]) -> ConfiguredBatch:
    rows = int(cfg.get("per_device_train_batch_size") or 8) * int(cfg.get("gradient_accumulation_steps") or 1)
    drops = []
    if cfg.get("dynamic_sampling"):  # an anchor gives an all-wrong group reward spread: it stays
        drops.append("equal-reward groups" + (" (an anchor's spread kept)" if cfg.get("anchor") else ""))
    if cfg.get("anchor_gate"):
        drops.append("groups the gate fails")
    draws = int(cfg.get("dynamic_sampling_factor") or 1) * int(cfg.get("max_num_gen_batches") or 1)
    return ConfiguredBatch(rows, tuple(drops), draws if drops else 1)


def configured_batch_note(base: Mapping[str, Any], arm: Mapping[str, Any],
                          tolerance: float = EFFECTIVE_BATCH_TOLERANCE) -> str | None:
    """Why two configs' effective batches may differ, or None: rows per step more than
    ``tolerance`` apart; or filters that differ while an arm that drops groups cannot refill (its
    batch is 1 − the share it drops, the other's is not); or the same drops refilled to different
    bounds. Arms whose drops differ but all refill are left to the measured check."""
    a, b = configured_batch(base), configured_batch(arm)
    if abs(a.rows - b.rows) > tolerance * max(a.rows, b.rows):
        reason = "rows per step differ"
    elif a.drops != b.drops and any(c.drops and c.draws == 1 for c in (a, b)):
        reason = "they drop different groups and one cannot refill"
    elif a.drops and a.drops == b.drops and a.draws != b.draws:
        reason = "the same groups are dropped but refilled to different bounds"
    else:
        return None
    return f"configured effective batch: {reason} (baseline: {a.describe()}; arm: {b.describe()})"


def measured_batch_note(base_shortfalls: Sequence[float], arm_shortfalls: Sequence[float]) -> str | None:
    """The report's check on finished runs (one mean train/refill_shortfall per run of each side)."""
    gap = effective_batch_gap(base_shortfalls, arm_shortfalls)
    if gap is None:
        return None
    return (f"measured effective batch: {gap[1]:.0%} of the arm's batch trains vs {gap[0]:.0%} of the baseline's "
            f"(1 − mean train/refill_shortfall; tolerance {EFFECTIVE_BATCH_TOLERANCE:.0%}): raise "
            "max_num_gen_batches, or read the comparison with that in mind")


def run_shortfalls(sweep_dir: Path, runs: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, list[float]]:
    """``arm_key`` → each finished run's mean train/refill_shortfall, for (run id, config) pairs;
    runs that are not completed or never logged it are left out."""
    out: dict[str, list[float]] = {}
    for run_id, cfg in runs:
        rd = RunDir(sweep_dir / run_id)
        if not rd.status_path.is_file() or rd.read_status().get("state") != "completed":
            continue
        values = [float(v) for row in rd.read_metrics() if isinstance(v := row.get("train/refill_shortfall"),
                                                                      (int, float)) and v == v]
        if values:
            out.setdefault(arm_key(cfg), []).append(sum(values) / len(values))
    return out


def batch_notes(pairs: Sequence[Pair], shortfalls: Mapping[str, Sequence[float]]) -> list[tuple[Pair, str]]:
    """Each pair's effective-batch warnings: the configured one, and the measured one where runs of
    both sides have finished."""
    out = []
    for pair in pairs:
        if pair.batch_note is not None:
            out.append((pair, pair.batch_note))
        measured = measured_batch_note(shortfalls.get(pair.keys[0], ()), shortfalls.get(pair.keys[1], ()))
        if measured is not None:
            out.append((pair, measured))
    return out


def _text(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, str) else canonical_json(v)
