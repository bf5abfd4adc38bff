"""A reference reset copies the full weights of an FSDP-2-sharded policy into a sharded π_ref, and
the checkpointed π_ref is the whole model: 2 CPU processes over gloo (tests/fsdp_support.py says
why this shards with torch directly rather than through accelerate)."""

from __future__ import annotations

import json

from tests.test_equivalence import HERE, torchrun


def test_reference_reset_of_a_sharded_policy_copies_full_weights(tmp_path):
    import torch
    from safetensors.torch import load_file

    from tests.trainer_support import resolved, tokenizer_for

    tokenizer_for(resolved())  # build the cached tiny model here, not in two processes at once
    proc = torchrun(2, str(HERE / "fsdp_support.py"), str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"result-r{rank}.json").read_text())
        assert result == {"keys_match": True, "reset_equal": True, "moved": True, "sharded": True,
                          "local_smaller": True, "loaded_equal": True}, (rank, result)
    saved = load_file(tmp_path / "checkpoint-1" / "reference.safetensors")
    policy = torch.load(tmp_path / "policy.pt")
    assert sorted(saved) == sorted(policy)
    for k, v in policy.items():
        assert saved[k].shape == v.shape and torch.equal(saved[k], v), k  # whole tensors, not shards
