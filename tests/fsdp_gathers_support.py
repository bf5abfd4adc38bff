"""Issue 38 §1 on 2 CPU processes (gloo), run by tests/test_fsdp.py as
``torchrun --nproc_per_node 2 THIS_FILE OUT``: all-gathers of a sharded π_ref, counted.

π_ref is sharded two ways: armorlab's (``reference.shard_per_layer``: each decoder layer, then
the root) and TRL's ``prepare_fsdp`` (root only, ``reshard_after_forward=True`` passed, as
accelerate's plugin does by default). The first draws 6 tokens through the anchor sampler (one
``generate`` call), the second through a plain ``generate`` (what the sampler did before), and
each runs one teacher-forced forward; every ``all_gather_single`` FSDP 2 issues
is recorded with its size (elements per process after the gather).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

NEW_TOKENS = 6


def count_gathers(fn):
    """(fn's result, sizes of the all-gathers it ran)."""
    import torch.distributed as dist

    sizes, original = [], dist.all_gather_single

    def counted(output_tensor, input_tensor, *args, **kwargs):
        sizes.append(int(output_tensor.numel()))
        return original(output_tensor, input_tensor, *args, **kwargs)

    dist.all_gather_single = counted
    try:
        return fn(), sizes
    finally:
        dist.all_gather_single = original


def main(out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from armorlab.train import anchors as anc
    from armorlab.train.models import prepare_model
    from armorlab.train.reference import decoder_layers, shard_per_layer
    from tests.trainer_support import model_cache, resolved

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    cfg = resolved()
    path = prepare_model(cfg["model"], cfg["task"], cache_dir=model_cache())
    tok = AutoTokenizer.from_pretrained(path)
    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=True,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, disable_compile=True)
    prompt = tok("12+34=")["input_ids"]
    result: dict = {}
    for how in ("per_layer", "trl_root"):
        model = AutoModelForCausalLM.from_pretrained(path).requires_grad_(False)
        whole = sum(p.numel() for p in model.parameters())
        layer = max(sum(p.numel() for p in m.parameters()) for m in decoder_layers(model))
        layers = len(decoder_layers(model))
        if how == "per_layer":
            shard_per_layer(model, reshard_after_forward=True)
        else:
            fully_shard(model, reshard_after_forward=True)
        model.eval()
        if how == "per_layer":  # the anchor sampler, as the trainer draws
            sampler = anc.TransformersSampler(model, tok, gen, [tok.eos_token_id], batch_size=2)
            drawn, gen_sizes = count_gathers(lambda s=sampler: s.sample([prompt], 1))  # noqa: B023
            completion = list(drawn[0][0].ids)
        else:  # a plain generate, as the sampler called it before
            ids = torch.tensor([prompt])
            drawn, gen_sizes = count_gathers(lambda m=model, i=ids: m.generate(  # noqa: B023
                input_ids=i, attention_mask=torch.ones_like(i), generation_config=gen))
            completion = drawn[0, len(prompt):].tolist()
        ids = torch.tensor([prompt + completion])
        _, fwd_sizes = count_gathers(lambda m=model, i=ids: m(input_ids=i))
        result[how] = {"layers": layers, "whole": whole, "layer": layer, "tokens": len(completion),
                       "generate": gen_sizes, "forward": fwd_sizes}
    Path(out, f"result-r{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
