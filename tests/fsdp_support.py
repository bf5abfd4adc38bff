"""Issue 9 §2: a reference reset copies the FULL weights of a sharded policy (FSDP 2), run by
tests/test_fsdp.py as ``torchrun --nproc_per_node 2 THIS_FILE OUT`` (2 CPU processes, gloo).

accelerate turns FSDP on only for GPU-like devices (its CPU path, MULTI_CPU, never takes the
FSDP branch), so the trainer cannot run FSDP on this machine. This script shards the tiny model
exactly as accelerate's FSDP 2 does (``fully_shard`` on each decoder layer, then the root) with
torch directly, trains the policy one SGD step, and runs armorlab's reset and reference
checkpoint code on the sharded models.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch


def shard(model):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def main(out: str) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from armorlab.train.models import prepare_model
    from armorlab.train.reference import ReferencePolicy, full_state_dict
    from tests.trainer_support import model_cache, resolved

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = resolved()
    path = prepare_model(cfg["model"], cfg["task"], cache_dir=model_cache())
    policy = shard(AutoModelForCausalLM.from_pretrained(path))
    reference = ReferencePolicy(shard(AutoModelForCausalLM.from_pretrained(path)), ref_reset_steps=1)
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    ids = torch.randint(3, 60, (2, 12), generator=torch.Generator().manual_seed(rank))
    policy(input_ids=ids, labels=ids).loss.backward()
    opt.step()

    before = full_state_dict(reference.model)
    reference.reset_from(policy, step=1)
    want, got = full_state_dict(policy), full_state_dict(reference.model)
    params = list(reference.model.parameters())
    reference.save(Path(out) / "checkpoint-1", write=rank == 0)  # a collective: every process
    fresh = ReferencePolicy(shard(AutoModelForCausalLM.from_pretrained(path)), ref_reset_steps=1)
    dist.barrier()
    fresh.load(Path(out) / "checkpoint-1")
    loaded = full_state_dict(fresh.model)
    result = {
        "keys_match": sorted(want) == sorted(got) == sorted(loaded),
        "reset_equal": all(torch.equal(want[k], got[k]) for k in want),
        "moved": any(not torch.equal(before[k], want[k]) for k in want),
        "sharded": all(hasattr(p, "to_local") for p in params),
        "local_smaller": sum(p.to_local().numel() for p in params) < sum(p.numel() for p in params),
        "loaded_equal": all(torch.equal(want[k], loaded[k]) for k in want),
    }
    if rank == 0:
        torch.save({k: v.cpu() for k, v in want.items()}, Path(out) / "policy.pt")
    Path(out, f"result-r{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
