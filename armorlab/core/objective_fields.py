"""The config keys of the field's objectives (issue 39), torch-free: TRL's ``loss_type`` and
``importance_sampling_level`` as ways to name an objective, and each objective's own parameters.

- ``loss_type: X`` selects objective X where armorlab registers it (TRL 1.16's cispo, sapo,
  vespo, luspo, bnpo, grpo, dapo, dr_grpo); the resolved config holds ``objective: X`` and no
  ``loss_type``. ``importance_sampling_level`` is accepted where it agrees with the objective.
- Each objective's parameters (``ObjectiveSpec.params``) keep the names of the library the
  objective follows: TRL's GRPOConfig fields (``sapo_temperature_pos``, ``vespo_k_pos``, ...) and
  verl's ActorConfig/policy_loss names (``clip_cov_ratio``, ``dro_beta``, ...), the latter
  armorlab fields (``PARAM_FIELDS``). The objective that reads one gets its default where unset
  (written into the resolved config); for another objective the key is inert and dropped, as
  ``alpha`` is for dapo (a grid may cross them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from armorlab.algos.field_objectives import NO_DUAL_CLIP
from armorlab.algos.objectives import objective_names, objective_spec
from armorlab.errors import ArmorLabError

# verl 0.9.1's names (ActorConfig.policy_loss), armorlab run-config fields: key → doc
PARAM_FIELDS: dict[str, str] = {
    "clip_cov_ratio": "clip_cov: share of tokens whose gradient is stopped (verl's; null = 2e-4)",
    "clip_cov_lb": "clip_cov: lower bound of the covariance that selects tokens (null = 1.0)",
    "clip_cov_ub": "clip_cov: upper bound of the covariance that selects tokens (null = 5.0)",
    "kl_cov_ratio": "kl_cov: share of tokens with the |log r| penalty (verl's; null = 2e-4)",
    "ppo_kl_coef": "kl_cov: coefficient of the |log r| penalty (verl's; null = 0.1)",
    "dro_beta": "dro: coefficient β of the ½·β·(log r)² penalty (required with objective: dro)",
}


def param_keys() -> frozenset[str]:
    """Every key some registered objective reads as a parameter."""
    return frozenset(k for name in objective_names() for k in objective_spec(name).params)


def apply_loss_type(raw: Mapping[str, Any], file: str | None) -> Mapping[str, Any]:
    """``raw`` with TRL's ``loss_type`` turned into ``objective`` and an agreeing
    ``importance_sampling_level`` removed; an error naming the key for anything else."""
    if "loss_type" not in raw and "importance_sampling_level" not in raw:
        return raw
    out = dict(raw)
    if "loss_type" in out:
        loss_type = out.pop("loss_type")
        if loss_type not in objective_names():
            raise ArmorLabError(f"TRL's loss type is not an armorlab objective (objectives: "
                                f"{', '.join(objective_names())})", key="loss_type", value=loss_type, file=file)
        if "objective" in out and out["objective"] != loss_type:
            raise ArmorLabError(f"loss_type names another objective than objective: {out['objective']!r}; give one",
                                key="loss_type", value=loss_type, file=file)
        out["objective"] = loss_type
    if "importance_sampling_level" in out:
        level = out.pop("importance_sampling_level")
        objective = out.get("objective", "dapo")
        want = "sequence" if objective in objective_names() and objective_spec(objective).sequence_level else "token"
        if level != want:
            sequence = [o for o in objective_names() if objective_spec(o).sequence_level]
            raise ArmorLabError(f"objective {objective!r} is {want}-level (sequence-level objectives: "
                                f"{', '.join(sequence)})", key="importance_sampling_level", value=level, file=file)
    return out


def resolve_params(out: dict[str, Any], file: str | None) -> None:
    """Fill the objective's parameters (its default where unset or null) and drop the others."""
    spec = objective_spec(out["objective"])
    if out.get("dual_clip") is not None and spec.name in NO_DUAL_CLIP:
        raise ArmorLabError(f"objective {spec.name!r} has no dual clip (its reference has none); remove it",
                            key="dual_clip", value=out["dual_clip"], file=file)
    for key in param_keys() - set(spec.params):
        out.pop(key, None)
    for key, default in spec.params.items():
        value = out.get(key)
        value = default if value is None else value
        if value is None:
            raise ArmorLabError(f"objective {spec.name!r} needs {key} (no default)", key=key, value=value, file=file)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ArmorLabError("must be a number", key=key, value=value, file=file)
        if default is None and not value > 0:
            raise ArmorLabError("must be > 0", key=key, value=value, file=file)
        out[key] = value
