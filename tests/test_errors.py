"""Errors, not tracebacks (issue 13 §4): every input an adversary found is exit 2 with one clear line."""

from __future__ import annotations

import datetime
import subprocess
import sys

import pytest

from armorlab.core.config import load_yaml_mapping, resolve
from armorlab.errors import ArmorLabError
from armorlab.sweeps.profile import parse_profile
from armorlab.sweeps.spec import parse_spec


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "armorlab.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


@pytest.mark.parametrize("args, says", [
    (["sweep"], "Missing argument"),
    (["nope"], "No such command"),
    (["sweep", "x.yaml", "--workers", "abc"], "--workers"),
    (["status", "--bogus"], "No such option"),
    (["report"], "Missing argument"),
])
def test_usage_errors_exit_2_with_the_usage_line(args, says):
    out = cli(*args)
    assert out.returncode == 2, out.stderr
    assert "Usage: armorlab" in out.stderr and says in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("raw, key", [
    ({"run_name": float("nan")}, "run_name"),
    ({"label_names": [datetime.date(2026, 1, 1)]}, "label_names"),
    ({"learning_rate": 10**400}, "learning_rate"),
    ({"seed": 18446744073709551616}, "seed"),
    ({"max_completion_length": 0}, "max_completion_length"),
    ({"report_to": 5}, "report_to"),
    ({"learning_rate": -1}, "learning_rate"),
    ({"beta": -1}, "beta"),
    ({"temperature": 0}, "temperature"),
    ({"temperature": -0.5}, "temperature"),
    ({"save_steps": 0}, "save_steps"),
    ({"steps_per_generation": 0}, "steps_per_generation"),
    ({"top_p": 1.5}, "top_p"),
    ({"num_iterations": 0}, "num_iterations"),
    ({"label_names": [float("inf")]}, "label_names"),
])
def test_values_that_crashed_or_meant_nothing_are_config_errors(raw, key):
    with pytest.raises(ArmorLabError) as err:
        resolve(raw, file="c.yaml")
    assert err.value.key == key and "c.yaml" in str(err.value)
    assert len(str(err.value)) < 400  # a 400-digit value is shortened, not printed whole


def test_obvious_ranges_keep_the_meaningful_values():
    cfg = resolve({"learning_rate": 0, "beta": 0, "temperature": 0.1, "save_steps": 0.5, "seed": 2**32 - 1,
                   "report_to": ["none"], "steps_per_generation": None})
    assert (cfg["learning_rate"], cfg["beta"], cfg["seed"], cfg["save_steps"]) == (0.0, 0.0, 2**32 - 1, 0.5)


def test_duplicate_yaml_keys_are_refused_at_any_depth(tmp_path):
    for text in ["alpha: 0.9\nalpha: 0.5\n", "task:\n  digits: 2\n  digits: 3\n"]:
        p = tmp_path / "dup.yaml"
        p.write_text(text)
        with pytest.raises(ArmorLabError, match="duplicate key") as err:
            load_yaml_mapping(p)
        assert "dup.yaml" in str(err.value)
    p.write_text("a: &a {x: 1}\nb:\n  <<: *a\n  x: 2\n")  # a merge key may be overridden: not a duplicate
    assert load_yaml_mapping(p) == {"a": {"x": 1}, "b": {"x": 2}}


def test_invalid_utf8_is_a_clear_error(tmp_path):
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"alpha: \xff\xfe\n")
    with pytest.raises(ArmorLabError, match="not UTF-8") as err:
        load_yaml_mapping(p)
    assert "bin.yaml" in str(err.value)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1, 0])
def test_mem_gb_must_be_a_finite_positive_number(value):
    with pytest.raises(ArmorLabError) as err:
        parse_profile({"mem_gb": value})
    assert err.value.key == "mem_gb"


def test_a_sweep_name_with_a_trailing_newline_is_refused():
    with pytest.raises(ArmorLabError) as err:
        parse_spec({"name": "abc\n"})
    assert err.value.key == "name"


def test_cli_bad_values_exit_2_without_traceback(tmp_path):
    (tmp_path / "s.yaml").write_text("name: s\nbase: {learning_rate: -1}\n")
    (tmp_path / "u.yaml").write_bytes(b"name: s\nbase: {alpha: \xff}\n")
    (tmp_path / "d.yaml").write_text("name: s\nseeds: [0]\nseeds: [1]\n")
    for spec, says in [("s.yaml", "learning_rate"), ("u.yaml", "UTF-8"), ("d.yaml", "duplicate key")]:
        out = cli("sweep", spec, "--dry-run", "--root", str(tmp_path / "runs"), cwd=tmp_path)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.slow
def test_damaged_run_dirs_are_warnings_and_the_rest_is_reported(tmp_path):
    """The damaged files the issue names, all in one sweep: status and report exit 0, each damaged
    file is named in a warning, and the healthy run is still reported."""
    import json

    from armorlab.core.runs import RunDir

    cfg = resolve({"max_steps": 20, "val_every": 10})
    sweep = tmp_path / "sw"
    runs = [RunDir.create(sweep, {**cfg, "seed": s}) for s in range(5)]
    for rd in runs:
        for step in (0, 10, 20):
            rd.append_metrics(step, {"val/acc": 0.5 + step / 100, "train/reward": step / 20})
        rd.write_status("completed")
    runs[1].status_path.write_text(json.dumps({"state": "running", "attempt": "x"}))
    runs[2].metrics_path.write_text('{"step": 0, "val/acc": "0.5"}\n')
    runs[3].metrics_path.write_bytes(b"\xff\xfe\x00binary\n\x80")
    with open(runs[4].metrics_path, "a") as fh:
        fh.write('{"step": 99999999999999999999, "val/acc": 0.1}\n')
    status = cli("status", str(sweep))
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert str(runs[1].status_path) in status.stderr  # the damaged field is named with its file
    report = cli("report", str(sweep), "--out", str(tmp_path / "rep"), "--no-cache")
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
    assert (tmp_path / "rep" / "index.html").is_file()
    html = (tmp_path / "rep" / "index.html").read_text()
    assert runs[0].id in html and str(runs[4].metrics_path) in html  # the huge step: a warning naming the file


def test_huge_grids_are_counted_and_refused_before_expansion(monkeypatch):
    from armorlab.sweeps.spec import count_points, expand

    spec = parse_spec({"name": "big", "grid": {k: list(range(1, 11)) for k in (
        "max_steps", "val_every", "val_samples", "kl_probe_prompts", "save_steps", "logging_steps",
        "num_iterations", "ref_reset_steps", "warmup_steps", "seed")}})
    assert count_points(spec) == 10**10
    with pytest.raises(ArmorLabError, match="ARMORLAB_MAX_POINTS"):
        expand(spec)  # a 10^10-point grid: refused, not expanded (this used to never end)
    small = parse_spec({"name": "s", "grid": {"alpha": [0.5, 0.7], "objective": ["armor"]}, "seeds": [0, 1, 2]})
    monkeypatch.setenv("ARMORLAB_MAX_POINTS", "5")
    with pytest.raises(ArmorLabError, match="6 points, more than the limit of 5"):
        expand(small)
    monkeypatch.setenv("ARMORLAB_MAX_POINTS", "6")
    assert len(expand(small)) == 6  # the limit is overridable


@pytest.mark.parametrize("param", [{"type": "float", "low": 0.1, "high": 1.0, "step": 1e-12},
                                   {"type": "int", "low": 1, "high": 10**15},
                                   {"type": "float", "low": 0.5, "high": 1.0, "step": 5e-301}])
def test_huge_exhaustive_search_spaces_are_refused(param):
    from armorlab.tune.space import parse_search

    key = "max_steps" if param["type"] == "int" else "alpha"
    with pytest.raises(ArmorLabError, match="ARMORLAB_MAX_POINTS") as err:
        parse_search({"space": {key: param}, "sampler": {"type": "grid"}}, {"objective": "armor"}, file="t.yaml")
    assert err.value.key == "search.space" and "t.yaml" in str(err.value)


def test_a_path_too_long_for_the_file_system_is_not_found_not_a_crash(tmp_path):
    """Found by benchmarks/fuzz.py: `base: <300 characters>` raised ENAMETOOLONG from stat()."""
    with pytest.raises(ArmorLabError, match="file not found") as err:
        parse_spec({"name": "s", "base": "a" * 300}, path=tmp_path / "s.yaml")
    assert err.value.key == "base"
