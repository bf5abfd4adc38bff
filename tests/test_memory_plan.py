"""The memory plan (issue 25 §1): each formula by hand on a small case, against bytes measured on
CPU tensors for the tiny model and a ~55 M-parameter Qwen2 built in code (within 25 %), the shapes
the plan reads, and the refusal: the line that overflows and what would make it fit, for the
papers' settings on today's profile and on the FSDP2 one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from model_dirs import fake_model_dir

from armorlab.cli import main
from armorlab.core import memory_plan as mp
from armorlab.core.config import load_yaml_mapping, resolve
from armorlab.core.known_models import KNOWN_CONFIGS
from armorlab.core.memory_plan import GIB, ModelShape, Parallelism, RunMemory, plan_memory
from armorlab.core.plan_inputs import (
    load_shape,
    parallelism_from_accelerate,
    parallelism_from_env,
    plan_config,
    run_memory,
    shape_from_config,
)
from armorlab.errors import ArmorLabError
from tests import memory_support

REPO = Path(__file__).resolve().parents[1]
# A hand-countable decoder: vocab 10, d 4, I 6, 2 layers, 2 heads of 2, 1 KV head, Qwen2 biases.
SMALL = ModelShape(name="small", vocab_size=10, hidden_size=4, intermediate_size=6, num_layers=2, num_heads=2,
                   num_kv_heads=1, head_dim=2, qkv_bias=True)
QWEN7B = shape_from_config(KNOWN_CONFIGS["Qwen/Qwen2.5-Math-7B"], name="Qwen2.5-Math-7B", source="shipped")
TOLERANCE = 0.25


def within(measured: int, formula: int, tol: float = TOLERANCE) -> bool:
    return abs(formula - measured) <= tol * measured


# --------------------------------------------------------------------------- formulas by hand
def test_parameter_count_by_hand_and_as_transformers_builds_it():
    # layer: q 4·4 + 4 bias, k and v 4·2 + 2 bias each, o 4·4, MLP 3·4·6, two norms 2·4 = 136
    assert mp.layer_parameter_count(SMALL) == 16 + 4 + 2 * (8 + 2) + 16 + 72 + 8 == 136
    # embedding 10·4, 2 layers, final norm 4, untied head 10·4
    assert SMALL.params == 40 + 2 * 136 + 4 + 40 == 356
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    cases = [(Qwen2Config(vocab_size=10, hidden_size=4, intermediate_size=6, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, tie_word_embeddings=False), "qwen2"),
             (Qwen3Config(vocab_size=12, hidden_size=8, intermediate_size=6, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=4, tie_word_embeddings=False), "qwen3"),
             (LlamaConfig(vocab_size=12, hidden_size=8, intermediate_size=6, num_hidden_layers=1, num_attention_heads=2,
                          tie_word_embeddings=True), "llama")]
    from transformers import AutoModelForCausalLM

    for config, kind in cases:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        fields = {**config.to_dict(), "model_type": kind}
        assert shape_from_config(fields, name=kind, source="test").params == sum(p.numel() for p in model.parameters())


def test_the_shipped_7b_shape_has_the_published_weights_size():
    # Qwen2.5-Math-7B's bf16 shards total 15.23 GB (4.88 + 4.93 + 4.33 + 1.09 GB): 7.615 B parameters
    assert QWEN7B.params == 7_615_616_512
    assert abs(QWEN7B.params * 2 / 1e9 - (4.88 + 4.93 + 4.33 + 1.09)) < 0.02
    qwen3 = shape_from_config(KNOWN_CONFIGS["Qwen/Qwen3-8B-Base"], name="q3", source="shipped")
    assert round(qwen3.params / 1e9, 2) == 8.19  # "Number of Parameters: 8.2B" on the model card


def test_kv_cache_adam_tile_probe_and_engine_by_hand():
    assert mp.kv_cache_bytes(SMALL, tokens=5, b=2) == 2 * 2 * 1 * 2 * 5 * 2 == 80
    # norms 2·(4 + 2·2)·4, attention q/k/v/out over 2 heads of 2: 4·4·2, MLP 4·6·2
    assert mp.layer_activation_bytes(SMALL, 2) == 64 + 32 + 48
    assert mp.adamw_state_bytes(356, 4) == 2848
    assert mp.ddp_bucket_bytes(356, 2) == 712
    # TRL's tile: 4096 tokens × 32768 columns, whatever the batch beyond them
    assert mp.logprob_tile_bytes(5000, 40000, 2) == 4096 * 32768 * 2
    assert mp.logprob_tile_bytes(10, 100, 4, triton=False, backward=True) == 10 * 32768 * 4 + 10 * 100 * 29
    assert mp.fused_head_backward_bytes(3, 10, 4, 2, 4) == 3 * 4 * (4 + 2) + 10 * 4 * 4
    assert mp.probe_kl_bytes(rows=2, completion=3, vocab=10, b=2) == 2 * 3 * 10 * (4 + 29)
    # the second model's forward: first logits 2·3·10·2, one layer's no-grad tensors over 2·(1 + 3)
    # tokens ((3·6 + 4·4)·2 each), the head's logits over 3 + 1 positions
    forward = 2 * 3 * 10 * 2 + 8 * (3 * 6 + 4 * 4) * 2 + 2 * 4 * 10 * 2
    assert mp.probe_chunk_bytes(SMALL, rows=2, prompt=1, completion=3, b=2) == max(forward, 1980)
    assert mp.vllm_engine_bytes(0.3, 80 * GIB) == int(0.3 * 80 * GIB)
    # no-grad forward: one layer's gate, silu(gate), up (3·6) and the residual in/out (4·4), per token
    assert mp.forward_no_grad_bytes(SMALL, tokens=5, b=2) == 5 * (18 + 16) * 2
    assert mp.layer_backward_bytes(SMALL, 2) == (3 * 6 + 4 * 4) * 2
    # FSDP2: two decoder layers + the LM head gathered (and as many unsharded gradients in backward)
    assert mp.fsdp_unit_bytes(SMALL, 2, grads=False) == (2 * 136 + 40) * 2
    assert mp.fsdp_unit_bytes(SMALL, 2, grads=True) == 2 * (2 * 136 + 40) * 2
    # vLLM's start-up profile: 4096 batched tokens through one layer, float32 logits and probabilities
    # of max_num_seqs rows, CUDA graphs
    assert mp.vllm_overhead_bytes(SMALL, max_seqs=3, b=2) == 4096 * 34 * 2 + 2 * 3 * 10 * 4 + GIB
    # generate: the larger of the prefill and the last step (full cache + one layer + sampling)
    prefill = mp.kv_cache_bytes(SMALL, 2 * 3, 2) + mp.forward_no_grad_bytes(SMALL, 6, 2) + 2 * 9 + 2 * 10 * 4
    decode = mp.kv_cache_bytes(SMALL, 2 * 8, 2) * 3 // 2 + 2 * 64 + 2 * 10 * 46
    assert mp.generate_bytes(SMALL, rows=2, prompt=3, new=5, b=2) == max(prefill, decode)
    # gradient checkpointing keeps each layer's input (d·b) instead of every saved tensor
    stored = mp.training_activation_bytes(SMALL, tokens=7, b=2, checkpointing=True)
    assert stored == 7 * (2 * 4 * 2 + (4 + 4) * 4 + 4 * 2)
    assert mp.training_activation_bytes(SMALL, 7, 2, False) - stored == 7 * 2 * (144 - 8)


# --------------------------------------------------------------------------- measured on CPU tensors
MODELS = [pytest.param(memory_support.tiny_model, id="tiny"),
          pytest.param(memory_support.qwen_55m, id="55M", marks=pytest.mark.slow)]


@pytest.mark.parametrize("build", MODELS)
@pytest.mark.parametrize("checkpointing", [True, False], ids=["checkpointing", "no-checkpointing"])
def test_training_micro_batch_matches_measured_bytes(build, checkpointing):
    (kept, kept_formula), (peak, peak_formula) = memory_support.training_step(build, checkpointing)
    assert within(kept, kept_formula), (kept, kept_formula)
    assert within(peak, peak_formula), (peak, peak_formula)


@pytest.mark.parametrize("build", MODELS)
def test_no_grad_scoring_matches_measured_bytes(build):
    measured, formula = memory_support.scoring(build)
    assert within(measured, formula), (measured, formula)


@pytest.mark.parametrize("build", MODELS)
@pytest.mark.parametrize("new", [4, 40], ids=["prefill-bound", "cache-bound"])
def test_generate_matches_measured_bytes(build, new):
    measured, formula = memory_support.generation(build, new)
    assert within(measured, formula), (measured, formula)


@pytest.mark.parametrize("build", MODELS)
def test_exact_kl_probe_chunk_matches_measured_bytes(build):
    measured, formula = memory_support.probe(build)
    assert within(measured, formula), (measured, formula)


@pytest.mark.parametrize("build", MODELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gradients_and_adamw_state_match_measured_bytes(build, dtype):
    (left, formula), (peak, _) = memory_support.optimizer_state(build, dtype)
    assert within(left, formula, 0.01) and within(peak, formula), (left, peak, formula)


# --------------------------------------------------------------------------- shapes and inputs
def test_tiny_shape_is_the_tiny_model_built():
    model, shape = memory_support.tiny_model()
    cfg = model.config
    assert (shape.vocab_size, shape.hidden_size, shape.intermediate_size, shape.num_layers, shape.num_heads,
            shape.max_positions) == (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
                                     cfg.num_attention_heads, cfg.max_position_embeddings)
    assert shape.params == sum(p.numel() for p in model.parameters())


def test_shapes_come_from_a_directory_then_the_shipped_table(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**KNOWN_CONFIGS["Qwen/Qwen3-8B"], "num_hidden_layers": 2}))
    assert load_shape(str(tmp_path / "m")).num_layers == 2  # a directory's own config.json wins
    assert load_shape("/nowhere/Qwen2.5-Math-7B").params == QWEN7B.params  # by the path's last component
    assert load_shape({"name": "Qwen/Qwen3-8B-Base"}).max_positions == 32768
    with pytest.raises(ArmorLabError, match="no config.json.*Qwen/Qwen2.5-Math-7B"):
        load_shape("/nowhere/Unknown-13B")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"model_type": "qwen2"}')
    with pytest.raises(ArmorLabError, match="lacks a field.*bad/config.json"):
        load_shape(str(tmp_path / "bad"))


def test_parallelism_from_accelerate_configs_and_the_launch_environment():
    fsdp = parallelism_from_accelerate(load_yaml_mapping(REPO / "slurm" / "accelerate-8gpu-fsdp2.yaml"), source="x")
    assert (fsdp.kind, fsdp.processes, fsdp.offload, fsdp.mixed_precision) == ("fsdp", 8, False, "bf16")
    ddp = parallelism_from_accelerate(load_yaml_mapping(REPO / "slurm" / "accelerate-8gpu.yaml"), source="x")
    assert (ddp.kind, ddp.processes) == ("ddp", 8)
    assert parallelism_from_accelerate({"distributed_type": "DEEPSPEED", "num_processes": 4,
                                        "deepspeed_config": {"zero_stage": 2}}, source="x").kind == "zero2"
    env = parallelism_from_env({"WORLD_SIZE": "4", "ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": "true",
                                "ACCELERATE_MIXED_PRECISION": "bf16"})
    assert (env.kind, env.processes, env.offload) == ("fsdp", 4, True)
    assert parallelism_from_env({}).kind == "single"


def test_run_settings_follow_trl_defaults_and_the_config():
    cfg = resolve({"model_init_kwargs": '{"dtype": "bfloat16"}', "per_device_train_batch_size": 4,
                   "gradient_accumulation_steps": 2, "steps_per_generation": 8}, check_paths=False)
    run = run_memory(cfg, QWEN7B, Parallelism("ddp", 2))
    assert (run.load_dtype, run.compute_dtype, run.generation_rows, run.vllm_max_seqs) == ("bfloat16", "bfloat16", 32, 32)
    assert run_memory(resolve({}), QWEN7B, Parallelism()).load_dtype == "float32"  # TRL loads fp32 by default


def test_plan_paths_are_not_checked_when_only_planning():
    cfg = resolve({"model": "/nowhere/Qwen2.5-Math-7B", "task": {"name": "math", "path": "/nowhere/d.jsonl"}},
                  check_paths=False)
    assert cfg["model"] == {"name": "/nowhere/Qwen2.5-Math-7B"}
    with pytest.raises(ArmorLabError, match="no such model directory"):
        resolve({"model": "/nowhere/Qwen2.5-Math-7B"})


def test_the_rule_for_holding_pi_ref_is_the_trainers():
    reference = pytest.importorskip("armorlab.train.reference")
    if not hasattr(reference, "reference_needed"):
        pytest.skip("the trainer builds π_ref for every run on this branch")
    from armorlab.core.plan_inputs import reference_held
    from armorlab.train.trainer_config import ArmorLabConfig

    for raw in ({}, {"objective": "armor"}, {"beta": 0.01}, {"anchor_gate": True}, {"kl_telemetry": False},
                {"kl_telemetry": False, "kl_probe_prompts": 0}, {"kl_telemetry": False, "val_every": 0}):
        cfg = resolve(raw)
        args = ArmorLabConfig(output_dir="/tmp/x", use_cpu=True, bf16=False,
                              **{k: v for k, v in cfg.items() if k not in ("task", "model")})
        assert reference_held(cfg) == reference.reference_needed(args, True), raw


# --------------------------------------------------------------------------- refusals
def _plan(par: Parallelism, **run) -> mp.MemoryPlan:
    return plan_memory(QWEN7B, par, dataclasses.replace(RunMemory(train_rows=16, completion_tokens=3072), **run),
                       80 * GIB)


def test_refusal_names_the_line_that_overflows_and_the_fix():
    old = _plan(Parallelism("ddp", 8, mixed_precision="bf16"), load_dtype="float32")
    with pytest.raises(ArmorLabError, match=r"'DDP gradient buckets \(fp32\)'.*FSDP2.*dtype: bfloat16"):
        old.check()
    fsdp = Parallelism("fsdp", 8, mixed_precision="bf16")
    new = _plan(fsdp, load_dtype="bfloat16", use_vllm=True, vllm_sleep=True, vllm_share=0.4, vllm_max_len=4096)
    assert new.overflow() is None and new.peak_bytes < 80 * GIB
    probe = dataclasses.replace(new.run, probe=True)
    with pytest.raises(ArmorLabError, match=r"exact-KL probe needs .*'exact-KL probe logits.*kl_probe_prompts: 0"):
        plan_memory(QWEN7B, fsdp, probe, 80 * GIB).check()
    big = dataclasses.replace(new.run, train_rows=64)
    with pytest.raises(ArmorLabError, match=r"a training micro-batch needs.*per_device_train_batch_size"):
        plan_memory(QWEN7B, fsdp, big, 80 * GIB).check()
    small_share = dataclasses.replace(new.run, vllm_share=0.15)
    with pytest.raises(ArmorLabError, match=r"the policy vLLM engine.*vllm_gpu_memory_utilization"):
        plan_memory(QWEN7B, fsdp, small_share, 80 * GIB).check()
    assert plan_memory(QWEN7B, fsdp, new.run, None).overflow() is None  # no GPU size: nothing refused


def _cli(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-Math-7B", "Qwen/Qwen3-8B-Base"])
def test_papers_settings_pass_on_the_fsdp_profile_and_are_refused_on_todays(model, capsys):
    spec = str(REPO / "sweeps" / "paper" / "armor_table1.yaml")
    code, out, err = _cli(["plan", spec, "--set", f"model={model}"], capsys)  # the spec's profile: gpu-8x-fsdp
    assert code == 0, err
    assert "fsdp × 8" in out and "fits" in out and "does not fit" not in out
    # today's: plain DDP, TRL's fp32 load, HF generate
    old = ["--set", "model_init_kwargs=null", "--set", "use_vllm=false"]
    code, out, err = _cli(["plan", spec, "--profile", str(REPO / "slurm" / "gpu-8x.yaml"), "--set", f"model={model}",
                           *old], capsys)
    assert code == 2
    assert "'DDP gradient buckets (fp32)' takes the resident memory to" in err and "FSDP2" in err


def test_allowances_and_the_engine_share_that_fits_by_hand():
    G = 100 * GIB
    run = RunMemory(use_vllm=True, vllm_mode="colocate", vllm_sleep=True, vllm_share=0.4)
    assert mp.fragmentation_bytes(G) == 5 * GIB             # 5 % of the GPU
    assert mp.sleep_leftover_bytes(0.4, G) == int(0.1 * 0.4 * G)  # 10 % of a 40 GiB share: 4 GiB
    weights = mp.Line("weights", "w", 20 * GIB)
    train = mp.Phase("train", "t", (mp.Line("act", "a", 30 * GIB),))
    awake = mp.Phase("rollout", "r", (mp.Line("vllm", "v", 36 * GIB),))
    sleeping = mp.MemoryPlan(QWEN7B, Parallelism(), run, G, [weights, mp.Line("sleep", "s", 4 * GIB)],
                             [train, awake])
    # awake it may take what the other 20 GiB leave (0.8); asleep its 10 % beside 20 + 30 GiB: ≤ 5
    assert sleeping.engine_shares() == [("vllm_gpu_memory_utilization", 0.4, 0.8)]
    ref_run = RunMemory(anchors=True, ref_vllm_mode="colocate", ref_vllm_share=0.2)
    never_asleep = mp.MemoryPlan(QWEN7B, Parallelism(), ref_run, G,
                                 [weights, mp.Line("ref_vllm", "e", 20 * GIB)], [train])
    assert never_asleep.engine_shares() == [("ref_vllm_memory", 0.2, 0.5)]  # (100 − 20 − 30) / 100
    # a sleeping π_ref engine is sized like the policy's: awake (its own phase) beside the 20 GiB
    # resident, 0.8; asleep, 10 % of its share beside 20 + 30 GiB: ≤ 5
    ref_sleeps = RunMemory(anchors=True, ref_vllm_mode="colocate", ref_vllm_share=0.4, vllm_sleep=True)
    anchors = mp.Phase("anchors", "a", (mp.Line("ref_vllm", "e", 36 * GIB),))
    asleep = mp.MemoryPlan(QWEN7B, Parallelism(), ref_sleeps, G, [weights, mp.Line("ref_sleep", "s", 4 * GIB)],
                           [train, anchors])
    assert asleep.engine_shares() == [("ref_vllm_memory", 0.4, 0.8)]
    assert mp.MemoryPlan(QWEN7B, Parallelism(), run, None).engine_shares() == []


def test_refusal_names_every_phase_over_the_limit_and_true_advice():
    G = 10 * GIB
    plan = mp.MemoryPlan(QWEN7B, Parallelism(), RunMemory(gradient_checkpointing=True), G,
                         [mp.Line("weights", "w", 4 * GIB)],
                         [mp.Phase("train", "a training micro-batch", (mp.Line("act", "a", 7 * GIB, fix="fa"),)),
                          mp.Phase("score", "log-prob scoring", (mp.Line("s", "s", 6 * GIB + 1, fix="fs"),)),
                          mp.Phase("val", "validation", (mp.Line("v", "v", 6 * GIB),))])  # 4 + 6 = 10: fits
    why = plan.overflow()
    assert why.count("\n") == 1 and "a training micro-batch needs 11.0 GiB" in why and "fa" in why
    assert "log-prob scoring needs 10.0 GiB" in why and "fs" in why and "validation" not in why
    on = plan_memory(QWEN7B, Parallelism(), RunMemory(train_rows=16, completion_tokens=3072,
                                                       gradient_checkpointing=True), 80 * GIB)
    off = plan_memory(QWEN7B, Parallelism(), RunMemory(train_rows=16, completion_tokens=3072,
                                                        gradient_checkpointing=False), 80 * GIB)
    assert "gradient_checkpointing: true" not in on.phases[0].main_line().fix
    assert "gradient_checkpointing: true" in off.phases[0].main_line().fix


def test_a_refused_plan_is_said_once(capsys):
    spec = str(REPO / "sweeps" / "paper" / "armor_table1.yaml")
    code, out, err = _cli(["plan", spec, "--profile", str(REPO / "slurm" / "gpu-8x.yaml"), "--set",
                           "model=Qwen/Qwen2.5-Math-7B", "--set", "model_init_kwargs=null"], capsys)
    assert code == 2 and "does not fit" in out
    reason = "'DDP gradient buckets (fp32)' takes the resident memory to"
    assert reason not in out and err.count("memory plan of") == err.count(reason) == 3, err  # 3 distinct plans


def test_plan_of_a_staged_spec_plans_every_stage(capsys):
    # the continuing stage's ARMOR arms hold π_ref and sample anchors: a shape stage 1 never has
    spec = str(REPO / "sweeps" / "paper" / "armor_table1.yaml")
    code, out, err = _cli(["plan", spec, "--set", "model=Qwen/Qwen2.5-Math-7B"], capsys)
    assert code == 0, err
    plans = out.split("memory per GPU")[1:]
    assert len(plans) == 3, out  # stage 1; continued dapo (both estimators); continued armor (both)
    stage1, dapo, armor = plans
    assert "dapo: base" in stage1 and "continue: objective=dapo" in " ".join(dapo.split())
    assert "continue: objective=armor" in " ".join(armor.split())
    assert "anchor sampling" in armor and "anchor sampling" not in dapo + stage1


def test_sweep_refuses_a_run_that_does_not_fit_before_writing_anything(tmp_path, monkeypatch):
    from armorlab.sweeps.submit import plan_sweep

    fake_model_dir(tmp_path / "model", config=KNOWN_CONFIGS["Qwen/Qwen2.5-Math-7B"])
    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"problem": "{i} + 1", "answer": "{i + 1}"}}\n' for i in range(1200)))
    over = {"model": str(tmp_path / "model"), "task": {"path": str(data)}, "eval_sets": None}  # the held-out files: elsewhere
    spec = REPO / "sweeps" / "paper" / "armor_table1.yaml"
    with pytest.raises(ArmorLabError, match=r"does not fit: memory plan: .*slurm/gpu-8x.yaml"):
        plan_sweep(spec, root=tmp_path / "runs", profile=REPO / "slurm" / "gpu-8x.yaml", overrides=over)
    assert not (tmp_path / "runs").exists()
    assert plan_sweep(spec, root=tmp_path / "runs", overrides=over).runs  # gpu-8x-fsdp: fits
    monkeypatch.setenv("ARMORLAB_MEMORY_CHECK", "off")
    assert plan_sweep(spec, root=tmp_path / "runs", profile=REPO / "slurm" / "gpu-8x.yaml", overrides=over).runs


def test_train_refuses_before_loading_on_a_gpu_too_small(tmp_path, monkeypatch):
    from armorlab.train import launch

    fake_model_dir(tmp_path / "model", config=KNOWN_CONFIGS["Qwen/Qwen2.5-Math-7B"])
    cfg = resolve({"model": str(tmp_path / "model")})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 80 * GIB})())
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ArmorLabError, match="memory plan: 'AdamW state"):
        launch.check_memory(cfg, "config.yaml")  # fp32 weights, gradients and moments of 7.6 B parameters


def test_plan_of_a_run_config_on_a_cpu_profile_only_prints(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("objective: armor\nanchor: true\n")
    code, out, _ = _cli(["plan", str(config), "--profile", str(REPO / "slurm" / "local.yaml")], capsys)
    assert code == 0 and "tiny" in out and "not checked: no gpu_memory_gb" in out
    code, _, err = _cli(["plan", str(config), "--set", "model=/nowhere/Unknown-13B"], capsys)
    assert code == 2 and "no config.json for this model" in err


def test_profiles_state_their_gpu_memory(tmp_path):
    from armorlab.sweeps.profile import load_profile

    for name in ("gpu-8x.yaml", "gpu-8x-fsdp.yaml", "gpu-8x-vllm.yaml", "gpu-example.yaml"):
        assert load_profile(REPO / "slurm" / name).gpu_memory_gb == 80, name
    assert load_profile(REPO / "slurm" / "local.yaml").gpu_memory_gb is None
    bad = tmp_path / "p.yaml"
    bad.write_text("gpu_memory_gb: -80\n")
    with pytest.raises(ArmorLabError, match=r"gpu_memory_gb.*p.yaml"):
        load_profile(bad)
    assert plan_config(resolve({}), Parallelism(), None).overflow() is None  # CPU profiles only print
