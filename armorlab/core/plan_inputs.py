"""What the memory plan (armorlab.core.memory_plan) reads, from files and configs, torch-free:
the model's shape from its config.json (no weights are loaded), the parallelism from a profile's
accelerate config (or, inside a launched job, from the environment accelerate sets) and the run
settings from a resolved run config.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from armorlab.algos.objectives import objective_spec
from armorlab.core.config import MODEL_FIELDS_TINY, TINY_MODEL, load_yaml_mapping
from armorlab.core.fsutil import SMALL_FILE_BYTES, read_regular_text
from armorlab.core.identity import hub_snapshot
from armorlab.core.known_models import KNOWN_CONFIGS, known_config
from armorlab.core.memory_plan import (
    DTYPE_BYTES,
    GIB,
    MemoryPlan,
    ModelShape,
    Parallelism,
    RunMemory,
    plan_memory,
)
from armorlab.core.model_dir import sizes_problem
from armorlab.errors import ArmorLabError

DEFAULT_PROMPT_TOKENS = 512  # prompts are not bounded by the config: the plan assumes this many
# armorlab.train.models' tiny model: char-level vocabulary (4 special tokens + 95 printable ASCII +
# newline + tab), MLP 4 × hidden, 1,024 positions, saved in float32 (tests check it against the build)
TINY_VOCAB = 4 + 95 + 2
TINY_POSITIONS = 1024
_LLAMA_LIKE = ("llama", "qwen2", "qwen3", "mistral")


# --------------------------------------------------------------------------- model shape
def shape_from_config(cfg: Mapping[str, Any], *, name: str, source: str) -> ModelShape:
    """A ModelShape from config.json's fields (a multimodal config's ``text_config`` if it has one)."""
    if isinstance(cfg, Mapping):
        cfg = cfg.get("text_config") or cfg
    problem = sizes_problem(cfg) if isinstance(cfg, Mapping) else "must hold a JSON object (text_config too)"
    if problem:  # a negative layer count planned a negative peak that "fits"
        raise ArmorLabError(f"config.json: {problem}", key="model", value=name, file=source)
    model_type = str(cfg.get("model_type", ""))
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        shape = ModelShape(
            name=name, vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]), num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            # PretrainedConfig ties by default; Llama, Qwen2/3 and Mistral configs do not
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", model_type not in _LLAMA_LIKE)),
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            max_positions=int(cfg.get("max_position_embeddings") or 4096),
            dtype=_dtype_name(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            source=source)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArmorLabError(f"config.json lacks a field the memory plan needs ({exc})", key="model", value=name,
                            file=source) from None
    return shape


def _dtype_name(value: Any) -> str:
    text = str(value).removeprefix("torch.")
    return {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}.get(
        text, text if text in DTYPE_BYTES else "float32")


def tiny_shape(model_cfg: Mapping[str, Any]) -> ModelShape:
    """The shape ``armorlab.train.models.build_model`` gives a ``model: tiny`` config."""
    values = {k: model_cfg.get(k, f.default) for k, f in MODEL_FIELDS_TINY.items()}
    hidden, heads = int(values["hidden_size"]), int(values["num_heads"])
    return ModelShape(name=TINY_MODEL, vocab_size=TINY_VOCAB, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_layers=int(values["num_layers"]), num_heads=heads, num_kv_heads=heads,
                      head_dim=hidden // heads, max_positions=TINY_POSITIONS, dtype="float32",
                      source="armorlab's tiny model (built in code)")


def load_shape(model: Any, *, file: str | None = None) -> ModelShape:
    """The shape of a run config's ``model`` (a name or the resolved mapping): ``tiny``; a local
    directory's config.json; a hub id's config.json in the local HF cache; else a model shipped in
    armorlab.core.known_models (by hub id or the path's last component)."""
    cfg = model if isinstance(model, Mapping) else {"name": model}
    name = str(cfg.get("name") or TINY_MODEL)
    if name == TINY_MODEL:
        return tiny_shape(cfg)
    path = Path(name).expanduser()
    candidates = [path / "config.json"] if path.is_dir() else []
    if not path.is_dir() and not path.is_absolute():
        snapshot = hub_snapshot(name, "model")
        if snapshot is not None:
            candidates.append(snapshot / "config.json")
    for candidate in candidates:
        if candidate.is_file():
            try:
                data = json.loads(read_regular_text(candidate, limit=SMALL_FILE_BYTES))
            except (OSError, ValueError) as exc:
                raise ArmorLabError(f"cannot read config.json: {exc}", key="model", value=name,
                                    file=str(candidate)) from None
            return shape_from_config(data, name=name, source=str(candidate))
    known = known_config(name)
    if known is not None:
        hub_id, fields = known
        return shape_from_config(fields, name=name, source=f"{hub_id} config.json (shipped in armorlab.core.known_models)")
    raise ArmorLabError("no config.json for this model: give a local model directory or a hub id in the local "
                        f"Hugging Face cache (the plan also knows {', '.join(KNOWN_CONFIGS)})",
                        key="model", value=name, file=file)


# --------------------------------------------------------------------------- parallelism
def parallelism_from_accelerate(cfg: Mapping[str, Any], *, source: str) -> Parallelism:
    """How an accelerate config file's processes share the model."""
    if cfg.get("use_cpu"):
        return Parallelism("single", int(cfg.get("num_processes") or 1), source=f"{source} (CPU)")
    kind = str(cfg.get("distributed_type", "NO")).upper()
    procs = int(cfg.get("num_processes") or 1)
    mixed = str(cfg.get("mixed_precision") or "no")
    if kind == "FSDP":
        fsdp = cfg.get("fsdp_config") or {}
        strategy = str(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()
        offload = bool(fsdp.get("fsdp_offload_params", False))
        version = int(fsdp.get("fsdp_version", 1))
        if version == 1 and strategy in ("NO_SHARD", "3"):
            return Parallelism("ddp", procs, mixed_precision=mixed, source=source)
        if version == 1 and strategy in ("SHARD_GRAD_OP", "2"):
            return Parallelism("zero2", procs, offload, mixed, source)
        return Parallelism("fsdp", procs, offload, mixed, source)
    if kind == "DEEPSPEED":
        stage = int((cfg.get("deepspeed_config") or {}).get("zero_stage", 0))
        return Parallelism(f"zero{stage}" if stage else "ddp", procs, mixed_precision=mixed, source=source)
    if kind in ("MULTI_GPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_HPU"):
        return Parallelism("ddp" if procs > 1 else "single", procs, mixed_precision=mixed, source=source)
    return Parallelism("single", 1, mixed_precision=mixed, source=source)


def parallelism_from_profile(profile: Any) -> Parallelism:
    """A profile's parallelism: one process per job (launcher: python), or its accelerate config."""
    if getattr(profile, "launcher", "python") != "accelerate" or not profile.accelerate_config:
        return Parallelism("single", 1, source="one process (launcher: python)")
    path = Path(profile.accelerate_config).expanduser()
    try:
        par = parallelism_from_accelerate(load_yaml_mapping(path), source=str(path))
    except ArmorLabError:
        raise
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:  # a field of the wrong type
        raise ArmorLabError(f"not an accelerate config the plan can read ({exc})", key="accelerate_config",
                            value=str(path), file=str(path)) from None
    if par.processes < 1:
        raise ArmorLabError("num_processes must be at least 1", key="num_processes", value=par.processes,
                            file=str(path))
    return par


def parallelism_from_env(env: Mapping[str, str] | None = None) -> Parallelism:
    """Inside a launched job: what ``accelerate launch`` (or torchrun) put in the environment."""
    env = os.environ if env is None else env
    procs = int(env.get("WORLD_SIZE") or 1)
    mixed = env.get("ACCELERATE_MIXED_PRECISION", "no")
    if env.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        offload = env.get("FSDP_OFFLOAD_PARAMS", "").lower() in ("1", "true")
        return Parallelism("fsdp", procs, offload, mixed, "accelerate launch (FSDP)")
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true"):
        stage = int(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") or 0)
        return Parallelism(f"zero{stage}" if stage else "ddp", procs, mixed_precision=mixed,
                           source="accelerate launch (DeepSpeed)")
    return Parallelism("ddp" if procs > 1 else "single", procs, mixed_precision=mixed,
                       source=f"{procs} process(es)")


def gpu_bytes_from_profile(profile: Any) -> int | None:
    gb = getattr(profile, "gpu_memory_gb", None)
    return None if gb is None else int(gb * GIB)


# --------------------------------------------------------------------------- run settings
def reference_held(cfg: Mapping[str, Any]) -> bool:
    """Whether the run holds π_ref: the same rule as armorlab.train.reference.reference_needed
    (an objective that mixes π_ref in, β ≠ 0, anchors or the gate, the KL telemetry, or with
    validation the exact-KL probe or π_ref's validation at resets)."""
    validating = int(cfg.get("val_every", 0)) > 0
    resets = bool(cfg.get("ref_reset_steps") or cfg.get("ref_reset_schedule"))
    return bool(objective_spec(cfg["objective"]).uses_reference or float(cfg.get("beta") or 0.0) != 0.0
                or cfg.get("anchor") or cfg.get("anchor_gate") or cfg.get("kl_telemetry", True)
                or (validating and (int(cfg.get("kl_probe_prompts") or 0) > 0
                                    or (resets and cfg.get("ref_validate_resets", False)))))


def _load_dtype(cfg: Mapping[str, Any], shape: ModelShape) -> str:
    kwargs = cfg.get("model_init_kwargs")
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs)
        except ValueError:
            kwargs = {}
    value = (kwargs or {}).get("dtype", (kwargs or {}).get("torch_dtype", "float32"))
    if value in (None, "auto"):
        return shape.dtype
    return _dtype_name(value)


def run_memory(cfg: Mapping[str, Any], shape: ModelShape, par: Parallelism, *,
               prompt_tokens: int = DEFAULT_PROMPT_TOKENS) -> RunMemory:
    """The memory-relevant settings of a resolved run config (TRL's defaults where it has none)."""
    load = _load_dtype(cfg, shape)
    fp16 = bool(cfg.get("fp16", False))
    bf16 = bool(cfg.get("bf16", not fp16))  # GRPOConfig: bf16 defaults to True unless fp16
    compute = "bfloat16" if bf16 else "float16" if fp16 else load
    rows = int(cfg.get("per_device_train_batch_size", 8))
    accumulation = int(cfg.get("gradient_accumulation_steps", 1))
    steps = int(cfg.get("steps_per_generation") or accumulation)
    gen_batch = cfg.get("generation_batch_size")
    gen_rows = int(gen_batch) // max(1, par.processes) if gen_batch else rows * steps
    vllm_tp = int(cfg.get("vllm_tensor_parallel_size", 1))
    ref_dtype = cfg.get("ref_vllm_dtype")
    ref_dtype = compute if ref_dtype is None else shape.dtype if ref_dtype == "auto" else _dtype_name(ref_dtype)
    return RunMemory(
        load_dtype=load, compute_dtype=compute, train_rows=rows, prompt_tokens=int(prompt_tokens),
        completion_tokens=int(cfg.get("max_completion_length", 256)),
        gradient_checkpointing=bool(cfg.get("gradient_checkpointing", False)), generation_rows=gen_rows,
        eval_rows=int(cfg.get("per_device_eval_batch_size", 8)),
        cast_lm_head_to_fp32=bool(cfg.get("cast_lm_head_to_fp32", False)),
        optimizer=str(cfg.get("optim", "adamw_torch_fused")), reference=reference_held(cfg),
        resets=bool(cfg.get("ref_reset_steps") or cfg.get("ref_reset_schedule")),
        anchors=bool(cfg.get("anchor") or cfg.get("anchor_gate")), validation=int(cfg.get("val_every", 0)) > 0,
        probe=int(cfg.get("kl_probe_prompts") or 0) > 0, use_vllm=bool(cfg.get("use_vllm", False)),
        vllm_mode=str(cfg.get("vllm_mode", "colocate")),
        vllm_share=float(cfg.get("vllm_gpu_memory_utilization", 0.3)),
        vllm_sleep=bool(cfg.get("vllm_enable_sleep_mode", False)), vllm_tp=vllm_tp,
        vllm_max_len=cfg.get("vllm_max_model_length"),
        # TRL's colocated engine: max_num_seqs = per_device_train_batch_size × TP × steps_per_generation
        vllm_max_seqs=rows * vllm_tp * steps,
        ref_vllm_mode=str(cfg.get("ref_vllm_mode", "none")), ref_vllm_share=float(cfg.get("ref_vllm_memory", 0.2)),
        ref_vllm_dtype=ref_dtype, ref_vllm_tp=int(cfg.get("ref_vllm_tensor_parallel_size", 1)))


# --------------------------------------------------------------------------- one call
_SHAPES: dict[str, ModelShape] = {}
_PLANS: dict[tuple, MemoryPlan] = {}  # most runs of a sweep differ in nothing that sizes memory


def plan_config(cfg: Mapping[str, Any], par: Parallelism, gpu_bytes: int | None, *,
                prompt_tokens: int = DEFAULT_PROMPT_TOKENS, file: str | None = None) -> MemoryPlan:
    """The memory plan of one resolved run config (shapes read once per model per process)."""
    model = cfg.get("model") or TINY_MODEL
    key = repr(sorted(model.items())) if isinstance(model, Mapping) else str(model)
    if key not in _SHAPES:
        _SHAPES[key] = load_shape(model, file=file)
    shape = _SHAPES[key]
    run = run_memory(cfg, shape, par, prompt_tokens=prompt_tokens)
    plan_key = (key, run, par, gpu_bytes)
    if plan_key not in _PLANS:
        _PLANS[plan_key] = plan_memory(shape, par, run, gpu_bytes)
    return _PLANS[plan_key]


def memory_check_enabled(env: Mapping[str, str] | None = None) -> bool:
    """``ARMORLAB_MEMORY_CHECK=off`` turns the refusal off (the plan is an estimate: docs/memory-plan.md)."""
    env = os.environ if env is None else env
    return env.get("ARMORLAB_MEMORY_CHECK", "on").lower() not in ("off", "0", "false", "no")
