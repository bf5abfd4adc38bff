"""The trainers whose logs armorlab reads (TRL, verl, OpenRLHF) and how their names map onto armorlab's;
one flavour's table serves every format (``normalise`` undoes transformers' ``rewrite_logs`` first).
docs/importers.md shows these tables; a test checks that it lists every rule."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from armorlab.analysis.importers.base import ImportedRun, build_table, seed_and_config

SRC = "src/"


@dataclass(frozen=True)
class Rule:
    """``pattern`` (a regex matched against the whole source name) → ``target`` (``{group}`` fills a named group);
    what each rule's armorlab metric means for that trainer: the tables of docs/importers.md."""
    pattern: str
    target: str

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)


@dataclass(frozen=True)
class Flavour:
    """A trainer's naming: ``step_keys`` carry its step in W&B/trackio rows; ``cannot``: metrics it never logs."""
    name: str
    rules: tuple[Rule, ...]
    drop: frozenset[str] = frozenset()
    normalise: Callable[[str], str] = str
    step_keys: tuple[str, ...] = ()
    cannot: tuple[str, ...] = ()
    identity: tuple[str, ...] = ()

    def names(self) -> Callable[[str], str | None]:
        """Source name → armorlab name by the first rule matching its ``normalise``d spelling, else
        ``src/<name>`` (the logged spelling); ``None`` drops it."""
        def target(name: str) -> str | None:
            key = self.normalise(name)
            if name in self.drop or key in self.drop:
                return None
            for rule in self.rules:
                if m := rule.regex.fullmatch(key):
                    return rule.target.format(**m.groupdict())
            return SRC + name
        return target


# the metrics no other trainer logs: armorlab's sequence-level KL, capacity and anchors
ARMORLAB_ONLY = ("kl/reverse_k3", "kl/forward_k3", "cap/pos_mean", "anchor/rate")


def readable(pattern: str) -> str:
    """A rule's pattern as the docs show it: ``rewards/(?P<f>.+)/mean`` → ``rewards/<f>/mean``."""
    return re.sub(r"\(\?P<(\w+)>(?:[^()]|\([^()]*\))*\)", r"<\1>", pattern)


def readable_target(target: str) -> str:
    """A rule's target as the docs show it: ``val/{ds}/acc`` → ``val/<ds>/acc``."""
    return re.sub(r"\{(\w+)\}", r"<\1>", target)


# TRL (GRPOTrainer): the closing summary row's keys (a row carrying any of these is dropped)
TRL_SUMMARY = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second",
                         "total_flos", "train_loss"})
# transformers' rewrite_logs (the W&B/TensorBoard/trackio callbacks' renaming) undone
_TRL_RAW = {"train/": "", "eval/": "eval_", "test/": "test_"}
# Names as in trainer_state.json's log_history (transformers' Trainer.log + TRL's GRPOTrainer.log).
TRL = Flavour("trl", normalise=lambda name: re.sub(r"^(train|eval|test)/", lambda m: _TRL_RAW[m[0]], name),
              step_keys=("train/global_step",),
              cannot=("val/n", "val/pass@k", *ARMORLAB_ONLY), drop=frozenset({"step", "global_step", *TRL_SUMMARY}),
              identity=("output_dir", "logging_dir", "run_name", "hub_model_id", "hub_token", "push_to_hub_token",
                        "_name_or_path", "project", "trackio_space_id", "resume_from_checkpoint", "_Created",
                        "_Username", "_Group"), rules=(
    Rule(r"reward", "train/reward"),
    Rule(r"reward_std", "train/reward_std"),
    Rule(r"frac_reward_zero_std", "train/frac_reward_zero_std"),
    Rule(r"rewards/(?P<f>.+)/mean", "train/rewards/{f}"),
    Rule(r"rewards/(?P<f>[^/]+)", "train/rewards/{f}"),
    Rule(r"completions/mean_length", "train/length"),
    Rule(r"completion_length", "train/length"),
    Rule(r"completions/clipped_ratio", "train/truncated"),
    Rule(r"entropy", "train/entropy"),
    Rule(r"kl", "obj/beta_kl"),
    Rule(r"clip_ratio/low_mean", "obj/clip_frac_low"),
    Rule(r"clip_ratio/high_mean", "obj/clip_frac_high"),
    Rule(r"clip_ratio/region_mean", "obj/clip_frac"),
    Rule(r"clip_ratio", "obj/clip_frac"),
    Rule(r"loss", "train/loss"),
    Rule(r"grad_norm", "train/grad_norm"),
    Rule(r"learning_rate", "train/learning_rate"),
    Rule(r"epoch", "train/epoch"),
    Rule(r"num_tokens", "train/num_tokens"),
    Rule(r"step_time", "train/step_time"),
    Rule(r"eval_reward", "val/acc"),
    Rule(r"eval_rewards/(?P<f>.+)/mean", "val/rewards/{f}"),
    Rule(r"eval_rewards/(?P<f>[^/]+)", "val/rewards/{f}"),
    Rule(r"eval_completions/mean_length", "val/length"),
    Rule(r"eval_completion_length", "val/length"),
    Rule(r"test_reward", "test/acc"),
    Rule(r"test_completions/mean_length", "test/length"),
))


# verl: names as its Tracking logs them (trainer/ppo/ray_trainer.py, metric_utils.py, core_algos.py).
_VAL = r"val-core/(?P<ds>.+)/(?P<var>[^/]+)"
VERL = Flavour("verl", cannot=("val/n", "val/pass@k", *ARMORLAB_ONLY),
               drop=frozenset({"training/global_step", "step"}),
               identity=("trainer.experiment_name", "trainer.project_name", "trainer.default_local_dir",
                         "trainer.validation_data_dir", "trainer.rollout_data_dir", "trainer.default_hdfs_dir",
                         "trainer.logger"), rules=(
    Rule(r"critic/score/mean", "train/reward"),
    Rule(r"actor/entropy", "train/entropy"),
    Rule(r"response_length/mean", "train/length"),
    Rule(r"response_length/clip_ratio", "train/truncated"),
    Rule(r"actor/pg_clipfrac", "obj/clip_frac"),
    Rule(r"actor/pg_clipfrac_lower", "obj/dual_clip_frac"),
    Rule(r"actor/ppo_kl", "obj/approx_kl"),
    Rule(r"actor/kl_loss", "obj/beta_kl"),
    Rule(r"actor/pg_loss", "obj/policy_loss"),
    Rule(r"actor/grad_norm", "train/grad_norm"),
    Rule(r"actor/lr", "train/learning_rate"),
    Rule(r"training/epoch", "train/epoch"),
    Rule(_VAL + r"/mean@(?P<n>\d+)", "val/{ds}/acc"),
    Rule(_VAL + r"/best@(?P<k>\d+)/mean", "val/{ds}/best@{k}_biased"),
))
# verl's actor kl_loss_type (core_algos.kl_penalty): the ones armorlab's obj/beta_kl means
KL_LOSS_TYPES = {"low_var_kl": "k3", "k3": "k3", "mse": "k2", "k2": "k2"}

# OpenRLHF: names as it logs them (openrlhf/trainer/ppo_trainer.py compute_eval_metrics; ray/ppo_actor.py),
# with the "train/" / "eval/" prefix its W&B and TensorBoard loggers add removed.
OPENRLHF = Flavour(
    "openrlhf", normalise=lambda name: re.sub(r"^(train|eval)/", "", name),
    step_keys=("train/global_step", "eval/global_step"),
    cannot=ARMORLAB_ONLY, drop=frozenset({"global_step", "train/global_step", "eval/global_step", "eval/epoch"}),
    identity=("save_path", "ckpt_path", "wandb_run_name", "use_tensorboard", "logger.wandb.run_name",
              "logger.tensorboard_dir", "ckpt.output_dir", "ckpt.path", "use_wandb", "logger.wandb.key", "wandb_org",
              "wandb_project", "wandb_group", "logger.wandb.org", "logger.wandb.project", "logger.wandb.group"),
    rules=(
    Rule(r"reward", "train/reward"),
    Rule(r"response_length", "train/length"),
    Rule(r"kl", "obj/beta_kl"),
    Rule(r"ppo_kl", "obj/approx_kl"),
    Rule(r"ppo_clip_ratio", "obj/clip_frac"),
    Rule(r"policy_loss", "obj/policy_loss"),
    Rule(r"actor_lr", "train/learning_rate"),
    Rule(r"actor_grad_norm", "train/grad_norm"),
    Rule(r"eval_num_samples", "val/n"),
    Rule(r"eval_response_length_mean", "val/length"),
    Rule(r"eval_(?P<ds>.+)_pass1", "val/{ds}/acc"),
    Rule(r"eval_(?P<ds>.+)_pass(?P<k>\d+)", "val/{ds}/pass@k"),
    Rule(r"eval_(?P<ds>.+)_response_length_mean", "val/{ds}/length"),
))

# no known trainer
NAMESPACES = ("train/", "val/", "test/", "obj/", "kl/", "cap/", "anchor/", "ref/")
GENERIC = Flavour("generic", rules=(  # names already in armorlab's namespaces are kept (logged by armorlab)
    Rule(r"(?P<name>(?:" + "|".join(n.rstrip("/") for n in NAMESPACES) + r")/.+)", "{name}"),))
FLAVOURS = {f.name: f for f in (TRL, VERL, OPENRLHF, GENERIC)}

_OPENRLHF_NAMES = re.compile(r"^(train/(ppo_kl|ppo_clip_ratio|policy_loss|actor_lr|response_length)|"
                             r"eval/eval_.+_pass\d+|eval/eval_num_samples)$")
_TRL_NAMES = re.compile(r"^(train|eval)/(completions/mean_length|completion_length|rewards/.+|"
                        r"clip_ratio/region_mean|frac_reward_zero_std)$")
_VERL_NAMES = re.compile(r"^(actor/|critic/|val-core/|val-aux/|response_length/|timing_s/|perf/)")


def pick(flavour: str | None, config: Mapping[str, Any], names: Iterable[str]) -> Flavour:
    """The flavour a runs.yaml names, else the detected one."""
    return FLAVOURS[flavour] if flavour else detect(config, names)


def detect(config: Mapping[str, Any], names: Iterable[str]) -> Flavour:
    """The trainer that logged a run, from its config's keys, else from its metric names."""
    keys = set(config)
    if any(k.startswith(("actor_rollout_ref.", "algorithm.adv_estimator")) for k in keys):
        return VERL
    if {"n_samples_per_prompt", "pretrain"} <= keys or "rollout.n_samples_per_prompt" in keys or \
            "algo.kl.estimator" in keys:
        return OPENRLHF
    if {"num_generations", "output_dir"} <= keys or {"beta", "num_generations"} <= keys:
        return TRL
    names = list(names)
    for fl, pattern in ((VERL, _VERL_NAMES), (OPENRLHF, _OPENRLHF_NAMES), (TRL, _TRL_NAMES)):
        if any(pattern.match(n) for n in names):
            return fl
    return TRL if "train/global_step" in names else GENERIC


def single_source_aliases(metrics: Iterable[str]) -> dict[str, str]:
    """``val/<ds>/<x>`` → ``val/<x>`` when exactly one data source logged it (then it is the whole set)."""
    by_name: dict[str, list[str]] = {}
    for m in metrics:
        ds, _, name = m.removeprefix("val/").rpartition("/")
        if m.startswith("val/") and ds and (name in ("acc", "pass@k", "length", "n") or name.endswith("_biased")):
            by_name.setdefault(name, []).append(m)
    return {found[0]: f"val/{name}" for name, found in by_name.items() if len(found) == 1}


def imported_run(series, fl: Flavour, flat: Mapping[str, Any], warnings: list[str], *,
                 extra: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                 cannot: Iterable[str] | None = None, config: Mapping[str, Any] | None = None,
                 **fields: Any) -> ImportedRun:
    """What every importer ends with: source series (+ ``extra`` already named) → armorlab-named table under
    ``fl``'s rules and aliases, and its run (``fields``: name, path, state, ...). verl's actor/kl_loss is
    obj/beta_kl only for a k3 or k2 estimator (default low_var_kl)."""
    if fl is VERL:
        kind = flat.get("actor_rollout_ref.actor.kl_loss_type")
        if kind is None and flat and "actor/kl_loss" in series:
            warnings.append("actor_rollout_ref.actor.kl_loss_type not in the config: actor/kl_loss read as verl's "
                            "default low_var_kl (k3)")
        if kind is not None and kind not in KL_LOSS_TYPES:
            fl = replace(fl, rules=tuple(r for r in fl.rules if r.pattern != "actor/kl_loss"))
    table = build_table(series, fl.names(), extra)
    for src, dst in single_source_aliases(table.column_names).items():
        if dst not in table.column_names:
            table = table.append_column(dst, table.column(src))
    table = table.select(["step", *sorted(table.column_names[1:])])
    return ImportedRun(table=table, config={**seed_and_config(flat, fl.identity), **(config or {})},
                       flavour=fl.name, warnings=warnings,
                       unavailable=[m for m in (fl.cannot if cannot is None else cannot) if m not in table.column_names],
                       **fields)
