"""The papers' defaults (ARMOR's α and τ, DAPO's preset), the reset schedule and the gate-only control."""

from pathlib import Path

import pytest

from armorlab.core.config import load_config, parse_overrides, resolve
from armorlab.sweeps.spec import expand, load_spec

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("g, alpha", [(8, 0.875), (16, 0.9375), (4, 0.75), (2, 0.5)])
def test_armor_alpha_defaults_to_g_minus_1_over_g(g, alpha):
    # G−1 on-policy samples + 1 anchor: at G = 16 the paper's Qwen2.5-Math-7B value 0.9375
    assert resolve({"objective": "armor", "num_generations": g, "per_device_train_batch_size": 32})["alpha"] == alpha


def test_explicit_alpha_wins_and_inert_alpha_stays_null():
    assert resolve({"objective": "armor", "alpha": 0.8})["alpha"] == 0.8
    assert resolve({"objective": "dapo"})["alpha"] is None
    cfg = resolve({"objective": "armor"})
    assert resolve(cfg) == cfg  # resolving is idempotent with the derived default


def test_armor_preset_tau_is_the_papers_160():
    assert resolve({"objective": "armor"})["ref_reset_steps"] == 160
    assert resolve({"objective": "armor", "ref_reset_steps": 50})["ref_reset_steps"] == 50
    assert resolve({"objective": "dapo"})["ref_reset_steps"] == 0


def test_anchor_ratio_defaults_to_the_objectives_own_choice():
    assert resolve({"objective": "armor"})["anchor_ratio"] == "mixed"
    for objective in ("grpo", "dapo", "dr_grpo", "gspo", "up", "up_gspo"):
        cfg = resolve({"objective": objective, "anchor": True})
        assert cfg["anchor_ratio"] == "behavior", objective
        assert cfg["alpha"] is None, objective  # π_θ/π_ref on anchor rows uses no α
    assert resolve({"objective": "dapo", "anchor": True, "anchor_ratio": "mixed"})["anchor_ratio"] == "mixed"
    assert resolve({"objective": "dapo"})["anchor_ratio"] is None  # no anchors: inert


def test_trainer_config_derives_the_same_defaults():
    from armorlab.train.trainer import ArmorLabConfig

    base = {"output_dir": "/tmp/unused-armorlab", "use_cpu": True, "bf16": False, "report_to": [],
            "per_device_train_batch_size": 16}
    args = ArmorLabConfig(**base, objective="armor", num_generations=16)
    assert args.alpha == 0.9375 and args.anchor_ratio == "mixed"
    args = ArmorLabConfig(**base, objective="dapo", anchor=True, num_generations=4)
    assert args.anchor_ratio == "behavior"


def test_paper_reset_schedule_is_one_line_in_yaml_and_on_the_cli(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("objective: armor\nref_reset_schedule: [[180, 1], [null, 0]]\n")
    assert load_config(path)["ref_reset_schedule"] == [[180, 1], [None, 0]]
    assert parse_overrides(["ref_reset_schedule=[[180, 1], [null, 0]]"]) == {"ref_reset_schedule": [[180, 1], [None, 0]]}


def test_dapo_preset_follows_the_dapo_paper():
    cfg = resolve({"objective": "dapo"})
    assert cfg["dynamic_sampling"] is True and cfg["dynamic_sampling_factor"] == 1
    assert (cfg["epsilon"], cfg["epsilon_high"], cfg["beta"], cfg["aggregation"]) == (0.2, 0.28, 0.0, None)
    off = resolve({"objective": "grpo"})
    assert off["dynamic_sampling"] is False and off["dynamic_sampling_factor"] is None
    assert resolve({"objective": "dapo", "dynamic_sampling": False, "dynamic_sampling_factor": 3}) == \
        resolve({"objective": "dapo", "dynamic_sampling": False})


def test_gate_only_control_is_dapo_with_the_identical_gate_and_no_anchor():
    plans = expand(load_spec(ROOT / "sweeps" / "armor_anchor_controls.yaml"))
    by_seed0 = [p.config for p in plans if p.config["seed"] == 0]
    full = next(c for c in by_seed0 if c["objective"] == "armor" and c["anchor"] and c["anchor_gate"]
                and c["anchor_filter"] == "correct" and c["anchor_ratio"] == "mixed")
    gate_only = [c for c in by_seed0 if c["objective"] == "dapo"]
    assert len(gate_only) == 1
    g = gate_only[0]
    assert g["anchor"] is False and g["anchor_gate"] is True and g["alpha"] is None
    gate_keys = ("anchor_samples", "anchor_reward_threshold", "ref_reset_steps", "ref_reset_schedule",
                 "dynamic_sampling", "epsilon", "epsilon_high", "max_steps", "task", "model", "learning_rate")
    assert {k: g[k] for k in gate_keys} == {k: full[k] for k in gate_keys}
    assert not any(c["objective"] == "armor" and not c["anchor"] and c["anchor_gate"] for c in by_seed0)


@pytest.mark.parametrize("name", ["armor_alpha", "armor_anchor_controls", "armor_reset", "armor_vs_baselines",
                                  "clip_bounds", "up_offpolicy"])
def test_tiny_sweeps_scale_tau_below_their_length(name):
    # the paper's τ = 160 would give at most one reset in a 200-step tiny run
    for plan in expand(load_spec(ROOT / "sweeps" / f"{name}.yaml")):
        cfg = plan.config
        if cfg["objective"] == "armor" and cfg["ref_reset_schedule"] is None and cfg["ref_reset_steps"]:
            assert cfg["ref_reset_steps"] * 2 <= cfg["max_steps"], (name, plan.point)
