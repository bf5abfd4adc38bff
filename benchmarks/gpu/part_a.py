"""(a) bf16 ArmorLabTrainer with anchors, the gate, r_mix, β ≠ 0 and gradient checkpointing; after each
reset π_ref must equal the policy: weights and the eval-path log-probs, exactly.

The paper's load: bf16 weights (``model_init_kwargs``) with the LM head in fp32
(``cast_lm_head_to_fp32``), bf16 autocast. A callback added after armorlab's own runs right after
each reset and compares π_ref with the policy; it also records the train-path noise floor (policy
in train mode with gradient checkpointing, against π_ref), not gated.
"""

from __future__ import annotations

import math
import time

import common


def main() -> None:
    common.quiet()
    import torch
    from transformers import AutoTokenizer, TrainerCallback

    from armorlab.train.trainer import ArmorLabTrainer

    tok = AutoTokenizer.from_pretrained(common.MODEL_DIR)
    tau = 1 if common.CPU else 2  # two resets either way (CPU: in 2 steps instead of 4)
    cfg = common.armorlab_config("a", objective="armor", anchor=True, anchor_gate=True, anchor_samples=2,
                                 ref_reset_steps=tau, beta=0.01, max_steps=2 * tau, learning_rate=1e-4,
                                 model_init_kwargs={"dtype": "bfloat16"}, cast_lm_head_to_fp32=True,
                                 gradient_checkpointing=True)
    trainer = ArmorLabTrainer(str(common.MODEL_DIR), [common.even_first_token], cfg,
                              train_dataset=common.dataset(64))
    fixed = tok([" ".join(common.prompts(1, seed=100 + i)) for i in range(8)], padding=True, padding_side="left",
                return_tensors="pt")
    checks: list[dict] = []

    class AfterReset(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if trainer.reference.last_reset_step != state.global_step:
                return
            policy = trainer.accelerator.unwrap_model(trainer.model)
            ref = trainer.ref_model
            pol, refs = dict(policy.named_parameters()), dict(ref.named_parameters())
            weight_gap = max(float((pol[k].detach().float() - refs[k].float()).abs().max()) for k in pol)
            ids = fixed["input_ids"].to(trainer.accelerator.device)
            att = fixed["attention_mask"].to(trainer.accelerator.device)
            width = ids.size(1) // 2
            was = policy.training
            policy.eval()
            with torch.no_grad():
                mine, _, _ = trainer._get_per_token_logps_and_entropies(policy, ids, att, width)
                theirs, _, _ = trainer._get_per_token_logps_and_entropies(ref, ids, att, width)
            policy.train()
            with torch.enable_grad():  # the training path: train mode, gradient checkpointing, grad on
                train_path, _, _ = trainer._get_per_token_logps_and_entropies(policy, ids, att, width)
            policy.train(was)
            noise = (train_path.detach().float() - theirs.float()).abs()
            checks.append({
                "step": state.global_step, "keys_equal": sorted(pol) == sorted(refs), "weight_max_abs_diff": weight_gap,
                "eval_logp_max_abs_diff": float((mine.float() - theirs.float()).abs().max()),
                "train_logp_max_abs_diff": float(noise.max()), "train_logp_mean_abs_diff": float(noise.mean()),
                "lm_head_dtypes": f"{pol['lm_head.weight'].dtype}/{refs['lm_head.weight'].dtype}",
                "ref_requires_grad": any(p.requires_grad for p in ref.parameters()), "ref_training": ref.training,
                "ref_gradient_checkpointing": bool(getattr(ref, "is_gradient_checkpointing", False)),
                "policy_gradient_checkpointing": bool(getattr(policy, "is_gradient_checkpointing", False)),
            })

    trainer.add_callback(AfterReset())  # after ArmorLabCallback: right after its reset
    started = time.perf_counter()
    trainer.train()
    common.sync()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    logged = {k: v for h in trainer.state.log_history for k, v in h.items()
              if k in ("anchor/rate", "anchor/gate_drop", "anchor/draws_per_anchor", "obj/mix_ratio_mean",
                       "obj/beta_kl", "kl/reverse_k3")}
    exact = all(c["weight_max_abs_diff"] == 0 and c["eval_logp_max_abs_diff"] == 0 and c["keys_equal"]
                for c in checks)
    ok = (len(losses) == 2 * tau and all(math.isfinite(x) for x in losses) and trainer.reference.resets == 2
          and len(checks) == 2 and exact and not any(c["ref_requires_grad"] or c["ref_training"] for c in checks))
    result = {"status": "PASS" if ok else "FAIL", "losses": len(losses), "resets": trainer.reference.resets,
              "seconds": round(time.perf_counter() - started, 1), "peak_gib": common.peak_gib(),
              **{f"last_{k}": v for k, v in logged.items()}}
    for c in checks:
        result.update({f"reset{c['step']}_{k}": v for k, v in c.items() if k != "step"})
    common.report("a", result)


if __name__ == "__main__":
    main()
