"""``ArmorLabConfig(GRPOConfig)``: TRL's config plus armorlab's own fields, each validated by the
same check as ``armorlab.core.config`` (the trainer imports it from here; ``armorlab.train.trainer`` re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from armorlab.core import trl_fields
from armorlab.core.checks import Invalid
from armorlab.core.config import FIELDS, INERT_KEYS, fill_objective_defaults
from armorlab.core.vllm_config import check_args
from armorlab.errors import ArmorLabError


def _with_run_config_fields(cls: type) -> type:
    """Give ``cls`` one dataclass field per armorlab run-config field (``config.FIELDS``: its type,
    default and doc), before ``@dataclass`` reads the class: the fields are declared once, there."""
    annotations = cls.__dict__.get("__annotations__", {})
    for name, spec in FIELDS.items():
        annotations[name] = spec.type
        setattr(cls, name, field(default=spec.default, metadata={"help": spec.doc}))
    cls.__annotations__ = annotations
    return cls


@dataclass
@_with_run_config_fields
class ArmorLabConfig(GRPOConfig):
    """GRPOConfig plus armorlab's fields (``armorlab.core.config.FIELDS``); each is validated by the
    same check as ``armorlab.core.config``.

    ``objective`` replaces TRL's ``loss_type``/``importance_sampling_level``; ``epsilon`` and
    ``epsilon_high`` are the clip bounds of every objective. A ``None`` in a field that
    ``config.resolve`` nulls when inert (anchor options with anchors off) means "not used by this
    run" and takes the default; ``alpha`` keeps the resolved value, null where the run never reads
    it (config.reads_alpha), and (G−1)/G where it does and a Python user left it out.
    """

    def __post_init__(self) -> None:
        for name, spec in FIELDS.items():
            value = getattr(self, name)
            if value is None and name in INERT_KEYS:
                value = spec.default
            try:
                setattr(self, name, spec.check(value))
            except Invalid as exc:
                raise ArmorLabError(str(exc), key=name, value=value) from None
        fill_objective_defaults(self)
        problems = trl_fields.args_problems(self)  # config.resolve refused these already; Python users too
        if problems:
            key, value, why = problems[0]
            raise ArmorLabError(why, key=key, value=value)
        check_args(self)
        super().__post_init__()
