"""(c) FSDP 2 on one GPU with resets (``accelerate launch --config_file slurm/accelerate-fsdp2.yaml
--num_processes 1``): anchors from the transformers sampler, a reset every step.

Records whether FSDP is on and π_ref sharded (DTensors), the reset's equality (full state dicts),
the memory the reset adds over the step's (local shards: ≈ nothing, not a model), and what a push
would stream (whole plain tensors), and the all-gathers FSDP runs inside each anchor draw call
and each π_ref scoring forward (issue 38 §1: sharded per layer, a call gathers each layer once, at
most layers + 1 with the root, not the whole model per generated token). accelerate turns FSDP on
only on GPU-like devices: with ``--cpu`` the same script runs unsharded (no gathers) and says so.
"""

from __future__ import annotations

import contextlib
import math
import time

import common


@contextlib.contextmanager
def gathers_counted(counts: list[int]):
    """Append the number of all-gathers run inside the block (FSDP 2's collective is
    ``all_gather_single`` or, in older torch, ``all_gather_into_tensor``; nested calls count once)."""
    import torch.distributed as dist

    names = [n for n in ("all_gather_single", "all_gather_into_tensor") if hasattr(dist, n)]
    originals = {n: getattr(dist, n) for n in names}
    seen, depth = [0], [0]

    def wrap(fn):
        def counted(*args, **kwargs):
            seen[0] += depth[0] == 0
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
        return counted

    for n in names:
        setattr(dist, n, wrap(originals[n]))
    try:
        yield
    finally:
        for n, fn in originals.items():
            setattr(dist, n, fn)
        counts.append(seen[0])


def counting(obj, method: str, counts: list[int]) -> None:
    """Count the all-gathers of every call of ``obj.method`` (an instance attribute wrapper)."""
    original = getattr(obj, method)

    def counted(*args, **kwargs):
        with gathers_counted(counts):
            return original(*args, **kwargs)

    setattr(obj, method, counted)


def main() -> None:
    common.quiet()
    import torch
    from torch.distributed.tensor import DTensor
    from transformers import TrainerCallback

    from armorlab.train.hooks import ArmorLabCallback
    from armorlab.train.reference import decoder_layers, full_parameters, full_state_dict
    from armorlab.train.trainer import ArmorLabTrainer

    cfg = common.armorlab_config("c", objective="armor", anchor=True, anchor_gate=True, anchor_samples=2,
                                 ref_reset_steps=1, max_steps=2, learning_rate=1e-4)
    trainer = ArmorLabTrainer(str(common.MODEL_DIR), [common.even_first_token], cfg, train_dataset=common.dataset(32))
    checks: list[dict] = []
    cuda = torch.cuda.is_available() and not common.CPU
    draw_gathers: list[int] = []
    forward_gathers: list[int] = []
    counting(trainer.reference_sampler, "sample", draw_gathers)
    counting(trainer, "_add_reference_logps", forward_gathers)

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
    layers = len(decoder_layers(trainer.accelerator.unwrap_model(trainer.ref_model)))
    per_call = max(draw_gathers + forward_gathers, default=0)
    ok = (len(losses) == 2 and all(math.isfinite(x) for x in losses) and trainer.reference.resets == 2
          and len(checks) == 2 and all(c["equal"] and c["push_plain_tensors"] for c in checks)
          and (sharded or not cuda) and bool(draw_gathers) and per_call <= layers + 1)
    result = {"status": "PASS" if ok else "FAIL", "fsdp": trainer.is_fsdp_enabled, "ref_sharded": sharded,
              "ref_model_gib": round(model_gib, 3), "seconds": round(time.perf_counter() - started, 1),
              "peak_gib": common.peak_gib(), "layers": layers, "draw_calls": len(draw_gathers),
              "draw_gathers_max": max(draw_gathers, default=0), "forward_calls": len(forward_gathers),
              "forward_gathers_max": max(forward_gathers, default=0), "gathers_per_call_limit": layers + 1}
    if not cuda:
        result["note"] = "accelerate enables FSDP only on GPUs: ran unsharded"
    for c in checks:
        result.update({f"reset{c['step']}_{k}": v for k, v in c.items() if k != "step"})
    common.report("c", result)


if __name__ == "__main__":
    main()
