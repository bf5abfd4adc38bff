"""A researcher's first hour (issue 40 §1): what long commands print while they work, when their
output goes to a file, and how many threads a local trainer gets."""

from __future__ import annotations

import pytest
from sweep_support import run_cli, standin_command, write_spec
from tune_support import spec, standin  # noqa: F401 (fixture)

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir


def test_trainer_threads_split_the_idle_cores():
    from armorlab.sweeps.executors import trainer_threads

    assert trainer_threads(1, cores=2, load=7.9) == 1      # loaded: idle max(1, round(2 − 7.9)) = 1
    assert trainer_threads(1, cores=2, load=0.1) == 2      # idle round(1.9) = 2
    assert trainer_threads(2, cores=2, load=0.1) == 1
    assert trainer_threads(3, cores=16, load=4.2) == 4     # round(11.8) = 12 idle, 12 // 3
    assert trainer_threads(4, cores=2, load=0.0) == 1      # never 0


def test_tables_are_not_cut_at_80_columns_in_a_pipe(tmp_path, monkeypatch):
    from armorlab.commands import UNBOUNDED_WIDTH, console

    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == UNBOUNDED_WIDTH               # pytest's captured stdout is no terminal
    monkeypatch.setenv("COLUMNS", "100")
    assert console().width == 100
    base = resolve({"max_steps": 5})
    for i, lr in enumerate((3.1622776601683794e-06, 1e-05)):
        RunDir.create(tmp_path / "sw", {**base, "learning_rate": lr, "alpha": 0.5 + i / 10, "ref_reset_steps": 7 * i,
                                        "temperature": 0.9 + i / 10})
    env = {k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"}
    out = run_cli("status", str(tmp_path / "sw"), env=env)
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout and max(map(len, out.stdout.splitlines())) > 80


def test_local_sweep_lines_name_the_run_and_its_point(tmp_path, monkeypatch):
    from armorlab.sweeps.jobs import ENV_COMMAND

    monkeypatch.setenv(ENV_COMMAND, standin_command())
    spec = write_spec(tmp_path / "s.yaml", {"name": "lab", "base": {"objective": "armor", "max_steps": 2, "val_every": 1},
                                            "grid": {"alpha": [0.6, 0.8]}, "seeds": [0]})
    out = run_cli("sweep", str(spec), "--root", str(tmp_path / "runs"), "-w", "1",
                  env={"ARMORLAB_STANDIN_STEP_S": "0.005"})
    assert out.returncode == 0, out.stderr
    for alpha in ("0.6", "0.8"):
        assert any(line.startswith("[") and "started" in line and f"alpha={alpha} seed=0" in line
                   for line in out.stderr.splitlines()), out.stderr
        assert any("done]" in line and f"alpha={alpha} seed=0 completed" in line
                   for line in out.stderr.splitlines()), out.stderr
    assert "trainer(s) at a time, each with" in out.stderr


@pytest.mark.usefixtures("standin")
def test_tune_prints_trials_started_finished_and_the_best_so_far(tmp_path):
    pytest.importorskip("optuna")
    p = spec(tmp_path, "grid2", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7]}
        objective: {metric: val/acc, summary: auc}
        sampler: {type: grid, seed: 3}
        n_trials: 2
    """)
    out = run_cli("tune", str(p), "--root", str(tmp_path / "runs"), "--workers", "1", timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("trials: ")]
    assert lines and "2/2 finished" in lines[-1] and "best so far: " in lines[-1] and "(trial " in lines[-1], lines
    assert "none yet" in lines[0] or "1/2 finished" in lines[0]
