"""Study spec validation, objective summaries and the small pure pieces of armorlab.tune*."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from armorlab.errors import ArmorLabError
from armorlab.tune.space import parse_search, trial_config

BASE = {"objective": "armor", "max_steps": 40, "val_every": 5}
SPACE = {"alpha": {"type": "float", "low": 0.5, "high": 1.0}}


def search(**over):
    raw = {"space": SPACE, "n_trials": 5, **over}
    return parse_search(raw, BASE, file="study.yaml")


def error_of(raw, base=BASE):
    raw = {"n_trials": 5, **raw} if "sampler" not in raw else raw
    with pytest.raises(ArmorLabError) as exc:
        parse_search(raw, base, file="study.yaml")
    return str(exc.value)


# --------------------------------------------------------------------------- the issue's example
def test_issue_example_parses_with_defaults_filled():
    s = parse_search({
        "space": {"alpha": {"type": "float", "low": 0.5, "high": 1.0},
                  "ref_reset_steps": {"type": "categorical", "choices": [0, 40, 80, 160]},
                  "epsilon_high": {"type": "float", "low": 0.2, "high": 0.4},
                  "learning_rate": {"type": "float", "low": "1e-6", "high": 1e-3, "log": True}},
        "objective": {"metric": "val/acc", "summary": "auc"}, "direction": "maximize",
        "sampler": {"type": "tpe", "seed": 0}, "pruner": {"type": "median", "warmup_steps": 50},
        "n_trials": 40, "storage": None}, BASE, file="x.yaml")
    assert s.n_trials == 40 and s.directions == ("maximize",) and not s.multi_objective
    assert s.space["learning_rate"].low == 1e-6 and s.space["learning_rate"].log
    assert s.space["ref_reset_steps"].choices == (0, 40, 80, 160)
    assert s.pruner == {"type": "median", "warmup_steps": 50}
    assert s.objectives[0].label == "auc(val/acc)"


@pytest.mark.parametrize("raw, key, fragment", [
    ({"space": {"alpha": {"type": "float", "low": 0.9, "high": 0.5}}}, "search.space.alpha.low", "low must be ≤ high"),
    ({"space": {"learning_rate": {"type": "float", "low": 0.0, "high": 1e-3, "log": True}}},
     "search.space.learning_rate.low", "log scale needs low > 0"),
    ({"space": {"ref_reset_steps": {"type": "categorical", "choices": []}}},
     "search.space.ref_reset_steps.choices", "non-empty"),
    ({"space": {"alpha": {"type": "uniform", "low": 0, "high": 1}}}, "search.space.alpha.type", "must be one of"),
    ({"space": {"alpha": {"type": "float", "low": 0.5, "high": 1.0, "scale": 2}}}, "search.space.alpha.scale",
     "unknown key"),
    ({"space": {"alpah": {"type": "float", "low": 0.5, "high": 1.0}}}, "search.space.alpah", "unknown config key"),
    ({"space": {"seed": [0, 1]}}, "search.space.seed", "seeds"),
    ({"space": {"output_dir": ["a"]}}, "search.space.output_dir", "run directory"),
    ({"space": SPACE, "n_trial": 3}, "search.n_trial", "unknown key"),
    ({"space": SPACE, "n_trials": 0}, "search.n_trials", "positive integer"),
    ({"space": SPACE, "n_trials": None}, "search.n_trials", "required"),
    ({"space": SPACE, "n_trials": 5, "sampler": {"type": "annealing"}}, "search.sampler.type", "unknown type"),
    ({"space": SPACE, "n_trials": 5, "sampler": {"type": "tpe", "n_startup": 3}}, "search.sampler.n_startup", "unknown option"),
    ({"space": SPACE, "pruner": {"type": "collapse", "delta": -1}}, "search.pruner.delta", "> 0"),
    ({"space": SPACE, "objective": {"metric": "acc"}}, "search.objective.metric", "namespaced"),
    ({"space": SPACE, "objective": {"metric": "val/acc", "summary": "mean"}}, "search.objective.summary",
     "must be one of"),
    ({"space": SPACE, "direction": "up"}, "search.direction", "maximize or minimize"),
    ({"space": SPACE, "storage": "runs/db.sqlite"}, "search.storage", "database URL"),
    # alpha must be in (0, 1]: the config's own check rejects the space's upper bound
    ({"space": {"alpha": {"type": "float", "low": 0.5, "high": 1.5}}}, "search.space.alpha", "valid run config"),
    ({"space": {"task.digits": [2, 9]}}, "search.space.task.digits", "valid run config"),
    ({"space": {"alpha": {"type": "int", "low": 1, "high": 4, "log": True, "step": 2}}}, "search.space.alpha.step",
     "log"),
    ({"space": {"epsilon_high": {"type": "float", "low": 0.2, "high": 0.45, "step": 0.1}}},
     "search.space.epsilon_high.step", "multiple of step"),
])
def test_bad_specs_name_key_value_and_file(raw, key, fragment):
    msg = error_of(raw)
    assert f"key '{key}'" in msg and "study.yaml" in msg and fragment in msg


def test_grid_needs_a_finite_space_and_caps_n_trials():
    msg = error_of({"space": SPACE, "sampler": "grid"})
    assert "search.space.alpha" in msg and "step" in msg
    s = parse_search({"space": {"alpha": {"type": "float", "low": 0.5, "high": 0.9, "step": 0.2},
                                "ref_reset_steps": [0, 80]}, "sampler": "grid"}, BASE)
    assert s.n_trials == 3 * 2  # defaults to the grid size
    assert s.grid() == {"alpha": [0.5, 0.7, 0.9], "ref_reset_steps": [0, 80]}
    msg = error_of({"space": {"ref_reset_steps": [0, 80]}, "sampler": "grid", "n_trials": 3})
    assert "search.n_trials" in msg and "only 2 points" in msg


def test_multi_objective_rejects_pruning_and_wants_one_direction_each():
    two = [{"metric": "val/acc", "summary": "auc"}, {"metric": "val/length", "summary": "final"}]
    s = parse_search({"space": SPACE, "objective": two, "direction": ["maximize", "minimize"], "n_trials": 4},
                     BASE)
    assert s.multi_objective and s.directions == ("maximize", "minimize")
    assert "single objective" in error_of({"space": SPACE, "objective": two, "pruner": "median"})
    assert "one per objective" in error_of({"space": SPACE, "objective": two, "direction": ["maximize"]})


def test_test_at_val_best_reads_the_test_twin_of_the_val_metric():
    s = search(objective={"metric": "val/acc", "summary": "test-at-val-best"})
    assert s.objectives[0].report == "test/acc"
    assert "val/" in error_of({"space": SPACE, "objective": {"metric": "train/reward",
                                                             "summary": "test-at-val-best"}})


def test_trial_config_applies_dotted_params_and_seed_and_is_resolved():
    cfg = trial_config(BASE, {"alpha": 0.6, "task.digits": 3}, 7)
    assert cfg["alpha"] == 0.6 and cfg["task"]["digits"] == 3 and cfg["seed"] == 7
    assert cfg["task"]["name"] == "arithmetic" and cfg["anchor"] is True  # armor preset applied


# --------------------------------------------------------------------------- load_study_spec
def write(tmp_path, text, name="study.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_load_study_spec_rejects_grid_and_missing_validation(tmp_path):
    from armorlab.tune.study import load_study_spec

    p = write(tmp_path, """
        name: s
        base: {objective: armor}
        grid: {alpha: [0.5]}
        search: {space: {alpha: {type: float, low: 0.5, high: 1.0}}, n_trials: 2}
    """)
    with pytest.raises(ArmorLabError, match="'grid'"):
        load_study_spec(p)
    p = write(tmp_path, """
        name: s
        base: {objective: armor, val_every: 0}
        search: {space: {alpha: {type: float, low: 0.5, high: 1.0}}, n_trials: 2}
    """)
    with pytest.raises(ArmorLabError, match="base.val_every"):
        load_study_spec(p)
    p = write(tmp_path, "name: s\nbase: {objective: armor}\n")
    with pytest.raises(ArmorLabError, match="search"):
        load_study_spec(p)


def test_cli_bad_spec_exits_2_without_traceback(tmp_path):
    p = write(tmp_path, """
        name: s
        base: {objective: armor}
        search: {space: {learning_rate: {type: float, low: -1, high: 1e-3, log: true}}}
    """)
    out = subprocess.run([sys.executable, "-m", "armorlab.cli", "tune", str(p), "--root", str(tmp_path / "r")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "search.space.learning_rate.low" in out.stderr and "study.yaml" in out.stderr
    assert not (tmp_path / "r").exists()  # nothing written for a bad spec


def test_ready_study_spec_in_repo_validates():
    from pathlib import Path

    from armorlab.tune.study import load_study_spec

    spec, s = load_study_spec(Path(__file__).parent.parent / "sweeps" / "armor_search.yaml")
    assert spec.name == "armor_search" and set(s.space) >= {"alpha", "ref_reset_steps", "learning_rate"}


# --------------------------------------------------------------------------- objective summaries
ROWS = [  # merged metric rows as RunDir.read_metrics returns them
    {"step": 0, "val/acc": 0.2, "test/acc": 0.1, "train/reward": 0.0},
    {"step": 1, "train/reward": 0.1},
    {"step": 10, "val/acc": 0.6, "test/acc": 0.5},
    {"step": 20, "val/acc": 0.6, "test/acc": 0.7},
    {"step": 30, "val/acc": 0.4, "test/acc": 0.3},
]


@pytest.mark.parametrize("summary, direction, expected", [
    ("final", "maximize", 0.4),
    ("peak", "maximize", 0.6),
    ("peak", "minimize", 0.2),
    # trapezoids: (0.2+0.6)/2*10 + 0.6*10 + (0.6+0.4)/2*10 = 4 + 6 + 5 = 15, over 30 steps
    ("auc", "maximize", 15 / 30),
    # best val is 0.6, first reached at step 10: test/acc there is 0.5 (not 0.7 at the tie)
    ("test-at-val-best", "maximize", 0.5),
    ("test-at-val-best", "minimize", 0.1),
])
def test_summaries(summary, direction, expected):
    from armorlab.tune.space import ObjectiveSpec
    from armorlab.tune.worker import summarize

    obj = ObjectiveSpec("val/acc", summary, "test/acc" if summary == "test-at-val-best" else None)
    assert summarize(ROWS, obj, direction) == pytest.approx(expected)


def test_summary_of_a_missing_metric_is_an_error():
    from armorlab.tune.space import ObjectiveSpec
    from armorlab.tune.worker import summarize

    with pytest.raises(ValueError, match="val/length"):
        summarize(ROWS, ObjectiveSpec("val/length", "final"), "maximize")


# --------------------------------------------------------------------------- collapse pruner
def test_collapse_pruner_prunes_only_a_curve_that_stays_down():
    import optuna

    from armorlab.tune.pruners import EVAL_N_ATTR, CollapsePruner, planned_evals

    p = CollapsePruner(delta=0.05, patience=3)
    steps = range(0, 120, 10)
    rising = {s: 0.1 + s / 200 for s in steps}
    dip = {s: 0.4 if s == 60 else 0.5 for s in steps}                # one bad eval is no collapse
    fallen = {s: 0.5 if s < 60 else 0.2 for s in steps}             # levels fall from step 40; onset 60
    for n in (None, 1000):                                           # noise from the curve / binomial
        assert p.collapse_step(rising, n) is None and p.collapse_step(dip, n) is None
        assert p.collapse_step(fallen, n) == 60
    # the eval size reaches the pruner as a trial attribute the worker sets from val/n
    trial = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, intermediate_values=fallen,
                                      user_attrs={EVAL_N_ATTR: 1000.0})
    assert p.prune(None, trial)
    # a minimised metric collapses upwards (eval sizes ignored: binomial noise is for accuracies)
    assert CollapsePruner(direction="minimize").collapse_step({s: 1 - v for s, v in fallen.items()}, 1000) == 60
    # nothing is judged before warmup
    assert CollapsePruner(warmup_steps=200).collapse_step(fallen) is None
    # evals a trial will have: 0, 10, ..., 200 → 21; 0, 10, ..., 100 and the last step 105 → 12
    assert planned_evals({"max_steps": 200, "val_every": 10}) == 21
    assert planned_evals({"max_steps": 105, "val_every": 10}) == 12
    assert planned_evals({"max_steps": 100, "val_every": 0}) is None


def test_collapse_pruner_false_prune_rate_on_flat_trials():
    """Flat synthetic trials (true val/acc 0.5, 256 completions per eval, 21 evals) checked after every
    eval as Optuna does: the legacy rule (0.05 below the running maximum for 3 evals) pruned about
    half of them; the calibrated one prunes ≈ α = 4 % (threshold of the whole trial, `horizon`)."""
    from armorlab.tune.pruners import CollapsePruner

    rng = np.random.default_rng(5)
    pruner = CollapsePruner(horizon=21)
    pruned = {None: 0, 256: 0}
    trials = 150
    for _ in range(trials):
        values = rng.binomial(256, 0.5, 21) / 256
        for n in pruned:
            seen = {}
            for k, v in enumerate(values):
                seen[10 * k] = float(v)
                if pruner.collapse_step(seen, n) is not None:
                    pruned[n] += 1
                    break
    assert pruned[256] / trials < 0.1 and pruned[None] / trials < 0.1


# --------------------------------------------------------------------------- storage safety
def test_nfs_is_detected_from_the_mount_table(tmp_path):
    from armorlab.tune.backend import fs_type, warn_if_network_fs

    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\nserver:/export /shared nfs4 rw 0 0\n"
                      "server:/export/x /shared/local/tmpfs tmpfs rw 0 0\n")
    assert fs_type("/shared/studies/a", str(mounts)) == "nfs4"
    assert fs_type("/shared/local/tmpfs/x", str(mounts)) == "tmpfs"   # longest prefix wins
    assert fs_type("/sharedother", str(mounts)) == "ext4"             # not a path prefix of /shared
    msg = warn_if_network_fs("/shared/studies/a", "the study journal", str(mounts))
    assert msg and "nfs4" in msg and "postgresql" in msg
    assert warn_if_network_fs("/home/x", "the study journal", str(mounts)) is None


def test_owner_liveness():
    from armorlab.tune.backend import owner_alive, process_start_time, worker_identity

    me = worker_identity()
    assert owner_alive(me, me) is True
    assert owner_alive(None, me) is False  # asked but never claimed: its worker died in between
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        other = {"host": socket.gethostname(), "pid": child.pid, "start": process_start_time(child.pid), "job": None}
        assert owner_alive(other, me) is True
        # same pid but another start time: the pid was reused by an unrelated process
        assert owner_alive({**other, "start": other["start"] - 1}, me) is False
        assert owner_alive({**other, "host": "elsewhere"}, me) is None  # cannot tell from here
    finally:
        child.kill()
        child.wait()
    assert owner_alive(other, me) is False
    # a requeued Slurm worker sees its earlier incarnation under its own job id
    assert owner_alive({"host": "n1", "pid": 5, "start": 1, "job": "77_1"}, {**me, "job": "77_1"}) is False


def test_slurm_job_id_prefers_the_array_task():
    from armorlab.tune.backend import slurm_job_id

    assert slurm_job_id({"SLURM_ARRAY_JOB_ID": "5", "SLURM_ARRAY_TASK_ID": "2", "SLURM_JOB_ID": "7"}) == "5_2"
    assert slurm_job_id({"SLURM_JOB_ID": "7"}) == "7" and slurm_job_id({}) is None


def test_synthetic_objective_has_its_optimum_where_documented():
    from armorlab.tune.synthetic_trainer import OPTIMUM, quality

    best = {k: (10 ** v if k == "learning_rate" else v) for k, (v, _) in OPTIMUM.items()}
    assert quality(best) == pytest.approx(1.0)
    assert quality({**best, "alpha": 0.9}) == pytest.approx(math.exp(-1.0))  # one width away


def test_tune_modules_stay_out_of_cli_startup():
    code = ("import sys\nfrom armorlab.cli import app\nimport armorlab.tune.study, armorlab.tune.space\n"
            "print(','.join(m for m in ('optuna', 'torch', 'submitit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ})
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("kind", ["tpe", "gp", "cmaes", "random", "grid", "bruteforce"])
def test_every_sampler_type_samples_inside_the_space(kind):
    import optuna

    from armorlab.tune.backend import make_sampler
    from armorlab.tune.space import suggest_params

    s = parse_search({"space": {"alpha": {"type": "float", "low": 0.5, "high": 0.9, "step": 0.1},
                                "ref_reset_steps": [0, 40]},
                      "sampler": {"type": kind, "seed": 0, **({"n_startup_trials": 1} if kind in ("tpe", "gp", "cmaes") else {})},
                      "n_trials": 4}, BASE)
    study = optuna.create_study(sampler=make_sampler(s, 0), direction="maximize")
    seen = []
    for _ in range(4):
        trial = study.ask()
        params = suggest_params(trial, s)
        assert 0.5 - 1e-9 <= params["alpha"] <= 0.9 + 1e-9 and params["ref_reset_steps"] in (0, 40)
        study.tell(trial, -abs(params["alpha"] - 0.7))
        seen.append((round(params["alpha"], 6), params["ref_reset_steps"]))
    if kind in ("grid", "bruteforce"):
        assert len(set(seen)) == 4  # exhaustive samplers never repeat a point


def test_pruner_defaults_follow_the_run_config():
    import optuna

    from armorlab.core.config import resolve
    from armorlab.tune.pruners import CollapsePruner, make_pruner

    base = resolve(BASE)
    hb = make_pruner(search(pruner={"type": "hyperband"}), base)
    assert isinstance(hb, optuna.pruners.HyperbandPruner)
    assert (hb._min_resource, hb._max_resource) == (5, 40)  # first validation step, max_steps
    med = make_pruner(search(pruner={"type": "median", "warmup_steps": 20}), base)
    assert isinstance(med, optuna.pruners.MedianPruner) and med._n_warmup_steps == 20
    col = make_pruner(search(pruner={"type": "collapse", "patience": 2}, direction="minimize"), base)
    assert isinstance(col, CollapsePruner) and col.sign == -1.0 and col.kwargs == {"patience": 2}
    assert isinstance(make_pruner(search(), base), optuna.pruners.NopPruner)
