"""Code that replaces a library's job, each timed against the library in the same run (issue 24 §5).

    .venv/bin/python benchmarks/library_replacements.py [--rounds 5] [--runs 200] [--steps 2000]
        [--only png,tdist] [--keep DIR]

Six pieces of armorlab do what a library would do, for speed:

    coercion       armorlab/commands/coercion.py   typer's own (pydantic) coercion of plain CLI values
    png            armorlab/analysis/png.py        matplotlib's PNG writer (Pillow), as savefig uses it
    tdist          armorlab/analysis/tdist.py      scipy.special (stdtrit, ndtri)
    process_exit   armorlab/core/process_exit.py   the interpreter's normal teardown (sys.exit)
    figure_worker  armorlab/analysis/figure_worker.py  figures drawn in the report's own process
    memo           armorlab/analysis/memo.py       no memo: every statistic and figure computed again

Each is timed on the figures a user waits for that it can change: `armorlab --help`,
`sweep --dry-run` of a 1,000-run grid, a warm report (nothing changed), a cold report (no cache, no
earlier report) of a large sweep (``--runs`` × ``--steps`` × 20 metrics, as benchmarks/analysis.py)
and of a small one (15 runs × 120 steps, the demo's size), and a report after one run of the sweep
moved (one metrics line appended). Every command runs in a fresh process, once with armorlab as it
is ("after") and once with the one replacement swapped for the library ("before"), back to back in
alternating order, ``--rounds`` rounds. The swap is made by a ``sitecustomize`` module this script
writes, which every process of the command loads (the figure worker's too) and which patches the
replaced function right after its module is imported; the "after" processes load the same
sitecustomize and patch nothing.

Output: ``name=value`` lines (``#`` lines are comments). Per replacement and figure: the median wall
time of each side, ``ratio`` = the median over rounds of that round's after/before wall time (the two
ran seconds apart, so the machine's slow and fast spells cancel in the pair), the same by CPU time
(``cpu_ratio``: user + sys of the command and its children) and ``gain`` = 1 − ratio. Last, per
replacement, its largest gain over its figures and the verdict: ``keep`` where that gain is ≥ 20 %
(the bar of issue 24), else ``drop``. A replacement already dropped (its module gone: armorlab uses
the library) is named and skipped; run this file from a checkout that still has it to time it.
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


# name → (module patched, patch, attribute it swaps, the module that replaced the library)
LIBRARY = {
    "coercion": ("armorlab.commands.coercion", _coercion_by_typer, "install", "armorlab.commands.coercion"),
    "png": ("armorlab.analysis.plots", _png_by_matplotlib, "encode_rgba", "armorlab.analysis.png"),
    "tdist": ("armorlab.analysis.tdist", _tdist_by_scipy, "t_quantiles", "armorlab.analysis.tdist"),
    "process_exit": ("armorlab.core.process_exit", _teardown_kept, "skip_teardown", "armorlab.core.process_exit"),
    "figure_worker": ("armorlab.analysis.figure_worker", _figures_in_process, "wanted",
                      "armorlab.analysis.figure_worker"),
    "memo": ("armorlab.analysis.memo", _no_memo, "using", "armorlab.analysis.memo"),
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


SITECUSTOMIZE = """import os, sys
sys.path.insert(0, {bench!r})
import library_replacements
del sys.path[0]
library_replacements.use_library(os.environ.get({var!r}, ""))
"""


# --------------------------------------------------------------------------- the benchmark
def main() -> None:
    import argparse
    import compileall
    import importlib.util
    import json
    import resource
    import shutil
    import statistics
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
    ap.add_argument("--only", default="", help="comma-separated replacements (default: all six)")
    ap.add_argument("--keep", type=Path, default=None, help="write the sweeps and reports here and keep them")
    args = ap.parse_args()
    chosen = [n for n in args.only.split(",") if n] or list(LIBRARY)
    unknown = set(chosen) - set(LIBRARY)
    if unknown:
        ap.error(f"unknown replacement(s) {sorted(unknown)}; known: {', '.join(LIBRARY)}")

    spec = importlib.util.spec_from_file_location("bench_analysis", Path(BENCH_DIR) / "analysis.py")
    bench_analysis = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_analysis)
    from armorlab.analysis.load import CACHE_DIR

    # installed copies are byte-compiled; without this every timed process would compile armorlab
    compileall.compile_dir(root / "armorlab", quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="armorlab-libbench-")) if args.keep is None else args.keep
    tmp.mkdir(parents=True, exist_ok=True)
    hook = tmp / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE.format(bench=BENCH_DIR, var=ENV_VAR))
    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join([str(hook), str(root), *filter(None, [os.environ.get("PYTHONPATH")])])

    def env_for(library: str) -> dict[str, str]:
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
    dropped = [n for n in chosen if importlib.util.find_spec(LIBRARY[n][3]) is None]
    for name in dropped:
        print(f"# {name}: {LIBRARY[name][3]} is gone (dropped: armorlab uses the library); not timed")
    chosen = [n for n in chosen if n not in dropped]
    if not chosen:
        return
    # every swap must really be in place (a renamed function would silently time the same code twice)
    for name in chosen:
        module, _, attr, _ = LIBRARY[name]
        probe = (f"import {module} as m; print(bool(getattr(getattr(m, {attr!r}), "
                 "'armorlab_bench_library', False)))")
        for library, expected in ((name, "True"), ("", "False")):
            _, _, res = run([sys.executable, "-c", probe], library)
            if res.stdout.strip() != expected:
                raise SystemExit(f"the swap of {name} did not take effect ({library!r}: {res.stdout!r})")

    cli = [sys.executable, "-m", "armorlab.cli"]
    t0 = time.perf_counter()
    large = {role: bench_analysis.write_sweep(tmp / f"large-{role}", args.runs, args.steps, 20)
             for role in ("cold", "warm", "changed")}
    small = {role: bench_analysis.write_sweep(tmp / f"small-{role}", 15, 120, 20, groups=5)
             for role in ("cold", "warm", "changed")}
    print(f"# wrote 3 sweeps of {args.runs} runs x {args.steps} steps and 3 of 15 runs x 120 steps "
          f"(20 metrics) in {time.perf_counter() - t0:.0f}s")

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
    figures = {
        "help": ([*cli, "--help"], None, None),
        "dry_run_1000": ([*cli, "sweep", str(spec_path), "--root", str(tmp / "dry"), "--dry-run"], None, None),
        "report_warm": (report_cmd(large["warm"], args.steps), None, warm_check),
        "report_cold_large": (report_cmd(large["cold"], args.steps), cold(large["cold"]), None),
        "report_cold_small": (report_cmd(small["cold"], 120), cold(small["cold"]), None),
        "report_one_run_moved_large": (report_cmd(large["changed"], args.steps),
                                       changed(large["changed"], args.steps), None),
        "report_one_run_moved_small": (report_cmd(small["changed"], 120), changed(small["changed"], 120), None),
    }
    run(report_cmd(large["warm"], args.steps), "")  # the report the warm runs find unchanged
    affects = {
        "coercion": ["help", "dry_run_1000", "report_warm"],
        "png": ["report_cold_large", "report_cold_small"],
        "tdist": ["report_cold_large", "report_cold_small"],
        "process_exit": ["report_warm", "report_cold_large", "report_cold_small"],
        # under 8 MB of metrics the report draws in-process anyway (figure_worker.wanted)
        "figure_worker": ["report_cold_large"],
        "memo": ["report_one_run_moved_large", "report_one_run_moved_small", "report_cold_large"],
    }
    pairs = [(name, fig) for name in chosen for fig in affects[name]]
    times: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    print(f"# load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.rounds} rounds")
    for r in range(args.rounds):
        for name, fig in pairs:
            command, prepare, check = figures[fig]
            sides = ("after", "before") if r % 2 == 0 else ("before", "after")
            for side in sides:
                library = name if side == "before" else ""
                if prepare is not None:
                    prepare(library)
                wall, cpu, res = run(command, library)
                if check is not None:
                    check(res)
                times.setdefault((name, fig, side), []).append((wall, cpu))
        print(f"# round {r + 1} done, load average {os.getloadavg()[0]:.1f}", flush=True)

    gains: dict[str, list[tuple[float, str]]] = {}
    for name, fig in pairs:
        after, before = times[(name, fig, "after")], times[(name, fig, "before")]
        ratio = statistics.median(a[0] / b[0] for a, b in zip(after, before, strict=True))
        cpu_ratio = statistics.median(a[1] / b[1] for a, b in zip(after, before, strict=True))
        print(f"{name}.{fig}.before_s={statistics.median(b[0] for b in before):.3f}")
        print(f"{name}.{fig}.after_s={statistics.median(a[0] for a in after):.3f}")
        print(f"# {name}.{fig} after/before per round: "
              + ", ".join(f"{a[0] / b[0]:.3f}" for a, b in zip(after, before, strict=True)))
        print(f"{name}.{fig}.cpu_ratio={cpu_ratio:.3f}")
        print(f"{name}.{fig}.ratio={ratio:.3f}")
        gains.setdefault(name, []).append((1.0 - ratio, fig))
    print(f"# load average at end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name in chosen:
        gain, fig = max(gains[name])
        print(f"{name}.max_gain={gain:.3f}  # {fig}")
        print(f"{name}.verdict={'keep' if gain >= KEEP_BAR else 'drop'}")
    if args.keep is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
