"""π_ref's samples from a vLLM engine: :class:`VLLMReferenceSampler` behind the ``ReferenceSampler`` seam.

``ref_vllm_mode: colocate`` starts a second, in-process vLLM engine holding π_ref next to the
trainer (its own memory share ``ref_vllm_memory``, dtype ``ref_vllm_dtype`` — the training dtype
unless set — and tensor-parallel size ``ref_vllm_tensor_parallel_size``). All prompts of a
sampling round that need anchors go to it in one ``generate`` call with ``n`` = the round's
samples and the policy's sampling settings; prompts whose draws are cached never reach it
(``AnchorRollout`` filters them). With TP > 1 the ranks of one engine pool their prompts (as
TRL's colocated policy engine does) and keep their own share of the outputs. With
``vllm_enable_sleep_mode`` on a device where vLLM can sleep (CUDA), the engine sleeps between
uses (level 1: weights parked in host memory, KV cache freed) and wakes to sample or take a push.

A reference reset pushes π_ref's weights into the engine in place — no reload from disk — one
parameter at a time (a sharded parameter gathered whole with ``full_tensor()`` on every rank,
each rank loading its own engine), then clears its prefix cache, so no KV block computed with
the old π_ref is reused. A π_ref server gets the same stream from rank 0 while the other ranks
take part in the gathers.

vLLM is imported lazily: armorlab imports without it, and asking for it without it installed
is an :class:`~armorlab.errors.ArmorLabError` naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from armorlab.errors import ArmorLabError
from armorlab.train.anchors import Completion, cut_at_eos
from armorlab.train.reference import full_parameters
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
    :func:`sampling_kwargs`); ``prompts_sent`` counts the prompts sent to the engine. ``tp_group``:
    the process group of the ranks sharing one engine (TP > 1), whose prompts are pooled; the
    sampler is then a collective (``collective``) and every rank must call it in each round.
    ``sleeps``: put the engine to sleep between uses (vLLM's sleep mode, level 1).
    """

    def __init__(self, llm: Any, tokenizer: Any, sampling: dict[str, Any], eos_token_ids: Sequence[int], *,
                 tp_group: Any = None, sleeps: bool = False) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.sampling = {k: v for k, v in sampling.items() if k != "n"}
        self.eos_token_ids = list(eos_token_ids)
        self.tp_group = tp_group
        self.sleeps = sleeps
        self.prompts_sent = 0
        self.generate_calls = 0
        self.weight_pushes = 0

    @property
    def collective(self) -> bool:
        return self.tp_group is not None

    def sample(self, prompt_ids: Sequence[Sequence[int]], k: int) -> list[list[Completion]]:
        from vllm import SamplingParams

        mine = [list(p) for p in prompt_ids]
        pooled, offset = self._pool(mine)
        if not pooled:
            return []
        params = SamplingParams(n=int(k), **self.sampling)
        with self.awake():
            outputs = self.llm.generate([{"prompt_token_ids": p} for p in pooled], sampling_params=params,
                                        use_tqdm=False)
        self.prompts_sent += len(mine)
        self.generate_calls += 1
        return [completions(self.tokenizer, [c.token_ids for c in request.outputs], self.eos_token_ids)
                for request in outputs[offset:offset + len(mine)]]

    def _pool(self, mine: list[list[int]]) -> tuple[list[list[int]], int]:
        """Every prompt of the engine's ranks (TP > 1) and where this rank's start; else its own."""
        if self.tp_group is None:
            return mine, 0
        import torch.distributed as dist

        shares: list[Any] = [None] * dist.get_world_size(group=self.tp_group)
        dist.all_gather_object(shares, mine, group=self.tp_group)
        me = dist.get_rank(group=self.tp_group)
        return [p for share in shares for p in share], sum(len(share) for share in shares[:me])

    def awake(self, tags: list[str] | None = None) -> Any:
        """Wake the engine for a block (``tags`` as vLLM's ``wake_up``), then let it sleep again."""
        import contextlib

        if not self.sleeps:
            return contextlib.nullcontext()

        @contextlib.contextmanager
        def awake():
            self.llm.wake_up(tags=tags)
            try:
                yield
            finally:
                self.llm.sleep(level=1)

        return awake()

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """π_ref ← the given (name, whole tensor) pairs, in place in the engine, then clear its prefix cache.

        The pairs are consumed one at a time (a generator stays a generator). On a CUDA device each
        goes to the model's ``load_weights`` as TRL pushes the policy into its colocated engine.
        Elsewhere vLLM's ``reload_weights`` with a weights iterator goes through the model's own
        ``load_weights`` (name mapping, fused q/k/v and gate/up) and the backend's post-load
        repacking, which the direct ``load_weights`` skips (fp32 on vLLM's CPU backend breaks).
        """
        import torch

        stream = ((name, t.detach()) for name, t in named_tensors)
        with self.awake(tags=["weights"]):
            if torch.cuda.is_available():
                model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
                for name, tensor in stream:
                    model.load_weights([(name, tensor)])
            else:
                cpu = ((name, t.to("cpu").contiguous()) for name, t in stream)
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": cpu})
            self.llm.reset_prefix_cache()
        self.weight_pushes += 1

    def sync_from(self, model: Any) -> None:
        """Push ``model``'s weights (an unwrapped HF causal LM, sharded or not) into the engine.

        Every rank pushes into its own engine, streaming one gathered parameter at a time, so the
        gathers (collectives under FSDP) run in the same order on every rank."""
        self.load_weights(full_parameters(model))


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
                    num_processes: int = 1, tensor_parallel_size: int = 1, sleep_mode: bool = False) -> Any:
    """An in-process vLLM ``LLM`` for π_ref, loaded from ``model_path`` (the policy's initial weights).

    Like TRL's colocate engine: ``external_launcher`` (one engine per training process, or per
    ``tensor_parallel_size`` processes; no worker processes), the rank variables vLLM reads, a
    free rendezvous port. ``sleep_mode``: started with vLLM's sleep mode and put to sleep at once.
    """
    from trl.generation.vllm_generation import ensure_master_addr_port
    from vllm import LLM

    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    os.environ["RANK"] = str(process_index)
    os.environ["LOCAL_RANK"] = str(local_process_index)
    os.environ["WORLD_SIZE"] = str(num_processes)
    ensure_master_addr_port()
    llm = LLM(model=model_path, gpu_memory_utilization=memory_share, max_model_len=max_model_len, dtype=dtype,
              tensor_parallel_size=tensor_parallel_size, distributed_executor_backend="external_launcher",
              seed=seed, max_num_batched_tokens=4096, logprobs_mode="processed_logprobs", enable_prefix_caching=True,
              enable_sleep_mode=sleep_mode)
    if sleep_mode:
        llm.sleep(level=1)
    return llm


def engine_dtype(args: Any, policy: Any) -> str:
    """``ref_vllm_dtype``, or the training dtype: bfloat16 under ``bf16``, float16 under ``fp16``, else
    the policy's own (not vLLM's "auto", which runs an fp32 checkpoint in bf16)."""
    if args.ref_vllm_dtype is not None:
        return args.ref_vllm_dtype
    if args.bf16:
        return "bfloat16"
    if args.fp16:
        return "float16"
    return str(policy.dtype).removeprefix("torch.")


def sleep_mode_available() -> bool:
    """Whether vLLM can sleep on this machine (CUDA-like devices; not its CPU backend)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


def tensor_parallel_group(trainer: Any, size: int) -> Any:
    """The process group of the ranks that share one reference engine (None for TP = 1): the
    policy engine's when it has the same size (one process-wide vLLM parallel state), else new
    subgroups of consecutive ranks, as TRL makes them (a collective: every rank builds them)."""
    if size == 1:
        return None
    acc = trainer.accelerator
    if acc.num_processes % size:
        raise ArmorLabError(f"must divide the number of processes ({acc.num_processes})",
                            key="ref_vllm_tensor_parallel_size", value=size)
    policy = getattr(trainer, "vllm_generation", None)
    if policy is not None and getattr(policy, "tensor_parallel_size", 1) == size and hasattr(policy, "tp_group"):
        return policy.tp_group
    import torch.distributed as dist

    group, _ = dist.new_subgroups_by_enumeration(
        [list(range(i * size, (i + 1) * size)) for i in range(acc.num_processes // size)])
    return group


def build_for_trainer(trainer: Any) -> VLLMReferenceSampler:
    """The ``ref_vllm_mode: colocate`` sampler of an ``ArmorLabTrainer`` (after TRL's set-up)."""
    args = trainer.args
    require_vllm("ref_vllm_mode", args.ref_vllm_mode)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    # π_ref's own weights where ref_from set them apart from the policy's start
    path = getattr(trainer, "reference_from", None) or getattr(policy.config, "_name_or_path", None) \
        or getattr(policy, "name_or_path", None)
    if not path:
        raise ArmorLabError("ref_vllm_mode needs a model loaded from a path or hub id (the engine loads it)",
                            key="ref_vllm_mode", value=args.ref_vllm_mode)
    acc = trainer.accelerator
    tp = int(args.ref_vllm_tensor_parallel_size)
    group = tensor_parallel_group(trainer, tp)
    sleeps = bool(args.vllm_enable_sleep_mode) and sleep_mode_available()
    # one seed per engine: the ranks of a TP group must sample alike
    llm = colocate_engine(str(path), memory_share=args.ref_vllm_memory, seed=args.seed + acc.process_index // tp,
                          dtype=engine_dtype(args, policy), max_model_len=args.vllm_max_model_length,
                          process_index=acc.process_index, local_process_index=acc.local_process_index,
                          num_processes=acc.num_processes, tensor_parallel_size=tp, sleep_mode=sleeps)
    sampling = sampling_kwargs(k=1, max_tokens=trainer.max_completion_length, temperature=trainer.temperature,
                               top_p=trainer.top_p, top_k=trainer.top_k, min_p=trainer.min_p,
                               repetition_penalty=trainer.repetition_penalty,
                               generation_kwargs=args.generation_kwargs)
    return VLLMReferenceSampler(llm, trainer._tokenizer, sampling, trainer.eos_token_ids, tp_group=group,
                                sleeps=sleeps)


# VLLMClient.generate's named sampling arguments; any other setting travels in generation_kwargs
_CLIENT_SAMPLING = ("repetition_penalty", "temperature", "top_p", "top_k", "min_p", "max_tokens")


class VLLMServerReferenceSampler:
    """:class:`~armorlab.train.anchors.ReferenceSampler` on a vLLM server holding π_ref (``ref_vllm_mode: server``).

    ``client`` is TRL's ``VLLMClient`` (an :class:`armorlab.train.vllm_client.WeightSyncClient`); every
    process generates through its own, only the one with ``pushes`` sends weights. ``sampling`` as
    for :class:`VLLMReferenceSampler`; ``device``: where a sharded parameter is gathered (NCCL
    gathers CUDA tensors); ``barrier`` keeps the other processes from sampling before the push is
    done. It runs ``concurrent`` ly with the policy's generation: its requests go to another process.
    """

    concurrent = True

    def __init__(self, client: Any, tokenizer: Any, sampling: dict[str, Any], eos_token_ids: Sequence[int], *,
                 pushes: bool = True, device: Any = None, barrier: Any = None) -> None:
        self.client = client
        self.tokenizer = tokenizer
        named = {k: v for k, v in sampling.items() if k in _CLIENT_SAMPLING}
        extra = {k: v for k, v in sampling.items() if k not in _CLIENT_SAMPLING and k != "n"}
        self.sampling = {**named, "generation_kwargs": extra or None}
        self.eos_token_ids = list(eos_token_ids)
        self.pushes = pushes
        self.device = device
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
        """π_ref ← ``model`` (an unwrapped HF causal LM) on the server, then clear its prefix cache.

        One parameter at a time: every process gathers it (a collective under FSDP), the pushing
        one streams it to the server; no process ever holds the whole model."""
        stream = full_parameters(model, device=self.device)
        if self.pushes:
            meta = [(name, str(p.dtype).removeprefix("torch."), list(p.shape)) for name, p in
                    ((plain, param) for plain, param in _named_parameters(model))]
            self.client.update_named_params(meta, stream)
            self.client.reset_prefix_cache()
        else:
            for _ in stream:  # take part in the gathers
                pass
        if self.barrier is not None:
            self.barrier()


def _named_parameters(model: Any) -> Iterable[tuple[str, Any]]:
    from armorlab.train.reference import plain_name

    return ((plain_name(name), p) for name, p in model.named_parameters())


def build_server_sampler(trainer: Any) -> VLLMServerReferenceSampler:
    """The ``ref_vllm_mode: server`` sampler of an ``ArmorLabTrainer``: connected, π_ref pushed once."""
    args = trainer.args
    require_vllm("ref_vllm_mode", args.ref_vllm_mode)
    import requests

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
                                         pushes=acc.is_main_process, device=acc.device,
                                         barrier=acc.wait_for_everyone if distributed else None)
    # the server may hold any weights (another run's π_ref): start from this run's
    sampler.sync_from(acc.unwrap_model(trainer.reference.model))
    return sampler
