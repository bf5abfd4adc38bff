"""π_ref's samples from a vLLM engine: :class:`VLLMReferenceSampler` behind the ``ReferenceSampler`` seam.

``ref_vllm_mode: colocate`` starts a second, in-process vLLM engine holding π_ref next to the
trainer (its own memory share, ``ref_vllm_memory``). All prompts of a step that need anchors go
to it in one ``generate`` call with ``n = k`` and the policy's sampling settings; prompts whose
draws are cached never reach it (``AnchorRollout`` filters them). At a reference reset the
policy's weights are pushed into the engine in place — no reload from disk — and its prefix
cache is cleared, so no KV block computed with the old π_ref is reused.

vLLM is imported lazily: armorlab imports without it, and asking for it without it installed
is an :class:`~armorlab.errors.ArmorLabError` naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from armorlab.errors import ArmorLabError
from armorlab.train.anchors import Completion, cut_at_eos
from armorlab.vllm.env import CPU_ENV, require_vllm


def sampling_kwargs(*, k: int, max_tokens: int, temperature: float, top_p: float, top_k: int | None,
                    min_p: float | None, repetition_penalty: float,
                    generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments: the policy's settings as TRL's colocate path builds them, n = k."""
    out = {"n": int(k), "repetition_penalty": repetition_penalty, "temperature": temperature, "top_p": top_p,
           "top_k": 0 if top_k is None else top_k, "min_p": 0.0 if min_p is None else min_p,
           "max_tokens": int(max_tokens)}
    out.update(generation_kwargs or {})
    return out


def completions(tokenizer: Any, token_ids: Iterable[Sequence[int]], eos_token_ids: Sequence[int]) -> list[Completion]:
    """One prompt's samples as :class:`Completion` s, each cut after its first eos."""
    ids = [cut_at_eos(list(t), eos_token_ids) for t in token_ids]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return [Completion(tuple(i), t) for i, t in zip(ids, texts, strict=True)]


class VLLMReferenceSampler:
    """:class:`~armorlab.train.anchors.ReferenceSampler` on a vLLM ``LLM`` holding π_ref.

    ``sampling`` are the ``SamplingParams`` keyword arguments except ``n`` (see
    :func:`sampling_kwargs`); ``prompts_sent`` counts the prompts sent to the engine.
    """

    def __init__(self, llm: Any, tokenizer: Any, sampling: dict[str, Any], eos_token_ids: Sequence[int]) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.sampling = {k: v for k, v in sampling.items() if k != "n"}
        self.eos_token_ids = list(eos_token_ids)
        self.prompts_sent = 0
        self.generate_calls = 0

    def sample(self, prompt_ids: Sequence[Sequence[int]], k: int) -> list[list[Completion]]:
        from vllm import SamplingParams

        if not prompt_ids:
            return []
        params = SamplingParams(n=int(k), **self.sampling)
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids], sampling_params=params,
                                    use_tqdm=False)
        self.prompts_sent += len(prompt_ids)
        self.generate_calls += 1
        return [completions(self.tokenizer, [c.token_ids for c in request.outputs], self.eos_token_ids)
                for request in outputs]

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """π_ref ← the given weights, in place in the engine, then clear its prefix cache.

        vLLM's ``reload_weights`` with a weights iterator goes through the model's own
        ``load_weights`` (name mapping, fused q/k/v and gate/up) and the backend's post-load
        repacking, which the direct ``model.load_weights`` TRL uses skips (fp32 on CPU breaks).
        """
        weights = [(name, t.detach().to("cpu").contiguous()) for name, t in named_tensors]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()

    def sync_from(self, model: Any) -> None:
        """Push ``model``'s weights (an unwrapped HF causal LM) into the engine."""
        self.load_weights(model.state_dict().items())


def reload_policy_sync(generation: Any) -> None:
    """Make TRL's colocate ``VLLMGeneration`` push the policy through ``reload_weights``.

    TRL writes each tensor with the model's ``load_weights``, which vLLM's CPU backend cannot take
    after it repacked the weights at start-up (``'Parameter' object has no attribute
    'weight_loader'``). ``reload_weights`` re-runs the loading and the repacking. The tensors come
    from TRL's own ``_iter_named_params`` (PEFT merge, gathering), copied before PEFT unmerges.
    Only installed on CPU: on GPU TRL's path stays as it is.
    """
    def sync_weights() -> None:
        weights = [(name, t.detach().to("cpu").clone()) for name, t in generation._iter_named_params()]
        generation.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights


def colocate_engine(model_path: str, *, memory_share: float, seed: int, max_model_len: int | None = None,
                    dtype: str = "auto", process_index: int = 0, local_process_index: int = 0,
                    num_processes: int = 1) -> Any:
    """An in-process vLLM ``LLM`` for π_ref, loaded from ``model_path`` (the policy's initial weights).

    Like TRL's colocate engine: ``external_launcher`` (one engine per training process, no worker
    processes), the rank variables vLLM reads, a free rendezvous port.
    """
    from trl.generation.vllm_generation import ensure_master_addr_port
    from vllm import LLM

    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    os.environ["RANK"] = str(process_index)
    os.environ["LOCAL_RANK"] = str(local_process_index)
    os.environ["WORLD_SIZE"] = str(num_processes)
    ensure_master_addr_port()
    return LLM(model=model_path, gpu_memory_utilization=memory_share, max_model_len=max_model_len, dtype=dtype,
               distributed_executor_backend="external_launcher", seed=seed, max_num_batched_tokens=4096,
               logprobs_mode="processed_logprobs", enable_prefix_caching=True)


def build_for_trainer(trainer: Any) -> VLLMReferenceSampler:
    """The ``ref_vllm_mode: colocate`` sampler of an ``ArmorLabTrainer`` (after TRL's set-up)."""
    args = trainer.args
    require_vllm("ref_vllm_mode", args.ref_vllm_mode)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    path = getattr(policy.config, "_name_or_path", None) or getattr(policy, "name_or_path", None)
    if not path:
        raise ArmorLabError("ref_vllm_mode needs a model loaded from a path or hub id (the engine loads it)",
                            key="ref_vllm_mode", value=args.ref_vllm_mode)
    acc = trainer.accelerator
    # the policy's dtype, not vLLM's "auto" (which runs an fp32 checkpoint in bf16): π_ref's samples
    # and the log-probs after a reset then match the trainer's model
    dtype = str(policy.dtype).removeprefix("torch.")
    llm = colocate_engine(str(path), memory_share=args.ref_vllm_memory, seed=args.seed + acc.process_index, dtype=dtype,
                          max_model_len=args.vllm_max_model_length, process_index=acc.process_index,
                          local_process_index=acc.local_process_index, num_processes=acc.num_processes)
    sampling = sampling_kwargs(k=1, max_tokens=trainer.max_completion_length, temperature=trainer.temperature,
                               top_p=trainer.top_p, top_k=trainer.top_k, min_p=trainer.min_p,
                               repetition_penalty=trainer.repetition_penalty,
                               generation_kwargs=args.generation_kwargs)
    return VLLMReferenceSampler(llm, trainer._tokenizer, sampling, trainer.eos_token_ids)


# VLLMClient.generate's named sampling arguments; any other setting travels in generation_kwargs
_CLIENT_SAMPLING = ("repetition_penalty", "temperature", "top_p", "top_k", "min_p", "max_tokens")


class VLLMServerReferenceSampler:
    """:class:`~armorlab.train.anchors.ReferenceSampler` on a vLLM server holding π_ref (``ref_vllm_mode: server``).

    ``client`` is TRL's ``VLLMClient`` (an :class:`armorlab.train.vllm_client.WeightSyncClient`); every
    process generates through its own, only the one with ``pushes`` sends weights. ``sampling`` as
    for :class:`VLLMReferenceSampler`; ``gather(model)`` returns the full state dict (a collective
    under FSDP); ``barrier`` keeps the other processes from sampling before the push is done.
    """

    def __init__(self, client: Any, tokenizer: Any, sampling: dict[str, Any], eos_token_ids: Sequence[int], *,
                 pushes: bool = True, gather: Any = None, barrier: Any = None) -> None:
        self.client = client
        self.tokenizer = tokenizer
        named = {k: v for k, v in sampling.items() if k in _CLIENT_SAMPLING}
        extra = {k: v for k, v in sampling.items() if k not in _CLIENT_SAMPLING and k != "n"}
        self.sampling = {**named, "generation_kwargs": extra or None}
        self.eos_token_ids = list(eos_token_ids)
        self.pushes = pushes
        self.gather = gather or (lambda model: model.state_dict())
        self.barrier = barrier
        self.prompts_sent = 0
        self.generate_calls = 0

    def sample(self, prompt_ids: Sequence[Sequence[int]], k: int) -> list[list[Completion]]:
        if not prompt_ids:
            return []
        out = self.client.generate([list(p) for p in prompt_ids], n=int(k), logprobs=None, **self.sampling)
        self.prompts_sent += len(prompt_ids)
        self.generate_calls += 1
        ids = out["completion_ids"]  # prompt-major: the k samples of a prompt, then the next prompt's
        return [completions(self.tokenizer, ids[i * k:(i + 1) * k], self.eos_token_ids) for i in range(len(prompt_ids))]

    def sync_from(self, model: Any) -> None:
        """π_ref ← ``model`` (an unwrapped HF causal LM) on the server, then clear its prefix cache."""
        weights = self.gather(model)
        if self.pushes:
            meta = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in weights.items()]
            self.client.update_named_params(meta, iter(weights.items()))
            self.client.reset_prefix_cache()
        if self.barrier is not None:
            self.barrier()


def build_server_sampler(trainer: Any) -> VLLMServerReferenceSampler:
    """The ``ref_vllm_mode: server`` sampler of an ``ArmorLabTrainer``: connected, π_ref pushed once."""
    args = trainer.args
    require_vllm("ref_vllm_mode", args.ref_vllm_mode)
    import requests

    from armorlab.train.reference import full_state_dict
    from armorlab.train.vllm_client import connect, unreachable

    acc = trainer.accelerator
    where = {"base_url": args.ref_vllm_server_base_url, "host": args.ref_vllm_server_host,
             "port": args.ref_vllm_server_port, "timeout": args.ref_vllm_server_timeout}
    try:
        client = connect(**where, group_port=args.ref_vllm_group_port,
                         device=acc.device if acc.is_main_process else None)
    except requests.exceptions.ConnectionError as exc:
        raise unreachable(exc, **where, prefix="ref_vllm_") from None
    sampling = sampling_kwargs(k=1, max_tokens=trainer.max_completion_length, temperature=trainer.temperature,
                               top_p=trainer.top_p, top_k=trainer.top_k, min_p=trainer.min_p,
                               repetition_penalty=trainer.repetition_penalty,
                               generation_kwargs=args.generation_kwargs)
    distributed = acc.num_processes > 1
    sampler = VLLMServerReferenceSampler(client, trainer._tokenizer, sampling, trainer.eos_token_ids,
                                         pushes=acc.is_main_process,
                                         gather=full_state_dict if distributed else None,
                                         barrier=acc.wait_for_everyone if distributed else None)
    # the server may hold any weights (another run's π_ref): start from this run's
    sampler.sync_from(acc.unwrap_model(trainer.reference.model))
    return sampler
