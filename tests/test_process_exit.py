"""`armorlab report` ends its process without the interpreter's teardown, with everything said
and written first; every other command, and main() called in-process, end as Python does."""

import os
import subprocess
import sys

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir

# an atexit handler stands for the teardown: it runs only when the interpreter tears down
SCRIPT = """import atexit, sys
atexit.register(lambda: print("teardown ran", flush=True))
import armorlab.cli
sys.argv = ["armorlab", *sys.argv[1:]]
armorlab.cli.{entry}()
print("after main", flush=True)
"""


def _sweep(root):
    for seed in (0, 1):
        rd = RunDir.create(root, resolve({"objective": "armor", "alpha": 0.8, "seed": seed, "max_steps": 4}))
        for s in range(5):
            rd.append_metrics(s, {"val/acc": 0.1 * s, "train/reward": 0.2 * s})
        rd.write_status("completed")
    return root


def _run(entry, *args):
    return subprocess.run([sys.executable, "-c", SCRIPT.format(entry=entry), *args], capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_report_skips_the_teardown_after_saying_where_the_report_is(tmp_path):
    sweep = _sweep(tmp_path / "sw")
    res = _run("run", "report", str(sweep), "--out", str(tmp_path / "rep"))
    assert res.returncode == 0, res.stderr
    assert "index.html  (2 runs, 1 groups" in res.stdout  # printed and flushed before the exit
    assert "teardown ran" not in res.stdout and "after main" not in res.stdout
    assert (tmp_path / "rep" / "index.html").stat().st_size > 0
    again = _run("run", "report", str(sweep), "--out", str(tmp_path / "rep"))  # unchanged: not rebuilt
    assert again.returncode == 0 and "unchanged" in again.stdout and "teardown ran" not in again.stdout


def test_other_commands_and_errors_end_as_python_does(tmp_path):
    version = _run("run", "--version")
    assert version.returncode == 0 and "armorlab " in version.stdout and "teardown ran" in version.stdout
    missing = _run("run", "report", str(tmp_path / "nothing.yaml"))
    assert missing.returncode == 2 and "recipe file not found" in missing.stderr
    assert "teardown ran" in missing.stdout


def test_main_in_process_never_ends_the_process(tmp_path):
    sweep = _sweep(tmp_path / "sw")
    code = SCRIPT.replace("armorlab.cli.{entry}()", "try:\n    armorlab.cli.main()\nexcept SystemExit as exc:\n"
                          "    print('exit code', exc.code, flush=True)")
    res = subprocess.run([sys.executable, "-c", code, "report", str(sweep), "--out", str(tmp_path / "rep")],
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr
    assert "exit code 0" in res.stdout and "after main" in res.stdout and "teardown ran" in res.stdout


def test_a_message_code_exits_1_with_the_message():
    res = subprocess.run([sys.executable, "-c", "from armorlab import process_exit as p\n"
                          "p.skip_teardown()\np.end('stopped: no runs')"], capture_output=True, text=True)
    assert res.returncode == 1 and "stopped: no runs" in res.stderr
