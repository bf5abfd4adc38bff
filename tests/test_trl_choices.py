"""The names armorlab.core.trl_fields accepts for TRL/transformers fields that take one of a fixed set
are the installed versions' (the shipped lists keep `sweep --dry-run` free of transformers)."""

from __future__ import annotations

import dataclasses
import typing
from enum import Enum

import pytest

from armorlab.core import trl_fields

transformers = pytest.importorskip("transformers")


def _enum_values(field_name: str) -> tuple[str, ...] | None:
    from trl import GRPOConfig

    f = next(f for f in dataclasses.fields(GRPOConfig) if f.name == field_name)
    for arg in typing.get_args(f.type) or (f.type,):
        if isinstance(arg, type) and issubclass(arg, Enum):
            return tuple(e.value for e in arg)
    choices = (f.metadata or {}).get("choices")
    return tuple(choices) if choices is not None else None


@pytest.mark.parametrize("field_name", ["optim", "lr_scheduler_type", "logging_strategy", "save_strategy",
                                        "hub_strategy", "log_level", "log_level_replica", "ddp_backend",
                                        "dataloader_multiprocessing_context"])
def test_named_choices_match_the_installed_transformers(field_name):
    installed = _enum_values(field_name)
    assert installed is not None, f"{field_name} is no longer an enum or choices field: revisit trl_fields"
    assert set(trl_fields.TRL_CHOICES[field_name]) == set(installed)


def test_report_to_names_match_the_installed_integrations():
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    assert set(trl_fields.REPORT_TO) == {"all", "none", *INTEGRATION_TO_CALLBACK}


def test_trl_documented_choices_are_what_its_trainer_accepts():
    import inspect

    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer)
    for mode in trl_fields.TRL_CHOICES["vllm_importance_sampling_mode"]:
        assert f'"{mode}"' in source
    for scale in trl_fields.SCALE_REWARDS:
        assert f'"{scale}"' in source
