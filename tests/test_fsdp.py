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


def test_sharded_ranks_stay_in_step_reset_by_local_shards_and_push_whole_tensors(tmp_path):
    """Issue 25 §2 on 2 gloo processes (tests/fsdp_ranks_support.py says what each step does).

    Before: process 1, whose anchors were all cached, skipped sampling while process 0's sharded
    π_ref waited in its forward's all-gather (a hang: the script's ``nosync`` mode still does; the
    timeout turns a regression into a failure), a reset gathered the full model on every process,
    and the colocated push handed vLLM DTensors ("mixed torch.Tensor and DTensor").
    """
    import subprocess

    from tests.trainer_support import resolved, tokenizer_for

    tokenizer_for(resolved())
    try:
        proc = torchrun(2, str(HERE / "fsdp_ranks_support.py"), str(tmp_path), timeout=420)
    except subprocess.TimeoutExpired:
        raise AssertionError("the processes hung: one of them skipped a collective forward") from None
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"result-r{r}.json").read_text()) for r in (0, 1))
    # 1. process 0: 3 prompts × (1 + 1 + 2) draws, never correct; process 1 drew nothing but took part
    #    in all 3 rounds and in as many generate calls (chunks of 2 rows: 2 + 2 + 3 for 3, 3, 6 rows)
    #    (adaptive rounds); the shared cache hands process 0's 3 new draws to process 1 (2 + 3 keys)
    assert r0["anchors"] == {"generated": 12, "rounds": 3, "generate_calls": 7, "cached": [False] * 3, "cache": 3}
    assert r1["anchors"] == {"generated": 0, "rounds": 3, "generate_calls": 7, "cached": [True] * 2, "cache": 5}
    # 2. the probe counted process 0's 5 sequences (3 forwards of 2 rows; process 1 scored dummies)
    assert (r0["probe"], r1["probe"]) == ({"count": 5.0, "finite": True}, {"count": 0.0, "finite": True})
    assert r0["validation"] == {"prompts": 3, "generate_calls": 3} and r1["validation"] == {"prompts": 1,
                                                                                          "generate_calls": 3}
    for r in (r0, r1):
        # 3. π_ref equals the trained policy, copied without a single whole-tensor gather
        assert r["reset"] == {"equal": True, "moved": True, "gathers": [], "sharded": True}
        # 4. the old push's error, and the new one: streamed, whole plain tensors, equal to π_ref
        assert "mixed torch.Tensor and DTensor" in r["old_push_error"]
        assert r["colocate_push"] == {"streamed": True, "resets": 1, "equal": True}
    assert r0["server_push"] == {"equal": True, "meta_full_shapes": True, "resets": 1}
    assert "server_push" not in r1  # only process 0 talks to the server


def test_sharded_reference_gathers_each_layer_once_per_call_not_the_model_per_token(tmp_path):
    """Issue 38 §1: π_ref sharded per layer (reference.shard_per_layer) gathers each layer at most
    once per ``generate`` call and per forward, each gather at most one layer's (or the root's
    remaining) parameters. The same count on TRL's root-only sharding — the planted violation — finds
    one whole-model gather per generated token."""
    from tests.trainer_support import resolved, tokenizer_for

    tokenizer_for(resolved())
    proc = torchrun(2, str(HERE / "fsdp_gathers_support.py"), str(tmp_path), timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        r = json.loads((tmp_path / f"result-r{rank}.json").read_text())
        per_layer, trl = r["per_layer"], r["trl_root"]
        assert per_layer["tokens"] == trl["tokens"] == 6 and per_layer["layers"] >= 2
        limit = per_layer["layers"] + 1  # each layer once, plus the root's own parameters
        root_rest = per_layer["whole"] - per_layer["layers"] * per_layer["layer"]
        for call in ("generate", "forward"):
            sizes = per_layer[call]
            assert 0 < len(sizes) <= limit, (rank, call, sizes)
            # no gather holds more than a layer or the root's rest (embeddings, norm): never the model
            assert max(sizes) <= max(per_layer["layer"], root_rest) < per_layer["whole"], (rank, call, sizes)
        # gloo pads each shard to an even split: the whole model gathered ⇒ ≥ its element count
        assert len(trl["generate"]) >= trl["tokens"] and min(trl["generate"]) >= trl["whole"], (rank, trl)
