"""Code that replaces a library's job, each timed against the library in the same run (issues 24, 34).

    .venv/bin/python benchmarks/library_replacements.py [--rounds 5] [--runs 200] [--steps 2000]
        [--only tensorboard_reader,tensorboard_crc] [--before-tree DIR] [--keep DIR]

The pieces of armorlab that do (or did) what a library would do, for speed:

    coercion       armorlab/commands/coercion.py   typer's own (pydantic) coercion of plain CLI values
    tensorboard_reader  analysis/importers/tensorboard_events.py   tbparse's SummaryReader
    tensorboard_crc     the same reader's CRC-32C checks (google-crc32c): their cost, not a library
    png, tdist, process_exit, figure_worker, memo   dropped in 0.2.0 (named and skipped)
    stats_copies   (DROPPED) the numpy percentile bootstrap and exact Mann–Whitney of stats/seeds.py,
                   Holm and the t-test power search of stats/verdicts.py: scipy.stats and statsmodels;
                   timed only with --before-tree, a checkout that still has them, e.g.
                   ``mkdir /tmp/before && git archive e45e485 armorlab | tar -x -C /tmp/before``
    layout         (DROPPED) plots._place, the figures' measured layout: matplotlib's constrained layout;
                   --before-tree a checkout of c151af0
    latex          (DROPPED) analysis/tables.py's _text_tabular: pandas' DataFrame.to_latex (Styler, jinja2);
                   --before-tree a checkout of 769fe9a

Not timed here: the W&B reader (analysis/importers/wandb_local.py) has no library to compare with:
wandb 0.31 (installed here) reads its ``.wandb`` logs only in its Go core (``wandb sync`` uploads them), no
Python reader; submitit's array submission (sweeps/executors.py, sbatch.py, array_task.py) needs
the Slurm cluster: benchmarks/sweep_submit.py times it against submitit's ``map_array``
(``array_submission_gain=``).

Each is timed on the figures a user waits for that it can change: `armorlab --help`,
an import of ``--tb-runs`` TensorBoard runs × ``--tb-steps`` steps (every run read into its table, in
a fresh process, as ``armorlab report`` of TensorBoard logs does first),
`sweep --dry-run` of a 1,000-run grid, a warm report (nothing changed), a cold report (no cache, no
earlier report) of a large sweep (``--runs`` × ``--steps`` × 20 metrics, as benchmarks/analysis.py)
and of a small one (15 runs × 120 steps, the demo's size), and a report after one run of the sweep
moved (one metrics line appended). Every command runs in a fresh process, once with armorlab as it
is ("after") and once with the one replacement swapped for the library ("before"), back to back in
alternating order, ``--rounds`` rounds. The swap is made by a ``sitecustomize`` module this script
writes, which every process of the command loads (the figure worker's too) and which patches the
replaced function right after its module is imported; the "after" processes load the same
sitecustomize and patch nothing.

Output: ``name=value`` lines (``#`` lines are comments). Per piece and figure: the median wall time
of the hand-written side and of the library side, ``ratio`` = the median over rounds of that round's
hand-written/library wall time (the two ran seconds apart, so the machine's slow and fast spells
cancel in the pair), the same by CPU time (``cpu_ratio``: user + sys of the command and its
children). Last, per piece, its largest gain (1 − ratio) over its figures and the verdict: ``keep``
where that gain is ≥ 20 % (the bar of issue 24), else ``drop``; a DROPPED piece reads ``gone``
(or ``bring back``), the CRC ``checked`` (its negative gain is its cost); then the table (piece,
library, figure, hand-written s, library s, gain, verdict) as ``#`` lines. A replacement already
dropped from LIBRARY (its module gone) is named and skipped.
The results and what was dropped: benchmarks/README.md, "Library replacements".
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ENV_VAR = "ARMORLAB_BENCH_LIBRARY"
KEEP_BAR = 0.20  # a replacement stays where it buys at least this share of a figure


# --------------------------------------------------------------------------- the library side
# Each function is applied to its module right after the module is imported, in every process of
# a timed command. Top-level imports of this file stay stdlib-light: every timed process loads it.
def _mark(fn):
    fn.armorlab_bench_library = True
    return fn


def _coercion_by_typer(module) -> None:
    module.install = _mark(lambda: False)  # cli.py calls it: typer keeps its own coercion


def _png_by_matplotlib(module) -> None:
    def encode_with_matplotlib(rgba, *, dpi=None, text=None, level=3):
        """What savefig(format="png") does once the canvas is drawn: matplotlib.image.imsave → Pillow."""
        import io

        import numpy as np
        from matplotlib.image import imsave

        buf = io.BytesIO()
        imsave(buf, np.asarray(rgba), format="png", dpi=dpi, metadata=dict(text or {}))
        return buf.getvalue()

    module.encode_rgba = _mark(encode_with_matplotlib)  # plots.py's own name for the encoder


def _tdist_by_scipy(module) -> None:
    def normal_ppf(q):
        from scipy.special import ndtri

        return float(ndtri(q))

    def t_quantiles(q, nu):
        import numpy as np
        from scipy.special import stdtrit

        return stdtrit(np.asarray(nu, dtype=np.float64), q)

    def t_quantile(q, nu):
        return float(t_quantiles(q, [nu])[0])

    # patched before collapse.py and stats.py import these names from the module
    module.normal_ppf, module.t_quantiles, module.t_quantile = map(_mark, (normal_ppf, t_quantiles, t_quantile))


def _teardown_kept(module) -> None:
    module.skip_teardown = _mark(lambda: None)  # `end` then always calls sys.exit


def _figures_in_process(module) -> None:
    module.wanted = _mark(lambda runs: False)  # FigureWorker(False) draws in the calling process


def _no_memo(module) -> None:
    using = module.using

    def using_disabled(store_path, *, enabled=True):
        return using(store_path, enabled=False)

    module.using = _mark(using_disabled)


def _tensorboard_by_tbparse(module) -> None:
    def read_dir(logdir):
        """tbparse's SummaryReader (TensorBoard's own event loader underneath): per-tag (steps, values)."""
        import numpy as np
        from tbparse import SummaryReader

        df = SummaryReader(str(logdir)).scalars
        return ({str(tag): (g["step"].to_numpy(np.int64), g["value"].to_numpy(np.float64))
                 for tag, g in df.groupby("tag", sort=False)}, {}, [])

    module.read_dir = _mark(read_dir)


def _tensorboard_without_crc(module) -> None:
    def records(data, source, warnings):
        """The TFRecord framing alone, no CRC checked: the "before" of the CRC's cost."""
        pos, end = 0, len(data)
        while pos + 12 <= end:
            (n,) = module._LEN.unpack_from(data, pos)
            if pos + 16 + n > end:
                return
            yield data[pos + 12:pos + 12 + n]
            pos += 16 + n

    module.records = _mark(records)


# name → (module patched, patch, attribute it swaps, the module that replaced the library)
LIBRARY = {
    "coercion": ("armorlab.commands.coercion", _coercion_by_typer, "install", "armorlab.commands.coercion"),
    "png": ("armorlab.analysis.plots", _png_by_matplotlib, "encode_rgba", "armorlab.analysis.png"),
    "tdist": ("armorlab.analysis.tdist", _tdist_by_scipy, "t_quantiles", "armorlab.analysis.tdist"),
    "process_exit": ("armorlab.core.process_exit", _teardown_kept, "skip_teardown", "armorlab.core.process_exit"),
    "figure_worker": ("armorlab.analysis.figure_worker", _figures_in_process, "wanted",
                      "armorlab.analysis.figure_worker"),
    "memo": ("armorlab.analysis.memo", _no_memo, "using", "armorlab.analysis.memo"),
    "tensorboard_reader": ("armorlab.analysis.importers.tensorboard_events", _tensorboard_by_tbparse, "read_dir",
                           "armorlab.analysis.importers.tensorboard_events"),
    # not a library: what checking the CRCs costs (its "gain" is negative, the CRC's share of the import)
    "tensorboard_crc": ("armorlab.analysis.importers.tensorboard_events", _tensorboard_without_crc, "records",
                        "armorlab.analysis.importers.tensorboard_events"),
}
# the library each replacement stands in for (the table's second column)
LIBRARY_NAMES = {"coercion": "typer (pydantic)", "png": "matplotlib (Pillow)", "tdist": "scipy.special",
                 "process_exit": "interpreter teardown", "figure_worker": "figures in-process", "memo": "no memo",
                 "tensorboard_reader": "tbparse", "tensorboard_crc": "no CRC check (its cost)"}
# pieces already replaced by their library, timed with --before-tree (a checkout that still has them)
DROPPED = {
    "stats_copies": ("scipy.stats (bootstrap, mannwhitneyu, ttest_ind_from_stats, t) + statsmodels "
                     "(multipletests, TTestIndPower)", ["report_cold_large", "report_cold_small"]),
    "layout": ("matplotlib constrained layout", ["report_cold_large", "report_cold_small"]),
    "latex": ("pandas DataFrame.to_latex (Styler, jinja2)", ["report_cold_small", "report_one_run_moved_small"]),
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds ``target`` as Python would and runs ``patch(module)`` right after the module's code."""

    def __init__(self, target: str | None, patch) -> None:
        self.target, self.patch = target, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        run_code, patch = spec.loader.exec_module, self.patch

        def exec_module(module):
            run_code(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def use_library(name: str) -> None:
    """Called by the sitecustomize in every timed process: ``name`` = the replacement to swap for its
    library, "" = none (the same finder is installed either way, so both sides pay the same)."""
    target, patch = LIBRARY[name][:2] if name else (None, None)
    sys.meta_path.insert(0, _PatchAfterImport(target, patch))


IMPORT_TENSORBOARD = """import sys
from pathlib import Path
from armorlab.analysis.importers import tensorboard_events as tb
print(sum(tb.read(Path(p)).table.num_rows for p in sys.argv[1:]))
"""

SITECUSTOMIZE = """import os, sys
sys.path.insert(0, {bench!r})
import library_replacements
del sys.path[0]
library_replacements.use_library(os.environ.get({var!r}, ""))
"""


# --------------------------------------------------------------------------- the benchmark
def _timed_rounds(args, chosen, pairs, figures, run) -> None:
    """Each (piece, figure) timed on both sides, alternating, ``args.rounds`` rounds; then the table."""
    import os
    import statistics

    def env_name(name: str, side: str) -> str:
        if name in DROPPED:  # the hand-written side is the older checkout's code
            return f"tree:{name}" if side == "hand" else ""
        return "" if side == "hand" else name

    times: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    print(f"# load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.rounds} rounds")
    for r in range(args.rounds):
        for name, fig in pairs:
            command, prepare, check = figures[fig]
            for side in ("hand", "library") if r % 2 == 0 else ("library", "hand"):
                library = env_name(name, side)
                if prepare is not None:
                    prepare(library)
                wall, cpu, res = run(command, library)
                if check is not None:
                    check(res)
                times.setdefault((name, fig, side), []).append((wall, cpu))
        print(f"# round {r + 1} done, load average {os.getloadavg()[0]:.1f}", flush=True)

    gains: dict[str, list[tuple[float, str]]] = {}
    rows = []
    for name, fig in pairs:
        hand, lib = times[(name, fig, "hand")], times[(name, fig, "library")]
        ratio = statistics.median(h[0] / b[0] for h, b in zip(hand, lib, strict=True))
        cpu_ratio = statistics.median(h[1] / b[1] for h, b in zip(hand, lib, strict=True))
        hand_s, lib_s = statistics.median(h[0] for h in hand), statistics.median(b[0] for b in lib)
        print(f"{name}.{fig}.hand_written_s={hand_s:.3f}")
        print(f"{name}.{fig}.library_s={lib_s:.3f}")
        print(f"# {name}.{fig} hand-written/library per round: "
              + ", ".join(f"{h[0] / b[0]:.3f}" for h, b in zip(hand, lib, strict=True)))
        print(f"{name}.{fig}.cpu_ratio={cpu_ratio:.3f}")
        print(f"{name}.{fig}.ratio={ratio:.3f}")
        gains.setdefault(name, []).append((1.0 - ratio, fig))
        rows.append((name, fig, hand_s, lib_s, 1.0 - ratio, 1.0 - cpu_ratio))
    print(f"# load average at end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    verdicts = {}
    for name in chosen:
        gain, fig = max(gains[name])
        if name == "tensorboard_crc":
            verdicts[name] = "checked"
        elif name in DROPPED:
            verdicts[name] = "gone" if gain < KEEP_BAR else "bring back"
        else:
            verdicts[name] = "keep" if gain >= KEEP_BAR else "drop"
        print(f"{name}.max_gain={gain:.3f}  # {fig}")
        print(f"{name}.verdict={verdicts[name]}")
    print("# | piece | library | figure | hand-written s | library s | gain (CPU) | verdict |")
    for name, fig, hand_s, lib_s, gain, cpu_gain in rows:
        library = DROPPED[name][0] if name in DROPPED else LIBRARY_NAMES[name]
        print(f"# | {name} | {library} | {fig} | {hand_s:.3f} | {lib_s:.3f} | {gain:+.1%} ({cpu_gain:+.1%}) "
              f"| {verdicts[name]} |")


def main() -> None:
    import argparse
    import compileall
    import importlib.util
    import json
    import resource
    import shutil
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    import yaml

    root = Path(BENCH_DIR).parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=200, help="runs of the large sweep")
    ap.add_argument("--steps", type=int, default=2000, help="metric lines per run of the large sweep")
    ap.add_argument("--only", default="", help="comma-separated replacements (default: all in LIBRARY, and "
                    "those in DROPPED with --before-tree)")
    ap.add_argument("--before-tree", type=Path, default=None,
                    help="a checkout that still has the DROPPED pieces (e.g. git archive of the commit before "
                         "their drop, unpacked): its code is the hand-written side of each")
    ap.add_argument("--tb-runs", type=int, default=20, help="TensorBoard runs of the import figure")
    ap.add_argument("--tb-steps", type=int, default=20_000, help="steps per TensorBoard run")
    ap.add_argument("--tb-tags", type=int, default=5, help="scalars per step of a TensorBoard run")
    ap.add_argument("--keep", type=Path, default=None, help="write the sweeps and reports here and keep them")
    args = ap.parse_args()
    chosen = [n for n in args.only.split(",") if n] or [*LIBRARY, *(DROPPED if args.before_tree else ())]
    unknown = set(chosen) - set(LIBRARY) - set(DROPPED)
    if unknown:
        ap.error(f"unknown replacement(s) {sorted(unknown)}; known: {', '.join(LIBRARY)}")

    spec = importlib.util.spec_from_file_location("bench_analysis", Path(BENCH_DIR) / "analysis.py")
    bench_analysis = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_analysis)
    from armorlab.analysis.load import CACHE_DIR

    # installed copies are byte-compiled; without this every timed process would compile armorlab
    compileall.compile_dir(root / "armorlab", quiet=1)
    if args.before_tree is not None:
        compileall.compile_dir(args.before_tree / "armorlab", quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="armorlab-libbench-")) if args.keep is None else args.keep
    tmp.mkdir(parents=True, exist_ok=True)
    hook = tmp / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE.format(bench=BENCH_DIR, var=ENV_VAR))
    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join([str(hook), str(root), *filter(None, [os.environ.get("PYTHONPATH")])])

    def env_for(library: str) -> dict[str, str]:
        if library.startswith("tree:"):  # the hand-written side of a dropped piece: the older checkout's code
            path = base_env["PYTHONPATH"].replace(str(root), str(args.before_tree.resolve()), 1)
            return {**base_env, "PYTHONPATH": path, ENV_VAR: ""}
        return {**base_env, ENV_VAR: library}

    def run(cmd: list[str], library: str) -> tuple[float, float, subprocess.CompletedProcess]:
        r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        res = subprocess.run(cmd, env=env_for(library), cwd=root, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if res.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} ({library or 'as shipped'}) failed:\n{res.stderr[-3000:]}")
        return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), res

    # a replacement already dropped (its module gone: armorlab uses the library) has nothing to compare
    dropped = [n for n in chosen if n in LIBRARY and importlib.util.find_spec(LIBRARY[n][3]) is None]
    dropped += [n for n in chosen if n in DROPPED and args.before_tree is None]
    for name in dropped:
        print(f"# {name}: gone (dropped: armorlab uses the library); not timed"
              + (" without --before-tree" if name in DROPPED else ""))
    chosen = [n for n in chosen if n not in dropped]
    if not chosen:
        return
    # every swap must really be in place (a renamed function would silently time the same code twice)
    for name in (n for n in chosen if n in LIBRARY):
        module, _, attr, _ = LIBRARY[name]
        probe = (f"import {module} as m; print(bool(getattr(getattr(m, {attr!r}), "
                 "'armorlab_bench_library', False)))")
        for library, expected in ((name, "True"), ("", "False")):
            _, _, res = run([sys.executable, "-c", probe], library)
            if res.stdout.strip() != expected:
                raise SystemExit(f"the swap of {name} did not take effect ({library!r}: {res.stdout!r})")

    cli = [sys.executable, "-m", "armorlab.cli"]
    affects = {
        "coercion": ["help", "dry_run_1000", "report_warm"],
        "png": ["report_cold_large", "report_cold_small"],
        "tdist": ["report_cold_large", "report_cold_small"],
        "process_exit": ["report_warm", "report_cold_large", "report_cold_small"],
        # under 8 MB of metrics the report draws in-process anyway (figure_worker.wanted)
        "figure_worker": ["report_cold_large"],
        "memo": ["report_one_run_moved_large", "report_one_run_moved_small", "report_cold_large"],
        "tensorboard_reader": ["import_tensorboard"],
        "tensorboard_crc": ["import_tensorboard"],
        **{name: figs for name, (_, figs) in DROPPED.items()},
    }
    pairs = [(name, fig) for name in chosen for fig in affects[name]]
    figures: dict[str, tuple] = {}
    if any(fig == "import_tensorboard" for _, fig in pairs):
        spec = importlib.util.spec_from_file_location("bench_import", Path(BENCH_DIR) / "import_runs.py")
        bench_import = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench_import)
        t0 = time.perf_counter()
        one = bench_import.write_one("tensorboard", tmp / "tb-one", args.tb_steps, args.tb_tags)
        tb_runs = bench_import.replicate("tensorboard", one, tmp / "tb", args.tb_runs)
        print(f"# wrote {args.tb_runs} TensorBoard runs x {args.tb_steps} steps x {args.tb_tags} scalars "
              f"in {time.perf_counter() - t0:.0f}s")
        # what `armorlab report` of TensorBoard logs does first: every run read into its table
        figures["import_tensorboard"] = ([sys.executable, "-c", IMPORT_TENSORBOARD, *map(str, tb_runs)], None,
                                         None)
    if not any(fig.startswith("report") or fig in ("help", "dry_run_1000") for _, fig in pairs):
        _timed_rounds(args, chosen, pairs, figures, run)
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    t0 = time.perf_counter()
    timed_figures = {fig for _, fig in pairs}
    roles = {"cold": "report_cold", "warm": "report_warm", "changed": "report_one_run_moved"}
    # only the sweeps a timed figure reads are written (a path no figure reads is never made)
    large = {role: bench_analysis.write_sweep(tmp / f"large-{role}", args.runs, args.steps, 20)
             if any(f.startswith(fig) and not f.endswith("_small") for f in timed_figures) else tmp / "unused"
             for role, fig in roles.items()}
    small = {role: bench_analysis.write_sweep(tmp / f"small-{role}", 15, 120, 20, groups=5)
             if f"{fig}_small" in timed_figures else tmp / "unused" for role, fig in roles.items()}
    print(f"# wrote the sweeps ({args.runs} runs x {args.steps} steps, 15 runs x 120 steps; 20 metrics) "
          f"in {time.perf_counter() - t0:.0f}s")

    def recipe(sweep: Path, steps: int) -> Path:
        path = sweep.parent / "recipe.yaml"
        path.write_text(bench_analysis.RECIPE.format(sweep=sweep, q=steps // 4, h=steps // 2, last=steps - 1))
        return path

    def report_cmd(sweep: Path, steps: int) -> list[str]:
        return [*cli, "report", str(recipe(sweep, steps)), "--out", str(sweep.parent / "report")]

    def cold(sweep: Path):
        def prepare(library: str) -> None:
            shutil.rmtree(sweep / CACHE_DIR, ignore_errors=True)
            shutil.rmtree(sweep.parent / "report", ignore_errors=True)
        return prepare

    def warm_check(res: subprocess.CompletedProcess) -> None:
        if "unchanged" not in res.stdout:
            raise SystemExit(f"the warm report was rebuilt, not skipped:\n{res.stdout}")

    def changed(sweep: Path, steps: int):
        """Bring the report up to date with the same side's code (untimed), then one run moves."""
        def prepare(library: str) -> None:
            run(report_cmd(sweep, steps), library)
            metrics = sorted(sweep.glob("*/metrics.jsonl"))[0]
            last = json.loads(metrics.read_text().splitlines()[-1])
            with metrics.open("a") as fh:
                fh.write(json.dumps({**last, "step": last["step"] + 1}) + "\n")
        return prepare

    spec_path = tmp / "sweep1000.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": "bench", "base": {"objective": "dapo", "max_steps": 1},
        "grid": {"learning_rate": [round(1e-4 * (i + 1), 6) for i in range(10)],
                 "epsilon_high": [round(0.21 + 0.01 * i, 2) for i in range(10)]},
        "seeds": list(range(10))}))
    # figure → (command, prepare(library) before each timed run, check of its output)
    figures |= {
        "help": ([*cli, "--help"], None, None),
        "dry_run_1000": ([*cli, "sweep", str(spec_path), "--root", str(tmp / "dry"), "--dry-run"], None, None),
        "report_warm": (report_cmd(large["warm"], args.steps), None, warm_check),
        "report_cold_large": (report_cmd(large["cold"], args.steps), cold(large["cold"]), None),
        "report_cold_small": (report_cmd(small["cold"], 120), cold(small["cold"]), None),
        "report_one_run_moved_large": (report_cmd(large["changed"], args.steps),
                                       changed(large["changed"], args.steps), None),
        "report_one_run_moved_small": (report_cmd(small["changed"], 120), changed(small["changed"], 120), None),
    }
    if "report_warm" in timed_figures:
        run(report_cmd(large["warm"], args.steps), "")  # the report the warm runs find unchanged
    _timed_rounds(args, chosen, pairs, figures, run)
    if args.keep is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
