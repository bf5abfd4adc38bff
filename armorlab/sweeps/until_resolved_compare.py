"""A sweep spec's ``compare:`` section: what `armorlab sweep --until-resolved` compares after each
look (armorlab.sweeps.until_resolved; the statistics are armorlab.stats.sequential's).

```yaml
compare:
  baseline: {objective: dapo}   # selects one arm of the compared stage (resolved values, as exclude: does)
  endpoint: final               # the per-run score judged: final, drop, selected_test, peak, auc, val@S, ...
  delta: 0.05                   # equivalence margin, fixed before the first look; null: nothing is equivalent
  spending: obf                 # obf (O'Brien–Fleming type, default) or pocock
  alpha: 0.05                   # familywise error rate over arms and looks
  stage: continue               # a spec with stages: the stage whose arms are compared (default: the last)
  select: {metric: val/acc, mode: max, report: test/acc}   # what `final`, `selected_test`, ... are read from
```
Every other arm of the compared stage (a distinct resolved config once seed and ``init_from``
are set aside, as ``controls:`` defines arms) is compared with the baseline. Without
``compare:``, a stage's ``controls:`` (one group) gives the baseline and the rest is the default.
Checked here: the keys and values; the baseline against the runs when the sweep is planned.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from armorlab.core.config import DEFAULT_SELECTION
from armorlab.errors import ArmorLabError
from armorlab.sweeps.controls import Controls

COMPARE_KEYS = ("baseline", "endpoint", "delta", "spending", "alpha", "stage", "select")
SELECT_KEYS = ("metric", "mode", "report")
# armorlab.stats.sequential.SPENDING, restated: parsing a spec must not load numpy/scipy (a test
# holds the two equal)
SPENDINGS = ("obf", "pocock")
# per-run scores of the report (armorlab.analysis.groups) a comparison may judge
ENDPOINTS = ("final", "drop", "drop_rel", "drop_z", "peak", "auc", "selected_val", "selected_test")
_AT_STEP = re.compile(r"(val|test)@(\d+)")


@dataclass(frozen=True)
class CompareSpec:
    baseline: dict[str, Any]
    endpoint: str = "final"
    delta: float | None = None
    spending: str = "obf"
    alpha: float = 0.05
    stage: str | None = None
    select: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_SELECTION))
    where: str = "compare"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"baseline": copy.deepcopy(self.baseline), "endpoint": self.endpoint,
                               "delta": self.delta, "spending": self.spending, "alpha": self.alpha,
                               "select": dict(self.select)}
        if self.stage is not None:
            out["stage"] = self.stage
        return out

    @property
    def matched_step(self) -> int | None:
        """S of a ``val@S``/``test@S`` endpoint (the report's matched step it is read at)."""
        m = _AT_STEP.fullmatch(self.endpoint)
        return int(m.group(2)) if m else None


def _number(raw: Any) -> bool:
    return isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw)


def parse_compare(raw: Any, file: str) -> CompareSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ArmorLabError("must be a mapping {baseline: <selector>, endpoint: final, delta: null, ...}",
                            key="compare", value=raw, file=file)
    for key in raw:
        if key not in COMPARE_KEYS:
            raise ArmorLabError(f"unknown key (known: {', '.join(COMPARE_KEYS)})", key=f"compare.{key}",
                                value=raw[key], file=file)
    baseline = raw.get("baseline")
    if not isinstance(baseline, Mapping) or not baseline or not all(isinstance(k, str) and k for k in baseline):
        raise ArmorLabError("must select the baseline arm: a mapping of config keys to values, e.g. "
                            "{objective: dapo}", key="compare.baseline", value=baseline, file=file)
    endpoint = raw.get("endpoint", "final")
    if not isinstance(endpoint, str) or not (endpoint in ENDPOINTS or _AT_STEP.fullmatch(endpoint)):
        raise ArmorLabError(f"must be a per-run score ({', '.join(ENDPOINTS)}, val@<step>, test@<step>)",
                            key="compare.endpoint", value=endpoint, file=file)
    delta = raw.get("delta")
    if delta is not None and not (_number(delta) and delta > 0):
        raise ArmorLabError("must be a number > 0, the equivalence margin (or null: no margin, nothing "
                            "equivalent)", key="compare.delta", value=delta, file=file)
    spending = raw.get("spending", "obf")
    if spending not in SPENDINGS:
        raise ArmorLabError(f"must be one of {', '.join(SPENDINGS)}", key="compare.spending", value=spending,
                            file=file)
    alpha = raw.get("alpha", 0.05)
    if not (_number(alpha) and 0 < alpha < 1):
        raise ArmorLabError("must be a number in (0, 1)", key="compare.alpha", value=alpha, file=file)
    stage = raw.get("stage")
    if stage is not None and not isinstance(stage, str):
        raise ArmorLabError("must name a stage", key="compare.stage", value=stage, file=file)
    select = dict(DEFAULT_SELECTION)
    if raw.get("select") is not None:
        sel = raw["select"]
        if not isinstance(sel, Mapping):
            raise ArmorLabError("must be a mapping {metric, mode, report}", key="compare.select", value=sel,
                                file=file)
        for key, value in sel.items():
            if key not in SELECT_KEYS:
                raise ArmorLabError(f"unknown key (known: {', '.join(SELECT_KEYS)})", key=f"compare.select.{key}",
                                    value=value, file=file)
            ok = value in ("max", "min") if key == "mode" else isinstance(value, str) and "/" in value
            if not ok:
                raise ArmorLabError("must be max or min" if key == "mode" else "must be a metric name such as "
                                    "val/acc", key=f"compare.select.{key}", value=value, file=file)
        select.update(sel)
    return CompareSpec(copy.deepcopy(dict(baseline)), endpoint, None if delta is None else float(delta), spending,
                       float(alpha), stage, select)


def from_controls(controls: list[Controls], where: str, file: str) -> CompareSpec:
    """The comparison a stage's ``controls:`` implies: its baseline, every other defaults."""
    if len(controls) != 1:
        raise ArmorLabError(f"--until-resolved compares against one baseline: {where} declares "
                            f"{len(controls)} control groups; add a `compare:` section naming the baseline",
                            key=where, value=None, file=file)
    return CompareSpec(copy.deepcopy(controls[0].baseline), where=f"{controls[0].where}.baseline")
