"""No silent dead runs: the warnings of armorlab.core.health on hand-made metric rows."""

from armorlab.core.health import (
    GATE_WINDOW,
    NO_GRADIENT_STEPS,
    TRUNCATION_STEPS,
    gate_warning,
    no_gradient_warning,
    run_warnings,
    truncation_warning,
)


def rows(n, **series):
    """n training rows (steps 1..n) plus a step-0 validation row; series[name] = list or constant."""
    out = [{"step": 0, "val/acc": 0.0}]
    for i in range(n):
        out.append({"step": i + 1, **{k: (v[i] if isinstance(v, list) else v) for k, v in series.items()}})
    return out


def one(n, values):
    """The (step, value) series of one metric over steps 1..n."""
    return [(i + 1, float(values[i] if isinstance(values, list) else values)) for i in range(n)]


def test_truncation_over_the_first_steps():
    assert TRUNCATION_STEPS == 5
    # first five steps: 1, 1, 1, 1, 0.5 → mean 0.9: not above 90 %
    assert truncation_warning(one(8, [1, 1, 1, 1, 0.5, 0, 0, 0])) is None
    # 1, 1, 1, 1, 0.75 → 0.95; later steps do not matter
    warning = truncation_warning(one(8, [1, 1, 1, 1, 0.75, 0, 0, 0]))
    assert warning and "95%" in warning and "steps 1–5" in warning and "max_completion_length" in warning
    # a running run with fewer steps waits; a finished one is judged on what it has
    short = one(3, 1.0)
    assert truncation_warning(short) is None and truncation_warning(short, final=True)


def test_gate_window():
    assert GATE_WINDOW == 10
    # nine dropped steps then one kept: window mean 0.9 → warns (≥ 90 %), at steps 1–10
    drop = [1.0] * 9 + [0.0] + [0.0] * 5
    warning = gate_warning(one(15, drop))
    assert warning and "90%" in warning and "steps 1–10" in warning
    # eight of every ten dropped: never 90 % in any window
    assert gate_warning(one(30, ([1.0] * 8 + [0.0] * 2) * 3)) is None
    assert gate_warning(one(4, 1.0)) is None
    assert "100%" in gate_warning(one(4, 1.0), final=True)
    assert gate_warning(one(20, 0.0)) is None and gate_warning([], final=True) is None


def test_no_gradient_run():
    assert NO_GRADIENT_STEPS == 10
    grad = [0.5] * 3 + [0.0] * 9 + [0.1] + [0.0] * 10
    warning = no_gradient_warning(one(len(grad), grad))
    assert warning and "steps 14–23" in warning
    assert no_gradient_warning(one(12, [0.5] * 3 + [0.0] * 9)) is None
    assert no_gradient_warning(one(3, 0.0), final=True)
    assert no_gradient_warning(one(3, [0.2, 0.0, 0.0]), final=True) is None
    assert run_warnings(rows(12, **{"train/grad_norm": 1.0, "train/truncated": 0.0})) == []


def test_run_warnings_from_metric_rows():
    # metrics.jsonl rows: null (undefined) values are skipped, the step-0 row is not a training step
    grad = [0.0] * 5 + [None] + [0.0] * 5
    found = run_warnings(rows(11, **{"train/grad_norm": grad, "train/truncated": 1.0, "anchor/gate_drop": 0.0}))
    assert len(found) == 2 and "steps 1–5" in found[0] and "steps 1–11" in found[1]


def test_status_and_report_show_the_warnings_and_ignore_logging_settings(tmp_path):
    from armorlab.analysis.load import load
    from armorlab.core.config import resolve
    from armorlab.core.runs import RunDir
    from armorlab.sweeps.status import collect
    from armorlab.train.launch import HealthMonitor

    sweep = tmp_path / "sweep"
    for seed, name, grad in ((0, "a", 0.0), (1, "b", 0.3)):
        rd = RunDir.create(sweep, resolve({"seed": seed, "run_name": name, "max_steps": 3}))
        rd.write_status("running")
        monitor = HealthMonitor(rd)
        for step in (1, 2, 3):
            rd.append_metrics(step, {"train/grad_norm": grad, "train/loss": 0.0})
            monitor.rows.append({"step": step, "train/grad_norm": grad})
        monitor.update(final=True)
        rd.write_status("completed")
    rows = {r.point: r for r in collect(sweep).rows}
    assert set(rows) == {"seed=0", "seed=1"}  # run_name is no factor
    assert len(rows["seed=0"].warnings) == 1 and "no gradient" in rows["seed=0"].warnings[0]
    assert rows["seed=1"].warnings == []
    rs = load([sweep], cache=False)
    assert rs.config_columns(varying_only=True) == ["seed"]
    assert [w for w in rs.warnings if "no gradient" in w] == \
        [f"run {r.run_id}: {r.warnings[0]}" for r in rows.values() if r.warnings]


def test_damaged_warnings_field_is_ignored(tmp_path):
    import json

    from armorlab.core.runs import RunDir

    rd = RunDir(tmp_path)
    rd.status_path.write_text(json.dumps({"state": "completed", "warnings": [1, {"x": 2}]}))
    assert "warnings" not in rd.read_status()
    rd.set_warnings(["w"])
    assert rd.read_status()["warnings"] == ["w"]


def test_gate_window_running_sum_finds_the_same_first_window_as_every_window_checked():
    # the one-pass search against the definition written out: every window's plain mean, in order
    import random

    def by_definition(series, final):
        w = GATE_WINDOW if len(series) >= GATE_WINDOW else (len(series) if final else 0)
        for i in range(len(series) - w + 1 if w else 0):
            win = series[i:i + w]
            if sum(v for _, v in win) / w >= 0.9:
                return win[0][0], win[-1][0]
        return None

    rng = random.Random(1)
    for trial in range(300):
        n = rng.choice([0, 3, 9, 10, 11, 40, 200])
        pool = [0.0, 0.5, 0.8, 0.9, 1.0] if trial % 2 else [0.9, 1.0, 0.7]  # exact-threshold windows too
        series = [(s, rng.choice(pool)) for s in range(n)]
        for final in (False, True):
            want = by_definition(series, final)
            got = gate_warning(series, final=final)
            assert (got is None) == (want is None)
            if want:
                assert f"steps {want[0]}–{want[1]}" in got
