"""Issue 26 on real tiny runs: schedules counted in rollouts, the kept checkpoints and selected.json
with disk bounded, the gate's refill and its shortfall, and the anchor cache off for a static π_ref."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import TrainerCallback

from armorlab.core.runs import RunDir
from armorlab.train.evaluate_kept import evaluate_kept
from armorlab.train.launch import train_run_dir
from armorlab.train.trainer import ArmorLabTrainer
from tests.trainer_support import AnswerSampler, answer_table, build, model_cache, resolved, tokenizer_for


@pytest.fixture(autouse=True)
def _cache(monkeypatch):
    monkeypatch.setenv("ARMORLAB_CACHE", model_cache())
    for var in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID", "ARMORLAB_JOB_ID"):
        monkeypatch.delenv(var, raising=False)


class DiskProbe(TrainerCallback):
    """After every save (and the keeper's pruning, which runs before it: callbacks in order):
    the checkpoints on disk and their bytes; and whether π_ref equals the policy after each step."""

    def __init__(self, trainer, run_dir):
        self.trainer, self.run_dir = trainer, run_dir
        self.on_disk: list[tuple[int, list[int], int]] = []
        self.ref_is_policy: dict[int, bool] = {}

    def on_step_end(self, args, state, control, **kwargs):
        ref = self.trainer.ref_model.state_dict()
        pol = self.trainer.accelerator.unwrap_model(self.trainer.model).state_dict()
        self.ref_is_policy[state.global_step] = all(torch.equal(ref[k], pol[k]) for k in pol)

    def on_save(self, args, state, control, **kwargs):
        cps = self.run_dir.checkpoints()
        size = sum(f.stat().st_size for cp in cps for f in cp.rglob("*") if f.is_file())
        self.on_disk.append((state.global_step, [int(p.name.split("-")[1]) for p in cps], size))


def _launch_with_probe(run_dir: RunDir, monkeypatch) -> DiskProbe:
    """train_run_dir with a DiskProbe added after the keeper (launch builds the trainer)."""
    from armorlab.train import launch

    probes = []
    real = launch.build_trainer

    def build_and_probe(cfg, rd, callbacks=(), **kw):
        trainer = real(cfg, rd, callbacks, **kw)
        probes.append(DiskProbe(trainer, rd))
        trainer.add_callback(probes[-1])
        return trainer

    monkeypatch.setattr(launch, "build_trainer", build_and_probe)
    outcome = train_run_dir(run_dir.path)
    assert outcome.exit_code == 0, outcome.reason
    return probes[0]


def _levels_by_hand(evals):
    """(step, mean of the evals one before to one after it that exist, their steps) for every eval
    but step 0: written out here, independently of armorlab.stats.select."""
    out = []
    for i in range(len(evals)):
        window = evals[max(i - 1, 0):i + 2]
        out.append((evals[i][0], sum(v for _, v in window) / len(window), [s for s, _ in window]))
    return [w for w in out if w[0] > 0]


def test_rollout_schedules_and_kept_checkpoints_on_a_real_run(tmp_path, monkeypatch):
    # U = steps_per_generation 2 / accumulation 1 = 2 optimizer steps per rollout; 5 rollouts = 10 steps;
    # validate after every rollout, reset π_ref after every 2nd, save every step, keep the last 1
    cfg = resolved(objective="dapo", dynamic_sampling=False, step_unit="rollout", max_rollouts=5, max_steps=10,
                   val_every=1,
                   ref_reset_steps=2, save_steps=1, save_total_limit=1, val_samples=2, kl_probe_prompts=0,
                   task={"name": "arithmetic", "train_size": 8, "val_size": 16, "test_size": 8})
    assert cfg["max_steps"] == 10
    rd = RunDir.create(tmp_path, cfg)
    probe = _launch_with_probe(rd, monkeypatch)

    rows = rd.read_metrics()
    assert [(r["step"], r["rollout"]) for r in rows] == [(0, 0)] + [(s, (s + 1) // 2) for s in range(1, 11)]
    assert [r["step"] for r in rows if "val/acc" in r] == [0, 2, 4, 6, 8, 10]      # after each rollout
    # π_ref ← π_θ after rollouts 2 and 4 = optimizer steps 4 and 8 (and never inside a rollout)
    assert [s for s, same in sorted(probe.ref_is_policy.items()) if same] == [4, 8]
    assert [r["ref/resets"] for r in rows[1:]] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]

    # every step saved a checkpoint; never more than last (1) + kept (1) + the newest eval's (1) at once
    assert [s for s, _, _ in probe.on_disk] == list(range(1, 11))
    assert max(len(cps) for _, cps, _ in probe.on_disk) <= 3
    evals = [(r["step"], r["val/acc"]) for r in rows if "val/acc" in r]
    best_step, best_level, window = max(_levels_by_hand(evals), key=lambda w: w[1])   # first on ties, as max
    selected = rd.read_selected()
    assert selected["step"] == best_step and selected["value"] == pytest.approx(best_level)
    assert selected["window"] == window and window[0] < best_step <= window[-1]
    assert selected["rollout"] == best_step // 2 and selected["metric"] == "val/acc" and selected["mode"] == "max"
    assert selected["checkpoint"] == f"checkpoints/checkpoint-{best_step}"
    assert (rd.path / selected["checkpoint"] / "model.safetensors").is_file()
    assert {p.name for p in rd.checkpoints()} == {f"checkpoint-{best_step}", "checkpoint-10"}
    assert not list(rd.checkpoints_dir.glob(".deleting-*"))
    # armorlab evaluate: the kept checkpoints on the test split, with the run's own k and RNG stream,
    # reproduce the test/acc the run logged at their steps
    record = evaluate_kept(rd.path)
    logged = {r["step"]: r for r in rows if "test/acc" in r}
    assert [c["step"] for c in record["checkpoints"]] == sorted({best_step, 10})
    for c in record["checkpoints"]:
        for key in ("val/acc", "test/acc", "test/pass@k"):
            assert c[key] == pytest.approx(logged[c["step"]][key]), key
        assert c["test/n"] == 8 * 2
        assert c["selected"] == (c["step"] == best_step)
    assert json.loads((rd.path / "evaluation.json").read_text()) == record
    print(f"disk: at most {max(len(c) for _, c, _ in probe.on_disk)} of 10 saved checkpoints at once, "
          f"{max(s for _, _, s in probe.on_disk) / 2**20:.1f} MiB (π_ref weights included after a reset)")


class CaptureTrainer(ArmorLabTrainer):
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.captured.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in out.items()})
        return out


def _gated_run(tmp_path, **overrides):
    """DAPO with the gate alone (no dynamic sampling), trained with every generation captured; the
    reference solves 3 of the 8 training prompts."""
    cfg = resolved(objective="dapo", dynamic_sampling=False, anchor_gate=True, **overrides)
    table = answer_table(cfg)
    solvable = {r["prompt"] for r in _train_rows(cfg)[:3]}
    sampler = AnswerSampler(tokenizer_for(cfg), lambda p: table[p] if p in solvable else "xx")
    trainer = build(tmp_path, cfg, trainer_cls=CaptureTrainer, sampler=sampler)
    trainer.captured = []
    trainer.train()
    return cfg, trainer


def test_the_gate_refills_too_and_logs_what_it_could_not_fill(tmp_path):
    # the gate alone (no dynamic sampling), factor 2: each generation draws 8 groups for 4 slots;
    # the reference solves 3 of the 8 training prompts, so a batch is full only when ≥ 4 of the 8
    # groups drawn are of those prompts
    cfg, trainer = _gated_run(tmp_path, dynamic_sampling_factor=2, max_steps=6)
    rows_per_gen = cfg["per_device_train_batch_size"] * cfg["steps_per_generation"]
    shortfalls = []
    for out in trainer.captured:
        assert out["completion_ids"].size(0) == rows_per_gen                   # the batch keeps its shape
        keep = out["armorlab_keep"].view(-1, cfg["num_generations"])[:, 0].tolist()
        assert keep == sorted(keep, reverse=True)                              # groups that train come first
        # the on-policy rows of the groups the gate kept, over all 8 drawn: 8 per solvable group
        drawn_solvable = round(float(out["armorlab_gen:anchor/gate_keep_success:count"]) / cfg["num_generations"])
        assert sum(keep) == min(4, drawn_solvable)
        short = float(out["armorlab_gen:train/refill_shortfall:total"]) / float(
            out["armorlab_gen:train/refill_shortfall:count"])
        assert short == pytest.approx((4 - sum(keep)) / 4)
        shortfalls.append(short)
    logged = [h["train/refill_shortfall"] for h in trainer.state.log_history if "train/refill_shortfall" in h]
    assert logged == pytest.approx([s for s in shortfalls for _ in range(cfg["steps_per_generation"])])
    assert any(s > 0 for s in shortfalls) and any(s < 1 for s in shortfalls), "the check would be vacuous"


def _train_rows(cfg):
    from armorlab.tasks import build_task

    return list(build_task(cfg["task"]).train)


def _asked_with(tmp_path, **overrides):
    cfg = resolved(objective="dapo", dynamic_sampling=False, anchor=True, max_steps=6,
                   task={"name": "arithmetic", "train_size": 4}, **overrides)
    sampler = AnswerSampler(tokenizer_for(cfg), answer_table(cfg).__getitem__)
    trainer = build(tmp_path, cfg, sampler=sampler)
    trainer.train()
    hits = [h["anchor/cache_hit"] for h in trainer.state.log_history if "anchor/cache_hit" in h]
    return len(sampler.asked), hits


def test_a_static_reference_draws_afresh_every_rollout_unless_the_window_cache_is_asked_for(tmp_path):
    # 4 training prompts = one generation batch; 6 steps = 3 rollouts; π_ref static (τ = 0)
    assert _asked_with(tmp_path / "off") == (12, [0.0, 0.0, 0.0])              # null = off when static
    assert _asked_with(tmp_path / "window", anchor_cache="window") == (4, [0.0, 1.0, 1.0])


def test_evaluate_names_what_is_wrong_and_exits_2(tmp_path):
    rd = RunDir.create(tmp_path, resolved())
    for target, words in ((tmp_path / "nowhere", "not a run directory"), (rd.path, "no checkpoints")):
        proc = subprocess.run([sys.executable, "-m", "armorlab.cli", "evaluate", str(target)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr


def test_refill_generates_until_the_batch_is_full_at_most_max_num_gen_batches(tmp_path):
    # verl's filter_groups: batches of f× the prompts (f = 1 here, 4 groups each) until the groups
    # that pass the gate fill the 4 slots, at most 3 batches; the reference solves 3 of the 8
    # training prompts, so a round brings 1.5 training groups on average: some steps fill within the
    # bound, others run out of it
    cfg, trainer = _gated_run(tmp_path, max_num_gen_batches=3, max_steps=8)
    rows_per_gen = cfg["per_device_train_batch_size"] * cfg["steps_per_generation"]
    slots, rounds_seen = rows_per_gen // cfg["num_generations"], []
    for out in trainer.captured:
        assert out["completion_ids"].size(0) == rows_per_gen                   # the batch keeps its shape
        keep = out["armorlab_keep"].view(-1, cfg["num_generations"])[:, 0].tolist()
        assert keep == sorted(keep, reverse=True)                              # groups that train come first
        rounds = int(out["armorlab_gen:train/gen_batches:total"])
        drawn = round(float(out["armorlab_gen:anchor/gate_keep_success:count"]) / cfg["num_generations"])
        drawn += round(float(out["armorlab_gen:anchor/gate_drop_success:count"]) / cfg["num_generations"])
        assert drawn == rounds * slots                                         # every round drew one batch
        solvable_drawn = round(float(out["armorlab_gen:anchor/gate_keep_success:count"]) / cfg["num_generations"])
        assert sum(keep) == min(slots, solvable_drawn)
        assert 1 <= rounds <= 3 and (sum(keep) == slots or rounds == 3)       # full, or the bound reached
        short = float(out["armorlab_gen:train/refill_shortfall:total"]) / float(
            out["armorlab_gen:train/refill_shortfall:count"])
        assert short == pytest.approx((slots - sum(keep)) / slots)
        groups = out["armorlab_group"].view(-1, cfg["num_generations"])[:, 0]
        assert len(set(groups.tolist())) == slots                              # ids unique across rounds
        rounds_seen.append(rounds)
    assert max(rounds_seen) > 1, "no step refilled: the check would be vacuous"
