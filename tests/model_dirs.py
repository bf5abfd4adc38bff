"""Stand-in Hugging Face model directories for tests that never load the weights: what
``save_pretrained`` leaves, in formats armorlab's pre-load check (armorlab.core.model_dir) accepts."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def safetensors_bytes(payload: bytes = b"\0" * 64) -> bytes:
    """A well-formed safetensors file holding no tensor, ``payload`` after its header (so two
    payloads give two files of one size with different bytes)."""
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    return struct.pack("<Q", len(header)) + header + payload


def fake_model_dir(path: Path, *, model_type: str = "qwen2", payload: bytes = b"\0" * 64,
                   config: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or {"model_type": model_type, "hidden_size": 64}))
    (path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (path / "model.safetensors").write_bytes(safetensors_bytes(payload))
    return path
