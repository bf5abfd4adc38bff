"""A report re-run on unchanged inputs is skipped (freshness stamp), and within a rebuilt report
the steps whose inputs did not change are reused (memo): each case changes exactly one input."""

import os
import subprocess
import sys

import numpy as np

from armorlab.analysis import freshness, memo
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


def test_cached_function_reuses_results_by_argument_value(tmp_path):
    calls = []

    @memo.cached
    def spread(x, *, scale=1.0):
        calls.append(1)
        return float(np.ptp(x)) * scale

    a = np.array([1.0, 4.0, 2.0])
    assert spread(a) == 3.0 and spread(a) == 3.0 and len(calls) == 2  # no store: plain calls
    store = tmp_path / "memo.pickle"
    with memo.using(store):
        assert spread(a) == 3.0 and spread(a.copy()) == 3.0 and len(calls) == 3   # same values: one call
        assert spread(a, scale=2.0) == 6.0 and len(calls) == 4                    # other argument: a call
    with memo.using(store):  # a new report: last report's results come from the store
        assert spread(np.array([1.0, 4.0, 2.0])) == 3.0 and len(calls) == 4
    with memo.using(store):  # the store keeps what the last report used only
        pass
    with memo.using(store):
        spread(a)
    assert len(calls) == 5
    store.write_bytes(b"not a pickle")  # a damaged store is an empty one
    with memo.using(store):
        assert spread(a) == 3.0 and len(calls) == 6


def test_rendered_skips_a_figure_only_while_its_file_is_as_written(tmp_path):
    drawn = []

    @memo.rendered
    def figure(values, path, *, title):
        drawn.append(title)
        path.write_text(f"{title}:{list(values)}")
        return path

    store, png = tmp_path / "memo.pickle", tmp_path / "f.png"
    for _ in range(2):
        with memo.using(store):
            figure([1, 2], png, title="a")
    assert drawn == ["a"]
    with memo.using(store):
        figure([1, 3], png, title="a")       # new data: drawn again
    assert drawn == ["a", "a"] and png.read_text() == "a:[1, 3]"
    png.write_text("edited by hand")
    with memo.using(store):
        figure([1, 3], png, title="a")       # the file is not what we wrote: drawn again
    assert len(drawn) == 3 and png.read_text() == "a:[1, 3]"


def test_rebuilt_report_reuses_unchanged_groups_and_matches_a_fresh_one(tmp_path):
    sweep = _sweep(tmp_path / "sw", n=6)
    out, fresh = tmp_path / "rep", tmp_path / "fresh"
    recipe = Recipe(runs=[str(sweep)], group_by=["objective"])
    R.build_report(recipe, out)
    first = (out / "tables" / "groups.csv").read_text()
    # one armor run moves: the dapo group's statistics come from the memo, the armor ones do not
    armor = next(p for p in sweep.iterdir()
                 if (p / "config.yaml").is_file() and "armor" in (p / "config.yaml").read_text())
    RunDir(armor).append_metrics(20, {"val/acc": 0.9, "test/acc": 0.7, "train/reward": 1.0})
    counts = {}
    real_using = memo.using

    def spy(path, **kw):
        cm = real_using(path, **kw)

        class Wrap:
            def __enter__(self):
                counts["store"] = cm.__enter__()
                return counts["store"]

            def __exit__(self, *exc):
                return cm.__exit__(*exc)
        return Wrap()

    R.memo.using = spy
    try:
        R.build_report(recipe, out)
    finally:
        R.memo.using = real_using
    assert counts["store"].hits > 0 and counts["store"].misses > 0
    R.build_report(recipe, fresh, cache=False)
    again = (out / "tables" / "groups.csv").read_text()
    assert again != first and again == (fresh / "tables" / "groups.csv").read_text()
