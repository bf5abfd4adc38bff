"""Measuring allocated bytes on CPU, where ``torch.cuda.max_memory_allocated`` does not exist and
``tracemalloc`` does not see torch's allocations: :class:`PeakBytes` follows every tensor storage an
op creates inside the block (a TorchDispatchMode, as torch.distributed._tools.mem_tracker does) and
drops it once no tensor holds it (a StorageWeakRef expires), so ``peak`` is the most bytes alive at
once. Storages that existed before (parameters, inputs, preallocated gradients) are not counted.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class PeakBytes(TorchDispatchMode):
    def __init__(self, *existing) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.ignore: set[int] = set()
        for obj in tree_flatten(list(existing))[0]:
            tensors = [*obj.parameters(), *obj.buffers()] if isinstance(obj, torch.nn.Module) else [obj]
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    self.ignore.add(StorageWeakRef(t.untyped_storage()).cdata)
        self.current = self.peak = 0

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.current -= self.live.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._sweep()  # storages freed since the last op
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                ref = StorageWeakRef(storage)
                if ref.cdata not in self.ignore and ref.cdata not in self.live:
                    self.live[ref.cdata] = (ref, storage.nbytes())
                    self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out


# --------------------------------------------------------------------------- scenarios
# Each runs one piece of training on CPU tensors (float32) and returns (measured peak bytes, the
# plan's formula for it) — the plan's GPU formulas with the CPU path's parameters (TRL's torch fold
# instead of its Triton kernel; every position scored).
def tiny_model():
    from armorlab.core.config import resolve
    from armorlab.core.plan_inputs import tiny_shape
    from armorlab.train.models import build_model, build_tokenizer

    cfg = resolve({})["model"]
    return build_model(cfg, build_tokenizer()).eval(), tiny_shape(cfg)


def qwen_55m():
    """A ~55 M-parameter Qwen2 (GQA, q/k/v biases) built in code."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from armorlab.core.plan_inputs import shape_from_config

    fields = dict(vocab_size=8000, hidden_size=768, intermediate_size=2048, num_hidden_layers=7, num_attention_heads=12,
                  num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False)
    config = Qwen2Config(**fields)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval(), shape_from_config({**fields, "model_type": "qwen2"}, name="q55m",
                                                                  source="code")


def _batch(vocab: int, rows: int, prompt: int, completion: int):
    torch.manual_seed(1)
    ids = torch.randint(1, vocab, (rows, prompt + completion))
    att = torch.ones_like(ids)
    att[0, :3] = 0  # a padded row: the attention takes a mask, as in TRL's left-padded batches
    labels = ids.masked_fill(att == 0, -100)
    labels[:, :-completion] = -100
    return ids, att, labels


def training_step(build, checkpointing: bool, rows: int = 2, prompt: int = 16, completion: int = 48):
    """Forward + backward of a micro-batch through TRL's fused log-prob head: ((after the forward,
    its formula), (peak, its formula)); the gradients exist before (a resident line of the plan)."""
    from trl.trainer.utils import add_fused_lm_head

    from armorlab.core import memory_plan as mp

    model, shape = build()
    model.float().train()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids, att, labels = _batch(shape.vocab_size, rows, prompt, completion)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with PeakBytes(model, ids, att, labels, [p.grad for p in model.parameters()]) as bytes_:
        out = model(input_ids=ids, attention_mask=att, labels=labels, fused_lm_head=True)
        after_forward = bytes_.current
        out.log_probs.sum().backward()
    tokens, scored = rows * (prompt + completion), rows * (prompt + completion - 1)  # the CPU path scores all
    stored = (mp.training_activation_bytes(shape, tokens, 4, checkpointing)
              + mp.attention_mask_bytes(rows, prompt + completion))
    head = (mp.logprob_tile_bytes(scored, shape.vocab_size, 4, triton=False, backward=True)
            + mp.fused_head_backward_bytes(scored, shape.vocab_size, shape.hidden_size, 4, 4))
    layers = mp.backward_peak_bytes(shape, tokens, 4, checkpointing)
    return (after_forward, stored), (bytes_.peak, stored + max(head, layers))


def scoring(build, rows: int = 2, prompt: int = 16, completion: int = 48):
    """A no-grad forward through the fused head (TRL's old / π_ref log-probs)."""
    from trl.trainer.utils import add_fused_lm_head

    from armorlab.core import memory_plan as mp

    model, shape = build()
    model.float()
    add_fused_lm_head(model)
    ids, att, labels = _batch(shape.vocab_size, rows, prompt, completion)
    with PeakBytes(model, ids, att, labels) as bytes_, torch.no_grad():
        model(input_ids=ids, attention_mask=att, labels=labels, fused_lm_head=True)
    tokens = rows * (prompt + completion)
    return bytes_.peak, (mp.forward_no_grad_bytes(shape, tokens, 4) + mp.attention_mask_bytes(rows, prompt + completion)
                         + mp.logprob_tile_bytes(tokens - rows, shape.vocab_size, 4, triton=False))


def generation(build, new: int, rows: int = 8, prompt: int = 16):
    """HF generate with sampling (temperature, top-p) and a forced length."""
    from armorlab.core import memory_plan as mp

    model, shape = build()
    model.float()
    torch.manual_seed(2)
    ids = torch.randint(4, shape.vocab_size, (rows, prompt))
    att = torch.ones_like(ids)
    att[0, :2] = 0
    with PeakBytes(model, ids, att) as bytes_, torch.no_grad():
        model.generate(input_ids=ids, attention_mask=att, max_new_tokens=new, min_new_tokens=new, do_sample=True,
                       top_p=0.95, temperature=1.0, pad_token_id=0, eos_token_id=1)
    return bytes_.peak, mp.generate_bytes(shape, rows, prompt, new, 4)


def probe(build, rows: int = 4, completion: int = 60):
    """armorlab's exact-KL probe on one chunk of rows."""
    from armorlab.core import memory_plan as mp
    from armorlab.train.anchors import Completion
    from armorlab.train.evaluation import sequence_exact_kl

    model, shape = build()
    other, _ = build()
    model.float(), other.float()
    torch.manual_seed(3)
    prompts = [torch.randint(4, shape.vocab_size, (2,)).tolist() for _ in range(rows)]
    samples = [[Completion(tuple(torch.randint(4, shape.vocab_size, (completion,)).tolist()), "")] for _ in range(rows)]
    with PeakBytes(model, other) as bytes_:
        sequence_exact_kl(model, other, prompts, samples, temperature=1.0, pad_token_id=0, batch_size=rows)
    return bytes_.peak, mp.probe_chunk_bytes(shape, rows, 2, completion, 4)


def optimizer_state(build, dtype):
    """Gradients + a fused AdamW step: ((bytes left, formula), (peak, formula))."""
    from armorlab.core import memory_plan as mp

    model, shape = build()
    model.to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    with PeakBytes(model) as bytes_:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
    size = torch.finfo(dtype).bits // 8
    formula = shape.params * size + mp.adamw_state_bytes(shape.params, size)  # gradients + two moments
    return (bytes_.current, formula), (bytes_.peak, formula)
