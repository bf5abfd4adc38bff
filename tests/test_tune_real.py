"""A small study whose trials are REAL `armorlab train` runs (tiny model, two steps each)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")


def test_real_trainer_study(tmp_path, monkeypatch):
    from optuna.trial import TrialState

    from armorlab.core.runs import RunDir
    from armorlab.tune.study import load_study, prepare_study, run_local, study_status

    monkeypatch.delenv("ARMORLAB_TRAIN_COMMAND", raising=False)
    spec = tmp_path / "real.yaml"
    spec.write_text(
        "name: real\n"
        "base: {objective: armor, max_steps: 2, val_every: 1, per_device_train_batch_size: 8,\n"
        "       num_generations: 4, val_samples: 2, kl_probe_prompts: 0,\n"
        "       task: {name: arithmetic, val_size: 16, test_size: 16}}\n"
        "seeds: [0]\n"
        "search:\n"
        "  space: {alpha: [0.6, 0.9]}\n"
        "  objective: {metric: val/acc, summary: auc}\n"
        "  sampler: grid\n")
    ctx = prepare_study(spec, root=tmp_path / "runs")
    result = run_local(ctx, 1, poll_s=0.5)
    logs = "".join(p.read_text()[-2000:] for p in (ctx.tune_dir / "logs").glob("*.log"))
    assert result["counts"]["complete"] == 2, logs

    _, study = load_study(ctx.study_dir)
    for t in study.get_trials(deepcopy=False):
        assert t.state == TrialState.COMPLETE
        rd = RunDir(ctx.study_dir / t.user_attrs["runs"][0])
        assert rd.read_status()["state"] == "completed" and rd.read_config()["alpha"] == t.params["alpha"]
        rows = [r for r in rd.read_metrics() if r.get("val/acc") is not None]
        steps = np.array([r["step"] for r in rows], float)
        vals = np.array([r["val/acc"] for r in rows], float)
        assert list(steps) == [0.0, 1.0, 2.0]
        # auc = trapezoid area / step span, computed here by hand
        by_hand = sum((vals[i] + vals[i + 1]) / 2 * (steps[i + 1] - steps[i]) for i in range(2)) / 2.0
        assert t.values[0] == pytest.approx(by_hand)
        # the worker reported each validation to the trial as it happened
        assert t.intermediate_values == pytest.approx({0: vals[0], 1: vals[1], 2: vals[2]})
    assert study_status(ctx.study_dir)["counts"]["finished"] == 2
