"""The continual protocol without a shock (issue 35, item 4), end to end on the tiny model:
``init_from.optimizer`` (fresh | parent: Adam's moments and the LR scheduler from the checkpoint),
the fresh optimizer's LR warm-up, ``ref_from`` (π_ref apart from where training starts) and
selection by a given step or rollout or the last checkpoint; the same keys in a sweep's stages."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_init_from import FirstWeights, _hash, _weights
from transformers import TrainerCallback

from armorlab.core.config import CONTINUAL_WARMUP, resolve
from armorlab.core.runs import RunDir, run_id
from armorlab.errors import ArmorLabError
from armorlab.sweeps.spec import expand, parse_spec
from armorlab.train.init_from import INIT, REF, find_start
from armorlab.train.launch import train_run_dir
from tests.trainer_support import model_cache, resolved

LR = 5e-3


@pytest.fixture(autouse=True)
def _cache(monkeypatch):
    monkeypatch.setenv("ARMORLAB_CACHE", model_cache())
    for var in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID", "ARMORLAB_JOB_ID"):
        monkeypatch.delenv(var, raising=False)


# --------------------------------------------------------------------------- config: ids and errors
# ids computed by the code before optimizer, warmup, ref_from and the other selections existed (ce2e003)
OLD_IDS = {
    "7a72bcba8528": {"init_from": {"run": "stage1/0123456789ab"}},
    "497ed5ead2d1": {"objective": "armor", "init_from": {"run": "s/0123456789ab",
                                                         "select": {"metric": "val/acc", "mode": "min"}}},
}


@pytest.mark.parametrize("expected", sorted(OLD_IDS))
def test_continuations_keep_their_run_ids_with_the_new_keys_at_their_defaults(expected):
    raw = OLD_IDS[expected]
    assert run_id(resolve(raw)) == expected
    defaults = {**raw, "ref_from": None,
                "init_from": {**raw["init_from"], "optimizer": "fresh", "warmup": CONTINUAL_WARMUP}}
    assert run_id(resolve(defaults)) == expected
    # a value away from the default is another run
    for changed in ({"optimizer": "parent"}, {"warmup": 0}):
        assert run_id(resolve({**raw, "init_from": {**raw["init_from"], **changed}})) != expected
    assert run_id(resolve({**raw, "ref_from": "model"})) != expected


@pytest.mark.parametrize("init_from, said", [
    ({"optimizer": "adam"}, "optimizer must be fresh or parent, not 'adam'"),
    ({"optimizer": "parent", "warmup": 4}, "warmup is for a fresh optimizer"),
    ({"warmup": -1}, "warmup (optimizer steps)"),
    ({"select": {"step": 3, "metric": "val/acc"}}, "select.step selects one checkpoint by itself"),
    ({"select": {"rollout": -2}}, "select.rollout"),
    ({"select": {"mode": "last", "metric": "val/acc"}}, "mode last takes no metric"),
    ({"select": {"mode": "median"}}, "select.mode must be max or min (or last"),
])
def test_bad_continuation_values_name_key_value_and_file(init_from, said):
    with pytest.raises(ArmorLabError) as err:
        resolve({"init_from": {"run": "s/0123456789ab", **init_from}}, file="stage2.yaml")
    assert err.value.key == "init_from" and err.value.file == "stage2.yaml"
    assert said in str(err.value)


def test_a_reference_checkpoint_is_fingerprinted_and_a_missing_one_named(tmp_path):
    from model_dirs import fake_model_dir

    with pytest.raises(ArmorLabError) as err:
        resolve({"ref_from": {"checkpoint": str(tmp_path / "nope")}}, file="run.yaml")
    assert (err.value.key, err.value.value, err.value.file) == ("ref_from.checkpoint", str(tmp_path / "nope"),
                                                                "run.yaml")
    ckpt = fake_model_dir(tmp_path / "ckpt")
    first = resolve({"ref_from": {"checkpoint": str(ckpt)}})
    assert first["ref_from"]["checkpoint"] == str(ckpt.resolve()) and first["ref_from"]["fingerprint"]
    (ckpt / "config.json").write_text((ckpt / "config.json").read_text() + " ")  # other weights, another run
    assert run_id(resolve({"ref_from": {"checkpoint": str(ckpt)}})) != run_id(first)
    with pytest.raises(ArmorLabError) as err:
        resolve({"ref_from": "initial"}, file="run.yaml")
    assert err.value.key == "ref_from" and "initial" in str(err.value)


# --------------------------------------------------------------------------- stages
def _spec(**third) -> dict:
    return {"name": "cont", "base": {"max_steps": 4}, "seeds": [0, 1], "stages": [
        {"name": "a"},
        {"name": "b", "from": {"stage": "a"}},
        {"name": "c", "from": {"stage": "b", "select": {"mode": "last"}, "optimizer": "parent"}, **third}]}


def test_stages_pass_optimizer_selection_and_a_reference_from_an_earlier_stage_of_the_line():
    spec = parse_spec(_spec(ref_from={"stage": "a", "select": {"step": 2}}), path="s.yaml")
    plans = expand(spec)
    # the sweep dir's spec copy expands to the same runs
    assert [p.run_id for p in expand(parse_spec(spec.to_dict(), path="copy.yaml"))] == [p.run_id for p in plans]
    by_id = {p.run_id: p for p in plans}
    third = [p for p in plans if p.stage == "c"]
    assert len(third) == 2
    for p in third:
        cfg = p.config
        parent = by_id[p.parent]
        grandparent = by_id[parent.parent]
        assert cfg["init_from"] == {"run": f"cont/{parent.run_id}", "select": {"mode": "last"}, "optimizer": "parent"}
        assert cfg["ref_from"] == {"run": f"cont/{grandparent.run_id}", "select": {"step": 2}}
        assert grandparent.stage == "a" and grandparent.config["seed"] == cfg["seed"]  # the run's own line
        assert run_id(cfg) == p.run_id
    # a reference from the stage it continues from, or the model, or a checkpoint: plain config values
    plans = expand(parse_spec(_spec(ref_from="model"), path="s.yaml"))
    assert {p.config.get("ref_from") for p in plans if p.stage == "c"} == {"model"}


@pytest.mark.parametrize("third, key, said", [
    ({"ref_from": {"stage": "nosuch"}}, "stages[2].ref_from.stage", "must name the stage this one continues from"),
    ({"ref_from": {"stage": "c"}}, "stages[2].ref_from.stage", "here: b, a"),
    ({"ref_from": {"stage": "a", "select": {"step": "x"}}}, "stages[2].ref_from.select", "select.step"),
    ({"ref_from": {"stage": "a", "pick": 1}}, "stages[2].ref_from.pick", "unknown key"),
    ({"ref_from": "initial"}, "stages[2].ref_from", "must be null, model"),
])
def test_stage_reference_errors_name_key_value_and_file(third, key, said, tmp_path):
    with pytest.raises(ArmorLabError) as err:
        parse_spec(_spec(**third), path=tmp_path / "s.yaml")
    assert err.value.key == key and err.value.file == str(tmp_path / "s.yaml") and said in str(err.value)


def test_stage_optimizer_errors_name_key_value_and_file(tmp_path):
    spec = _spec()
    spec["stages"][2]["from"]["optimizer"] = "adamw"
    with pytest.raises(ArmorLabError) as err:
        parse_spec(spec, path=tmp_path / "s.yaml")
    assert (err.value.key, err.value.value) == ("stages[2].from.optimizer", "adamw")


# --------------------------------------------------------------------------- end to end, tiny model
@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A completed 4-step run (2 optimizer steps per rollout) with a checkpoint at every step."""
    import os

    os.environ.setdefault("ARMORLAB_CACHE", model_cache())
    root = tmp_path_factory.mktemp("runs")
    cfg = resolved(max_steps=4, val_every=1, save_steps=1, save_total_limit=None, learning_rate=LR,
                   steps_per_generation=2)
    rd = RunDir.create(root / "stage1", cfg)
    assert train_run_dir(rd.path).state == "completed"
    assert [cp.name for cp in rd.checkpoints()] == [f"checkpoint-{s}" for s in (1, 2, 3, 4)]
    return rd


def _child(parent_rd, seed, init=None, **extra):
    cfg = resolved(max_steps=2, seed=seed, learning_rate=LR,
                   init_from={"run": f"stage1/{parent_rd.id}", **(init or {})}, **extra)
    return RunDir.create(parent_rd.path.parent.parent / "stage2", cfg)


class FirstOptimizer(TrainerCallback):
    """The optimizer's state and the scheduler's position before the first update."""

    def __init__(self):
        self.state = self.sched = None

    def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if self.state is None:
            self.state = {k: {n: t.clone() if torch.is_tensor(t) else t for n, t in v.items()}
                          for k, v in optimizer.state_dict()["state"].items()}
            self.sched = lr_scheduler.state_dict()


def _lrs(rd):
    return [r["train/learning_rate"] for r in rd.read_metrics() if "train/learning_rate" in r]


def test_selection_by_step_rollout_or_last_picks_that_checkpoint(parent):
    # U = steps_per_generation 2 / accumulation 1 = 2 updates per rollout: rollout 1 ends at step 2
    for seed, select, step in ((10, {"step": 3}, 3), (11, {"rollout": 1}, 2), (12, {"mode": "last"}, 4)):
        child = _child(parent, seed, {"select": select})
        start = find_start(child, child.read_config()["init_from"])
        assert start.step == step and start.checkpoint == (parent.path / f"checkpoints/checkpoint-{step}").absolute()
    child = _child(parent, 13, {"select": {"step": 7}})
    with pytest.raises(ArmorLabError) as err:
        find_start(child, child.read_config()["init_from"])
    assert (err.value.key, err.value.value) == ("init_from.select.step", 7) and "[1, 2, 3, 4]" in str(err.value)


def test_a_fresh_optimizer_warms_up_and_warmup_zero_does_not(parent):
    warm = _child(parent, 20, {"select": {"step": 2}})
    cold = _child(parent, 21, {"select": {"step": 2}, "warmup": 0})
    for rd in (warm, cold):
        assert train_run_dir(rd.path).state == "completed"
    # linear warm-up over 8 steps from 0 (HF's): update k runs at LR·(k − 1)/8, so the first one
    # only fills Adam's moments
    assert CONTINUAL_WARMUP == 8
    assert _lrs(warm) == pytest.approx([0.0, LR * 1 / 8])
    assert _lrs(cold) == pytest.approx([LR, LR])


def test_parent_optimizer_restores_adam_moments_and_scheduler(parent, tmp_path):
    seen, weights = FirstOptimizer(), FirstWeights()
    child = _child(parent, 30, {"select": {"step": 3}, "optimizer": "parent"})
    assert train_run_dir(child.path, callbacks=[seen, weights]).state == "completed"
    saved = torch.load(parent.path / "checkpoints/checkpoint-3/optimizer.pt", weights_only=True)["state"]
    assert seen.state.keys() == saved.keys() and saved
    for k in saved:
        assert int(seen.state[k]["step"]) == int(saved[k]["step"]) == 3  # three Adam updates behind it
        assert torch.equal(seen.state[k]["exp_avg"], saved[k]["exp_avg"])
        assert torch.equal(seen.state[k]["exp_avg_sq"], saved[k]["exp_avg_sq"])
    assert seen.sched["last_epoch"] == 3
    assert _lrs(child) == pytest.approx([LR, LR])  # no warm-up: the parent's constant schedule goes on
    at3 = _weights(parent.path / "checkpoints/checkpoint-3")
    assert all(torch.equal(weights.state[k], at3[k]) for k in at3)
    # a checkpoint without optimizer state: the error names it
    bare = parent.path.parent.parent / "bare"
    shutil.copytree(parent.path, bare / parent.id)
    (bare / parent.id / "checkpoints/checkpoint-3/optimizer.pt").unlink()
    orphan = RunDir.create(parent.path.parent.parent / "stage2b", resolved(
        max_steps=1, init_from={"run": f"bare/{parent.id}", "select": {"step": 3}, "optimizer": "parent"}))
    with pytest.raises(ArmorLabError) as err:
        train_run_dir(orphan.path)
    assert (err.value.key, err.value.value) == ("init_from.optimizer", "parent")
    assert str((bare / parent.id / "checkpoints/checkpoint-3").absolute()) in str(err.value)
    assert err.value.file == str(orphan.config_path)


def test_ref_from_sets_the_reference_apart_from_where_training_starts(parent):
    last, at2 = _hash(_weights(parent.path / "checkpoints/checkpoint-4")), \
        _hash(_weights(parent.path / "checkpoints/checkpoint-2"))
    # π_ref from another selection of a run: recorded, and resuming keeps it
    child = _child(parent, 40, {"select": {"mode": "last"}},
                   ref_from={"run": f"stage1/{parent.id}", "select": {"step": 2}})
    assert train_run_dir(child.path).state == "completed"
    init = json.loads((child.path / INIT).read_text())
    assert (init["params_sha256"], init["ref_params_sha256"]) == (last, at2)
    assert json.loads((child.path / REF).read_text())["step"] == 2
    # an explicit checkpoint
    ckpt = parent.path / "checkpoints/checkpoint-1"
    child = _child(parent, 41, {"select": {"mode": "last"}}, ref_from={"checkpoint": str(ckpt)})
    assert train_run_dir(child.path).state == "completed"
    init = json.loads((child.path / INIT).read_text())
    assert (init["params_sha256"], init["ref_params_sha256"]) == (last, _hash(_weights(ckpt)))
    # the initial model (the config's model), with training from the parent's last checkpoint
    child = _child(parent, 42, {"select": {"mode": "last"}}, ref_from="model")
    assert train_run_dir(child.path).state == "completed"
    init = json.loads((child.path / INIT).read_text())
    first = _hash(_weights(init["ref_from"]))
    assert init["params_sha256"] == last and init["ref_params_sha256"] == first != last
    # a reference run that is not there
    child = _child(parent, 43, ref_from={"run": "nosuch/0123456789ab", "select": {"mode": "last"}})
    with pytest.raises(ArmorLabError) as err:
        train_run_dir(child.path)
    assert (err.value.key, err.value.value) == ("ref_from.run", "nosuch/0123456789ab")
