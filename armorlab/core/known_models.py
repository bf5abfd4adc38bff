"""config.json shape fields of the papers' hub models, for planning memory where the checkpoint is
not on disk (offline: armorlab never downloads). A local directory or a cached hub snapshot always
wins (armorlab.core.plan_inputs.load_shape); these are looked up by hub id or by the directory's
last component (``/path/to/Qwen2.5-Math-7B``).

Every number below is copied from the model's published config.json (sources in the comments),
and the parameter count the plan derives from them is checked against the published weights' size
in tests/test_memory_plan.py.
"""

from __future__ import annotations

from typing import Any

KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    # ARMOR's main model (sweeps/paper/base.yaml). Source: config.json of Qwen/Qwen2.5-Math-7B as
    # re-published verbatim by https://huggingface.co/unsloth/Qwen2.5-Math-7B/blob/main/config.json
    # ("_name_or_path": "Qwen/Qwen2.5-Math-7B"); the same fields in every fine-tune of it read
    # (TIGER-Lab/Qwen2.5-Math-7B-CFT, sksq96/NuminaMath, zhimeng/Qwen-2.5-7B-Simple-RL). Its bf16
    # shards total 15.23 GB (unsloth/Qwen2.5-Math-7B tree: 4.88 + 4.93 + 4.33 + 1.09 GB) = 7.615 B params.
    "Qwen/Qwen2.5-Math-7B": {
        "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    # ARMOR's second model (sweeps/paper/armor_table1.yaml, armor_reset.yaml: Qwen3-8B-Base). Source:
    # config.json of Qwen/Qwen3-8B copied verbatim in
    # https://huggingface.co/thejaminator/qwen-hook-layer-9/commit/478fb720f1f3ced834fce0275b55b2732d438edc
    # ("Copy config.json from Qwen/Qwen3-8B"). The base checkpoint has the same architecture; its
    # config.json sets max_position_embeddings 32768 instead of 40960 (as read from
    # Qwen3-8B-Base/config.json in public training notes, e.g. the code search's "Qwen3-8B-Base/config.json
    # 的 max_position_embeddings=32768"); no other field differs.
    "Qwen/Qwen3-8B": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "attention_bias": False, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3-8B-Base": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "attention_bias": False, "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
}


def known_config(name: str) -> tuple[str, dict[str, Any]] | None:
    """(hub id, config fields) for a hub id or a path whose last component names a known model."""
    if name in KNOWN_CONFIGS:
        return name, KNOWN_CONFIGS[name]
    tail = name.rstrip("/").rsplit("/", 1)[-1].lower()
    for hub_id, fields in KNOWN_CONFIGS.items():
        if hub_id.rsplit("/", 1)[-1].lower() == tail:
            return hub_id, fields
    return None
