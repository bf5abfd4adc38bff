"""A researcher's first hour (issue 40): each friction as the user met it, through the CLI where
that is how it was met."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

from armorlab.cli import main


def _yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def _error_of(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


# --------------------------------------------------------------------------- §5 small habits
def test_set_with_a_space_says_what_was_meant(capsys):
    err = _error_of(capsys, ["train", "--set", "alpha", "0.7"])
    assert "did you mean --set alpha=0.7?" in err and "cannot read file" not in err
    err = _error_of(capsys, ["sweep", "x.yaml", "--dry-run", "--set", "alpha"])
    assert "did you mean --set alpha=VALUE?" in err


def test_a_misspelt_objective_gets_a_near_miss(capsys):
    err = _error_of(capsys, ["train", "--set", "objective=armr"])
    assert "(did you mean 'armor'?)" in err and "key 'objective'" in err


def test_a_sweep_spec_with_two_typos_reports_both(tmp_path, capsys):
    for name, spec, keys in (
        ("top", {"bsae": {"model": "tiny"}, "gird": {"alpha": [0.9]}}, ("'bsae'", "'gird'")),
        ("grid", {"base": {"model": "tiny"}, "grid": {"alpah": [0.9], "ref_reset_step": [1]}},
         ("'grid.alpah'", "'grid.ref_reset_step'")),
        ("base+grid", {"base": {"model": "tiny", "alpah": 0.5}, "grid": {"ref_reset_step": [1]}},
         ("'base.alpah'", "'grid.ref_reset_step'")),
        ("include", {"base": {"model": "tiny"}, "include": [{"objectiv": "dapo"}, {"alpah": 0.5}]},
         ("'include.objectiv'", "'include.alpah'")),
    ):
        spec_path = _yaml(tmp_path / "s.yaml", {"name": "t", "seeds": [0], **spec})
        err = _error_of(capsys, ["sweep", str(spec_path), "--dry-run", "--root", str(tmp_path / "runs")])
        assert "2 problems in" in err, (name, err)
        assert all(k in err for k in keys), (name, err)


def test_max_prompt_length_is_told_what_replaced_it(tmp_path, capsys):
    err = _error_of(capsys, ["train", "--set", "max_prompt_length=64"])
    assert "no longer has it" in err and "did you mean 'max_completion_length'" not in err
    spec_path = _yaml(tmp_path / "s.yaml", {"name": "t", "grid": {"max_prompt_length": [64]}})
    err = _error_of(capsys, ["sweep", str(spec_path), "--dry-run", "--root", str(tmp_path / "runs")])
    assert "no longer has it" in err and "max_completion_length" not in err


def test_check_task_shows_an_unrenderable_chat_prompt_as_text(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ARMORLAB_CACHE", str(tmp_path / "cache"))  # the tiny model is not built
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(30)))
    cfg = _yaml(tmp_path / "c.yaml", {"model": "tiny", "task": {
        "name": "math", "path": str(data), "val_size": 4, "test_size": 4, "chat": True, "system_prompt": "Be brief."}})
    err = _error_of(capsys, ["check-task", str(cfg), "--rows", "1"])
    assert "[system] Be brief.\n[user] What is" in err
    assert "{'role'" not in err and "set task.chat: false" in err and str(cfg) in err


def test_ddp_unused_parameter_warning_is_filtered():
    from armorlab.train.launch import quiet_known_noise

    text = ("find_unused_parameters=True was specified in DDP constructor, but did not find any unused "
            "parameters in the forward pass.")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_known_noise()
        warnings.warn(text, UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else"]


# --------------------------------------------------------------------------- §6 one owner, every time
def test_a_rerun_after_kill_9_never_starts_a_second_trainer(tmp_path, monkeypatch):
    """The sweep is killed while its (detached) trainer still imports, before a trainer of its own
    would have taken the lock: the re-run must find the run owned (the job took the lock before
    starting the trainer), say by whom, and start nothing — every time."""
    import os
    import signal
    import subprocess
    import sys

    from sweep_support import run_cli, standin_command, wait_for, write_spec

    from armorlab.core.runs import RunDir
    from armorlab.sweeps.jobs import ENV_COMMAND
    from armorlab.sweeps.submit import plan_sweep

    monkeypatch.setenv(ENV_COMMAND, standin_command())
    for attempt in range(2):
        name = f"own{attempt}"
        spec = write_spec(tmp_path / f"{name}.yaml", {"name": name, "base": {"max_steps": 3, "val_every": 1},
                                                      "seeds": [attempt]})
        root = tmp_path / "runs"
        rd = RunDir(root / name / plan_sweep(spec, root=root).runs[0].run_id)
        env = {**os.environ, "ARMORLAB_STANDIN_START_S": "6", "ARMORLAB_STANDIN_STEP_S": "0.01"}
        sweep = subprocess.Popen([sys.executable, "-m", "armorlab.cli", "sweep", str(spec), "--root", str(root),
                                  "-w", "1", "--detach"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda rd=rd: (rd.path / "standin_pids").is_file(), 60, "the trainer to start")
            sweep.send_signal(signal.SIGKILL)
            sweep.wait(timeout=60)
            trainer = int((rd.path / "standin_pids").read_text().split()[0])
            out = run_cli("sweep", str(spec), "--root", str(root), env={"ARMORLAB_STANDIN_START_S": "0"})
            assert out.returncode == 0, out.stderr
            assert f"is owned by PID {trainer} on" in out.stderr and "nothing to run" in out.stderr, out.stderr
            wait_for(lambda rd=rd: rd.read_status()["state"] == "completed", 120, "the first trainer to finish")
        finally:
            if sweep.poll() is None:
                sweep.kill()
        assert (rd.path / "standin_pids").read_text().split() == [str(trainer)]  # one trainer process, ever
        assert rd.read_status()["attempt"] == 1 and [r["step"] for r in rd.read_metrics()] == [0, 1, 2, 3]


# --------------------------------------------------------------------------- §2 status states
def test_status_of_a_live_local_sweep_says_queued_running_completed(tmp_path):
    """A local sweep alive with three runs: one not started, one its trainer owns, one finished.
    The sweep process being alive makes none of them `running` by itself."""
    import socket
    import subprocess
    import sys

    from armorlab.core.config import resolve
    from armorlab.core.runs import RunDir
    from armorlab.sweeps.manifest import Manifest
    from armorlab.sweeps.status import collect

    sweep_dir = tmp_path / "sw"
    cfg = resolve({"max_steps": 5})
    waiting, training, done = (RunDir.create(sweep_dir, {**cfg, "seed": s}) for s in (0, 1, 2))
    training.write_status("running")
    done.write_status("completed")
    hold = ("import sys, time; from armorlab.core.runs import RunDir; RunDir(sys.argv[1]).acquire_owner(); "
            "print('held', flush=True); time.sleep(60)")
    # stands in for the sweep: a live process of this host whose command line names armorlab
    sweep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "armorlab"])
    trainer = subprocess.Popen([sys.executable, "-c", hold, str(training.path)], stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout.readline().strip() == "held"
        manifest = Manifest(sweep_dir, "sw", runs=[waiting.id, training.id, done.id])
        manifest.record("local", manifest.runs,
                        [f"local:{socket.gethostname()}:{sweep.pid}:{n}" for n in range(3)])
        rows = {r.run_id: (r.state, r.slurm_state, r.attempts) for r in collect(sweep_dir).rows}
    finally:
        for p in (sweep, trainer):
            p.kill()
            p.wait()
    assert rows == {waiting.id: ("queued", "local:queued", 0), training.id: ("running", "local:running", 1),
                    done.id: ("completed", "local", 0)}


# --------------------------------------------------------------------------- §2 intervals in range
def test_score_ranges_follow_the_metric_and_the_values():
    from armorlab.analysis.ranges import score_range, score_ranges

    assert score_range("auc", "val/acc", "test/acc") == (0.0, 1.0)
    assert score_range("test@100", "val/acc", "test/pass@8") == (0.0, 1.0)
    assert score_range("drop", "val/math500/avg@4", "test/acc") == (-1.0, 1.0)
    assert score_range("final", "val/reward", "test/acc") is None          # not a proportion by its name
    assert score_range("peak_step", "val/acc", "test/acc") is None
    # a value outside [0, 1] under an accuracy's name: no range is assumed
    assert score_ranges(["auc", "final"], "val/acc", "test/acc", {"auc": [0.4, 1.5], "final": [0.2]}) == \
        {"final": (0.0, 1.0)}


def test_a_two_seed_auc_interval_stays_in_0_1():
    import math

    import pandas as pd

    from armorlab.analysis import groups as G
    from armorlab.analysis.ranges import score_ranges

    per_run = pd.DataFrame({"run_id": list("abcde"), "group": ["two"] * 2 + ["three"] * 3,
                            "auc": [0.3, 0.9, 0.90, 0.98, 0.99]})
    groups = G.Groups(keys=[], table=pd.DataFrame({"group": ["two", "three"]}),
                      of_run={r: g for r, g in zip(per_run.run_id, per_run.group, strict=True)})
    bounds = score_ranges(["auc"], "val/acc", "test/acc", per_run)
    free, clipped = (G.group_summary(per_run, groups, ["auc"], bounds=b).set_index("group") for b in (None, bounds))
    # two seeds: 0.6 ± t(0.975, 1) · 0.4243/√2 = 0.6 ± 12.7062 · 0.3 → [−3.212, 4.412] → [0, 1]
    assert free.loc["two", "auc_ci_low"] == pytest.approx(0.6 - 12.7062 * 0.3, abs=1e-3)
    assert (clipped.loc["two", "auc_ci_low"], clipped.loc["two", "auc_ci_high"]) == (0.0, 1.0)
    # three seeds: mean 0.95667, sd 0.049329, 4.30265 · 0.049329/√3 = 0.12254 → [0.83413, 1.07921] → high 1
    assert clipped.loc["three", "auc_ci_low"] == pytest.approx(0.95667 - 0.12254, abs=1e-4)
    assert clipped.loc["three", "auc_ci_high"] == 1.0
    assert math.isclose(clipped.loc["three", "auc_mean"], 0.95667, abs_tol=1e-5)


def test_a_difference_of_accuracies_stays_in_minus_1_1():
    from armorlab.analysis.ranges import difference_range
    from armorlab.analysis.verdict_table import within
    from armorlab.stats import verdicts as V

    (v,) = V.compare({"arm": [0.1, 0.9], "base": [0.2, 0.7]}, [("arm", "base")], "selected_test")
    # Welch: d = 0.05, se² = 0.32/2 + 0.125/2 = 0.2225, df = 0.2225²/(0.16² + 0.0625²) = 1.678: t ≈ 5.6
    assert v.diff == pytest.approx(0.05) and v.low < -2 and v.high > 2
    clipped = within(v, difference_range((0.0, 1.0)))
    assert (clipped.low, clipped.high, clipped.verdict) == (-1.0, 1.0, v.verdict)


# --------------------------------------------------------------------------- §4 cluster habits
REPO = Path(__file__).resolve().parents[1]


def _usage_lines() -> list[tuple[str, str]]:
    """Every `armorlab sweep` line a user can copy: from the comments of slurm/*.yaml and the code of
    README.md and docs/*.md (continuation lines joined); a synopsis with [options] is not a command."""
    import re

    found = []
    for f in sorted((REPO / "slurm").glob("*.yaml")):
        found += [(f.name, m.group(1)) for m in re.finditer(r"^#\s+(armorlab sweep .*)$", f.read_text(), re.M)]
    for f in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = f.read_text().replace("\\\n", " ")
        found += [(f.name, line) for line in text.splitlines() if line.startswith("armorlab sweep ")]
    return [(f, line.split(" #")[0].strip()) for f, line in found if "[" not in line]


def test_every_shipped_sweep_line_runs_as_written_in_a_dry_run(tmp_path, capsys, monkeypatch):
    import shlex

    monkeypatch.chdir(REPO)
    lines = _usage_lines()
    assert len(lines) >= 10 and any(f == "gpu-8x-vllm.yaml" for f, _ in lines)
    for f, line in lines:
        argv = [w for w in shlex.split(line)[1:] if w != "--wait"]  # --wait would follow a real submission
        argv = ["sweeps/armor_alpha.yaml" if w == "SPEC" else w for w in argv]
        argv += ["--root", str(tmp_path / "runs")] + ([] if "--dry-run" in argv else ["--dry-run"])
        with pytest.raises(SystemExit) as exc:
            main(argv)
        out = capsys.readouterr()
        assert exc.value.code == 0, (f, line, out.err[-1500:])


def test_a_dry_run_shows_each_profiles_launch_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    for profile, launcher in (("slurm/gpu-8x.yaml", "accelerate.commands.launch --config_file"),
                              ("slurm/default.yaml", "-m armorlab.cli train --run-dir")):
        with pytest.raises(SystemExit) as exc:
            main(["sweep", "sweeps/armor_alpha.yaml", "--profile", profile, "--dry-run", "--root", str(tmp_path)])
        assert exc.value.code == 0
        line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("each run is trained by: ")]
        assert len(line) == 1 and launcher in line[0] and "'<run dir>'" in line[0], (profile, line)


def test_an_error_of_one_grid_point_names_the_point(tmp_path, capsys):
    spec = _yaml(tmp_path / "s.yaml", {"name": "t", "base": {"objective": "armor"},
                                       "grid": {"alpha": [0.7, 1.5], "ref_reset_steps": [0, 2]}, "seeds": [0]})
    err = _error_of(capsys, ["sweep", str(spec), "--dry-run", "--root", str(tmp_path / "runs")])
    assert "point alpha=1.5, ref_reset_steps=0: must be ≤ 1.0" in err and "key 'alpha'" in err


def test_a_dry_run_reads_a_config_only_model_dir_with_a_warning(tmp_path, capsys):
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                                   "num_attention_heads": 2, "vocab_size": 128}))
    argv = ["sweep", str(REPO / "sweeps/armor_alpha.yaml"), "--set", f"model={model}", "--root", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--dry-run"])
    out = capsys.readouterr()
    assert exc.value.code == 0, out.err
    assert "warning: not a loadable model directory: no weights" in out.err and "provisional" in out.err
    assert "each run is trained by:" in out.out
    err = _error_of(capsys, argv)  # a real run still refuses it, before anything is written
    assert "no weights" in err and not (tmp_path / "r").exists()


def test_setuptools_editable_banner_is_filtered_on_every_editable_install():
    import re
    import subprocess
    import sys

    makefile = (REPO / "Makefile").read_text()
    spec = re.search(r'^EDITABLE = PYTHONWARNINGS="([^"]+)"$', makefile, re.M).group(1)
    installs = [ln for ln in makefile.splitlines() if re.search(r"pip install .*-e ", ln)]
    assert installs and all(ln.lstrip().startswith("@$(EDITABLE) ") for ln in installs)
    # the banner as setuptools' editable_wheel raises it (a BuildBackendWarning, a UserWarning)
    banner = ("Editable installation.\n!!\n\n        ****\n        Please be careful with folders in your working "
              "directory with the same\n        name as your package as they may take precedence during imports.")
    code = f"import warnings; warnings.warn({banner!r}, UserWarning); warnings.warn('other', UserWarning)"
    for env, shown in (({}, True), ({"PYTHONWARNINGS": spec}, False)):
        err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", **env}).stderr
        assert ("Editable installation" in err) is shown and "other" in err
