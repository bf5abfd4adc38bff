"""``stop_on_collapse``: the config of a run that stops itself once its validation curve has
collapsed (armorlab.stats.stopping decides; docs/training.md). Torch-free.

```yaml
stop_on_collapse: true                                   # patience = 3 evals, δ 0.03, α 0.04
stop_on_collapse: {patience: 30, delta: 0.03, alpha: 0.04}  # patience in rollouts
```
``patience`` (rollouts, the papers' unit) is how long the fall must have lasted: the detector's
level (C1 of armorlab.stats.collapse) is the mean of the evals of ``patience`` rollouts. The
resolved config holds all three keys; off (null/false, the default) is dropped from it, so the run
ids of configs written before the key existed do not change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from armorlab.core.checks import Invalid, integer, number
from armorlab.core.schedule import config_per_rollout, config_val_every_steps, planned_evals
from armorlab.errors import ArmorLabError

KEY = "stop_on_collapse"
DEFAULT_LEVEL_EVALS = 3  # armorlab.stats.collapse.PATIENCE: evals per level when patience is not given
DEFAULT_DELTA, DEFAULT_ALPHA = 0.03, 0.04  # armorlab.stats.collapse.DELTA / ALPHA
MAX_PATIENCE = 1_000_000  # rollouts; a run's own horizon bounds it further (check_stop)


def stop_shape(v: Any) -> dict[str, Any] | None:
    """The field's own check: null/false = off, true = the defaults, or {patience, delta, alpha}."""
    if v is None or v is False:
        return None
    if v is True:
        return {"patience": None, "delta": DEFAULT_DELTA, "alpha": DEFAULT_ALPHA}
    if not isinstance(v, Mapping):
        raise Invalid("must be true, false or {patience: <rollouts>, delta: <fall>, alpha: <false-stop rate>}")
    extra = sorted(set(map(str, v)) - {"patience", "delta", "alpha"})
    if extra:
        raise Invalid(f"unknown key {extra[0]!r} (known: patience, delta, alpha)")
    out: dict[str, Any] = {}
    for key, check, default in (("patience", integer(1, MAX_PATIENCE), None),
                                ("delta", number(0.0, 1.0, lo_open=True), DEFAULT_DELTA),
                                ("alpha", number(0.0, 0.5, lo_open=True), DEFAULT_ALPHA)):
        value = v.get(key, default)
        try:
            out[key] = None if value is None else check(value)
        except Invalid as exc:
            raise Invalid(f"{key} {exc}") from None
    return out


STOP_FIELDS: dict[str, tuple[Any, ...]] = {
    KEY: (None, stop_shape, "stop the run once its keep_select metric (val/acc) has collapsed: null/false = off, "
          "true, or {patience: <rollouts the fall must last>, delta, alpha} (docs/training.md)", dict | None),
}


def rollouts_per_eval(cfg: Mapping[str, Any]) -> Fraction | None:
    """Rollouts between two evals of a resolved config (None: it does not validate, or U is unknown)."""
    every, per = config_val_every_steps(cfg), config_per_rollout(cfg)
    return None if not every or per is None else Fraction(every) / per


def level_evals(patience: int, per_eval: Fraction) -> int:
    """Evals per level: the fewest whose span covers ``patience`` rollouts (at least 1)."""
    return max(1, math.ceil(Fraction(patience) / per_eval))


def check_stop(cfg: dict[str, Any], file: str | None) -> None:
    """Fill ``patience`` (3 evals, in rollouts) and refuse a stop that could never fire: no
    validation, or a patience over half the run (the test needs two levels)."""
    stop = cfg.get(KEY)
    if stop is None:
        return
    per_eval = rollouts_per_eval(cfg)
    if per_eval is None:
        why = ("the run never validates (val_every: 0)" if not cfg.get("val_every") else
               "the rollouts between evals are unknown (only generation_batch_size is set)")
        raise ArmorLabError(f"needs a validation curve in rollouts: {why}", key=KEY, value=stop, file=file)
    if stop["patience"] is None:
        stop["patience"] = math.ceil(DEFAULT_LEVEL_EVALS * per_eval)
    evals = planned_evals(cfg) or 0
    if 2 * level_evals(stop["patience"], per_eval) > evals:
        raise ArmorLabError(f"patience {stop['patience']} rollouts is over half the run ({evals} evals, one every "
                            f"{float(per_eval):g} rollouts): the run could never stop", key=f"{KEY}.patience",
                            value=stop["patience"], file=file)
