"""A real-checkpoint-like model built in code: Qwen2 architecture, byte-level BPE tokenizer with
a ChatML chat template, saved with ``save_pretrained`` — what a user's local checkpoint looks like,
in a few hundred KB and without a download.

``python tests/checkpoint_support.py DIR`` writes one (docs/training.md, "Your own model and data").
"""

from __future__ import annotations

import sys
from pathlib import Path

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "What is 12 + 30? The answer is \\boxed{42}.", "Compute 7 * 6. So the result is \\boxed{42}.",
    "Solve for x: 2x = 10, x = \\boxed{5}", "The sum of 1/2 and 1/4 is \\boxed{\\frac{3}{4}}.",
    "Put your final answer within \\boxed{}.", "system user assistant", "0123456789 + - * / = ( )",
]


def tokenizer(chat_template: bool = True):
    """A byte-level BPE tokenizer (the GPT-2/Qwen family's kind) trained on a few lines, in code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>" if chat_template else "<|endoftext|>",
                                   pad_token="<|endoftext|>", bos_token=None)
    if chat_template:
        fast.chat_template = CHATML
    return fast


def build(out_dir: str | Path, *, chat_template: bool = True, seed: int = 0) -> Path:
    """Save a randomly initialised tiny Qwen2ForCausalLM and its tokenizer to ``out_dir``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    tok = tokenizer(chat_template)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "tiny-qwen2"))
