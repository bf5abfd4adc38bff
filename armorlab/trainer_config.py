"""``ArmorLabConfig(GRPOConfig)``: TRL's config plus armorlab's own fields, each validated by the
same check as ``armorlab.config`` (the trainer imports it from here; ``armorlab.trainer`` re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from armorlab import trl_fields
from armorlab.checks import Invalid
from armorlab.config import FIELDS, INERT_KEYS, fill_objective_defaults
from armorlab.errors import ArmorLabError
from armorlab.vllm_config import check_args


@dataclass
class ArmorLabConfig(GRPOConfig):
    """GRPOConfig plus armorlab's fields; each is validated by the same check as ``armorlab.config``.

    ``objective`` replaces TRL's ``loss_type``/``importance_sampling_level``; ``epsilon`` and
    ``epsilon_high`` are the clip bounds of every objective. A ``None`` in a field that
    ``config.resolve`` nulls when inert (``alpha`` for dapo, anchor options with anchors off)
    means "not used by this run" and takes the default.
    """

    objective: str = field(default=FIELDS["objective"].default, metadata={"help": FIELDS["objective"].doc})
    alpha: float | None = field(default=FIELDS["alpha"].default, metadata={"help": FIELDS["alpha"].doc})
    advantage_estimator: str = field(default=FIELDS["advantage_estimator"].default,
                                     metadata={"help": FIELDS["advantage_estimator"].doc})
    quantile_k: float | None = field(default=FIELDS["quantile_k"].default, metadata={"help": FIELDS["quantile_k"].doc})
    kl_estimator: str | None = field(default=FIELDS["kl_estimator"].default,
                                     metadata={"help": FIELDS["kl_estimator"].doc})
    dual_clip: float | None = field(default=None, metadata={"help": FIELDS["dual_clip"].doc})
    aggregation: str | None = field(default=None, metadata={"help": FIELDS["aggregation"].doc})
    anchor: bool = field(default=FIELDS["anchor"].default, metadata={"help": FIELDS["anchor"].doc})
    anchor_samples: int | None = field(default=FIELDS["anchor_samples"].default,
                                       metadata={"help": FIELDS["anchor_samples"].doc})
    anchor_filter: str | None = field(default=FIELDS["anchor_filter"].default,
                                      metadata={"help": FIELDS["anchor_filter"].doc})
    anchor_gate: bool = field(default=FIELDS["anchor_gate"].default, metadata={"help": FIELDS["anchor_gate"].doc})
    anchor_ratio: str | None = field(default=FIELDS["anchor_ratio"].default,
                                     metadata={"help": FIELDS["anchor_ratio"].doc})
    anchor_reward_threshold: float | None = field(default=FIELDS["anchor_reward_threshold"].default,
                                                  metadata={"help": FIELDS["anchor_reward_threshold"].doc})
    ref_reset_steps: int = field(default=FIELDS["ref_reset_steps"].default,
                                 metadata={"help": FIELDS["ref_reset_steps"].doc})
    ref_reset_schedule: list[list[int]] | None = field(default=None,
                                                       metadata={"help": FIELDS["ref_reset_schedule"].doc})
    val_every: int = field(default=FIELDS["val_every"].default, metadata={"help": FIELDS["val_every"].doc})
    val_samples: int = field(default=FIELDS["val_samples"].default, metadata={"help": FIELDS["val_samples"].doc})
    val_temperature: float = field(default=FIELDS["val_temperature"].default,
                                   metadata={"help": FIELDS["val_temperature"].doc})
    kl_probe_prompts: int = field(default=FIELDS["kl_probe_prompts"].default,
                                  metadata={"help": FIELDS["kl_probe_prompts"].doc})
    token_sample_rate: float = field(default=FIELDS["token_sample_rate"].default,
                                     metadata={"help": FIELDS["token_sample_rate"].doc})
    dynamic_sampling: bool = field(default=FIELDS["dynamic_sampling"].default,
                                   metadata={"help": FIELDS["dynamic_sampling"].doc})
    dynamic_sampling_factor: int | None = field(default=FIELDS["dynamic_sampling_factor"].default,
                                                metadata={"help": FIELDS["dynamic_sampling_factor"].doc})
    ref_vllm_mode: str = field(default=FIELDS["ref_vllm_mode"].default, metadata={"help": FIELDS["ref_vllm_mode"].doc})
    ref_vllm_memory: float = field(default=FIELDS["ref_vllm_memory"].default,
                                   metadata={"help": FIELDS["ref_vllm_memory"].doc})
    ref_vllm_server_host: str = field(default=FIELDS["ref_vllm_server_host"].default,
                                      metadata={"help": FIELDS["ref_vllm_server_host"].doc})
    ref_vllm_server_port: int = field(default=FIELDS["ref_vllm_server_port"].default,
                                      metadata={"help": FIELDS["ref_vllm_server_port"].doc})
    ref_vllm_server_base_url: str | None = field(default=None, metadata={"help": FIELDS["ref_vllm_server_base_url"].doc})
    ref_vllm_server_timeout: float = field(default=FIELDS["ref_vllm_server_timeout"].default,
                                           metadata={"help": FIELDS["ref_vllm_server_timeout"].doc})
    ref_vllm_group_port: int = field(default=FIELDS["ref_vllm_group_port"].default,
                                     metadata={"help": FIELDS["ref_vllm_group_port"].doc})

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
