"""No GRPOConfig setting is silently ignored: each field is honoured, mapped or rejected."""

import dataclasses
import subprocess
import sys

import pytest

from armorlab.core import trl_fields
from armorlab.core.config import resolve
from armorlab.core.runs import run_id
from armorlab.errors import ArmorLabError


def _installed_defaults():
    from trl import GRPOConfig

    out = {}
    for f in dataclasses.fields(GRPOConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def test_every_installed_grpo_field_is_classified_exactly_once():
    installed = set(_installed_defaults())
    honoured, mapped, rejected = trl_fields.HONOURED, set(trl_fields.MAPPED), set(trl_fields.REJECTED)
    assert not (honoured & mapped) and not (honoured & rejected) and not (mapped & rejected)
    unclassified = installed - (honoured | mapped | rejected)
    assert not unclassified, f"classify these GRPOConfig fields in armorlab/core/trl_fields.py: {sorted(unclassified)}"
    stale = (honoured | mapped | rejected) - installed
    assert not stale, f"no longer GRPOConfig fields: {sorted(stale)}"


def test_the_defaults_written_down_are_trls():
    installed = _installed_defaults()
    for table in (trl_fields.MAPPED, trl_fields.REJECTED):
        for key, (default, _why) in table.items():
            assert installed[key] == default, key
    for key, default in trl_fields.OFF_SWITCHES.items():  # dropped from resolved configs at these values
        assert installed[key] == default, key


@pytest.mark.parametrize(
    "key, value, instead",
    [
        ("delta", 2.0, "dual_clip"),
        ("loss_type", "ppo", "objectives"),           # not an armorlab objective: the known ones are named
        ("importance_sampling_level", "sequence", "gspo"),
        ("sync_ref_model", True, "ref_reset_steps"),
        ("num_train_epochs", 1, "max_steps"),
        ("eval_strategy", "steps", "val_every"),
        ("off_policy_mask_threshold", 0.2, "not applied"),
        ("data_seed", 3, "seed"),
    ],
)
def test_resolve_refuses_unhonoured_fields_naming_key_value_file_and_the_alternative(key, value, instead):
    with pytest.raises(ArmorLabError) as err:
        resolve({key: value}, file="run.yaml")
    msg = str(err.value)
    assert err.value.key == key and repr(value) in msg and "run.yaml" in msg and instead in msg


def test_a_rejected_feature_left_off_is_accepted_and_is_the_same_run():
    plain = resolve({"objective": "dapo"})
    off = resolve({"objective": "dapo", "use_vllm": False, "top_entropy_quantile": 1, "entropy_coef": 0.0})
    assert off == plain and run_id(off) == run_id(plain) and "use_vllm" not in off


def test_honoured_fields_pass_through():
    cfg = resolve({"scale_rewards": "batch", "mask_truncated_completions": True, "use_bias_correction_kl": False})
    assert cfg["scale_rewards"] == "batch" and cfg["mask_truncated_completions"] is True
    assert cfg["use_bias_correction_kl"] is False


def test_cli_exits_2_naming_key_value_file_and_alternative(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("objective: dapo\ndelta: 3.0\n")
    out = subprocess.run([sys.executable, "-m", "armorlab.cli", "train", str(cfg), "--out", str(tmp_path / "runs")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "'delta'" in out.stderr and "3.0" in out.stderr and "run.yaml" in out.stderr and "dual_clip" in out.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_trainer_config_refuses_them_too():
    from armorlab.train.trainer import ArmorLabConfig

    base = {"output_dir": "/tmp/unused-armorlab", "use_cpu": True, "bf16": False, "report_to": [],
            "per_device_train_batch_size": 4, "num_generations": 2}
    for key, value in (("delta", 2.0), ("loss_type", "grpo"), ("data_seed", 1)):
        with pytest.raises(ArmorLabError) as err:
            ArmorLabConfig(**base, **{key: value})
        assert err.value.key == key
    ArmorLabConfig(**base, use_vllm=False, loss_type="dapo")  # TRL's defaults: nothing is ignored
