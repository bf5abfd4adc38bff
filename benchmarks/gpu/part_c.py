"""(c) FSDP 2 on one GPU with resets (``accelerate launch --config_file slurm/accelerate-fsdp2.yaml
--num_processes 1``): anchors from the transformers sampler, a reset every step.

Records whether FSDP is on and π_ref sharded (DTensors), the reset's equality (full state dicts),
the memory the reset adds over the step's (local shards: ≈ nothing, not a model), and what a push
would stream (whole plain tensors). accelerate turns FSDP on only on GPU-like devices: with
``--cpu`` the same script runs unsharded and says so.
"""

from __future__ import annotations

import math
import time

import common


def main() -> None:
    common.quiet()
    import torch
    from torch.distributed.tensor import DTensor
    from transformers import TrainerCallback

    from armorlab.train.hooks import ArmorLabCallback
    from armorlab.train.reference import full_parameters, full_state_dict
    from armorlab.train.trainer import ArmorLabTrainer

    cfg = common.armorlab_config("c", objective="armor", anchor=True, anchor_gate=True, anchor_samples=2,
                                 ref_reset_steps=1, max_steps=2, learning_rate=1e-4)
    trainer = ArmorLabTrainer(str(common.MODEL_DIR), [common.even_first_token], cfg, train_dataset=common.dataset(32))
    checks: list[dict] = []
    cuda = torch.cuda.is_available() and not common.CPU

    class BeforeReset(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                common.sync()
                torch.cuda.reset_peak_memory_stats()
                checks.append({"step": state.global_step, "allocated_gib": torch.cuda.memory_allocated() / 2**30})

    class AfterReset(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if trainer.reference.last_reset_step != state.global_step:
                return
            entry = checks[-1] if cuda else {"step": state.global_step}
            if cuda:
                common.sync()
                entry["reset_extra_gib"] = round(torch.cuda.max_memory_allocated() / 2**30 - entry.pop("allocated_gib"), 3)
            want = full_state_dict(trainer.accelerator.unwrap_model(trainer.model))
            got = full_state_dict(trainer.ref_model)
            entry["equal"] = sorted(want) == sorted(got) and all(torch.equal(want[k].cpu(), got[k].cpu()) for k in want)
            entry["push_plain_tensors"] = all(type(t) is torch.Tensor for _, t in full_parameters(trainer.ref_model))
            if not cuda:
                checks.append(entry)

    callbacks = trainer.callback_handler.callbacks
    callbacks.insert(next(i for i, c in enumerate(callbacks) if isinstance(c, ArmorLabCallback)), BeforeReset())
    trainer.add_callback(AfterReset())
    started = time.perf_counter()
    trainer.train()
    common.sync()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    sharded = all(isinstance(p, DTensor) for p in trainer.ref_model.parameters())
    model_gib = sum(p.numel() * p.element_size() for p in trainer.ref_model.parameters()) / 2**30
    ok = (len(losses) == 2 and all(math.isfinite(x) for x in losses) and trainer.reference.resets == 2
          and len(checks) == 2 and all(c["equal"] and c["push_plain_tensors"] for c in checks)
          and (sharded or not cuda))
    result = {"status": "PASS" if ok else "FAIL", "fsdp": trainer.is_fsdp_enabled, "ref_sharded": sharded,
              "ref_model_gib": round(model_gib, 3), "seconds": round(time.perf_counter() - started, 1),
              "peak_gib": common.peak_gib()}
    if not cuda:
        result["note"] = "accelerate enables FSDP only on GPUs: ran unsharded"
    for c in checks:
        result.update({f"reset{c['step']}_{k}": v for k, v in c.items() if k != "step"})
    common.report("c", result)


if __name__ == "__main__":
    main()
