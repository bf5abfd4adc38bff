"""Issue 39 §2–3: TRL's habits in a run config — ``loss_type`` names an objective, TRL's and
verl's parameter names are accepted, the entropy bonus is honoured — and the entropy equations
against TRL 1.16's statement of them."""

from __future__ import annotations

import pytest

from armorlab.core.config import resolve
from armorlab.core.runs import run_id
from armorlab.errors import ArmorLabError


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo", "bnpo", "grpo", "dr_grpo"])
def test_loss_type_selects_the_objective_and_the_resolved_config_says_which(loss_type):
    cfg = resolve({"loss_type": loss_type}, file="run.yaml")
    assert cfg["objective"] == loss_type and "loss_type" not in cfg
    assert run_id(cfg) == run_id(resolve({"objective": loss_type}))


def test_loss_type_cispo_brings_trl_recommended_epsilon_max():
    assert resolve({"loss_type": "cispo"})["epsilon_high"] == 5.0
    assert resolve({"loss_type": "cispo", "epsilon_high": 4.0})["epsilon_high"] == 4.0


@pytest.mark.parametrize("raw, key, words", [
    ({"loss_type": "ppo"}, "loss_type", "not an armorlab objective"),
    ({"loss_type": "sapo", "objective": "dapo"}, "loss_type", "another objective"),
    ({"loss_type": "grpo", "importance_sampling_level": "sequence"}, "importance_sampling_level", "token-level"),
    ({"objective": "dro"}, "dro_beta", "needs dro_beta"),
    ({"objective": "dro", "dro_beta": -1.0}, "dro_beta", "> 0"),
    ({"objective": "sapo", "sapo_temperature_pos": "hot"}, "sapo_temperature_pos", "number"),
    ({"objective": "cispo", "dual_clip": 3.0}, "dual_clip", "no dual clip"),
])
def test_bad_objective_keys_name_key_value_and_file(raw, key, words):
    with pytest.raises(ArmorLabError) as err:
        resolve(raw, file="run.yaml")
    assert err.value.key == key and words in str(err.value) and "run.yaml" in str(err.value)


def test_a_sequence_level_loss_type_takes_trl_importance_sampling_level():
    cfg = resolve({"loss_type": "luspo", "importance_sampling_level": "sequence"})
    assert cfg["objective"] == "luspo" and "importance_sampling_level" not in cfg


def test_parameters_are_filled_for_their_objective_and_dropped_for_others():
    sapo = resolve({"objective": "sapo", "sapo_temperature_neg": 2.0})
    assert (sapo["sapo_temperature_pos"], sapo["sapo_temperature_neg"]) == (1.0, 2.0)  # TRL's default, the user's
    cov = resolve({"objective": "clip_cov"})
    assert (cov["clip_cov_ratio"], cov["clip_cov_lb"], cov["clip_cov_ub"]) == (2e-4, 1.0, 5.0)  # verl's defaults
    dapo = resolve({"objective": "dapo", "clip_cov_ratio": 0.1, "sapo_temperature_pos": 3.0})
    assert "clip_cov_ratio" not in dapo and "sapo_temperature_pos" not in dapo
    assert run_id(dapo) == run_id(resolve({"objective": "dapo"}))  # inert: the same run


def test_entropy_bonus_fields_are_accepted_and_off_is_the_same_run():
    on = resolve({"entropy_coef": 0.01, "use_adaptive_entropy": True, "entropy_target": 0.5,
                  "top_entropy_quantile": 0.2})
    assert (on["entropy_coef"], on["use_adaptive_entropy"], on["entropy_target"], on["top_entropy_quantile"]) == (
        0.01, True, 0.5, 0.2)
    assert run_id(resolve({"entropy_coef": 0.0, "use_adaptive_entropy": False})) == run_id(resolve({}))


# --------------------------------------------------------------------------- entropy equations
def trl_bonus(entropies, mask, ga):
    """TRL 1.16 _compute_loss: (entropies · mask).sum() / mask.sum().clamp(min=1) / GA."""
    return (entropies * mask).sum() / mask.sum().clamp(min=1.0) / ga


def test_entropy_bonus_is_trl_formula_bit_for_bit():
    import torch

    from armorlab.algos.entropy import entropy_bonus

    g = torch.Generator().manual_seed(0)
    h = torch.rand(5, 7, generator=g) * 3
    mask = (torch.rand(5, 7, generator=g) > 0.3).float()
    for ga in (1.0, 4.0):
        assert torch.equal(entropy_bonus(h, mask, ga), trl_bonus(h, mask, ga))
    assert float(entropy_bonus(h, torch.zeros(5, 7), 1.0)) == 0.0


def test_adaptive_coefficient_follows_trl_rule():
    """TRL: c ← min(c + Δ, max) when the window's entropy ≤ target, else max(c − Δ, min); applied
    only while the last entropy ≤ target. Values by hand with Δ = 0.005, bounds [0, 0.012]."""
    from armorlab.algos.entropy import applied_entropy_coef, next_entropy_coef

    kw = {"target": 0.2, "delta": 0.005, "lo": 0.0, "hi": 0.012}
    c = 0.0
    trace = []
    for h in (0.1, 0.15, 0.2, 0.19, 0.5, 0.3, 0.35):
        c = next_entropy_coef(c, h, **kw)
        trace.append(round(c, 9))
    assert trace == [0.005, 0.01, 0.012, 0.012, 0.007, 0.002, 0.0]
    assert applied_entropy_coef(0.01, float("inf"), adaptive=True, target=0.2) == 0.0  # TRL: no bonus before a measurement
    assert applied_entropy_coef(0.01, 0.2, adaptive=True, target=0.2) == 0.01
    assert applied_entropy_coef(0.01, 0.9, adaptive=False, target=0.2) == 0.01


# --------------------------------------------------------------------------- they train
@pytest.mark.slow
def test_loss_type_cispo_with_an_adaptive_entropy_bonus_trains(tmp_path):
    """A tiny run of `loss_type: cispo` with TRL's adaptive entropy bonus and entropy mask at GA 2:
    the weights move, the coefficient is logged per optimiser step and moves by Δ toward the
    target (the tiny model's entropy, ≈ 0.3 nats, is below a target of 5)."""
    import torch

    from tests.trainer_support import build, resolved

    cfg = resolved(loss_type="cispo", entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=5.0,
                   top_entropy_quantile=0.5, gradient_accumulation_steps=2, steps_per_generation=2, max_steps=2)
    assert cfg["objective"] == "cispo" and cfg["epsilon_high"] == 5.0
    trainer = build(tmp_path, cfg)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters(), strict=True))
    coefs = [row["obj/entropy_coef"] for row in trainer.state.log_history if "obj/entropy_coef" in row]
    assert coefs == pytest.approx([0.015, 0.02])
