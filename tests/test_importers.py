"""Importers of other libraries' runs (armorlab.analysis.importers), on files those libraries wrote
(tests/importer_writers.py): TRL's GRPOTrainer, transformers' TrainerState, wandb offline, torch's
and tensorboard's writers, trackio, verl's FileLogger."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from armorlab.analysis import groups as G
from armorlab.analysis import importers
from armorlab.analysis.importers import flavours, verl
from armorlab.analysis.load import load
from armorlab.analysis.recipe import Recipe
from armorlab.errors import ArmorLabError

W = pytest.importorskip("importer_writers")
needs_wandb = pytest.mark.skipif(not importers.wandb_local.available(), reason="armorlab[wandb] not installed")
needs_tb = pytest.mark.skipif(not importers.tensorboard_events.available(), reason="armorlab[tensorboard] not installed")
needs_trackio = pytest.mark.skipif(__import__("importlib").util.find_spec("trackio") is None,
                                   reason="armorlab[trackio] not installed")


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file below ``root``: size, mtime_ns, sha256 (what 'read-only' must leave alone)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            out[str(p)] = (st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def curve(rs, run, metric):
    steps, values = rs.curve(run, metric)
    return steps.tolist(), values.tolist()


# =========================================================================== a real TRL run
@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl")
    W.run_writer("trl", root / "out", {"seed": 0})
    return root / "out"


@pytest.mark.slow
def test_trl_output_dir_merges_checkpoints_drops_the_summary_row(trl_run):
    out = trl_run / "grpo"
    top = json.loads((out / "trainer_state.json").read_text())
    assert any("train_runtime" in r for r in top["log_history"])  # the closing row the importer drops
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    rs = load([out])
    [rid] = rs.run_ids
    run = rs.runs.iloc[0]
    assert (run["format"], run["state"], run["seed"], run["beta"]) == ("trl", "completed", 0, 0.04)
    train = {r["step"]: r for r in top["log_history"] if "reward" in r}
    evals = {r["step"]: r for r in top["log_history"] if "eval_reward" in r}
    assert rs.wide["step"].tolist() == [1, 2, 3]  # three checkpoints' histories, no step twice
    assert curve(rs, rid, "train/reward") == (sorted(train), [train[s]["reward"] for s in sorted(train)])
    assert curve(rs, rid, "val/acc") == ([2, 3], [evals[2]["eval_reward"], evals[3]["eval_reward"]])
    assert curve(rs, rid, "train/length")[1] == [train[s]["completions/mean_length"] for s in sorted(train)]
    assert curve(rs, rid, "obj/beta_kl")[1] == [train[s]["kl"] for s in sorted(train)]
    assert curve(rs, rid, "src/completions/max_length")[1] == [train[s]["completions/max_length"] for s in sorted(train)]
    assert not [m for m in rs.metrics if "runtime" in m and not m.startswith("src/eval_")]
    assert any("val/n unknown" in w for w in rs.warnings)


def test_trainer_state_histories_newest_checkpoint_wins_and_old_names_map(tmp_path):
    out = tmp_path / "old-trl"
    # an older attempt's checkpoint (step 2 logged 0.9), then the run that resumed before it and went on
    W.write_trainer_state(out, [{"step": 1, "reward": 0.1, "completion_length": 10.0},
                                {"step": 2, "reward": 0.9, "completion_length": 11.0}], max_steps=4, checkpoint=2)
    history = [{"step": 1, "reward": 0.1, "completion_length": 10.0, "rewards/acc_reward": 0.1, "clip_ratio": 0.01},
               {"step": 2, "reward": 0.2, "completion_length": 12.0, "rewards/acc_reward": 0.2, "clip_ratio": 0.02},
               {"step": 2, "eval_reward": 0.55, "eval_completion_length": 9.0},
               {"step": 3, "reward": 0.3, "completion_length": 13.0, "rewards/acc_reward": 0.3, "clip_ratio": 0.03},
               {"step": 4, "reward": 0.4, "completion_length": 14.0, "rewards/acc_reward": 0.4, "clip_ratio": 0.04},
               {"step": 4, "train_runtime": 12.0, "train_loss": 0.5, "total_flos": 0.0}]
    W.write_trainer_state(out, history, max_steps=4, checkpoint=4)
    rs = load([out])
    rid = rs.run_ids[0]
    assert curve(rs, rid, "train/reward") == ([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
    assert curve(rs, rid, "train/length")[1] == [10.0, 12.0, 13.0, 14.0]
    assert curve(rs, rid, "train/rewards/acc_reward")[1] == [0.1, 0.2, 0.3, 0.4]
    assert curve(rs, rid, "obj/clip_frac")[1] == [0.01, 0.02, 0.03, 0.04]
    assert curve(rs, rid, "val/acc") == ([2], [0.55]) and curve(rs, rid, "val/length") == ([2], [9.0])
    assert "train/loss" not in rs.metrics and rs.runs.iloc[0]["state"] == "completed"
    assert any("seed unknown" in w for w in rs.warnings)


@pytest.mark.slow
@needs_tb
def test_tensorboard_and_trackio_of_the_trl_run_give_its_trainer_state(trl_run):
    ref = load([trl_run / "grpo"], format="trl")
    tb = load([trl_run / "grpo" / "runs"])
    assert tb.runs.iloc[0]["format"] == "tensorboard" and tb.runs.iloc[0]["seed"] == 0
    for metric in ("train/reward", "val/acc", "train/entropy", "obj/beta_kl", "train/length"):
        s_ref, v_ref = curve(ref, ref.run_ids[0], metric)
        s_tb, v_tb = curve(tb, tb.run_ids[0], metric)
        assert s_tb == s_ref and np.allclose(v_tb, v_ref, rtol=1e-6, atol=1e-9), metric  # float32 in TensorBoard
    if importers.trackio_db.is_project_db(trl_run / "trl-import.db"):
        tr = load([trl_run / "trl-import.db"])
        rid = tr.run_ids[0]
        assert rid == "grpo-seed0" and tr.runs.iloc[0]["seed"] == 0
        for metric in ("train/reward", "val/acc", "obj/beta_kl"):
            assert curve(tr, rid, metric) == curve(ref, ref.run_ids[0], metric), metric  # trackio's step ≠ TRL's
        assert any("rows without the trainer's step" in w for w in tr.warnings)


@pytest.mark.slow
def test_import_and_report_write_nothing_into_the_sources(trl_run, tmp_path):
    before = snapshot(trl_run)
    out = tmp_path / "rep"
    proc = subprocess.run([sys.executable, "-m", "armorlab.cli", "report", str(trl_run / "grpo"),
                           str(trl_run / "trl-import.db"), str(trl_run / "grpo" / "runs"), "--out", str(out),
                           "--val-n", "16"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (out / "index.html").is_file()
    # and without --out: the report goes to reports/<name> under the cwd, never into the TRL dir
    proc = subprocess.run([sys.executable, "-m", "armorlab.cli", "report", str(trl_run / "grpo")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "reports" / "grpo" / "index.html").is_file()
    assert snapshot(trl_run) == before


# =========================================================================== W&B offline runs
WANDB_TRL = {"name": "trl-grpo", "config": {"num_generations": 8, "beta": 0.04, "output_dir": "out/a", "seed": 3},
             "rows": [{"data": {"train/reward": 0.1 * s, "train/completions/mean_length": 10.0 + s,
                                "train/global_step": s, "train/epoch": s / 10}} for s in range(1, 6)]
             + [{"data": {"eval/reward": 0.4, "train/global_step": 3}},
                {"data": {"eval/reward": 0.35, "train/global_step": 5}}]}
WANDB_VERL = {"name": "verl-grpo", "config": {"actor_rollout_ref": {"actor": {"kl_loss_type": "low_var_kl"}},
                                              "trainer": {"experiment_name": "e1"}, "data": {"seed": 7}},
              # verl logs a step's validation metrics in the same Tracking.log call as its training ones
              "rows": [{"step": s, "data": {"critic/score/mean": 0.2 + 0.01 * s, "actor/kl_loss": 0.001 * s,
                                            "actor/entropy": 1.0 - 0.01 * s, "response_length/mean": 100.0 + s,
                                            "training/global_step": s, **({} if s != 4 else {
                                                "val-core/openai/gsm8k/acc/mean@4": 0.61,
                                                "val-core/openai/gsm8k/acc/best@4/mean": 0.8,
                                                "val-aux/openai/gsm8k/reward/mean@4": 0.61})}} for s in range(1, 8)]}
WANDB_OPENRLHF = {"name": "openrlhf-ppo", "config": {"pretrain": "m", "n_samples_per_prompt": 4, "seed": 11},
                  "define_step": {"train/*": "train/global_step", "eval/*": "eval/global_step"},
                  "rows": [{"data": {"train/reward": 0.3 + 0.01 * s, "train/kl": 0.01 * s, "train/ppo_kl": 0.001,
                                     "train/response_length": 50.0 + s, "train/global_step": s}} for s in range(1, 5)]
                  + [{"data": {"eval/eval_math_pass1": 0.45, "eval/eval_math_pass4": 0.7, "eval/eval_num_samples": 400.0,
                               "eval/global_step": 2}}], "exit_code": 1}
# one row of 3,000 keys: a record over W&B's 32 KiB block, split into first/middle/last chunks
WANDB_BIG = {"name": "big", "rows": [{"step": 0, "data": {f"custom/metric_{i:04d}": float(i) for i in range(3000)}},
                                    {"step": 1, "data": {"custom/metric_0001": 2.0}}]}


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory):
    if not importers.wandb_local.available():
        pytest.skip("armorlab[wandb] not installed")
    root = tmp_path_factory.mktemp("wb")
    W.run_writer("wandb", root, {"runs": [WANDB_TRL, WANDB_VERL, WANDB_OPENRLHF, WANDB_BIG]})
    return root


def _by_name(rs):
    return {r["run_id"].split("/")[-1]: r for r in rs.runs.to_dict("records")}


@needs_wandb
def test_wandb_offline_runs_of_each_trainer(wandb_runs):
    before = snapshot(wandb_runs)
    rs = load([wandb_runs / "wandb"])
    runs = _by_name(rs)
    assert set(runs) == {"trl-grpo", "verl-grpo", "openrlhf-ppo", "big"}
    trl, vr, orl = runs["trl-grpo"]["run_id"], runs["verl-grpo"]["run_id"], runs["openrlhf-ppo"]["run_id"]
    # TRL: the step is train/global_step (W&B's own _step counts log calls: eval rows are extra calls)
    assert curve(rs, trl, "train/reward") == ([1, 2, 3, 4, 5], [0.1 * s for s in range(1, 6)])
    assert curve(rs, trl, "train/length")[1] == [11.0, 12.0, 13.0, 14.0, 15.0]
    assert curve(rs, trl, "val/acc") == ([3, 5], [0.4, 0.35])
    assert runs["trl-grpo"]["seed"] == 3 and runs["trl-grpo"]["beta"] == 0.04 and "output_dir" not in runs["trl-grpo"]
    assert runs["trl-grpo"]["state"] == "completed"
    # verl: step = its global step; the data source has a slash; best@k marked biased; kl_loss is k3
    assert curve(rs, vr, "train/reward")[0] == list(range(1, 8))
    assert curve(rs, vr, "obj/beta_kl")[1] == pytest.approx([0.001 * s for s in range(1, 8)])
    assert curve(rs, vr, "val/openai/gsm8k/acc") == ([4], [0.61]) and curve(rs, vr, "val/acc") == ([4], [0.61])
    assert curve(rs, vr, "val/best@4_biased") == ([4], [0.8])
    assert curve(rs, vr, "src/val-aux/openai/gsm8k/reward/mean@4") == ([4], [0.61])
    assert runs["verl-grpo"]["seed"] == "data.seed=7" and "trainer.experiment_name" not in runs["verl-grpo"]
    # OpenRLHF: train rows by train/global_step, eval rows by eval/global_step; pass1 is avg@k; val/n logged
    assert curve(rs, orl, "train/reward")[0] == [1, 2, 3, 4] and curve(rs, orl, "obj/approx_kl")[1] == [0.001] * 4
    assert curve(rs, orl, "val/acc") == ([2], [0.45]) and curve(rs, orl, "val/pass@k") == ([2], [0.7])
    assert curve(rs, orl, "val/n") == ([2], [400.0]) and curve(rs, orl, "train/length")[1] == [51.0, 52.0, 53.0, 54.0]
    assert (runs["openrlhf-ppo"]["state"], runs["openrlhf-ppo"]["reason"]) == ("failed", "exit code 1")
    big = runs["big"]["run_id"]
    assert curve(rs, big, "src/custom/metric_2999") == ([0], [2999.0])
    assert curve(rs, big, "src/custom/metric_0001") == ([0, 1], [1.0, 2.0])
    assert snapshot(wandb_runs) == before


@needs_wandb
def test_wandb_torn_log_keeps_what_was_written(wandb_runs, tmp_path):
    src = next(d for d in (wandb_runs / "wandb").glob("offline-run-*")
               if "verl-grpo" in importers.wandb_local.read([d]).name)
    dst = tmp_path / "wandb" / src.name
    shutil.copytree(src, dst)
    f = next(dst.glob("*.wandb"))
    whole = load([dst])
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 5])
    torn = load([dst])
    assert any("torn last record" in w for w in torn.warnings)
    rid, rid0 = torn.run_ids[0], whole.run_ids[0]
    assert curve(torn, rid, "train/reward") == curve(whole, rid0, "train/reward")
    with pytest.raises(ArmorLabError, match="not a W&B transaction log"):
        f.write_bytes(b"garbage" + data)
        load([dst])


@needs_wandb
def test_wandb_one_parse_and_item_by_item_read_the_same(wandb_runs, monkeypatch):
    folders = sorted((wandb_runs / "wandb").glob("offline-run-*"))
    fast = [importers.wandb_local.read([f]) for f in folders]
    monkeypatch.setattr(importers.wandb_local._History, "_decode_fast", lambda self: None)
    slow = [importers.wandb_local.read([f]) for f in folders]
    for a, b in zip(fast, slow, strict=True):
        assert a.table.equals(b.table) and a.config == b.config and a.name == b.name


# =========================================================================== TensorBoard
@needs_tb
def test_tensorboard_keeps_every_point_and_tolerates_a_torn_record(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = W.write_tensorboard(tmp_path / "tb" / "run1", [(s, {"val/acc": (s % 97) / 97}) for s in range(12_000)])
    ea = EventAccumulator(str(logdir))
    ea.Reload()
    assert len(ea.Scalars("val/acc")) == 10_000  # TensorBoard's default subsample: what must not happen here
    rs = load([tmp_path / "tb"])
    steps, values = rs.curve(rs.run_ids[0], "val/acc")
    assert steps.tolist() == list(range(12_000))
    assert np.allclose(values, [(s % 97) / 97 for s in range(12_000)], atol=1e-7)
    f = next(logdir.glob("events.out.tfevents.*"))
    f.write_bytes(f.read_bytes()[:-3])  # a writer killed inside its last record
    torn = load([tmp_path / "tb"])
    assert torn.curve(torn.run_ids[0], "val/acc")[0].tolist() == list(range(11_999))
    assert any("torn last record" in w for w in torn.warnings)


@needs_tb
def test_tensorboard_crcs_are_checked(tmp_path):
    import struct

    pytest.importorskip("google_crc32c")
    logdir = W.write_tensorboard(tmp_path / "tb" / "run1", [(s, {"val/acc": s / 100}) for s in range(100)])
    f = next(logdir.glob("events.out.tfevents.*"))
    whole = f.read_bytes()
    frames, pos = [], 0          # (offset, data length) of each record: record 0 is the file-version event
    while pos < len(whole):
        (n,) = struct.unpack_from("<Q", whole, pos)
        frames.append((pos, n))
        pos += 16 + n
    assert len(frames) == 101
    rs = load([tmp_path / "tb"])                    # the writer's own CRCs hold: nothing skipped
    assert rs.curve(rs.run_ids[0], "val/acc")[0].tolist() == list(range(100))
    assert not any("CRC" in w for w in rs.warnings)
    damaged = bytearray(whole)
    at, n = frames[1 + 40]                          # step 40's data, one byte flipped
    damaged[at + 12 + n - 1] ^= 0x01
    at, _ = frames[1 + 70]                          # step 70's length CRC, one bit flipped
    damaged[at + 8] ^= 0x01
    f.write_bytes(bytes(damaged))
    rs = load([tmp_path / "tb"])
    assert rs.curve(rs.run_ids[0], "val/acc")[0].tolist() == [s for s in range(70) if s != 40]
    assert sum("fails its CRC; skipped" in w for w in rs.warnings) == 1
    assert sum("fails its CRC; the rest of the file skipped" in w for w in rs.warnings) == 1


@needs_tb
def test_the_benchmarks_library_sides_read_what_the_importer_reads(tmp_path):
    """benchmarks/library_replacements.py times the reader against tbparse and against itself
    without CRCs: both must read the same points, or the comparison is of different work."""
    import importlib.util
    from types import SimpleNamespace

    pytest.importorskip("tbparse")
    spec = importlib.util.spec_from_file_location(
        "library_replacements", Path(__file__).parents[1] / "benchmarks" / "library_replacements.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tb = importers.tensorboard_events
    logdir = W.write_tensorboard(tmp_path / "run", [(s, {"val/acc": s / 7, "train/reward": -s / 3}) for s in range(40)])
    by_tbparse, no_crc = SimpleNamespace(), SimpleNamespace(_LEN=tb._LEN)
    bench._tensorboard_by_tbparse(by_tbparse)
    bench._tensorboard_without_crc(no_crc)
    ours, theirs = tb.read_dir(logdir)[0], by_tbparse.read_dir(logdir)[0]
    assert sorted(ours) == sorted(theirs) == ["train/reward", "val/acc"]
    for tag in ours:
        assert ours[tag][0].tolist() == theirs[tag][0].tolist() == list(range(40))
        np.testing.assert_array_equal(ours[tag][1], theirs[tag][1])
    data = next(logdir.glob("events.out.tfevents.*")).read_bytes()
    assert list(no_crc.records(data, "f", [])) == list(tb.records(data, "f", []))


@needs_tb
def test_tensorboard_scalar_tensor_summaries(tmp_path):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    writer = EventFileWriter(str(tmp_path / "tf2"))
    for step in range(5):
        for tag, value in (("val/acc", np.float32(0.5 + step / 10)), ("train/reward", np.float64(step / 4)),
                           ("train/step_count", np.int64(step))):
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
                tag=tag, tensor=tensor_util.make_tensor_proto(value),
                metadata=summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
                    plugin_name="scalars")))])
            writer.add_event(event_pb2.Event(step=step, wall_time=1.0, summary=summary))
    writer.close()
    rs = load([tmp_path / "tf2"])
    rid = rs.run_ids[0]
    assert curve(rs, rid, "train/reward") == (list(range(5)), [s / 4 for s in range(5)])
    assert np.allclose(curve(rs, rid, "val/acc")[1], [0.5 + s / 10 for s in range(5)])
    assert curve(rs, rid, "train/step_count")[1] == [0.0, 1.0, 2.0, 3.0, 4.0]


@needs_tb
def test_tensorboard_one_parse_and_event_by_event_read_the_same(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run"))
    writer.add_text("args", '{"seed": 5, "beta": 0.1}')  # a text event among scalars: read one by one
    for step in range(0, 50):
        writer.add_scalar("train/reward", step / 50, step)
        writer.add_scalar("val/acc", 0.0 if step % 7 == 0 else 1 / (step + 1), step)  # zeros are values too
        if step == 20:
            writer.add_histogram("weights", np.arange(10.0), step)
    writer.close()
    fast = importers.tensorboard_events.read(tmp_path / "run")
    monkeypatch.setattr(importers.tensorboard_events, "_fast", lambda payloads: None)
    slow = importers.tensorboard_events.read(tmp_path / "run")
    assert fast.table.equals(slow.table) and fast.table.num_rows == 50
    steps, values = fast.table.column("step").to_pylist(), fast.table.column("val/acc").to_pylist()
    assert steps == list(range(50)) and values[0] == 0.0 and values[7] == 0.0
    assert importers.tensorboard_events.read_texts(tmp_path / "run")["args/text_summary"].startswith('{"seed"')


# =========================================================================== verl
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample():
    for n, c in [(4, 0), (4, 1), (4, 3), (6, 2), (8, 8), (5, 4)]:
        correct = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(correct, k))
            expected = sum(any(s) for s in subsets) / len(subsets)
            assert verl.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


def test_verl_file_logger_and_validation_dumps(tmp_path):
    rows = [(0, {"val-core/openai/gsm8k/acc/mean@4": 0.375, "val-core/openai/gsm8k/acc/best@4/mean": 0.7})]
    rows += [(s, {"critic/score/mean": 0.1 * s, "actor/entropy": 2.0 - 0.1 * s, "actor/pg_clipfrac": 0.01,
                  "actor/ppo_kl": 0.002, "actor/kl_loss": 0.003, "response_length/mean": 64.0 + s,
                  "response_length/clip_ratio": 0.0, "training/global_step": s, "timing_s/gen": 1.5})
             for s in range(1, 4)]
    rows += [(3, {"val-core/openai/gsm8k/acc/mean@4": 0.5, "val-core/openai/gsm8k/acc/best@4/mean": 0.74})]
    path = W.write_verl_jsonl(tmp_path / "logs", "gsm8k", "grpo-s0", rows)
    assert path == tmp_path / "logs" / "gsm8k" / "grpo-s0.jsonl"
    # two prompts × 4 samples at step 0 (3 of 8 correct); at step 3, 4 of 8 with one prompt all wrong
    correct = {0: {"p1": [1, 1, 0, 0], "p2": [1, 0, 0, 0]}, 3: {"p1": [1, 1, 1, 1], "p2": [0, 0, 0, 0]}}
    dumps = tmp_path / "val_dumps"
    for step, by_prompt in correct.items():
        W.write_verl_dump(dumps, step, [{"input": p, "output": "…", "gts": "42", "score": float(x), "acc": bool(x)}
                                        for p, xs in by_prompt.items() for x in xs])
    rs = load([path])
    rid = rs.run_ids[0]
    assert curve(rs, rid, "train/reward") == ([1, 2, 3], pytest.approx([0.1, 0.2, 0.3]))
    rs.counter = "rollout"  # verl's step is one rollout batch: the same x in either counter
    assert curve(rs, rid, "val/acc") == ([0, 3], [0.375, 0.5])
    rs.counter = "step"
    assert curve(rs, rid, "obj/clip_frac")[1] == [0.01] * 3 and curve(rs, rid, "train/truncated")[1] == [0.0] * 3
    assert curve(rs, rid, "val/acc") == ([0, 3], [0.375, 0.5]) and curve(rs, rid, "val/best@4_biased")[0] == [0, 3]
    assert "src/timing_s/gen" in rs.metrics and "val/n" not in rs.metrics
    assert any("records no config" in w for w in rs.warnings)
    assert rs.runs.iloc[0]["unavailable"].split(", ")[:2] == ["val/n", "val/pass@k"]
    assert any("cannot give val/n, val/pass@k, kl/reverse_k3" in w for w in rs.warnings)

    mapping = tmp_path / "runs.yaml"
    mapping.write_text(f"runs:\n  {path}:\n    group: verl grpo\n    seed: 0\n    val_dumps: {dumps}\n")
    rs = load([], mapping=mapping)
    rid = rs.run_ids[0]
    run = rs.runs.iloc[0]
    assert (run["run_group"], run["seed"]) == ("verl grpo", 0)
    assert curve(rs, rid, "val/n") == ([0, 3], [8.0, 8.0])
    assert curve(rs, rid, "val/acc") == ([0, 3], [3 / 8, 4 / 8])
    assert curve(rs, rid, "val/pass@k") == ([0, 3], [1.0, 0.5])
    # pass@1 = mean over prompts of c/n; pass@2 = 1 − C(n−c,2)/C(n,2) per prompt
    assert curve(rs, rid, "val/pass@1")[1] == pytest.approx([(2 / 4 + 1 / 4) / 2, (1 + 0) / 2])
    assert curve(rs, rid, "val/pass@2")[1] == pytest.approx([((1 - 1 / 6) + (1 - 3 / 6)) / 2, 0.5])
    assert not any("val/n unknown" in w for w in rs.warnings)
    assert "val/n" not in rs.runs.iloc[0]["unavailable"] and "kl/reverse_k3" in rs.runs.iloc[0]["unavailable"]


def test_verl_resumed_file_says_what_it_lost(tmp_path):
    path = W.write_verl_jsonl(tmp_path, "p", "resumed", [(s, {"critic/score/mean": 0.5}) for s in range(40, 45)])
    rs = load([path])
    assert any("starts at step 40" in w for w in rs.warnings)


def test_verl_torn_and_deep_lines_are_skipped(tmp_path):
    path = W.write_verl_jsonl(tmp_path, "p", "torn", [(s, {"critic/score/mean": s / 10}) for s in range(1, 5)])
    data = path.read_bytes()
    path.write_bytes(data + b'{"step": 5, "data": ' + b"[" * 100_000 + b"\n" + b'{"step": 6, "data": {"critic/sc')
    rs = load([path])
    assert curve(rs, rs.run_ids[0], "train/reward") == ([1, 2, 3, 4], pytest.approx([0.1, 0.2, 0.3, 0.4]))
    assert sum("skipped unreadable line" in w for w in rs.warnings) == 2


# =========================================================================== trackio
@needs_trackio
def test_trackio_project_runs_config_and_nonfinite_values(tmp_path):
    spec = {"project": "proj", "runs": [
        {"name": "verl-s0", "config": {"actor_rollout_ref": {"actor": {"kl_loss_type": "kl"}}, "data": {"seed": 0}},
         "rows": [{"step": s, "data": {"critic/score/mean": 0.1 * s, "actor/kl_loss": 0.5,
                                       "actor/grad_norm": float("nan") if s == 2 else 1.0}} for s in range(1, 4)]},
        {"name": "plain", "rows": [{"step": 10 * s, "data": {"val/acc": 0.5, "loss": 1.0 / s}} for s in range(1, 3)]}]}
    W.run_writer("trackio", tmp_path / "tk", spec)
    db = tmp_path / "tk" / "proj.db"
    before = snapshot(tmp_path / "tk")
    rs = load([db])
    runs = _by_name(rs)
    v, p = runs["verl-s0"]["run_id"], runs["plain"]["run_id"]
    assert curve(rs, v, "train/reward") == ([1, 2, 3], pytest.approx([0.1, 0.2, 0.3]))
    assert curve(rs, v, "train/grad_norm") == ([1, 3], [1.0, 1.0])  # NaN ("NaN" in trackio's JSON) is no value
    # kl_loss_type "kl" (k1) is not armorlab's obj/beta_kl: kept under src/
    assert "obj/beta_kl" not in rs.metrics and curve(rs, v, "src/actor/kl_loss")[1] == [0.5] * 3
    assert runs["verl-s0"]["seed"] == "data.seed=0" and runs["verl-s0"]["sweep"] == "proj"
    assert curve(rs, p, "val/acc") == ([10, 20], [0.5, 0.5]) and curve(rs, p, "src/loss")[1] == [1.0, 0.5]
    assert snapshot(tmp_path / "tk") == before


# =========================================================================== the same curve, every format
def _synthetic(collapse: bool, seed: int) -> list[tuple[int, float]]:
    """val/acc every 10 steps (n = 400 completions): rises to 0.8, then (collapse) falls to 0.55."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(0, 301, 10):
        p = 0.5 + 0.3 * min(s, 100) / 100
        if collapse and s > 150:
            p -= 0.25 * min(s - 150, 100) / 100
        out.append((s, rng.binomial(400, p) / 400))
    return out


@pytest.mark.slow
@needs_tb
@needs_wandb
@needs_trackio
def test_the_same_curve_gives_the_same_collapse_through_every_format(tmp_path):
    from armorlab.core.runs import RunDir

    curves = {"collapse": _synthetic(True, 1), "flat": _synthetic(False, 2)}
    roots = {}
    for kind, pts in curves.items():
        rd = RunDir.create(tmp_path / "armorlab" / kind, {"objective": kind, "seed": 0})
        for s, v in pts:
            rd.append_metrics(s, {"val/acc": v, "val/n": 400.0})
        rd.write_status("completed")
        roots.setdefault("armorlab", []).append(rd.path)
        W.write_trainer_state(tmp_path / "trl" / kind, [{"step": s, "eval_reward": v} for s, v in pts], max_steps=300,
                              checkpoint=300)
        roots.setdefault("trl", []).append(tmp_path / "trl" / kind)
        rows = [(s, {"val-core/synthetic/acc/mean@4": v}) for s, v in pts]
        roots.setdefault("tensorboard", []).append(W.write_tensorboard(tmp_path / "tb" / kind, rows))
        roots.setdefault("verl", []).append(W.write_verl_jsonl(tmp_path / "verl", "synthetic", kind, rows))
    spec = {"runs": [{"name": kind, "rows": [{"step": s, "data": {"val-core/synthetic/acc/mean@4": v}} for s, v in pts]}
                     for kind, pts in curves.items()]}
    W.run_writer("wandb", tmp_path / "wb", spec)
    W.run_writer("trackio", tmp_path / "tk", {"project": "synthetic", **spec})
    roots["wandb"] = [tmp_path / "wb"]
    roots["trackio"] = [tmp_path / "tk" / "synthetic.db"]
    verdicts = {}
    for fmt, paths in roots.items():
        rs = load(paths, val_n=400)
        formats = set(rs.runs["format"]) if "format" in rs.runs else {"armorlab"}
        assert formats == {fmt}, fmt
        recipe = Recipe(runs=[str(p) for p in paths])
        groups = G.make_groups(rs.runs, [])
        scores = G.run_scores(rs, groups, recipe, [], G.Notes())
        for row in scores.to_dict("records"):
            where = f"{row['run_id']} {rs.runs.set_index('run_id').loc[row['run_id'], 'path']}"
            kind = "collapse" if "collapse" in where else "flat"
            assert kind == "collapse" or "flat" in where
            verdicts.setdefault(kind, {})[fmt] = (row["collapse_step"], row["collapse_z"], row["noise"])
    for kind, by_fmt in verdicts.items():
        ref_step, ref_z, ref_noise = by_fmt["armorlab"]
        assert ref_noise == "binomial"
        assert (ref_step is not None and not (isinstance(ref_step, float) and math.isnan(ref_step))) == (kind == "collapse")
        for fmt, (step, z, noise) in by_fmt.items():
            same_step = step == ref_step or (step != step and ref_step != ref_step)
            assert same_step and noise == ref_noise, (kind, fmt, step, ref_step)
            assert (math.isnan(z) and math.isnan(ref_z)) or z == pytest.approx(ref_z, rel=1e-4), (kind, fmt)
        assert len(by_fmt) == 6


# =========================================================================== detection, mapping, CLI
def test_detect_each_format(tmp_path):
    W.write_trainer_state(tmp_path / "trl", [{"step": 1, "reward": 0.1}], max_steps=1, checkpoint=1)
    jsonl = W.write_verl_jsonl(tmp_path / "v", "p", "e", [(1, {"critic/score/mean": 0.1})])
    (tmp_path / "empty").mkdir()
    assert importers.detect(tmp_path / "trl") == "trl"
    assert importers.detect(tmp_path / "trl" / "checkpoint-1" / "trainer_state.json") == "trl"
    assert importers.detect(jsonl) == "verl"
    assert importers.detect(tmp_path / "empty") is None
    if importers.tensorboard_events.available():
        W.write_tensorboard(tmp_path / "tb", [(0, {"a": 1.0})])
        assert importers.detect(tmp_path / "tb") == "tensorboard"
    plan = importers.plan([tmp_path])
    assert sorted(s.format for s in plan.sources) == sorted(["trl", "verl"] + (["tensorboard"] if (tmp_path / "tb").exists() else []))
    with pytest.raises(ArmorLabError, match="no run directories found"):
        load([tmp_path / "empty"])
    with pytest.raises(ArmorLabError, match="unknown format"):
        load([tmp_path], format="mlflow")


def test_flavour_detection_and_unmapped_names():
    assert flavours.detect({"actor_rollout_ref.actor.kl_loss_type": "k3"}, []).name == "verl"
    assert flavours.detect({"num_generations": 8, "beta": 0.0}, []).name == "trl"
    assert flavours.detect({}, ["eval/eval_aime_pass1"]).name == "openrlhf"
    assert flavours.detect({}, ["train/completions/mean_length"]).name == "trl"
    assert flavours.detect({}, ["val/acc"]).name == "generic"
    names = flavours.TRL.names()
    assert names("train/reward") == "train/reward" and names("eval/reward") == "val/acc"
    assert names("train/profiling/x") == "src/train/profiling/x" and names("train/global_step") is None
    assert flavours.VERL.names()("val-core/lighteval/MATH/test/acc/best@16/mean") == "val/lighteval/MATH/test/best@16_biased"


def test_runs_yaml_errors_name_key_and_file(tmp_path):
    (tmp_path / "a").mkdir()
    cases = {"runs:\n  a: {grop: x}\n": "runs.a.grop", "runs:\n  a: {val_n: -1}\n": "runs.a.val_n",
             "runs:\n  nope: {group: x}\n": "runs.nope", "val_n: 0\nruns:\n  a: {}\n": "val_n",
             "runs:\n  a: {format: mlflow}\n": "runs.a.format", "run: {}\n": "run"}
    for text, key in cases.items():
        f = tmp_path / "runs.yaml"
        f.write_text(text)
        with pytest.raises(ArmorLabError) as err:
            importers.load_mapping(f)
        assert f"'{key}'" in str(err.value) and "runs.yaml" in str(err.value), text


def test_cli_report_on_imported_runs(tmp_path):
    for seed, drop in ((0, 0.0), (1, 0.1)):
        for group, base in (("a", 0.5), ("b", 0.6)):
            history = [{"step": s, "reward": base, "eval_reward": base + 0.01 * (s % 3) - drop * (s > 20)}
                       for s in range(0, 40, 5)]
            W.write_trainer_state(tmp_path / "runs" / f"{group}-s{seed}", history, max_steps=35, checkpoint=35)
    mapping = tmp_path / "runs.yaml"
    mapping.write_text("val_n: 200\nruns:\n  runs/a-s*: {group: A}\n  runs/b-s*: {group: B}\n"
                       "  runs/a-s0: {seed: 0}\n")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "armorlab.cli", "report", *args], capture_output=True,
                              text=True, cwd=tmp_path)

    out = cli("--map", str(mapping), "--out", "rep")
    assert out.returncode == 0, out.stderr
    assert "4 runs, 2 groups" in out.stdout
    html = (tmp_path / "rep" / "index.html").read_text()
    assert "<td>A</td>" in html and "<td>B</td>" in html and "val/n unknown" not in html  # named bare
    out = cli(str(tmp_path / "runs"), "--out", "rep2", "--format", "nope")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "'nope'" in out.stderr
    out = cli(str(tmp_path / "runs"), "--out", "rep3", "--group-by", "max_steps")
    assert out.returncode == 0, out.stderr
    assert "val/n unknown for 4 imported run(s)" in (tmp_path / "rep3" / "index.html").read_text()
    out = cli(str(tmp_path / "runs"), "--out", "rep4", "--group-by", "no_such_key")
    assert out.returncode == 2 and "'no_such_key'" in out.stderr


def test_docs_list_every_rule():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "importers.md").read_text()
    for fl in (flavours.TRL, flavours.VERL, flavours.OPENRLHF):
        for rule in fl.rules:
            assert f"`{flavours.readable(rule.pattern)}`" in doc, (fl.name, rule.pattern)
            assert f"`{flavours.readable_target(rule.target)}`" in doc, (fl.name, rule.target)


def test_reports_of_imported_runs_are_rebuilt_not_served_stale(tmp_path):
    from armorlab.analysis import freshness
    from armorlab.analysis.recipe import recipe_for_paths

    W.write_trainer_state(tmp_path / "trl", [{"step": 1, "reward": 0.1}], max_steps=4, checkpoint=1)
    # a new checkpoint adds a dir, not a file at the top: a stamp over the top dir's files would miss it
    assert freshness.input_key(recipe_for_paths([str(tmp_path / "trl")]), tmp_path / "rep") is None
    assert freshness.input_key(recipe_for_paths([], runs_map="runs.yaml"), tmp_path / "rep") is None
