"""A report re-run on unchanged inputs is skipped (freshness stamp: each case changes exactly one
input), and a report rebuilt after one run moved is the report written from scratch."""

import os
import subprocess
import sys

from armorlab.analysis import freshness
from armorlab.analysis import report as R
from armorlab.analysis.recipe import Recipe
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir


def _sweep(root, n=4):
    for k in range(n):
        rd = RunDir.create(root, resolve({"objective": "dapo" if k % 2 else "armor", "seed": k // 2,
                                          "max_steps": 20}))
        for s in range(0, 21, 5):
            rd.append_metrics(s, {"val/acc": 0.1 * s / 20 + 0.01 * k, "test/acc": 0.05 * s / 20,
                                  "train/reward": s / 20})
        rd.write_status("completed")
    return root


def test_stamp_is_fresh_until_one_input_output_recipe_or_code_changes(tmp_path):
    sweep = _sweep(tmp_path / "sw")
    out = tmp_path / "rep"
    recipe = Recipe(runs=[str(sweep)], group_by=["objective"])
    result = R.build_report(recipe, out)
    summary = freshness.fresh_summary(recipe, out)
    assert summary is not None and summary["n_runs"] == 4 and summary["n_groups"] == 2
    assert summary["index"] == str(result.index)

    # an appended metrics line (a run still training) makes it stale
    rd = RunDir(next(p for p in sweep.iterdir() if (p / "config.yaml").is_file()))
    metrics = rd.metrics_path.read_bytes()
    rd.append_metrics(25, {"val/acc": 0.5})
    assert freshness.fresh_summary(recipe, out) is None
    rd.metrics_path.write_bytes(metrics)  # same bytes, new mtime: stale too (no content hashing)
    assert freshness.fresh_summary(recipe, out) is None
    R.build_report(recipe, out)
    assert freshness.fresh_summary(recipe, out) is not None

    # a different recipe, a touched status file, a removed figure: stale; each undone: fresh again
    assert freshness.fresh_summary(Recipe(runs=[str(sweep)], group_by=["seed"]), out) is None
    status = rd.status_path.read_bytes()
    st = os.stat(rd.status_path)
    rd.write_status("completed", reason="again")
    assert freshness.fresh_summary(recipe, out) is None
    rd.status_path.write_bytes(status)
    os.utime(rd.status_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert freshness.fresh_summary(recipe, out) is not None
    png = next((out / "plots").glob("*.png"))
    data = png.read_bytes()
    png.unlink()
    assert freshness.fresh_summary(recipe, out) is None
    png.write_bytes(data)  # same bytes, but not the file the report wrote (mtime): still stale
    assert freshness.fresh_summary(recipe, out) is None
    # the code that wrote it changed (a source file's mtime moved)
    src = os.path.join(os.path.dirname(freshness.__file__), "groups.py")
    st = os.stat(src)
    try:
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        assert freshness.fresh_summary(recipe, out) is None
    finally:
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_cli_skips_a_fresh_report_without_importing_pandas(tmp_path):
    sweep = _sweep(tmp_path / "sw")
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "armorlab.cli", "report", str(sweep), "--out", str(out)]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "unchanged" not in first.stdout
    code = ("import sys\nfrom pathlib import Path\nfrom armorlab.commands.report import write_report\n"
            "from armorlab.analysis.recipe import recipe_for_paths\n"
            f"write_report(recipe_for_paths([{str(sweep)!r}]), Path({str(out)!r}))\n"
            "print('HEAVY', [m for m in ('pandas', 'scipy', 'matplotlib') if m in sys.modules])\n")
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stdout and "HEAVY []" in again.stdout
    assert first.stdout.split()[0] == again.stdout.split()[0]  # the same index.html


def test_rebuilt_report_after_one_run_moved_matches_a_fresh_one(tmp_path):
    sweep = _sweep(tmp_path / "sw", n=6)
    out, fresh = tmp_path / "rep", tmp_path / "fresh"
    recipe = Recipe(runs=[str(sweep)], group_by=["objective"])
    R.build_report(recipe, out)
    first = (out / "tables" / "groups.csv").read_text()
    # one armor run moves: its metrics are parsed again, the others come from the metrics cache
    armor = next(p for p in sweep.iterdir()
                 if (p / "config.yaml").is_file() and "armor" in (p / "config.yaml").read_text())
    RunDir(armor).append_metrics(20, {"val/acc": 0.9, "test/acc": 0.7, "train/reward": 1.0})
    R.build_report(recipe, out)
    R.build_report(recipe, fresh, cache=False)
    again = (out / "tables" / "groups.csv").read_text()
    assert again != first and again == (fresh / "tables" / "groups.csv").read_text()
