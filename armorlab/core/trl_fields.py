"""Every TRL ``GRPOConfig`` field, classified by what ``ArmorLabTrainer`` does with it (torch-free).

- **honoured**: passed to ``GRPOConfig`` and applied by TRL/transformers code that armorlab
  keeps (or by armorlab itself the same way, e.g. ``beta``, ``epsilon``, ``reward_weights``).
- **mapped**: armorlab expresses the setting with its own key or decides it itself (the run
  directory, its own validation, its objectives). Giving one in a run config is an error that
  names the armorlab key to use instead, whatever its value.
- **rejected**: a feature ``ArmorLabTrainer`` does not run. Its TRL default (the feature off) is
  accepted and dropped from the resolved config; any other value is an error.

``tests/test_config.py`` enumerates the installed ``GRPOConfig`` and fails on a field that is in
none of the three sets, and checks the TRL defaults written here against the installed ones.
The trainer re-checks the mapped and rejected fields by value when a job starts (Python users
who build an ``ArmorLabConfig`` directly).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from armorlab.core.checks import Invalid, address, boolean, did_you_mean, integer, number, optional

_EVAL = "armorlab validates on its own val/test sets: use val_every, val_samples, val_temperature"
_PICK = "checkpoints are compared offline: `armorlab report` with select: {metric: val/acc, ...}"
_REF = "use ref_reset_steps / ref_reset_schedule (π_ref ← π_θ, a full copy)"

# TRL's defaults (the feature off / the loss's own values): dropped from a resolved config at them
ENTROPY_DEFAULTS: dict[str, Any] = {"top_entropy_quantile": 1.0, "entropy_coef": 0.0, "use_adaptive_entropy": False,
                                    "entropy_coef_min": 0.0, "entropy_coef_max": 1.0, "entropy_coef_delta": 0.005,
                                    "entropy_target": 0.2}
TRL_OBJECTIVE_DEFAULTS: dict[str, Any] = {"sapo_temperature_neg": 1.05, "sapo_temperature_pos": 1.0,
                                          "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0,
                                          "vespo_lambda_neg": 2.0}

# Applied as in stock GRPOTrainer (TRL or transformers reads them; armorlab's overrides keep them).
HONOURED: frozenset[str] = frozenset({
    # optimisation and schedule
    "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "optim", "optim_args",
    "optim_target_modules", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
    "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "auto_find_batch_size",
    # rows per generate call of armorlab's own generation (validation, anchors, the exact-KL probe)
    "per_device_eval_batch_size",
    "seed", "full_determinism",
    # precision, compilation, memory
    "bf16", "fp16", "tf32", "use_cpu", "gradient_checkpointing", "gradient_checkpointing_kwargs",
    "torch_compile", "torch_compile_backend", "torch_compile_mode", "torch_empty_cache_steps",
    "use_liger_kernel", "liger_kernel_config", "use_cache", "neftune_noise_alpha", "cast_lm_head_to_fp32",
    # distribution and data loading
    "accelerator_config", "parallelism_config", "deepspeed", "fsdp", "fsdp_config", "ddp_backend",
    "ddp_broadcast_buffers", "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph",
    "ddp_timeout", "ds3_gather_for_generation", "dataloader_drop_last", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context", "dataloader_in_order", "remove_unused_columns", "debug",
    "skip_memory_metrics",
    # logging, saving, hub (metrics.jsonl is written from TRL's log calls)
    "logging_strategy", "logging_steps", "logging_first_step", "logging_nan_inf_filter", "log_level",
    "log_level_replica", "log_on_each_node", "include_num_input_tokens_seen", "disable_tqdm", "report_to",
    "run_name", "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
    "save_strategy", "save_steps", "save_total_limit", "save_only_model", "save_on_each_node",
    "enable_jit_checkpoint", "restore_callback_states_from_checkpoint", "ignore_data_skip", "push_to_hub",
    "hub_token", "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push", "hub_revision",
    "log_completions", "log_multimodal", "num_completions_to_print", "log_unique_prompts",
    "log_completions_hub_repo",
    # model loading (the reference is loaded the same way)
    "model_init_kwargs", "trust_remote_code", "disable_dropout", "router_aux_loss_coef",
    # GRPO generation and scoring (the reference sampler shares the policy's generation config)
    "num_generations", "generation_batch_size", "steps_per_generation", "num_iterations",
    "max_completion_length", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "generation_kwargs", "chat_template_kwargs", "cache_implementation", "pad_to_multiple_of",
    # TRL's vLLM generation (colocate): anchor rows get no sampler log-probs, so TRL's importance
    # sampling correction leaves them at ratio 1; armorlab's losses apply the ratio as TRL's does
    "use_vllm", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex",
    "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
    "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap",
    # TRL's vLLM server mode (`armorlab vllm-serve`); off CUDA the weights go through armorlab.train.vllm_client
    "vllm_mode", "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
    "vllm_group_port",
    "shuffle_dataset", "max_tool_calling_iterations", "use_transformers_continuous_batching",
    "transformers_continuous_batching_config", "use_transformers_paged",
    "reward_weights", "multi_objective_aggregation", "scale_rewards", "mask_truncated_completions",
    # the loss: clip bounds of every objective, TRL's β·k3 KL (with its importance-ratio correction)
    "epsilon", "epsilon_high", "beta", "use_bias_correction_kl",
    # TRL's entropy bonus (static, adaptive) and entropy mask, applied by ArmorLabTrainer as TRL does
    # (armorlab.algos.entropy), and the parameters of TRL's sapo and vespo losses (objective: sapo|vespo)
    *ENTROPY_DEFAULTS, *TRL_OBJECTIVE_DEFAULTS,
})

# key → (TRL's default, what to use instead). Present in a run config at all → error.
MAPPED: dict[str, tuple[Any, str]] = {
    "output_dir": (None, "set by armorlab from the run directory (checkpoints/); remove it"),
    "resume_from_checkpoint": (None, "a run resumes from its run directory's last complete checkpoint; remove it"),
    "local_rank": (-1, "set by the launcher (torchrun / accelerate launch); remove it"),
    "num_train_epochs": (3.0, "use max_steps (armorlab runs are counted in optimizer steps)"),
    # a run config's loss_type names an objective (armorlab.core.objective_fields); here: ArmorLabConfig
    "loss_type": ("dapo", "use objective (every registered one, TRL's loss types among them) and aggregation"),
    "importance_sampling_level": ("token", "use a sequence-level objective (gspo, up_gspo, gmpo, luspo)"),
    "delta": (None, "use dual_clip: c > 1 caps the loss of A < 0 tokens at −A·c (verl's dual clip)"),
    "sync_ref_model": (False, _REF),
    "ref_model_sync_steps": (512, _REF),
    "ref_model_mixup_alpha": (0.6, _REF),
    "average_tokens_across_devices": (
        True, "armorlab always divides the loss by the count of the whole generation batch over all processes"),
    "do_train": (False, "`armorlab train` trains; remove it"),
    "do_eval": (False, _EVAL),
    "do_predict": (False, _EVAL),
    "eval_strategy": ("no", _EVAL),
    "eval_steps": (None, _EVAL),
    "eval_delay": (0, _EVAL),
    "eval_on_start": (False, _EVAL),
    "eval_accumulation_steps": (None, _EVAL),
    "eval_do_concat_batches": (True, _EVAL),
    "eval_use_gather_object": (False, _EVAL),
    "num_generations_eval": (None, _EVAL),
    "prediction_loss_only": (False, _EVAL),
    "include_for_metrics": ([], _EVAL),
    "batch_eval_metrics": (False, _EVAL),
    "bf16_full_eval": (False, _EVAL),
    "fp16_full_eval": (False, _EVAL),
    "load_best_model_at_end": (False, _PICK),
    "metric_for_best_model": (None, _PICK),
    "greater_is_better": (None, _PICK),
}

# key → (TRL's default = the feature off, why it is not available). Another value → error.
REJECTED: dict[str, tuple[Any, str]] = {
    "off_policy_mask_threshold": (None, "not applied by armorlab objectives"),
    "data_seed": (None, "the prompt order is seeded by seed (TRL's RepeatSampler ignores data_seed)"),
    "train_sampling_strategy": ("random", "prompts are drawn by TRL's RepeatSampler; use shuffle_dataset"),
    "length_column_name": ("length", "only read by group_by_length sampling, which GRPO does not use"),
    "label_names": (None, "GRPO has no labels"),
    "label_smoothing_factor": (0.0, "GRPO's loss has no labels to smooth"),
}

# Set at run time by launch.py / the launcher, never compared with a default in the trainer.
RUNTIME_SET = frozenset({"output_dir", "resume_from_checkpoint", "local_rank"})


def classification(key: str) -> str | None:
    """``"honoured"``, ``"mapped"``, ``"rejected"`` or None (not a GRPOConfig field armorlab knows)."""
    if key in HONOURED:
        return "honoured"
    if key in MAPPED:
        return "mapped"
    if key in REJECTED:
        return "rejected"
    return None


def _equal(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    if isinstance(default, (int, float)) and isinstance(value, (int, float)):
        return float(value) == float(default)
    return value == default


def config_problem(key: str, value: Any) -> str | None:
    """Why ``key: value`` in a run config is refused (None when it is fine): the resolve-time check."""
    if key in MAPPED:
        return f"not honoured by ArmorLabTrainer: {MAPPED[key][1]}"
    if key in REJECTED and not _equal(value, REJECTED[key][0]):
        return f"unsupported with ArmorLabTrainer: {REJECTED[key][1]}"
    return None


# Honoured fields whose TRL default is dropped like a rejected feature's: `use_vllm: false` and the
# vLLM server fields at their defaults were accepted (and dropped) before ArmorLabTrainer ran those
# features; their run ids stay the same.
OFF_SWITCHES: dict[str, Any] = {"use_vllm": False, "vllm_mode": "colocate", "vllm_server_base_url": None,
                                "vllm_server_host": "0.0.0.0", "vllm_server_port": 8000,
                                "vllm_server_timeout": 240.0, "vllm_group_port": 51216,
                                **ENTROPY_DEFAULTS, **TRL_OBJECTIVE_DEFAULTS}


def is_inert_default(key: str, value: Any) -> bool:
    """A rejected feature (or an OFF_SWITCHES switch) left at TRL's default: dropped from the
    resolved config (same run id as absent)."""
    if key in OFF_SWITCHES:
        return _equal(value, OFF_SWITCHES[key])
    return key in REJECTED and _equal(value, REJECTED[key][0])


def args_problems(args: Any) -> list[tuple[str, Any, str]]:
    """(key, value, why) for every mapped or rejected field of a built config that differs from TRL's default."""
    out = []
    for table, prefix in ((MAPPED, "not honoured by ArmorLabTrainer"), (REJECTED, "unsupported with ArmorLabTrainer")):
        for key, (default, why) in table.items():
            if key in RUNTIME_SET or not hasattr(args, key):
                continue
            value = getattr(args, key)
            if not _equal(value, default):
                out.append((key, value, f"{prefix}: {why}"))
    return out


# --------------------------------------------------------------------------- value kinds and ranges
@lru_cache(maxsize=1)
def grpo_field_kinds() -> dict[str, str]:
    """GRPOConfig's fields → value kind (``float``, ``int``, ``bool``, ``str``, ``map``, ``any``; ``?`` when
    null is allowed), shipped as JSON (tools/gen_grpo_fields.py) so checking a spec never imports
    TRL. tests/test_config.py compares it to the installed GRPOConfig; the trainer checks names
    again against the real class when a job starts.
    """
    # next to this module (package data, installed as a plain file): importlib.resources would
    # cost a few ms of imports in every command that checks a spec
    return json.loads(Path(__file__).with_name("grpo_fields.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def grpo_field_names() -> frozenset[str]:
    return frozenset(grpo_field_kinds())


def check_trl_value(kind: str, value: Any) -> Any:
    """Numbers become numbers — a YAML ``1e-5`` (a string in YAML 1.1) and ``1.0e-5`` must give one
    run id, and TrainingArguments would not convert the string — and booleans must be booleans."""
    base, optional = kind.rstrip("?"), kind.endswith("?")
    if value is None:
        if optional or base in ("any", "str"):
            return None
        raise Invalid("must not be null")
    if base == "float":
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise Invalid("must be a number") from None
        return number()(value)
    if base == "int":
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise Invalid("must be an integer") from None
        return integer()(value)
    if base == "bool":
        return boolean(value)
    if base == "map" and not isinstance(value, (str, dict)):
        raise Invalid("must be a mapping (or its JSON text)")
    if base == "str" and not (isinstance(value, str) or (  # report_to also takes a list of names
            isinstance(value, list) and all(isinstance(x, str) for x in value))):
        raise Invalid("must be a string")
    return value


# Ranges of TRL/transformers fields where one is obvious (the kind check comes first). Seeds go
# to numpy, which takes < 2**32.
SEED_MAX = 2**32 - 1
TRL_RANGES: dict[str, Callable[[Any], Any]] = {
    "seed": integer(0, SEED_MAX),
    "data_seed": optional(integer(0, SEED_MAX)),
    "learning_rate": number(0.0),
    "beta": number(0.0),
    "temperature": number(0.0, lo_open=True),
    "top_p": number(0.0, 1.0, lo_open=True),
    "top_k": optional(integer(0)),
    "min_p": optional(number(0.0, 1.0)),
    "repetition_penalty": number(0.0, lo_open=True),
    "max_steps": integer(1),
    "num_train_epochs": number(0.0),
    "save_steps": number(0.0, lo_open=True),
    "logging_steps": number(0.0, lo_open=True),
    "eval_steps": optional(number(0.0, lo_open=True)),
    "warmup_steps": number(0.0),
    "steps_per_generation": optional(integer(1)),
    "generation_batch_size": optional(integer(1)),
    "max_completion_length": optional(integer(1)),
    "num_iterations": integer(1),
    "num_generations": integer(2),
    "per_device_train_batch_size": integer(1),
    "per_device_eval_batch_size": integer(1),
    "gradient_accumulation_steps": integer(1),
    "weight_decay": number(0.0),
    "max_grad_norm": number(0.0),
    "adam_beta1": number(0.0, 1.0, hi_open=True),
    "adam_beta2": number(0.0, 1.0, hi_open=True),
    "adam_epsilon": number(0.0),
    "epsilon": number(0.0),
    "epsilon_high": optional(number(0.0)),
    "dataloader_num_workers": integer(0),
    # TRL's vLLM fields: a bad one surfaced as a connection error or a traceback inside the job
    "vllm_server_port": integer(1, 65535),
    "vllm_group_port": integer(1, 65535),
    "vllm_server_host": address,
    "vllm_server_base_url": optional(address),
    "vllm_server_timeout": number(0.0, lo_open=True),
    "vllm_gpu_memory_utilization": number(0.0, 1.0, lo_open=True),
    "vllm_tensor_parallel_size": integer(1),
    "vllm_max_model_length": optional(integer(1)),
}


# --------------------------------------------------------------------------- fields that take a name
# The names TRL/transformers accept, written here so a spec is checked without importing them:
# transformers' enums (OptimizerNames, SchedulerType, IntervalStrategy, SaveStrategy, HubStrategy,
# its log levels and reporting integrations) and TRL's documented choices (grpo_config.py).
# tests/test_trl_choices.py compares them with the installed versions.
OPTIMIZERS = (
    "adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused", "adafactor",
    "adamw_anyprecision", "adamw_torch_4bit", "adamw_torch_8bit", "ademamix", "sgd", "adagrad", "adamw_bnb_8bit",
    "adamw_8bit", "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit", "paged_adamw_8bit",
    "paged_ademamix_32bit", "paged_ademamix_8bit", "paged_lion_32bit", "paged_lion_8bit", "rmsprop", "rmsprop_bnb",
    "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "galore_adamw", "galore_adamw_8bit", "galore_adafactor",
    "galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise", "lomo", "adalomo",
    "grokadamw", "schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd", "apollo_adamw",
    "apollo_adamw_layerwise", "stable_adamw")
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
              "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr", "cosine_warmup_with_min_lr",
              "warmup_stable_decay", "greedy")
REPORT_TO = ("all", "none", "azure_ml", "comet_ml", "mlflow", "neptune", "tensorboard", "trackio", "wandb",
             "codecarbon", "clearml", "dagshub", "flyte", "dvclive", "swanlab", "kubeflow")
LOG_LEVELS = ("detail", "debug", "info", "warning", "error", "critical", "passive")
SCALE_REWARDS = ("group", "batch", "none")
TRL_CHOICES: dict[str, tuple[str, ...]] = {
    "optim": OPTIMIZERS,
    "lr_scheduler_type": SCHEDULERS,
    "logging_strategy": ("no", "steps", "epoch"),
    "save_strategy": ("no", "steps", "epoch", "best"),
    "hub_strategy": ("end", "every_save", "checkpoint", "all_checkpoints"),
    "log_level": LOG_LEVELS,
    "log_level_replica": LOG_LEVELS,
    "dataloader_multiprocessing_context": ("fork", "spawn", "forkserver"),
    "ddp_backend": ("nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl"),
    "vllm_mode": ("server", "colocate"),
    "vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
}


def _named(key: str, choices: tuple[str, ...]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v is None and key in ("dataloader_multiprocessing_context", "ddp_backend"):
            return None
        if v not in choices:
            raise Invalid(f"must be one of {', '.join(choices)}{did_you_mean(v, choices)}")
        return v
    return check


def _scale_rewards(v: Any) -> Any:
    """TRL takes a name or a bool (true = "group", false = "none", as its GRPOConfig maps them)."""
    if isinstance(v, bool):
        return "group" if v else "none"
    if v not in SCALE_REWARDS:
        raise Invalid(f"must be one of {', '.join(SCALE_REWARDS)}, true (= group) or false (= none)")
    return v


def _report_to(v: Any) -> Any:
    names = [v] if isinstance(v, str) else v
    if v is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise Invalid("must be a backend name or a list of them")
    for n in names:
        if n not in REPORT_TO:
            raise Invalid(f"unknown logging backend {n!r}{did_you_mean(n, REPORT_TO)} (known: {', '.join(REPORT_TO)})")
    return v


TRL_RANGES.update({key: _named(key, choices) for key, choices in TRL_CHOICES.items()})
TRL_RANGES.update({"scale_rewards": _scale_rewards, "report_to": _report_to})
# fields whose TRL_RANGES check is their whole check (the shipped kind would refuse a valid value:
# scale_rewards is typed str but takes a bool)
OWN_KIND_CHECK = frozenset({"scale_rewards"})
