"""armorlab's config fields, defaults and validation: torch-free, used by training and sweeps alike.

A run config is a flat mapping of armorlab fields and TRL ``GRPOConfig`` fields, plus two nested
sections, ``task`` and ``model``. ``resolve`` validates it and fills every default so the result
is the *fully resolved* config whose canonical JSON hashes to the run id (see runs.py).

Keys that cannot influence a run are normalised to ``None`` (``alpha`` outside ARMOR/mixed
anchors, anchor options with anchors off) so a grid that crosses them with an objective that
ignores them collapses into one run instead of training duplicates.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from armorlab.algos.objectives import (
    AGGREGATIONS,
    DEFAULT_EPS,
    default_alpha,
    objective_names,
    objective_spec,
)
from armorlab.core import objective_fields, trl_fields
from armorlab.core.checks import (
    Invalid,
    address,
    boolean,
    choice,
    did_you_mean,
    integer,
    json_value,
    number,
    optional,
    text,
)
from armorlab.core.eval_sets import DEFAULT_KEEP_SELECT, TEST_METRIC, resolve_eval_sets
from armorlab.core.eval_sets import FIELD_SPECS as EVAL_SET_FIELDS
from armorlab.core.fit_checks import TINY_MAX_POSITIONS, TINY_MODEL, check_held_out, check_lengths  # noqa: F401
from armorlab.core.identity import data_identity, model_identity
from armorlab.core.schedule import STEP_UNITS, config_per_rollout, rollout_horizon
from armorlab.core.stop_on_collapse import STOP_FIELDS, check_stop
from armorlab.core.trl_fields import TRL_RANGES, check_trl_value, grpo_field_kinds, grpo_field_names
from armorlab.core.vllm_config import check_engine_parallelism, check_vllm_servers
from armorlab.core.yamlfile import UniqueKeyLoader, load_yaml_mapping  # noqa: F401 - the config's readers
from armorlab.errors import ArmorLabError, combine

ANCHOR_RATIOS = ("mixed", "behavior", "current")
TASKS = ("arithmetic", "scratchpad", "math")
REF_VLLM_MODES = ("none", "colocate", "server")
REF_VLLM_DTYPES = ("auto", "bfloat16", "float16", "float32")


# --------------------------------------------------------------------------- value checks
def objective_choices() -> tuple[str, ...]:
    """The objectives a config may name: every registered one (armorlab.algos.objectives)."""
    return objective_names()


def _objective(v: Any) -> str:
    choices = objective_names()  # read at check time: an objective registered later is valid too
    if not isinstance(v, str) or v not in choices:
        raise Invalid(f"must be one of {', '.join(choices)}{did_you_mean(v, choices)}")
    return v


def _dual_clip(v: Any) -> float | None:
    if v is None:
        return None
    v = number()(v)
    if v <= 1.0:
        raise Invalid("must be > 1 (or null to disable)")
    return v


def _schedule(v: Any) -> list[list[int | None]] | None:
    """[[until_step, tau], ...]: reset every tau steps for the steps ≤ until_step (until_step included);
    until_step increases; a null until_step (last pair only) holds to the end of the run."""
    if v is None:
        return None
    if not isinstance(v, list) or not v:
        raise Invalid("must be a non-empty list of [until_step, tau] pairs")
    out, last = [], 0
    for i, pair in enumerate(v):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise Invalid("each entry must be a pair [until_step, tau]")
        if pair[0] is None and i != len(v) - 1:
            raise Invalid("only the last pair may have a null until_step (= to the end of the run)")
        until, tau = (None if pair[0] is None else integer(1)(pair[0])), integer(0)(pair[1])
        if until is not None and until <= last:
            raise Invalid("until_step values must increase")
        out.append([until, tau])
        last = until or last
    return out


# ``init_from.run``: "<sweep>/<run-id>", relative to the runs root (the sweep dir's parent), so the
# run id does not depend on where the root lies; the sweep name as armorlab.sweeps.spec allows it.
INIT_FROM_RUN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}/[0-9a-f]{12}")
SELECT_MODES = ("max", "min")
DEFAULT_SELECT = DEFAULT_KEEP_SELECT  # init_from.select's metric form: val/acc, max, as the kept checkpoint's
DEFAULT_SELECTION = {**DEFAULT_SELECT, "report": TEST_METRIC}  # report recipes, compare: (shown on test/acc)


OPTIMIZER_STARTS = ("fresh", "parent")
# Linear LR warm-up (optimizer steps) of a continuation whose Adam starts fresh: a fresh Adam's
# first update is ≈ ±lr on every weight whatever the gradient's size (m̂/√v̂ = g/|g| at step 1),
# a jolt away from the selected checkpoint; 8 steps is what removed a 19.8-nat first-rollout
# KL shock on the toy (issue 35); docs/schedules.md.
CONTINUAL_WARMUP = 8
SELECT_FORMS = "{metric: <name>, mode: max|min}, {step: N}, {rollout: N} or {mode: last}"


def _select(select: Any, where: str = "select") -> dict[str, Any]:
    """A checkpoint selection: the metric's noise-aware max/min, a given optimizer step or rollout,
    or the last checkpoint. The metric form fills its defaults (val/acc, max); the others are kept
    as given, so a config of the metric form hashes as it did before the others existed."""
    select = dict(DEFAULT_SELECT) if select is None else select
    if not isinstance(select, Mapping):
        raise Invalid(f"{where} must be one of {SELECT_FORMS}")
    keys = set(map(str, select))
    for counter in ("step", "rollout"):
        if counter in keys:
            if keys != {counter}:
                raise Invalid(f"{where}.{counter} selects one checkpoint by itself: {SELECT_FORMS}")
            try:
                return {counter: integer(0)(select[counter])}
            except Invalid as exc:
                raise Invalid(f"{where}.{counter} {exc}") from None
    if select.get("mode") == "last":
        if keys != {"mode"}:
            raise Invalid(f"{where}: mode last takes no metric (the last complete checkpoint)")
        return {"mode": "last"}
    if keys - {"metric", "mode"}:
        raise Invalid(f"{where} must be one of {SELECT_FORMS}")
    metric, mode = select.get("metric", DEFAULT_SELECT["metric"]), select.get("mode", DEFAULT_SELECT["mode"])
    if not isinstance(metric, str) or not metric:
        raise Invalid(f"{where}.metric must be a metric name such as val/acc")
    if mode not in SELECT_MODES:
        raise Invalid(f"{where}.mode must be max or min (or last: the last complete checkpoint)")
    return {"metric": metric, "mode": mode}


def _run_selection(v: Mapping[str, Any], extra_keys: tuple[str, ...], what: str) -> dict[str, Any]:
    extra = sorted(set(map(str, v)) - {"run", "select", *extra_keys})
    if extra:
        raise Invalid(f"unknown key {extra[0]!r} (known: run, select{''.join(', ' + k for k in extra_keys)})")
    run = v.get("run")
    if not isinstance(run, str) or not INIT_FROM_RUN_RE.fullmatch(run):
        raise Invalid(f"{what}run must be '<sweep name>/<12-hex run id>' (relative to the runs root)")
    return {"run": run, "select": _select(v.get("select"), f"{what}select")}


def _init_from(v: Any) -> dict[str, Any] | None:
    """``{run: "<sweep>/<run-id>", select: ..., optimizer: fresh|parent, warmup: N}``: start from
    the checkpoint that run selected (``select``: SELECT_FORMS, default val/acc max), with π_ref
    initialised to it unless ``ref_from`` says otherwise. ``optimizer: parent`` restores the
    checkpoint's Adam moments and LR scheduler; ``fresh`` (default) starts them anew with a linear
    LR warm-up of ``warmup`` optimizer steps (default CONTINUAL_WARMUP; 0 = none). Keys at their
    defaults are dropped, so configs written before they existed keep their run ids."""
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise Invalid("must be a mapping {run: <sweep>/<run-id>, select: {metric, mode}} or null")
    out = _run_selection(v, ("optimizer", "warmup"), "")
    optimizer = v.get("optimizer", "fresh")
    if optimizer not in OPTIMIZER_STARTS:
        raise Invalid(f"optimizer must be fresh or parent, not {optimizer!r}")
    warmup = v.get("warmup")
    if warmup is not None:
        try:
            warmup = integer(0)(warmup)
        except Invalid as exc:
            raise Invalid(f"warmup (optimizer steps) {exc}") from None
        if optimizer == "parent" and warmup:
            raise Invalid("warmup is for a fresh optimizer: optimizer: parent restores the parent's "
                          "Adam moments and LR schedule")
    if optimizer != "fresh":
        out["optimizer"] = optimizer
    if warmup is not None and warmup != CONTINUAL_WARMUP and optimizer == "fresh":
        out["warmup"] = warmup
    return out


def _ref_from(v: Any) -> str | dict[str, Any] | None:
    """Where π_ref starts, apart from where training starts: null = the same checkpoint as the
    policy (init_from's, else the model); ``model`` = the config's model (before any stage);
    ``{run: <sweep>/<run-id>, select: ...}`` = that run's selection (init_from's rule);
    ``{checkpoint: <dir>}`` = a checkpoint directory (fingerprinted into the run id)."""
    if v is None or v == "model":
        return v
    if not isinstance(v, Mapping):
        raise Invalid("must be null, model, {run: <sweep>/<run-id>, select: ...} or {checkpoint: <dir>}")
    if "checkpoint" in v:
        extra = sorted(set(map(str, v)) - {"checkpoint", "fingerprint"})
        if extra:
            raise Invalid(f"unknown key {extra[0]!r} beside checkpoint (known: checkpoint)")
        if not isinstance(v["checkpoint"], str) or not v["checkpoint"]:
            raise Invalid("checkpoint must be the path of a checkpoint directory")
        return {k: v[k] for k in ("checkpoint", "fingerprint") if k in v}
    return _run_selection(v, (), "")


def continual_warmup(init_from: Mapping[str, Any] | None) -> int:
    """The LR warm-up (optimizer steps) a continuation's fresh optimizer gets: 0 without init_from
    or with ``optimizer: parent``."""
    if not init_from or init_from.get("optimizer", "fresh") != "fresh":
        return 0
    return int(init_from.get("warmup", CONTINUAL_WARMUP))


def _operators(v: Any, allowed: str = "+-*") -> str:
    if not isinstance(v, str) or not v or any(c not in allowed for c in v) or len(set(v)) != len(v):
        raise Invalid(f"must be a non-empty string of distinct operators from '{allowed}'")
    return v


def _sum_operators(v: Any) -> str:
    return _operators(v, "+-")


@dataclass(frozen=True)
class Field:
    default: Any
    check: Callable[[Any], Any]
    doc: str
    type: Any = None  # the Python type of a run-config field (ArmorLabConfig's dataclass field)


# --------------------------------------------------------------------------- armorlab's fields
FIELDS: dict[str, Field] = {
    "objective": Field("dapo", _objective, "policy objective (armorlab.algos.objectives; one can be added "
                       "with @register_objective)", type=str),
    "alpha": Field(None, optional(number(0.0, 1.0, lo_open=True)),
                   "ARMOR mixing weight α in (0, 1]; null = (G−1)/G of num_generations (0.875 at G = 8)",
                   type=float | None),
    "advantage_estimator": Field("group_mean", choice("group_mean", "quantile"),
                                 "baseline of the group advantage: GRPO/DAPO's mean or QAE's K-quantile",
                                 type=str),
    "quantile_k": Field(0.4, number(0.0, 1.0, lo_open=True), "QAE's K: baseline = K-quantile of the group",
                        type=float | None),
    "kl_estimator": Field("k3", choice("k3", "k2", "low_var_kl"), "per-token estimator of the β·KL(π_θ‖π_ref) "
                          "penalty: k3 (TRL's, unclamped), k2, or low_var_kl (verl's: k3 clamped to [−10, 10])",
                          type=str | None),
    "dual_clip": Field(None, _dual_clip, "dual-clip constant c > 1 for A < 0 (verl), null = off",
                       type=float | None),
    "aggregation": Field(None, optional(choice(*AGGREGATIONS)), "loss aggregation; null = objective's",
                         type=str | None),
    "anchor": Field(False, boolean, "inject one reference-policy sample per group (ARMOR Eq. 3)", type=bool),
    "anchor_samples": Field(4, integer(1), "k: reference samples per prompt for the anchor", type=int | None),
    "anchor_filter": Field("correct", choice("correct", "any"), "keep a correct anchor, or the first",
                           type=str | None),
    "anchor_gate": Field(False, boolean, "drop groups whose reference found no correct sample", type=bool),
    "anchor_ratio": Field(None, optional(choice(*ANCHOR_RATIOS)),
                          "ratio on anchor rows; null = the objective's own (armor: mixed, others: behavior)",
                          type=str | None),
    "anchor_reward_threshold": Field(1.0, number(), "reward at or above which an anchor is correct",
                                     type=float | None),
    "ref_reset_steps": Field(0, integer(0), "τ: reset π_ref ← π_θ every τ steps (step_unit); 0 = static", type=int),
    "ref_reset_schedule": Field(None, _schedule, "[[until_step, τ], ...]: τ for steps ≤ until_step "
                                "(null until_step = to the end; steps in step_unit); later steps use "
                                "ref_reset_steps", type=list[list[int]] | None),
    "val_every": Field(10, integer(0), "validate every N steps (step_unit; and at step 0); 0 = never", type=int),
    "step_unit": Field("optimizer", choice(*STEP_UNITS), "what ref_reset_steps, ref_reset_schedule and val_every "
                       "count: optimizer steps, or rollouts (generation batches, the papers' and verl's step; "
                       "docs/schedules.md)", type=str),
    "max_rollouts": Field(None, optional(integer(1)), "horizon in rollouts: sets max_steps to max_rollouts × "
                          "optimizer steps per rollout (give one of the two)", type=int | None),
    "anchor_rounds": Field("one", choice("one", "adaptive"), "reference draws per prompt: one sampler call of "
                           "k draws (one), or rounds of 1, 1, 2, 4, ... draws for the prompts still without an "
                           "anchor (adaptive: fewer draws, more calls)", type=str | None),
    "anchor_skip_solved": Field(False, boolean, "with dynamic sampling, draw from π_ref for no group whose "
                                "on-policy samples are all correct: DAPO's filter drops it whatever its anchor "
                                "(docs/schedules.md)", type=bool),
    "anchor_cache": Field(None, optional(choice("window", "off")), "reuse a prompt's reference draws until π_ref "
                          "resets (window) or draw afresh every rollout (off); null = window when π_ref resets, "
                          "off when it is static", type=str | None),
    "keep_checkpoints": Field(1, integer(0), "checkpoints kept at the best validation levels (the noise-aware "
                              "rule of selected.json), besides the last save_total_limit; 0 = none "
                              "(TRL's rotation alone)", type=int),
    "val_samples": Field(4, integer(1), "k of avg@k / pass@k", type=int),
    "val_temperature": Field(1.0, number(0.0), "sampling temperature for validation", type=float),
    "val_top_p": Field(None, optional(number(0.0, 1.0, lo_open=True)), "top-p of validation sampling (verl's "
                       "val_kwargs.top_p; the DAPO recipe's 0.7); null = the training top_p", type=float | None),
    "overlong_buffer_len": Field(0, integer(0), "DAPO's soft overlong punishment: the last N tokens before "
                                 "max_completion_length cost up to overlong_penalty_factor of reward, linearly "
                                 "(verl's overlong_buffer.len); 0 = off", type=int),
    "overlong_penalty_factor": Field(1.0, number(0.0), "reward a completion of max_completion_length tokens loses "
                                     "to the overlong punishment (verl's overlong_buffer.penalty_factor)",
                                     type=float),
    "val_greedy": Field(False, boolean, "also score one greedy completion per held-out prompt (val/acc_greedy, "
                        "test/acc_greedy) beside val/acc's val_samples at val_temperature; inert at "
                        "val_temperature 0, where val/acc is greedy", type=bool),
    "grad_share_every": Field(10, integer(0), "every N optimizer steps, split the step's gradient with "
                              "respect to the trained tokens' log-probs by part: anchor vs on-policy rows "
                              "(obj/anchor_grad_share) and the β·KL term vs the policy loss "
                              "(obj/kl_grad_share, obj/kl_grad_cos); 0 = off; any number of processes, "
                              "FSDP and gradient checkpointing included",
                              type=int),
    "kl_probe_prompts": Field(8, integer(0), "prompts in the exact-KL probe; 0 = off", type=int),
    "token_sample_rate": Field(0.0, number(0.0, 1.0), "share of tokens dumped to tokens/ parquet",
                               type=float),
    "dynamic_sampling": Field(False, boolean, "DAPO: groups whose rewards are all equal leave the loss and "
                              "its normaliser (train/zero_var_frac)", type=bool),
    "dynamic_sampling_factor": Field(1, integer(1), "generate this many times the prompts and train on the "
                                     "first groups that train: with unequal rewards (dynamic_sampling) and past "
                                     "the gate (anchor_gate); verl's filter_groups; 1 = no refill",
                                     type=int | None),
    "max_num_gen_batches": Field(1, integer(1), "refill until the batch is full: generation batches (each of "
                                 "dynamic_sampling_factor × the prompts) per step at most, verl's "
                                 "max_num_gen_batches; what they cannot fill is logged as train/refill_shortfall; "
                                 "1 = one batch", type=int),
    "init_from": Field(None, _init_from, "start from the checkpoint another run selected (its selected.json), "
                       "π_ref initialised to it: {run: <sweep>/<run-id>, select: {metric, mode} | {step: N} | "
                       "{rollout: N} | {mode: last}, optimizer: fresh|parent, warmup: N}; a sweep's `stages:` "
                       "set it (docs/schedules.md)", type=dict | None),
    "ref_from": Field(None, _ref_from, "where π_ref starts, apart from the policy: null = where training starts, "
                      "model = the config's model, {run: <sweep>/<run-id>, select: ...} = that run's selection, "
                      "{checkpoint: <dir>}; a stage's `ref_from:` sets it", type=str | dict | None),
    "ref_vllm_mode": Field("none", choice(*REF_VLLM_MODES), "where π_ref's anchor samples come from: none = "
                           "transformers generate, colocate = a second in-process vLLM engine, server = a "
                           "vLLM server of its own (`armorlab vllm-serve`)", type=str),
    "ref_vllm_memory": Field(0.2, number(0.0, 1.0, lo_open=True),
                             "share of accelerator memory for the reference engine (vLLM gpu_memory_utilization)",
                             type=float),
    "ref_vllm_server_host": Field("0.0.0.0", address, "host of the reference's vLLM server (ref_vllm_mode: server)",
                                  type=str),
    "ref_vllm_server_port": Field(8001, integer(1, 65535), "port of the reference's vLLM server", type=int),
    "ref_vllm_server_base_url": Field(None, optional(address), "base URL of the reference's vLLM server; when set, "
                                      "host and port are ignored", type=str | None),
    "ref_vllm_server_timeout": Field(240.0, number(0.0), "seconds to wait for the reference's server to answer",
                                     type=float),
    "ref_vllm_group_port": Field(51217, integer(1, 65535), "port of the NCCL weight-update group of the "
                                 "reference's server (GPU; TRL's vllm_group_port is the policy's)", type=int),
    "ref_vllm_dtype": Field(None, optional(choice(*REF_VLLM_DTYPES)),
                            "dtype of the reference's colocated engine; null = the training dtype (bfloat16 "
                            "with bf16, float16 with fp16, else the model's)", type=str | None),
    "ref_vllm_tensor_parallel_size": Field(1, integer(1), "tensor-parallel size of the reference's colocated "
                                           "engine (ranks per engine; with a colocated policy engine it must "
                                           "equal vllm_tensor_parallel_size)", type=int),
    "kl_telemetry": Field(True, boolean, "log kl/reverse_* and kl/forward_*; where nothing else reads π_ref's "
                          "log-probs (dapo/grpo/up at β = 0 without anchors) they are computed on 1/8 of the "
                          "rows; false: neither, and π_ref is not built when nothing else reads it", type=bool),
    "ref_validate_resets": Field(False, boolean, "validate π_ref (ref/val_acc) at every reset; false: only at "
                                 "resets on evaluation steps, where it is that step's val/acc", type=bool),
}
# held-out evaluation sets and the kept checkpoint's metric (armorlab.core.eval_sets)
FIELDS.update({name: Field(*spec) for name, spec in EVAL_SET_FIELDS.items()})
# a run that stops itself once it has collapsed (armorlab.core.stop_on_collapse)
FIELDS.update({name: Field(*spec) for name, spec in STOP_FIELDS.items()})
# --------------------------------------------------------------------------- objectives' own parameters
# verl's names for the parameters of its losses (armorlab.core.objective_fields); null = the
# objective's default, dropped where the objective does not read them
FIELDS.update({key: Field(None, optional(number()), doc, type=float | None)
               for key, doc in objective_fields.PARAM_FIELDS.items()})

# Execution settings of the reference engine: dropped from the resolved config while they are not
# read (the mode off, or another mode's settings), so runs that do not use them keep their run ids.
REF_VLLM_KEYS = ("ref_vllm_mode", "ref_vllm_memory", "ref_vllm_dtype", "ref_vllm_tensor_parallel_size")
# Fields dropped from the resolved config at these values (the default, or the value that does
# nothing), so configs written before they existed keep their run ids (the resolved config of
# `step_unit: optimizer` is the one without the key).
DROPPED_AT_DEFAULT: dict[str, Any] = {"step_unit": "optimizer", "max_rollouts": None, "anchor_cache": None,
                                      "anchor_rounds": "one", "anchor_skip_solved": False,
                                      "keep_checkpoints": 1, "init_from": None, "ref_from": None,
                                      "val_greedy": False, "val_top_p": None, "overlong_buffer_len": 0,
                                      "overlong_penalty_factor": 1.0, "max_num_gen_batches": 1,
                                      "grad_share_every": 10,
                                      "ref_vllm_dtype": None, "ref_vllm_tensor_parallel_size": 1,
                                      "kl_telemetry": True, "ref_validate_resets": False,
                                      "eval_sets": None, "allow_eval_overlap": False, "keep_select": None,
                                      "stop_on_collapse": None}
REF_VLLM_SERVER_KEYS = ("ref_vllm_server_host", "ref_vllm_server_port", "ref_vllm_server_base_url",
                        "ref_vllm_server_timeout", "ref_vllm_group_port")

# Defaults armorlab sets on TRL fields for every model.
COMMON_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "beta": 0.0,
    "temperature": 1.0,
    "logging_steps": 1,  # metrics.jsonl gets every step
}
# The toy defaults, for `model: tiny` only: sized for the tiny model on a CPU.
TINY_DEFAULTS: dict[str, Any] = {
    "max_steps": 60,
    # measured with benchmarks/learning.py: 5e-4 (or 16 rows = 2 prompts/step) destroys the warm
    # start; 5e-5 with 4 prompts × 8 generations per step raises val/acc within 200 steps
    "learning_rate": 5e-5,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "per_device_train_batch_size": 32,
    "gradient_accumulation_steps": 1,
    "num_generations": 8,
    "steps_per_generation": 2,
    "max_completion_length": 8,
    "save_steps": 20,
    "save_total_limit": 2,
    "gradient_checkpointing": False,
}
# The real-model preset (a local checkpoint or hub id): the papers' RLVR settings — lr 1e-6
# (TRL's default), G = 16 samples per prompt, a constant schedule, 1,024-token completions
# (raise it for long reasoning); one prompt group per device and step. Every other GRPOConfig
# field keeps TRL's default (bf16 and gradient checkpointing on a GPU).
REAL_DEFAULTS: dict[str, Any] = {
    "max_steps": 500,
    "learning_rate": 1e-6,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "per_device_train_batch_size": 16,
    "num_generations": 16,
    "max_completion_length": 1024,
    "save_steps": 50,
    "save_total_limit": 2,
}
TRL_DEFAULTS: dict[str, Any] = {**COMMON_DEFAULTS, **TINY_DEFAULTS}  # the tiny model's, as before


def preset(objective: str) -> dict[str, Any]:
    """The defaults an objective brings (its ``ObjectiveSpec.defaults``), applied only where the
    user did not set the key."""
    return dict(objective_spec(objective).defaults)

# GRPOConfig fields the run directory decides (checkpoints/ is the output dir; resume is automatic).
MANAGED_KEYS = frozenset({"output_dir", "resume_from_checkpoint", "overwrite_output_dir"})
# GRPOConfig fields that change how a run is *logged*, not what it *is*: they stay in config.yaml
# but not in the run id (runs.run_id) nor among the report's experimental factors.
LOGGING_KEYS = frozenset({
    "report_to", "logging_steps", "logging_strategy", "logging_first_step", "logging_nan_inf_filter",
    "log_level", "log_level_replica", "log_on_each_node", "run_name", "disable_tqdm", "project",
    "log_completions", "log_completions_hub_repo", "log_multimodal", "log_unique_prompts",
    "num_completions_to_print", "trackio_bucket_id", "trackio_space_id", "trackio_static_space_id",
})
# report_to backend → (module to import, pip package).
LOGGING_BACKENDS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow"),
    "trackio": ("trackio", "trackio"), "comet_ml": ("comet_ml", "comet_ml"), "clearml": ("clearml", "clearml"),
    "dvclive": ("dvclive", "dvclive"), "neptune": ("neptune", "neptune"), "swanlab": ("swanlab", "swanlab"),
    "codecarbon": ("codecarbon", "codecarbon"), "azure_ml": ("azureml", "azureml-core"),
}
LOGGING_EXTRAS = ("tensorboard", "wandb", "mlflow", "trackio")  # pyproject's optional dependencies

# the generated tasks' prompt sets, the same for each of them
_SYNTHETIC_SPLITS: dict[str, Field] = {
    "train_size": Field(256, optional(integer(1)), "fixed train prompts; null = fresh every time"),
    "val_size": Field(64, integer(1), "held-out validation prompts"),
    "test_size": Field(64, integer(1), "held-out test prompts"),
    "split_seed": Field(0, integer(0), "seed of the train/val/test split (independent of `seed`)"),
}

TASK_FIELDS: dict[str, dict[str, Field]] = {
    "arithmetic": {
        "digits": Field(2, integer(1, 6), "digits per operand (zero-padded)"),
        "operands": Field(2, integer(2, 4), "operands per problem"),
        "operators": Field("+", _operators, "operators drawn from '+-*'"),
        **_SYNTHETIC_SPLITS,
    },
    # several correct derivations per prompt, checked step by step (armorlab/tasks/scratchpad.py)
    "scratchpad": {
        "digits": Field(2, integer(1, 6), "digits per operand (zero-padded in the prompt)"),
        "operands": Field(3, integer(2, 6), "terms per problem: a derivation has operands − 1 steps"),
        "operators": Field("+", _sum_operators, "operators drawn from '+-'"),
        **_SYNTHETIC_SPLITS,
    },
    "math": {
        "path": Field(None, text, "JSONL/parquet file, save_to_disk directory or cached hub dataset id"),
        "fingerprint": Field(None, optional(text), "filled in by armorlab: the data's content "
                             "fingerprint (part of the run id); a given value is replaced"),
        "split": Field("train", text, "split to read from a save_to_disk DatasetDict or a hub dataset"),
        "problem_key": Field("problem", text, "column holding the problem: text, or a conversation "
                             "(a list of {role, content} messages, TRL's format)"),
        "answer_key": Field("answer", text, "column holding the reference answer"),
        "prompt_template": Field(None, optional(text), "text prompt around the problem; {problem} marks "
                                 "its place (e.g. the boxed-answer instruction, or `dapo`: DAPO-Math-17k's "
                                 "\"Answer:\" instruction)"),
        "scorer": Field("boxed", choice("boxed", "answer_line"), "what a completion is scored on: its boxed "
                        "answer (math-verify), or DAPO-Math's last \"Answer:\" line (verl's math_dapo; boxed as "
                        "fallback)"),
        "system_prompt": Field(None, optional(text), "system message of chat prompts"),
        "chat": Field(None, optional(boolean), "send chat prompts (the tokenizer's chat template, as TRL "
                      "applies it); null = when the model's tokenizer has a chat template"),
        "val_size": Field(64, integer(1), "rows held out for validation"),
        "test_size": Field(64, integer(1), "rows held out for test"),
        "train_size": Field(None, optional(integer(1)), "cap on training rows; null = all the rest"),
        "split_seed": Field(0, integer(0), "seed of the split"),
    },
}

MODEL_FIELDS_TINY: dict[str, Field] = {
    # upper bounds: a tiny model is built on the CPU; 1e12 passed as an integer and failed at job start
    "hidden_size": Field(128, integer(32, 8192), "hidden width"),
    "num_layers": Field(3, integer(1, 64), "transformer layers"),
    "num_heads": Field(4, integer(1, 256), "attention heads (head_dim = hidden/heads ≥ 32)"),
    "warm_start_steps": Field(1000, integer(0, 1_000_000), "max supervised warm-start steps on the task's train "
                              "pool"),
    "warm_start_target": Field(0.75, optional(number(0.0, 1.0, lo_open=True)),
                               "stop the warm start at this greedy accuracy on a dev slice of the "
                               "pool (null = run all warm_start_steps)"),
    "warm_start_seed": Field(0, integer(0), "seed of the tiny model's init and warm start"),
}


def known_keys() -> frozenset[str]:
    return frozenset(FIELDS) | grpo_field_names() | {"task", "model"}


# GRPOConfig fields that TRL retired: the nearest spelling (max_prompt_length → max_completion_length)
# would point a user at a different knob, so say what replaced it instead
RETIRED_TRL_KEYS = {
    "max_prompt_length": "TRL's GRPOConfig no longer has it: prompts are not truncated; shorten or drop overlong "
                         "prompts in the data, and give `armorlab plan --prompt-tokens N` their length",
}


def unknown_key_hint(key: Any, choices: Any = None) -> str:
    """What to say after "unknown config key": a retired TRL field's replacement, else a near miss."""
    if isinstance(key, str) and key.rsplit(".", 1)[-1] in RETIRED_TRL_KEYS:
        return f" ({RETIRED_TRL_KEYS[key.rsplit('.', 1)[-1]]})"
    return did_you_mean(key, known_keys() if choices is None else choices)


# --------------------------------------------------------------------------- dotted keys
def get_dotted(cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def set_dotted(cfg: dict[str, Any], key: str, value: Any, *, file: str | None = None) -> None:
    """Set ``a.b.c`` in a nested dict, turning a short-form section (``task: arithmetic``) into a dict."""
    parts = key.split(".")
    if any(not p for p in parts):
        raise ArmorLabError("malformed dotted key", key=key, value=value, file=file)
    node = cfg
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if isinstance(child, str) and i == 0 and part in ("task", "model"):
            child = {"name": child}
        elif child is None:
            child = {}
        elif not isinstance(child, dict):
            raise ArmorLabError(f"cannot set a sub-key of non-mapping '{part}'", key=key, value=value,
                                file=file)
        node[part] = child
        node = child
    node[parts[-1]] = value


def parse_overrides(items: Iterable[str], *, file: str = "--set") -> dict[str, Any]:
    """``["alpha=0.7", "task.digits=3"]`` → nested dict; values are parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ArmorLabError("override must look like key=value", key=item, value=None, file=file)
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ArmorLabError(f"cannot parse value: {exc}", key=key, value=raw, file=file) from None
        set_dotted(out, key.strip(), value, file=file)
    return out


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``over`` into a copy of ``base``; nested mappings merge, everything else replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if key in ("task", "model") and isinstance(out.get(key), str) and isinstance(value, Mapping):
            out[key] = {"name": out[key]}
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# --------------------------------------------------------------------------- resolution
def _check_section(fields: Mapping[str, Field], raw: Mapping[str, Any], prefix: str,
                   file: str | None) -> dict[str, Any]:
    out = {}
    for key, value in raw.items():
        if key == "name":
            continue
        if key not in fields:
            raise ArmorLabError(f"unknown key{did_you_mean(key, fields)} (known: {', '.join(sorted(fields))})",
                                key=f"{prefix}.{key}", value=value, file=file)
    for key, field in fields.items():
        value = raw.get(key, field.default)
        try:
            out[key] = field.check(value)
        except Invalid as exc:
            raise ArmorLabError(str(exc), key=f"{prefix}.{key}", value=value, file=file) from None
    return out


def _resolve_task(raw: Any, file: str | None, check_paths: bool = True) -> dict[str, Any]:
    if raw is None:
        raw = {"name": "arithmetic"}
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, Mapping):
        raise ArmorLabError("must be a task name or a mapping", key="task", value=raw, file=file)
    name = raw.get("name", "arithmetic")
    if name not in TASKS:
        raise ArmorLabError(f"unknown task (known: {', '.join(TASKS)})", key="task.name", value=name,
                            file=file)
    out = {"name": name, **_check_section(TASK_FIELDS[name], raw, "task", file)}
    if name == "math":
        if check_paths:
            ident = data_identity(out["path"], file=file)
            out["path"], out["fingerprint"] = ident["path"], ident["fingerprint"]
            check_held_out(out, raw, file)
        if out["scorer"] == "boxed":
            del out["scorer"]  # the default: math configs written before the key keep their run ids
        template = out["prompt_template"]
        if template is not None and template != "dapo" and "{problem}" not in template:
            raise ArmorLabError("must contain {problem} where the problem goes", key="task.prompt_template",
                                value=template, file=file)
    return out


def _resolve_model(raw: Any, file: str | None, check_paths: bool = True) -> dict[str, Any]:
    if raw is None:
        raw = {"name": TINY_MODEL}
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, Mapping):
        raise ArmorLabError("must be 'tiny', a model path/hub id, or a mapping", key="model", value=raw,
                            file=file)
    name = raw.get("name", TINY_MODEL)
    try:
        text(name)
    except Invalid as exc:
        raise ArmorLabError(str(exc), key="model.name", value=name, file=file) from None
    if name == TINY_MODEL:
        out = {"name": name, **_check_section(MODEL_FIELDS_TINY, raw, "model", file)}
        if out["hidden_size"] % out["num_heads"] or out["hidden_size"] // out["num_heads"] < 32:
            raise ArmorLabError("hidden_size must split into heads of ≥ 32 dims (vLLM CPU needs it)",
                                key="model.num_heads", value=out["num_heads"], file=file)
        return out
    extra = sorted(set(raw) - {"name", "fingerprint"})
    if extra:
        raise ArmorLabError("a model path takes no other keys", key=f"model.{extra[0]}",
                            value=raw[extra[0]], file=file)
    if not check_paths:
        return {"name": name}
    return model_identity(name, file=file)  # {name: absolute path or hub id, fingerprint}


MAX_PROBLEMS = 20


def resolve(raw: Mapping[str, Any], *, file: str | None = None, check_paths: bool = True) -> dict[str, Any]:
    """Validate ``raw`` and return the fully resolved config (all armorlab defaults filled).

    ``check_paths=False`` (``armorlab plan``) leaves the model and data paths unchecked and
    unfingerprinted: the result plans memory but is no run config (its run id is not the run's).

    TRL keys are checked here by name, by kind (numbers, booleans), by range and, for the fields
    that take one of a fixed set of names (optim, lr_scheduler_type, report_to, scale_rewards,
    ...), against that set; GRPOConfig checks them again when the job starts.

    Every problem of the config is reported at once (armorlab.errors.combine): after the first,
    the key it names is set aside and the rest resolved again, up to MAX_PROBLEMS.
    """
    try:
        return _resolve_once(raw, file=file, check_paths=check_paths)
    except ArmorLabError as first:
        if not isinstance(raw, Mapping):
            raise
        problems, rest = [first], copy.deepcopy(dict(raw))
        while len(problems) < MAX_PROBLEMS and _drop_key(rest, problems[-1].key):
            try:
                _resolve_once(rest, file=file, check_paths=check_paths)
            except ArmorLabError as exc:
                if any(exc.key == p.key for p in problems):
                    break
                problems.append(exc)
                continue
            break
        raise combine(problems) from None


def _drop_key(raw: dict[str, Any], key: str | None) -> bool:
    """Remove the (dotted) config key a problem names; False when there is none to remove."""
    if not key:
        return False
    top, _, sub = key.partition(".")
    if top not in raw:
        return False
    if not sub:
        del raw[top]
        return True
    section = raw[top]
    if isinstance(section, Mapping) and sub in section:
        raw[top] = {k: v for k, v in section.items() if k != sub}
        return True
    if isinstance(section, str) or section is None:
        del raw[top]
        return True
    return False


def _resolve_once(raw: Mapping[str, Any], *, file: str | None = None, check_paths: bool = True) -> dict[str, Any]:
    """One pass of ``resolve``: the first problem found is raised."""
    if not isinstance(raw, Mapping):
        raise ArmorLabError("config must be a mapping", key="<root>", value=raw, file=file)
    known_trl = grpo_field_names()
    raw = objective_fields.apply_loss_type(raw, file)  # TRL's loss_type: X names objective X
    for key in raw:
        if not isinstance(key, str):
            raise ArmorLabError("keys must be strings", key=str(key), value=raw[key], file=file)
        if key in MANAGED_KEYS:
            raise ArmorLabError("set by armorlab from the run directory; remove it", key=key,
                                value=raw[key], file=file)
        if key not in FIELDS and key not in known_trl and key not in ("task", "model"):
            raise ArmorLabError("unknown config key (not an armorlab field nor a GRPOConfig field)"
                                + unknown_key_hint(key), key=key, value=raw[key], file=file)
        problem = trl_fields.config_problem(key, raw[key]) if key not in FIELDS else None
        if problem:
            raise ArmorLabError(problem, key=key, value=raw[key], file=file)
    objective = raw.get("objective", FIELDS["objective"].default)
    try:
        objective = FIELDS["objective"].check(objective)
    except Invalid as exc:
        raise ArmorLabError(str(exc), key="objective", value=objective, file=file) from None
    sized = TINY_DEFAULTS if _model_name(raw.get("model")) == TINY_MODEL else REAL_DEFAULTS
    defaults = {**{k: f.default for k, f in FIELDS.items()}, **COMMON_DEFAULTS, **sized, **DEFAULT_EPS,
                **preset(objective)}
    out: dict[str, Any] = {}
    for key, default in defaults.items():
        value = raw.get(key, default)
        if value is None and key in INERT_KEYS:  # null = "unused here": resolving stays idempotent
            value = default
        if key in FIELDS:
            try:
                value = FIELDS[key].check(value)
            except Invalid as exc:
                raise ArmorLabError(str(exc), key=key, value=value, file=file) from None
        out[key] = _copied(value)
    for key, value in raw.items():
        if key not in out and key not in ("task", "model"):
            out[key] = _copied(value)
    kinds = grpo_field_kinds()
    for key in out:
        if key in kinds and key not in FIELDS and key not in trl_fields.OWN_KIND_CHECK:
            try:
                out[key] = check_trl_value(kinds[key], out[key])
            except Invalid as exc:
                raise ArmorLabError(f"GRPOConfig field {exc}", key=key, value=out[key], file=file) from None
    for key, check in TRL_RANGES.items():
        if key in out:
            try:
                out[key] = check(out[key])
            except Invalid as exc:
                if key == "num_generations":
                    exc = Invalid(f"GRPO needs at least 2 generations per prompt ({exc})")
                raise ArmorLabError(str(exc), key=key, value=out[key], file=file) from None
    steps = rollout_horizon(out["step_unit"], out["max_rollouts"], out["max_steps"], config_per_rollout(out),
                            max_steps_given="max_steps" in raw, file=file)
    if steps is not None:
        out["max_steps"] = steps
    check_stop(out, file)
    for key in [k for k in out if k not in FIELDS and trl_fields.is_inert_default(k, out[k])]:
        del out[key]  # `use_vllm: false` and no use_vllm are one run
    for key, value in out.items():  # dates, NaN, binary, ... cannot be hashed into a run id
        try:
            json_value(value)
        except Invalid as exc:
            raise ArmorLabError(str(exc), key=key, value=value, file=file) from None
    _check_logging_backends(out.get("report_to"), file)
    fill_objective_defaults(out)
    objective_fields.resolve_params(out, file)
    check_vllm_servers(out, file)
    check_engine_parallelism(out, file)
    check_full_support_sampling(out, file)
    if out["overlong_buffer_len"] and isinstance(out.get("max_completion_length"), int) \
            and out["overlong_buffer_len"] >= out["max_completion_length"]:
        raise ArmorLabError(f"the overlong buffer must be shorter than max_completion_length "
                            f"({out['max_completion_length']})", key="overlong_buffer_len",
                            value=out["overlong_buffer_len"], file=file)
    if check_paths:
        _fingerprint_ref_checkpoint(out, file)
    out["task"] = _resolve_task(raw.get("task"), file, check_paths)
    out["model"] = _resolve_model(raw.get("model"), file, check_paths)
    resolve_eval_sets(out, file, check_paths)
    if check_paths and set(raw) - {"task", "model"}:  # not for a model/task section resolved on its own
        check_lengths(out, file)
    _normalise_inert(out)
    return out


# UP's objectives: the A > 0 branch π_θ/sg(π_θ) (and pure IS, π_θ/π_old unclipped) assumes the rows
# were sampled from π_θ's full distribution; no ratio corrects a truncated sampler there.
UP_OBJECTIVES = ("up", "up_gspo", "up_pure_is", "up_self_anchored")
# (key, value at which sampling keeps the full vocabulary); TRL's defaults
FULL_SUPPORT = (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0))


def check_full_support_sampling(out: Mapping[str, Any], file: str | None) -> None:
    """Refuse truncated sampling (top_p < 1, top_k > 0, min_p > 0) with ARMOR's anchors or UP:
    vLLM's log-probs are then renormalised over the kept tokens (TRL issue 6789), while anchors
    are scored with π_ref's full-vocabulary log-probs, and UP's positive branch has no ratio
    that could correct for the truncated sampler (docs/papers.md, "Truncated sampling")."""
    if not (out.get("anchor") or out["objective"] in UP_OBJECTIVES):
        return
    who = "ARMOR's anchors (anchor: true)" if out.get("anchor") else f"objective {out['objective']}"
    for key, full in FULL_SUPPORT:
        value = out.get(key)
        if value is not None and value != full:
            raise ArmorLabError(f"truncated sampling biases {who}: log-probs of a truncated sampler are "
                                f"renormalised over the kept tokens, π_ref's and π_θ's are not; use {key}: "
                                f"{full} (validation sampling has its own val_* keys)", key=key, value=value,
                                file=file)


def _fingerprint_ref_checkpoint(out: dict[str, Any], file: str | None) -> None:
    """``ref_from: {checkpoint: <dir>}`` names weights by path: their fingerprint enters the run id
    (as the model's does), and a directory that is not a loadable checkpoint is refused here."""
    ref = out.get("ref_from")
    if not isinstance(ref, dict) or "checkpoint" not in ref:
        return
    try:
        ident = model_identity(ref["checkpoint"], file=file)
    except ArmorLabError as exc:
        raise ArmorLabError(str(exc).split(" [")[0], key="ref_from.checkpoint", value=ref["checkpoint"],
                            file=file) from None
    out["ref_from"] = {"checkpoint": ident["name"], "fingerprint": ident["fingerprint"]}


_SCALARS = (str, int, float, bool, type(None))


def _copied(value: Any) -> Any:
    # most values are immutable scalars: a sweep resolves each grid point's ~60 keys, and
    # deepcopy's dispatch per scalar showed up in a 1,000-run dry run's profile
    return value if type(value) in _SCALARS else copy.deepcopy(value)


def _model_name(raw: Any) -> Any:
    if isinstance(raw, Mapping):
        return raw.get("name", TINY_MODEL)
    return TINY_MODEL if raw is None else raw


def _check_logging_backends(report_to: Any, file: str | None) -> None:
    """A ``report_to`` backend that is not installed fails here, before a run dir exists, instead
    of in transformers' callback set-up inside the job."""
    import importlib.util

    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    for name in names:
        if name not in LOGGING_BACKENDS:
            continue  # "none", "all" and unknown names: GRPOConfig checks them
        module, package = LOGGING_BACKENDS[name]
        if importlib.util.find_spec(module) is None:
            how = f"'armorlab[{name}]'" if name in LOGGING_EXTRAS else package
            raise ArmorLabError(f"the '{name}' logging backend is not installed: pip install {how}",
                                key="report_to", value=report_to, file=file)


INERT_KEYS = frozenset({"alpha", "quantile_k", "kl_estimator", "anchor_filter", "anchor_ratio", "anchor_samples",
                        "anchor_reward_threshold", "dynamic_sampling_factor", "anchor_cache",
                        "anchor_rounds", "anchor_skip_solved", "ref_vllm_mode", "ref_vllm_memory", "ref_vllm_dtype",
                        "ref_vllm_tensor_parallel_size"})


def default_anchor_ratio(objective: str) -> str:
    """The objective's own ratio for off-policy (anchor) rows: r_mix for an objective that mixes in
    π_ref (armor); for the others the importance ratio against the policy that sampled the row,
    π_θ/π_ref (``behavior``)."""
    return "mixed" if objective_spec(objective).uses_reference else "behavior"


def reference_resets(ref_reset_steps: int, schedule: Any) -> bool:
    """Whether π_ref is ever reset (τ > 0 anywhere), i.e. not static."""
    return bool(ref_reset_steps) or any(int(tau) > 0 for _, tau in schedule or ())


def default_anchor_cache(ref_reset_steps: int, schedule: Any) -> str:
    """What ``anchor_cache: null`` means: ``window`` when π_ref resets (draws stay valid until the
    next reset), ``off`` when it is static (a cache would fix each prompt's anchor and gate
    decision for the whole run, where ARMOR samples afresh)."""
    return "window" if reference_resets(ref_reset_steps, schedule) else "off"


def reads_alpha(objective: str, anchor: bool, anchor_ratio: str | None) -> bool:
    """Whether a run reads α: its objective mixes in π_ref (armor), or its anchor rows take the mixed
    ratio. Elsewhere α is null in the resolved config, and the trainer never sees a value for it."""
    return objective_spec(objective).uses_reference or (bool(anchor) and anchor_ratio == "mixed")


def fill_objective_defaults(cfg: Any) -> None:
    """Defaults that depend on other keys (a dict or an ArmorLabConfig): anchor_ratio from the
    objective, α from G where the run reads it. Shared by ``resolve`` and the trainer's config (for
    Python users who build it without ``resolve``; a resolved config has them already)."""
    get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k)
    put = cfg.__setitem__ if isinstance(cfg, dict) else lambda k, v: setattr(cfg, k, v)
    if get("anchor_ratio") is None:
        put("anchor_ratio", default_anchor_ratio(get("objective")))
    if get("alpha") is None and reads_alpha(get("objective"), get("anchor"), get("anchor_ratio")):
        put("alpha", default_alpha(int(get("num_generations"))))


def _normalise_inert(cfg: dict[str, Any]) -> None:
    """Null out keys that cannot affect this run so equivalent grid points share one run id."""
    anchor_on = cfg["anchor"]
    if cfg["advantage_estimator"] != "quantile":
        cfg["quantile_k"] = None
    if not cfg["beta"]:
        cfg["kl_estimator"] = None
    if not anchor_on:
        cfg["anchor_filter"] = None
        cfg["anchor_ratio"] = None
    if not (anchor_on or cfg["anchor_gate"]):
        cfg["anchor_samples"] = None
        cfg["anchor_reward_threshold"] = None
        cfg["anchor_cache"] = None
        cfg["anchor_rounds"] = "one"  # inert: its default, dropped below (ids of anchor-less runs unchanged)
    elif cfg["anchor_cache"] == default_anchor_cache(cfg["ref_reset_steps"], cfg["ref_reset_schedule"]):
        cfg["anchor_cache"] = None  # what null means here: one run, one id
    if not ((anchor_on or cfg["anchor_gate"]) and cfg["dynamic_sampling"]):
        cfg["anchor_skip_solved"] = False  # no draws, or no filter dropping solved groups: nothing to skip
    if not reads_alpha(cfg["objective"], anchor_on, cfg["anchor_ratio"]):
        cfg["alpha"] = None  # a user's α the run never reads (a grid crossing dapo with α): one run
    # the refill serves both filters; gate-only configs from before it did keep a null factor
    if not cfg["dynamic_sampling"] and (not cfg["anchor_gate"] or cfg["dynamic_sampling_factor"] == 1):
        cfg["dynamic_sampling_factor"] = None
    if not (cfg["dynamic_sampling"] or cfg["anchor_gate"]):
        cfg["max_num_gen_batches"] = 1  # nothing to refill
    if cfg["val_temperature"] == 0:  # val/acc is the greedy score already
        cfg["val_greedy"] = False
        cfg["val_top_p"] = None
    if not cfg["overlong_buffer_len"]:
        cfg["overlong_penalty_factor"] = 1.0
    for key, default in DROPPED_AT_DEFAULT.items():
        if key in cfg and cfg[key] == default:
            del cfg[key]
    # an anchor-less run never starts the engine: its keys are inert (one run id, as with α on dapo),
    # so a paper base can ship `ref_vllm_mode: colocate` for the ARMOR rows beside their DAPO rows
    mode = cfg.get("ref_vllm_mode", "none") if anchor_on or cfg["anchor_gate"] else "none"
    unread = (*REF_VLLM_KEYS, *REF_VLLM_SERVER_KEYS) if mode == "none" else \
        REF_VLLM_SERVER_KEYS if mode == "colocate" else ("ref_vllm_memory", "ref_vllm_dtype",
                                                         "ref_vllm_tensor_parallel_size")
    for key in unread:
        cfg.pop(key, None)


def split_config(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Resolved config → (armorlab-only fields incl. task/model, GRPOConfig kwargs)."""
    ours = {k: v for k, v in cfg.items() if k in FIELDS or k in ("task", "model")}
    trl = {k: v for k, v in cfg.items() if k not in ours}
    return ours, trl


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> dict[str, Any]:
    """Read a YAML config (or start empty), apply ``key=value`` overrides, resolve."""
    raw = load_yaml_mapping(path) if path is not None else {}
    over = parse_overrides(overrides)
    merged = deep_merge(raw, over)
    return resolve(merged, file=str(path) if path is not None else "--set")
