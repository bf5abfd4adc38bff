"""Adding an objective through the public API alone (issue 24 §2): one decorated function, seen by
the config layer without torch, trained for two steps by ArmorLabTrainer."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from armorlab import ArmorLabConfig, ArmorLabTrainer, objective_spec, policy_loss, register_objective, resolve
from armorlab.algos.objectives import Batch, Surrogate, clipped, token_log_ratio, unregister_objective
from armorlab.errors import ArmorLabError

CALLS: list[int] = []


@pytest.fixture
def toy():
    @register_objective("toy_sym", aggregation="token-mean", capacity="clipped", defaults={"epsilon": 0.1})
    def toy_sym(b: Batch) -> Surrogate:
        """A symmetric-clip PPO on the token ratio (ε_high := ε_low)."""
        CALLS.append(b.logp.shape[0])
        log_r = token_log_ratio(b.logp, b.old_logp)
        sym = Batch(**{**b.__dict__, "eps_high": b.eps_low})
        return clipped(sym, log_r.exp(), plain_log_ratio=log_r)

    yield toy_sym
    unregister_objective("toy_sym")


def test_the_config_layer_sees_a_registered_objective(toy):
    cfg = resolve({"objective": "toy_sym"})
    assert cfg["objective"] == "toy_sym" and cfg["epsilon"] == 0.1  # its preset
    spec = objective_spec("toy_sym")
    assert (spec.aggregation, spec.capacity, spec.sequence_level) == ("token-mean", "clipped", False)
    assert spec.doc == "A symmetric-clip PPO on the token ratio (ε_high := ε_low)."
    unregister_objective("toy_sym")
    with pytest.raises(ArmorLabError, match="objective"):
        resolve({"objective": "toy_sym"})


def test_a_registered_objective_computes_its_own_loss(toy):
    # ratio 1.3 on one token with A = +1: the symmetric clip at 1 + 0.1 binds (dapo's 1.28 would too),
    # ratio 1.05 on the other: inside; token-mean of −A·clamp(r) = −(1.1 + 1.05)/2
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.3, 1.05]])).requires_grad_(True)
    out = policy_loss("toy_sym", logp, old, torch.tensor([1.0]), torch.ones(1, 2), eps_low=0.1, eps_high=0.28)
    assert float(out.loss.detach()) == pytest.approx(-(1.1 + 1.05) / 2)
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.05 / 2])  # no gradient where the clip binds
    assert out.metrics["clip_frac_high"] == pytest.approx(0.5)


def test_registering_needs_valid_metadata():
    with pytest.raises(ValueError, match="aggregation"):
        register_objective("bad", aggregation="mean", capacity="clipped")
    with pytest.raises(ValueError, match="capacity"):
        register_objective("bad", aggregation="token-mean", capacity="unclipped")
    with pytest.raises(ValueError, match="already registered"):
        register_objective("dapo", aggregation="token-mean", capacity="clipped")(lambda b: None)


def test_the_registry_is_readable_without_torch():
    code = ("import sys\nfrom armorlab import objective_spec\nfrom armorlab.core.config import objective_choices\n"
            "print(objective_choices(), objective_spec('armor').uses_reference, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, uses_ref, torch_loaded = out.stdout.strip().rsplit(" ", 2)
    assert names.startswith("('grpo', 'dapo', 'dr_grpo', 'gspo', 'up', 'up_gspo', 'up_pure_is', 'up_self_anchored', 'armor', "
                            "'cispo'")
    assert (uses_ref, torch_loaded) == ("True", "False")


@pytest.mark.slow
def test_a_registered_objective_trains_two_steps(toy, tmp_path):
    from armorlab.tasks import build_task
    from armorlab.train.models import prepare_model
    from tests.trainer_support import model_cache

    task = build_task({"name": "arithmetic", "train_size": 8})
    model = prepare_model({"name": "tiny"}, {"name": "arithmetic"}, cache_dir=model_cache())
    args = ArmorLabConfig(output_dir=str(tmp_path), objective="toy_sym", max_steps=2, learning_rate=1e-3,
                          per_device_train_batch_size=16, num_generations=8, steps_per_generation=2,
                          max_completion_length=8, val_every=0, kl_probe_prompts=0, use_cpu=True, bf16=False,
                          report_to="none", save_strategy="no", logging_steps=1, gradient_checkpointing=False)
    assert args.epsilon == 0.2  # ArmorLabConfig takes TRL's ε; the preset is a resolve-time default
    trainer = ArmorLabTrainer(str(model), task.reward_funcs, args, train_dataset=task.train)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    CALLS.clear()
    trainer.train()
    assert trainer.state.global_step == 2 and CALLS  # the toy objective computed every training loss
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters(), strict=True))
    logged = [h for h in trainer.state.log_history if "obj/clip_frac" in h]
    assert len(logged) == 2
