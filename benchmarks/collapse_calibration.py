"""Calibration of collapse_step and divergence_step against simulated binomial eval noise.

Known truth, many runs: every eval is Binomial(n, p_true)/n, the mean of n scored completions.

    flat   p_true constant (p ∈ {0.3, 0.5, 0.7}): any collapse reported is a false alarm (fpr)
    fall   p_true rises by 4 SE over the first 30 % of evals, stays at p, then falls by 4 SE
           (SE = sqrt(p(1 − p)/n)) over max(2, 15 % of the evals) from the middle of the run and
           stays down: a hit (tpr) is a collapse reported with its step inside the fall
           (after the last plateau eval, at or before the first eval at the bottom)

over eval sizes n ∈ {64, 128, 256, 512, 1024} (val/n = prompts × samples) and 10, 20, 30, 40
evals (every 10 steps). divergence_step gets a train reward rising from 0.2 to 0.8 (32 rows per
step) in both. Each rule runs in two noise modes: ``binomial`` (val/n logged, (N1)) and ``curve``
(noise estimated from the curve, (N2)). The legacy rule ("δ = 0.05 below the running maximum for
3 evals", and "train slope > 0 while val slope < 0 over 5 evals") is measured on the same curves.

Targets (issue 10): fpr ≤ 0.05 and tpr ≥ 0.90 for collapse_step and divergence_step with val/n
logged. The last two lines are the binomial-mode collapse_step figures:

    .venv/bin/python benchmarks/collapse_calibration.py [--reps 100]
"""

from __future__ import annotations

import argparse

import numpy as np

from armorlab.stats import collapse as C

PS = (0.3, 0.5, 0.7)
SIZES = (64, 128, 256, 512, 1024)
N_EVALS = (10, 20, 30, 40)
EVERY = 10
TRAIN_ROWS = 32


def legacy_collapse(steps, v, delta=0.05, m=3):
    """The rule before issue 10: m consecutive evals ≥ δ below the running maximum."""
    below = v <= np.maximum.accumulate(v) - delta
    hits = np.flatnonzero(np.convolve(below.astype(int), np.ones(m, dtype=int), mode="valid") == m)
    return int(steps[hits[0]]) if hits.size else None


def legacy_divergence(steps, v, ts, tv, w=5):
    """The rule before issue 10: train slope > 0 while val slope < 0 over the last w evals."""
    for end in range(w, v.size + 1):
        lo, hi = steps[end - w], steps[end - 1]
        inside = (ts >= lo) & (ts <= hi)
        if np.polyfit(steps[end - w:end], v[end - w:end], 1)[0] < 0 and np.polyfit(
                ts[inside], tv[inside], 1)[0] > 0:
            return int(steps[end - 1])
    return None


def fall_curve(p: float, n: int, k: int) -> tuple[np.ndarray, int, int]:
    """True accuracy per eval for the fall scenario, with the fall's first and last eval."""
    d = 4 * np.sqrt(p * (1 - p) / n)
    rise, f0 = int(round(0.3 * k)), int(round(0.5 * k)) - 1
    f1 = f0 + max(2, int(round(0.15 * k)))
    true = np.full(k, p)
    true[:rise] = np.linspace(p - d, p, rise + 1)[:-1]
    true[f0:f1 + 1] = np.linspace(p, p - d, f1 - f0 + 1)
    true[f1:] = p - d
    return true, f0, f1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=100, help="runs per (p, n, evals) cell and scenario")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rules = {
        "collapse_binomial": lambda s, v, n, ts, tv: C.collapse_step(s, v, n=n),
        "collapse_curve": lambda s, v, n, ts, tv: C.collapse_step(s, v),
        "divergence_binomial": lambda s, v, n, ts, tv: C.divergence_step(s, v, ts, tv, n=n),
        "divergence_curve": lambda s, v, n, ts, tv: C.divergence_step(s, v, ts, tv),
        "legacy_collapse": lambda s, v, n, ts, tv: legacy_collapse(s, v),
        "legacy_divergence": lambda s, v, n, ts, tv: legacy_divergence(s, v, ts, tv),
    }
    fp = {r: [] for r in rules}
    tp = {r: [] for r in rules}
    worst_cell = {r: (1.0, None) for r in rules}
    for p in PS:
        for n in SIZES:
            for k in N_EVALS:
                steps = np.arange(k) * EVERY
                ts = np.arange(steps[-1] + 1)
                true, f0, f1 = fall_curve(p, n, k)
                cell = {r: [] for r in rules}
                for _ in range(args.reps):
                    tv = rng.binomial(TRAIN_ROWS, np.linspace(0.2, 0.8, ts.size)) / TRAIN_ROWS
                    flat = rng.binomial(n, p, k) / n
                    fall = rng.binomial(n, true) / n
                    for r, rule in rules.items():
                        fp[r].append(rule(steps, flat, n, ts, tv) is not None)
                        got = rule(steps, fall, n, ts, tv)
                        hit = got is not None and steps[f0] < got <= steps[f1]
                        tp[r].append(hit)
                        cell[r].append(hit)
                for r in rules:
                    if np.mean(cell[r]) < worst_cell[r][0]:
                        worst_cell[r] = (float(np.mean(cell[r])), f"p={p} n={n} evals={k}")
    runs = len(PS) * len(SIZES) * len(N_EVALS) * args.reps
    print(f"runs_per_scenario={runs}")
    for r in rules:
        print(f"{r}: fpr={np.mean(fp[r]):.4f} tpr={np.mean(tp[r]):.4f} "
              f"worst_cell_tpr={worst_cell[r][0]:.3f} ({worst_cell[r][1]})")
    print(f"fpr_ratio_legacy_over_new={np.mean(fp['legacy_collapse']) / max(np.mean(fp['collapse_binomial']), 1e-9):.1f}")
    print(f"fpr={np.mean(fp['collapse_binomial']):.4f}")
    print(f"tpr={np.mean(tp['collapse_binomial']):.4f}")


if __name__ == "__main__":
    main()
