import dataclasses

import pytest
from model_dirs import fake_model_dir

from armorlab.core.config import (
    load_config,
    parse_overrides,
    resolve,
    split_config,
)
from armorlab.core.trl_fields import grpo_field_names
from armorlab.errors import ArmorLabError


def test_shipped_grpo_field_names_match_installed_trl():
    from trl import GRPOConfig

    assert grpo_field_names() == {f.name for f in dataclasses.fields(GRPOConfig)}


def test_defaults_and_presets():
    cfg = resolve({"objective": "armor"})
    assert cfg["anchor"] is True and cfg["anchor_gate"] is True
    assert cfg["alpha"] == 0.875 and cfg["epsilon"] == 0.2 and cfg["epsilon_high"] == 0.28  # (8−1)/8
    assert cfg["task"]["name"] == "arithmetic" and cfg["model"]["name"] == "tiny"
    gspo = resolve({"objective": "gspo"})
    assert (gspo["epsilon"], gspo["epsilon_high"]) == (3e-4, 4e-4)  # GSPO's paper
    # an explicit value beats the preset
    assert resolve({"objective": "gspo", "epsilon": 0.1})["epsilon"] == 0.1


def test_inert_keys_collapse_equivalent_points():
    a = resolve({"objective": "dapo", "alpha": 0.5})
    b = resolve({"objective": "dapo", "alpha": 0.9})
    assert a == b and a["alpha"] is None
    assert resolve({"objective": "dapo", "anchor": True, "anchor_ratio": "mixed"})["alpha"] == 0.875
    gate_only = resolve({"objective": "dapo", "anchor_gate": True})
    assert gate_only["anchor_samples"] == 4 and gate_only["anchor_filter"] is None


def test_short_and_dotted_sections(tmp_path):
    over = parse_overrides(["task.digits=3", "alpha=0.7", "model=tiny"])
    assert over == {"task": {"digits": 3}, "alpha": 0.7, "model": "tiny"}
    cfg = resolve({"objective": "armor", **over})
    assert cfg["task"]["digits"] == 3 and cfg["alpha"] == 0.7
    fake_model_dir(tmp_path)
    model = resolve({"model": str(tmp_path)})["model"]
    assert model["name"] == str(tmp_path) and set(model) == {"name", "fingerprint"}


@pytest.mark.parametrize(
    "raw, key, value",
    [
        ({"objective": "ppo"}, "objective", "ppo"),
        ({"objective": "armor", "alpha": 0.0}, "alpha", 0.0),
        ({"objective": "armor", "alpha": 1.5}, "alpha", 1.5),
        ({"dual_clip": 1.0}, "dual_clip", 1.0),
        ({"epsilon": -0.1}, "epsilon", -0.1),
        ({"anchor": "yes"}, "anchor", "yes"),
        ({"anchor": True, "dynamic_sampling": True, "anchor_skip_solved": "yes\x00"}, "anchor_skip_solved", "yes\x00"),
        ({"anchor": True, "dynamic_sampling": True, "anchor_skip_solved": 10**30}, "anchor_skip_solved", 10**30),
        ({"anchor_samples": 0, "anchor": True}, "anchor_samples", 0),
        ({"ref_reset_schedule": [[180, 1], [100, 0]]}, "ref_reset_schedule", [[180, 1], [100, 0]]),
        ({"ref_reset_schedule": [[None, 1], [100, 0]]}, "ref_reset_schedule", [[None, 1], [100, 0]]),
        ({"dynamic_sampling": True, "dynamic_sampling_factor": 0}, "dynamic_sampling_factor", 0),
        ({"no_such_key": 1}, "no_such_key", 1),
        ({"task": {"name": "arithmetic", "digitz": 2}}, "task.digitz", 2),
        ({"task": {"operators": "+/"}}, "task.operators", "+/"),
        ({"task": "chess"}, "task.name", "chess"),
        ({"output_dir": "/tmp/x"}, "output_dir", "/tmp/x"),
        ({"num_generations": 1}, "num_generations", 1),
        ({"model": {"name": "tiny", "num_heads": 8}}, "model.num_heads", 8),
    ],
)
def test_bad_values_name_key_value_and_file(raw, key, value):
    with pytest.raises(ArmorLabError) as err:
        resolve(raw, file="my.yaml")
    msg = str(err.value)
    assert f"'{key}'" in msg and repr(value) in msg and "my.yaml" in msg
    assert err.value.key == key


def test_load_config_file_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("objective: armor\ntask: {name: arithmetic, digits: 3}\nlearning_rate: 0.001\n")
    cfg = load_config(path, ["task.train_size=8", "alpha=0.6"])
    assert cfg["task"]["digits"] == 3 and cfg["task"]["train_size"] == 8 and cfg["alpha"] == 0.6
    ours, trl = split_config(cfg)
    assert trl["learning_rate"] == 0.001 and "alpha" in ours and "task" in ours and "alpha" not in trl
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ArmorLabError, match="bad.yaml"):
        load_config(bad)
    with pytest.raises(ArmorLabError, match="override must look like"):
        load_config(path, ["alpha"])


def test_shipped_grpo_field_kinds_match_installed_trl():
    import typing

    from trl import GRPOConfig

    from armorlab.core.trl_fields import grpo_field_kinds

    kinds = grpo_field_kinds()
    for f in dataclasses.fields(GRPOConfig):
        args = set(typing.get_args(f.type)) or {f.type}
        if kinds[f.name].startswith("float"):
            assert float in args, f.name
        if kinds[f.name].startswith("int"):
            assert int in args and float not in args and str not in args, f.name
        if kinds[f.name].startswith("bool"):
            assert args - {type(None)} == {bool}, f.name
        if kinds[f.name].startswith("map"):
            assert any(a is dict or typing.get_origin(a) is dict for a in args), f.name
        assert kinds[f.name].endswith("?") == (type(None) in args and kinds[f.name] != "any"), f.name


def test_mapping_fields_take_a_yaml_mapping_or_its_json_text():
    # model_init_kwargs is `dict | str | None` in GRPOConfig: the paper configs load bf16 weights with it
    cfg = resolve({"model_init_kwargs": {"dtype": "bfloat16"}, "generation_kwargs": '{"min_new_tokens": 2}'})
    assert cfg["model_init_kwargs"] == {"dtype": "bfloat16"}
    assert cfg["generation_kwargs"] == '{"min_new_tokens": 2}'
    with pytest.raises(ArmorLabError, match="must be a mapping.*model_init_kwargs"):
        resolve({"model_init_kwargs": ["dtype", "bfloat16"]})


def test_trl_numbers_are_normalised_so_equal_values_share_a_run_id():
    from armorlab.core.runs import run_id

    a = resolve({"learning_rate": "1e-5", "dataloader_num_workers": "3", "epsilon_high": 1})
    b = resolve({"learning_rate": 1.0e-5, "dataloader_num_workers": 3, "epsilon_high": 1.0})
    assert a == b and run_id(a) == run_id(b)
    assert a["learning_rate"] == 1e-5 and a["dataloader_num_workers"] == 3
    assert isinstance(a["dataloader_num_workers"], int) and isinstance(a["epsilon_high"], float)


@pytest.mark.parametrize(
    "raw, key, value",
    [
        ({"learning_rate": "fast"}, "learning_rate", "fast"),
        ({"dataloader_num_workers": 2.5}, "dataloader_num_workers", 2.5),
        ({"bf16": "yes"}, "bf16", "yes"),
        ({"adam_beta1": None}, "adam_beta1", None),
    ],
)
def test_bad_trl_values_name_key_value_and_file(raw, key, value):
    with pytest.raises(ArmorLabError) as err:
        resolve(raw, file="spec.yaml")
    assert f"'{key}'" in str(err.value) and repr(value) in str(err.value) and "spec.yaml" in str(err.value)


@pytest.mark.parametrize("key,value", [("top_p", 0.7), ("top_k", 20), ("min_p", 0.05)])
@pytest.mark.parametrize("who", [{"objective": "armor"}, {"objective": "dapo", "anchor": True},
                                 {"objective": "up"}, {"objective": "up_gspo"}])
def test_truncated_sampling_is_refused_with_anchors_and_up(who, key, value):
    with pytest.raises(ArmorLabError) as err:
        resolve({**who, key: value}, file="spec.yaml")
    assert err.value.key == key and err.value.value == value and "spec.yaml" in str(err.value)
    assert "truncated sampling" in str(err.value)


def test_truncated_sampling_stays_allowed_where_nothing_assumes_full_support():
    # no anchor and no UP branch: the plain ratio's sampler mismatch is TRL's (issue 6789), not refused here
    assert resolve({"objective": "dapo", "top_p": 0.7})["top_p"] == 0.7
    assert resolve({"objective": "armor", "anchor": False, "anchor_gate": False, "top_k": 20})["top_k"] == 20
    # the full-support values themselves are fine with anchors
    assert resolve({"objective": "armor", "top_p": 1.0, "top_k": 0, "min_p": 0.0})["objective"] == "armor"


def test_anchor_skip_solved_is_inert_without_draws_or_the_filter():
    armor = {"objective": "armor", "anchor": True, "dynamic_sampling": True}
    assert "anchor_skip_solved" not in resolve(armor)  # at its default: run ids as before the key
    assert resolve({**armor, "anchor_skip_solved": True})["anchor_skip_solved"] is True
    for inert in ({"objective": "dapo"}, {**armor, "dynamic_sampling": False}):
        assert resolve({**inert, "anchor_skip_solved": True}) == resolve(inert)
