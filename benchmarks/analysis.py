"""Analysis speed as ratios against peers measured side by side in the same run (absolute seconds
do not carry between machines):

    .venv/bin/python benchmarks/analysis.py [--runs 200] [--steps 2000] [--metrics 20]
        [--tokens 10000000] [--repeats 15] [--report-repeats 7] [--keep DIR]

(a) writes ``runs`` run dirs (20 groups: ARMOR α × τ, seeds for the rest) of ``steps`` metric lines
    with ``metrics`` metrics each, then times the command ``armorlab report RECIPE`` (a fresh
    process: start-up and imports included) cold (no metrics cache, no earlier report) and warm
    (nothing changed since the last report), and its peers the same way: a fresh process doing a
    pyarrow ``read_json`` of every metrics.jsonl plus one parquet write (the bound for parsing the
    files at all), and `armorlab --help`, alternating, ``report-repeats`` rounds. Targets:
    ``report_cold_vs_peer`` ≤ 1.5, the median over the rounds of each round's cold/peer ratio
    (the two ran seconds apart, so the machine's slow and fast spells cancel in each pair; the
    best cold over the best peer compares the two commands' luckiest moments, which rarely
    coincide, and is printed as ``report_cold_vs_peer_best_of_rounds``);
    ``report_warm_vs_cold`` ≤ 0.1 and ``report_warm_vs_help`` ≤ 3 (best over best).
(b) times ``capacity_stats.token_kernel`` (reverse KL k1/k2/k3, forward KL by importance
    weighting, ARMOR capacity statistics, capacity-limited share) over ``tokens`` float32 tokens
    against a plain numpy copy of the same four input arrays — the memory-bandwidth bound — in
    alternating order, ``repeats`` times; ``kernel_ratio`` (target ≤ 2) is the median over
    repeats of each repeat's kernel/copy (best over best is printed too).
Output: ``name=value`` lines (``#`` lines are comments), the ratios last, ``report_cold_vs_peer``
the very last.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from armorlab.analysis.capacity_stats import token_kernel
from armorlab.analysis.load import CACHE_DIR
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
TAUS = (0, 25, 50, 100)
EVAL_METRICS = ("val/acc", "val/pass@4", "val/length", "test/acc")
STEP_METRICS = ("train/reward", "train/length", "train/entropy", "train/truncation", "obj/clip_frac_low",
                "obj/clip_frac_high", "obj/ratio_mean", "obj/approx_kl", "anchor/rate", "anchor/gate_drop",
                "kl/reverse_k1", "kl/reverse_k3", "kl/forward_k1", "kl/forward_k3", "cap/pos_mean",
                "cap/pos_bound_frac", "cap/neg_mean", "ref/resets")


def write_sweep(root: Path, runs: int, steps: int, metrics: int, seed: int = 0, groups: int = 20) -> Path:
    """Synthetic ARMOR α×τ sweep of ``groups`` groups (≤ 20) with ``runs // groups`` seeds each; every
    metric logged at every step (the worst case for parsing)."""
    names = [*EVAL_METRICS, *STEP_METRICS][:metrics]
    sweep = root / "bench"
    rng = np.random.default_rng(seed)
    template = "{" + '"step":%d,' + ",".join(f'"{n}":%.6g' for n in names) + "}\n"
    t = np.arange(steps, dtype=np.float64)
    for i in range(runs):
        group, run_seed = i % groups, i // groups
        alpha, tau = ALPHAS[group % len(ALPHAS)], TAUS[group // len(ALPHAS)]
        cfg = resolve({"objective": "armor", "alpha": alpha, "ref_reset_steps": tau, "seed": run_seed,
                       "max_steps": steps})
        rd = RunDir.create(sweep, cfg)
        peak_at = steps * (0.3 + 0.5 * alpha)
        base = 0.6 * (1 - np.exp(-t / (steps / 8))) - 0.4 * np.clip((t - peak_at) / steps, 0, None)
        cols = [base + rng.normal(0, 0.02, steps) for _ in names]
        table = np.column_stack([t, *cols])
        rd.metrics_path.write_text("".join(template % tuple(row) for row in table))
        rd.write_status("completed")
    return sweep


RECIPE = """title: bench
runs: [{sweep}]
group_by: [alpha, ref_reset_steps]
curves: [val/acc, train/reward, kl/reverse_k3, kl/forward_k3, cap/pos_mean, train/entropy]
select: {{metric: val/acc, mode: max, report: test/acc}}
matched_steps: [{q}, {h}, {last}]
"""


PEER = """import glob, sys
import pyarrow as pa, pyarrow.json as pj, pyarrow.parquet as pq
files = sorted(glob.glob(sys.argv[1]))
pq.write_table(pa.concat_tables([pj.read_json(f) for f in files], promote_options="default"), sys.argv[2])
"""


def bench_report(runs: int, steps: int, metrics: int, repeats: int,
                 keep: Path | None) -> tuple[dict[str, float], float]:
    """Times the real command, ``armorlab report RECIPE`` in a fresh interpreter (imports and
    start-up included): cold (no metrics cache, no earlier report) and warm (nothing changed
    since the last report), against its peers run the same way in alternating order: a pyarrow
    read_json of every metrics.jsonl plus one parquet write of them (the bound for parsing the
    files at all) and `armorlab --help`, ``repeats`` rounds. Returns the best time of each (the
    least disturbed run on a shared machine) and the median over rounds of the round's cold/peer
    ratio (the headline)."""
    tmp = Path(tempfile.mkdtemp(prefix="armorlab-bench-")) if keep is None else keep
    try:
        t0 = time.perf_counter()
        sweep = write_sweep(tmp, runs, steps, metrics)
        size = sum(p.stat().st_size for p in sweep.glob("*/metrics.jsonl"))
        print(f"# wrote {runs} runs x {steps} steps x {metrics} metrics ({size / 1e6:.0f} MB of metrics.jsonl) "
              f"in {time.perf_counter() - t0:.1f}s")
        recipe = tmp / "bench.yaml"
        recipe.write_text(RECIPE.format(sweep=sweep, q=steps // 4, h=steps // 2, last=steps - 1))
        out = tmp / "report"
        report = [sys.executable, "-m", "armorlab.cli", "report", str(recipe), "--out", str(out)]
        wall: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}

        def timed(label: str, cmd: list[str]) -> subprocess.CompletedProcess:
            # wall time, and the child's CPU time (user + sys): on a shared machine the CPU time
            # says what the work costs, the wall time what a user waits
            r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True)
            wall.setdefault(label, []).append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.setdefault(label, []).append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
            if res.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr}")
            return res

        def cold() -> None:
            shutil.rmtree(sweep / CACHE_DIR, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
            timed("report_cold", report)

        def warm() -> None:
            res = timed("report_warm", report)
            if "unchanged" not in res.stdout:  # an armorlab without the freshness stamp (before/after runs)
                print("# the warm report was rebuilt, not skipped")

        steps_ = {
            "report_cold": cold,
            "report_warm": warm,  # right after a cold one: nothing changed since
            "peer_read_json_parquet": lambda: timed("peer_read_json_parquet", [
                sys.executable, "-c", PEER, str(sweep / "*" / "metrics.jsonl"), str(tmp / "peer.parquet")]),
            "help": lambda: timed("help", [sys.executable, "-m", "armorlab.cli", "--help"]),
        }
        names = list(steps_)
        for i in range(repeats):
            for name in names[i % 2 * 2:] + names[:i % 2 * 2]:  # alternate: peers first every other round
                steps_[name]()
        best = {k: min(v) for k, v in wall.items()}
        for k in names:
            print(f"{k}_s={best[k]:.3f}")
            print(f"{k}_cpu_s={min(cpu[k]):.3f}")
        # the cold/peer ratio per round (the two ran within seconds of each other): the
        # machine's slow and fast spells cancel in each pair; their median is the headline
        paired = sorted(c / p for c, p in zip(wall["report_cold"], wall["peer_read_json_parquet"], strict=True))
        print(f"# report_cold_vs_peer per round: {', '.join(f'{r:.2f}' for r in paired)}")
        print(f"report_cold_mvalues_per_s={runs * steps * metrics / best['report_cold'] / 1e6:.2f}")
        print(f"# load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; best of {repeats}")
        return best, float(np.median(paired))
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def bench_kernel(n: int, repeats: int) -> float:
    rng = np.random.default_rng(0)
    old = np.log(rng.uniform(0.01, 1.0, n)).astype(np.float32)
    logp = (old + rng.normal(0, 0.05, n)).astype(np.float32)
    ref = (old + rng.normal(0, 0.1, n)).astype(np.float32)
    adv = rng.normal(0, 1, n).astype(np.float32)
    arrays = (logp, old, ref, adv)

    def kernel() -> None:
        token_kernel(logp, old, ref, adv, objective="armor", alpha=0.8)

    def copy() -> None:
        for a in arrays:
            a.copy()

    wall: dict[str, list[float]] = {"kernel": [], "copy": []}
    cpu: dict[str, list[float]] = {"kernel": [], "copy": []}
    for _ in range(repeats):  # alternate, a tenth of a second apart: machine noise hits both alike
        for name, fn in (("kernel", kernel), ("copy", copy)):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    best = {name: min(times) for name, times in wall.items()}
    print(f"kernel_tokens={n}")
    print(f"kernel_ms={best['kernel'] * 1e3:.1f}")
    print(f"kernel_mtokens_per_s={n / best['kernel'] / 1e6:.0f}")
    print(f"copy_ms={best['copy'] * 1e3:.1f}")
    print(f"kernel_ratio_best_of_repeats={best['kernel'] / best['copy']:.2f}")
    print(f"kernel_cpu_ratio={np.median(np.divide(cpu['kernel'], cpu['copy'])):.2f}")
    return float(np.median(np.divide(wall["kernel"], wall["copy"])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--metrics", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=10_000_000)
    # 15: best of 9 over best of 9 read 1.41-1.90 over runs of the same kernel
    ap.add_argument("--repeats", type=int, default=15, help="kernel timing repeats")
    # 7: on a shared 2-core machine the peer alone took 2.1-2.8 s within minutes; the median of
    # 5 rounds' ratios of unchanged code still spread 1.22-1.46 over six runs
    ap.add_argument("--report-repeats", type=int, default=7, help="report/peer timing rounds")
    ap.add_argument("--keep", type=Path, default=None, help="write the sweep and reports here and keep them")
    args = ap.parse_args()
    if not 4 <= args.metrics <= len(EVAL_METRICS) + len(STEP_METRICS):
        ap.error(f"--metrics must be in 4..{len(EVAL_METRICS) + len(STEP_METRICS)}")
    kernel_ratio = bench_kernel(args.tokens, args.repeats)
    best, cold_vs_peer = bench_report(args.runs, args.steps, args.metrics, args.report_repeats, args.keep)
    print(f"kernel_ratio={kernel_ratio:.2f}")
    print(f"report_warm_vs_help={best['report_warm'] / best['help']:.2f}")
    print(f"report_warm_vs_cold={best['report_warm'] / best['report_cold']:.3f}")
    print(f"report_cold_vs_peer_best_of_rounds={best['report_cold'] / best['peer_read_json_parquet']:.2f}")
    print(f"report_cold_vs_peer={cold_vs_peer:.2f}")

if __name__ == "__main__":
    main()
