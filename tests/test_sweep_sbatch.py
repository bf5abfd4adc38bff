"""sbatch injection (issue 13 §1): no value from a profile or a path may add a line to the job script.

Every profile field and the sweep path are tried with shell metacharacters ($(), backticks, ;,
quotes) and with line breaks (\\n, \\r, NUL, U+2028). Line breaks are refused with a clear error;
the others must render into a script of submitit's shape which, executed by bash with a stub
``srun``, runs nothing of the payload.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from armorlab.errors import ArmorLabError
from armorlab.sweeps.executors import SlurmSubmitter
from armorlab.sweeps.profile import parse_profile
from armorlab.sweeps.sbatch import check_script

FIELDS = ["partition", "account", "qos", "python", "accelerate_config", "sbatch.constraint", "setup"]
BREAKS = ["x\ntouch PWNED #", "x\rtouch PWNED", "x\x00touch PWNED", "x\u2028touch PWNED", "x\ttouch"]
SHELL = ["$(touch PWNED)", "`touch PWNED`", "x; touch PWNED", "x' ; touch PWNED #", 'x" ; touch PWNED #']


def _profile_data(field: str, value: str) -> dict:
    if field == "sbatch.constraint":
        return {"sbatch": {"constraint": value}}
    if field == "setup":
        return {"setup": [value]}
    return {field: value}


@pytest.mark.parametrize("value", BREAKS)
@pytest.mark.parametrize("field", FIELDS)
def test_line_breaks_in_any_profile_field_are_refused(field, value, tmp_path):
    with pytest.raises(ArmorLabError) as err:
        parse_profile(_profile_data(field, value), path=tmp_path / "p.yaml")
    assert err.value.key == field.split(".")[0] and "control character" in str(err.value)
    assert "p.yaml" in str(err.value)


def test_line_breaks_in_sbatch_option_names_are_refused(tmp_path):
    with pytest.raises(ArmorLabError, match="sbatch long option"):
        parse_profile({"sbatch": {"constraint\n": "a"}}, path=tmp_path / "p.yaml")


def _run_script(text: str, cwd: Path) -> None:
    """Execute the script as Slurm would start it, with an ``srun`` that does nothing."""
    bin_dir = cwd / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    script = cwd / "job.sh"
    script.write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(script)], cwd=cwd, env=env, check=True, capture_output=True, timeout=30)


@pytest.mark.parametrize("value", SHELL)
@pytest.mark.parametrize("field", ["partition", "account", "qos", "sbatch.constraint", "root"])
def test_shell_metacharacters_stay_inert(field, value, tmp_path):
    data = {} if field == "root" else _profile_data(field, value)
    sweep_dir = (tmp_path / value / "sweep") if field == "root" else tmp_path / "sweep"
    text = SlurmSubmitter(sweep_dir, parse_profile(data), job_name="s").sbatch_text(2)
    check_script(text)  # the shape submitit writes; sbatch_text checked it already, this documents it
    work = tmp_path / "work"
    work.mkdir()
    _run_script(text, work)
    assert not (work / "PWNED").exists() and not Path("PWNED").exists()


@pytest.mark.parametrize("value", ["r\noot", "r\root", "r\x00oot", "r\x1boot"])
def test_line_breaks_in_the_sweep_path_are_refused(value, tmp_path):
    with pytest.raises(ArmorLabError) as err:
        SlurmSubmitter(tmp_path / value / "sweep", parse_profile({}), job_name="s").sbatch_text(1)
    assert "--root" in str(err.value) and "control character" in str(err.value)


def test_the_rendered_script_is_checked_line_by_line():
    good = "\n".join(["#!/bin/bash", "", "# Parameters", "#SBATCH --job-name=s", "#SBATCH --exclusive", "",
                      "# setup", "module load x", "", "# command", "export SUBMITIT_EXECUTOR=slurm",
                      "srun python -m submitit.core._submit /r", ""])
    check_script(good, ["module load x"])
    injected = good.replace("#SBATCH --exclusive", "#SBATCH --partition='x\ntouch PWNED #'")
    with pytest.raises(ArmorLabError, match="not an #SBATCH option"):
        check_script(injected, ["module load x"])
    with pytest.raises(ArmorLabError, match="setup block"):
        check_script(good, ["module load y"])
    with pytest.raises(ArmorLabError, match="one command line"):
        check_script(good.replace("srun python", "touch PWNED\nsrun python"), ["module load x"])
    with pytest.raises(ArmorLabError, match="control character"):
        check_script(good.replace("--exclusive", "--exclusive\r"), ["module load x"])


def test_cli_refuses_an_injected_profile_with_exit_2(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase: {task: arithmetic, model: tiny, max_steps: 2}\nseeds: [0]\n")
    prof = tmp_path / "p.yaml"
    prof.write_text('executor: slurm\npartition: "x\\ntouch PWNED #"\n')
    out = subprocess.run([sys.executable, "-m", "armorlab.cli", "sweep", str(spec), "--profile", str(prof),
                          "--dry-run", "--root", str(tmp_path / "runs")], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "partition" in out.stderr and "p.yaml" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "PWNED").exists()
