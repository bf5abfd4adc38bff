"""Issue 25 §2 under FSDP 2 on 2 CPU processes (gloo), run by tests/test_fsdp.py as
``torchrun --nproc_per_node 2 THIS_FILE OUT [nosync]``.

The models are sharded as accelerate's FSDP 2 shards the policy (``fully_shard`` on each decoder
layer, then the root) and as the trainer shards π_ref (``reference.shard_per_layer``, the same, with
``reshard_after_forward=True`` passed as accelerate's plugin passes it — not TRL's root-only
``prepare_fsdp`` under FSDP 2's auto setting, which kept π_ref gathered and hid the per-token
gathers): every forward of either gathers parameters from both processes, so both must run the
same forwards.

1. anchors: process 0 has 3 prompts that the reference never solves (k = 4: three adaptive rounds
   of draws), process 1 has its 2 prompts in the anchor cache (nothing to draw); the cache is
   shared, so process 0's 3 new draws reach process 1's cache;
2. the exact-KL probe with 5 sequences on process 0 and none on process 1, validation-style
   generation of the policy with 3 prompts against 1;
3. a π_ref reset after an optimizer step, with every whole-tensor gather disabled (local shards);
4. the push of the sharded π_ref into each process's engine (a stand-in that copies what it gets
   into plain tensors as vLLM's weight loader does) and from process 0 to a server (a stand-in client).

``nosync`` runs (1) without the processes' sync, as before issue 25: it hangs (the caller's timeout).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch


def shard_like_armorlab_reference(model):
    from armorlab.train.reference import shard_per_layer

    return shard_per_layer(model, reshard_after_forward=True).eval()  # as the trainer's _prepare_reference


class EngineStandIn:
    """What the push needs of a vLLM ``LLM``: ``collective_rpc("reload_weights", weights_iterator=...)``
    copying each tensor into the engine's own plain tensor (``param.data.copy_(loaded)``, vLLM's
    default weight loader), and ``reset_prefix_cache``."""

    def __init__(self, plain_model):
        self.params = dict(plain_model.named_parameters())
        self.streamed = None
        self.resets = 0

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights"
        weights = kwargs["weights_iterator"]
        self.streamed = not isinstance(weights, (list, tuple, dict))
        for name, tensor in weights:
            self.params[name].data.copy_(tensor)

    def reset_prefix_cache(self):
        self.resets += 1


class ClientStandIn:
    def __init__(self):
        self.meta, self.tensors, self.resets = None, {}, 0

    def update_named_params(self, meta, named):
        self.meta = meta
        for name, tensor in named:
            assert type(tensor) is torch.Tensor, type(tensor)
            self.tensors[name] = tensor.clone()

    def reset_prefix_cache(self):
        self.resets += 1


def main(out: str, mode: str) -> None:
    import functools

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from armorlab.train import anchors as anc
    from armorlab.train.evaluation import sequence_exact_kl
    from armorlab.train.models import prepare_model
    from armorlab.train.reference import ReferencePolicy, full_state_dict
    from armorlab.train.vllm_reference import VLLMReferenceSampler, VLLMServerReferenceSampler
    from tests.fsdp_support import shard as shard_like_accelerate  # each layer, then the model
    from tests.trainer_support import model_cache, resolved

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    cfg = resolved()
    path = prepare_model(cfg["model"], cfg["task"], cache_dir=model_cache())
    tok = AutoTokenizer.from_pretrained(path)
    policy = shard_like_accelerate(AutoModelForCausalLM.from_pretrained(path))
    ref = shard_like_armorlab_reference(AutoModelForCausalLM.from_pretrained(path)).requires_grad_(False)
    sync = None if mode == "nosync" else functools.partial(anc.max_over_processes, device="cpu")
    gen = GenerationConfig(max_new_tokens=4, do_sample=True, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id, disable_compile=True)
    result: dict = {}

    # 1. anchors: process 1's prompts are all cached
    sampler = anc.TransformersSampler(ref, tok, gen, [tok.eos_token_id], batch_size=2, sync=sync)
    never = lambda requests, samples: [[0.0] * len(s) for s in samples]  # noqa: E731 - unsolvable prompts
    rollout = anc.AnchorRollout(sampler, never, k=4, anchor_filter="correct", threshold=1.0, sync=sync,
                                adaptive=True, share=anc.all_processes)
    texts = ["12+34=", "5+6=", "70+8="] if rank == 0 else ["9+9=", "1+2="]
    reqs = [anc.GroupRequest(t, tok(t)["input_ids"]) for t in texts]
    if rank == 1:
        for t in texts:
            rollout.cache.put(anc.prompt_key(t), anc.ReferenceDraw([anc.Completion((5,), "x")], [1.0]))
    outcomes, generated = rollout.run(reqs, seed=0, step=0)
    result["anchors"] = {"generated": generated, "rounds": rollout.rounds, "generate_calls": sampler.generate_calls,
                         "cached": [o.cached for o in outcomes], "cache": len(rollout.cache)}
    if mode == "nosync":
        dist.barrier()
        Path(out, f"result-r{rank}.json").write_text(json.dumps(result))
        return

    # 2. probe and validation-style generation with unequal rows
    ids = [tok(t)["input_ids"] for t in texts] if rank == 0 else []
    comps = [[anc.Completion(tuple(tok(str(i))["input_ids"][-1:]) + (tok.eos_token_id,), str(i))] for i in range(len(ids))]
    ids, comps = (ids + ids[:2], comps + comps[:2]) if rank == 0 else (ids, comps)  # 5 sequences vs 0
    total, count = sequence_exact_kl(policy, ref, ids, comps, temperature=1.0, pad_token_id=tok.pad_token_id,
                                     batch_size=2, sync=sync)
    result["probe"] = {"count": count, "finite": bool(torch.isfinite(torch.tensor(total)))}
    val = anc.TransformersSampler(policy, tok, gen, [tok.eos_token_id], batch_size=2, sync=sync)
    samples = val.sample([tok(t)["input_ids"] for t in (texts if rank == 0 else texts[:1])], 2)
    result["validation"] = {"prompts": len(samples), "generate_calls": val.generate_calls}

    # 3. reset by local shards after one optimizer step
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    batch = torch.randint(3, 60, (2, 12), generator=torch.Generator().manual_seed(rank))
    policy(input_ids=batch, labels=batch).loss.backward()
    opt.step()
    before = full_state_dict(ref)
    gathers = []
    original_full, original_redistribute = DTensor.full_tensor, DTensor.redistribute
    DTensor.full_tensor = lambda self, *a, **k: gathers.append("full_tensor") or original_full(self, *a, **k)
    DTensor.redistribute = lambda self, *a, **k: gathers.append("redistribute") or original_redistribute(self, *a, **k)
    try:
        ReferencePolicy(ref, ref_reset_steps=1).reset_from(policy, step=1)
    finally:
        DTensor.full_tensor, DTensor.redistribute = original_full, original_redistribute
    want, got = full_state_dict(policy), full_state_dict(ref)
    result["reset"] = {"equal": all(torch.equal(want[k], got[k]) for k in want),
                       "moved": any(not torch.equal(before[k], want[k]) for k in want), "gathers": gathers,
                       "sharded": all(isinstance(p, DTensor) for p in ref.parameters())}

    # 4. pushes of the sharded π_ref
    plain = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        old_style = None
        try:  # what was pushed before: state_dict() values, DTensors
            next(iter(dict(plain.named_parameters()).values())).data.copy_(next(iter(ref.state_dict().values())))
        except RuntimeError as exc:
            old_style = str(exc)
    result["old_push_error"] = old_style
    engine = EngineStandIn(plain)
    colocated = VLLMReferenceSampler(engine, tok, {"max_tokens": 4}, [tok.eos_token_id])
    colocated.sync_from(ref)
    result["colocate_push"] = {"streamed": engine.streamed, "resets": engine.resets,
                               "equal": all(torch.equal(p, got[name]) for name, p in engine.params.items())}
    client = ClientStandIn()
    server = VLLMServerReferenceSampler(client, tok, {"max_tokens": 4}, [tok.eos_token_id], pushes=rank == 0,
                                        barrier=dist.barrier)
    server.sync_from(ref)
    if rank == 0:
        shapes = {name: shape for name, _, shape in client.meta}
        result["server_push"] = {
            "equal": sorted(client.tensors) == sorted(n for n, _ in ref.named_parameters())
            and all(torch.equal(t, got[n]) for n, t in client.tensors.items()),
            "meta_full_shapes": all(shapes[n] == list(got[n].shape) for n in shapes), "resets": client.resets}
    Path(out, f"result-r{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "sync")
