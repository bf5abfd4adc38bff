"""Errors, not tracebacks (issue 13 §4): every input an adversary found is exit 2 with one clear line."""

from __future__ import annotations

import datetime
import subprocess
import sys

import pytest

from armorlab.config import load_yaml_mapping, resolve
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
