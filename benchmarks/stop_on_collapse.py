"""stop_on_collapse (armorlab.stats.stopping, S1) on simulated runs with known truth, and what it saves.

Every eval is Binomial(n, p_true)/n, fed one at a time to the trainer's own CollapseWatch, as a
run of ``--rollouts`` rollouts with an eval every ``--every`` rollouts (horizon = the evals the run
would have), patience = 3 evals, δ = 0.03, α = 0.04 (stop_on_collapse: true):

    flat      p_true constant, p ∈ {0.3, 0.5, 0.7}: any stop is a false stop
    collapse  p_true rises by 0.1 over the first 20 % of the run, holds, and from rollout c falls
              by ``--fall`` over 20 rollouts, then stays down: the delay is (stop rollout − c),
              a stop before c is early (counted, and a miss is a run that never stops)

at eval sizes n = 256 (64 prompts × 4 samples, the toy) and n = 8,000 (500 problems × 16
samples: the paper sweeps' val split, docs/papers.md). Savings: a sweep of ``--runs`` runs of
which ``--collapsing`` stop on a collapse at ``--collapse-at`` (each in turn), each run costing
``--gpu-hours`` for the whole horizon (docs/papers.md's estimate for 500 rollouts: 215 training
+ 2,300 generation ≈ 2,515 H100-hours); saved = collapsing × (1 − median stop rollout at
n = 8,000 / horizon) × cost. The defaults are armor_table1: 3 + 12 runs, its stage-1 DAPO seeds
stopping (the paper presets stop stage 1 only, docs/papers.md). armorlab's sources do not record
the rollout at which the papers' DAPO runs collapse: 150 of 500 is issue 39's example, 250 and
350 show how the saving scales; give yours with --collapse-at.

    .venv/bin/python benchmarks/stop_on_collapse.py [--reps 500]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from armorlab.stats.stopping import CollapseWatch

PS = (0.3, 0.5, 0.7)
SIZES = (256, 8000)


def simulate(true: np.ndarray, n: int, rollouts: np.ndarray, horizon: int, rng) -> float | None:
    """The rollout at which a run with these true accuracies stops; None when it never does."""
    watch = CollapseWatch(patience=3, horizon=horizon)
    for r, v in zip(rollouts, rng.binomial(n, true) / n, strict=True):
        if watch.observe(int(r), float(v), n) is not None:
            return float(r)
    return None


def collapse_curve(p: float, rollouts: np.ndarray, total: int, at: int, fall: float) -> np.ndarray:
    rise = np.clip(rollouts / (0.2 * total), 0, 1) * 0.1
    down = np.clip((rollouts - at) / 20, 0, 1) * fall
    return np.clip(p - 0.1 + rise - down, 0.0, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=500, help="runs per (p, n) cell and scenario")
    ap.add_argument("--rollouts", type=int, default=500, help="the horizon (the paper sweeps' 500)")
    ap.add_argument("--every", type=int, default=5, help="rollouts between evals (the paper sweeps' 5)")
    ap.add_argument("--fall", type=float, default=0.10, help="how far p_true falls in a collapse")
    ap.add_argument("--collapse-at", type=int, nargs="+", default=[150, 250, 350],
                    help="onsets c (rollouts); 150 of 500 is issue 39's example")
    ap.add_argument("--runs", type=int, default=15, help="runs in the sweep (armor_table1: 3 + 12)")
    ap.add_argument("--collapsing", type=int, default=3, help="of which stop on collapse (stage 1's 3 seeds)")
    ap.add_argument("--gpu-hours", type=float, default=2515.0, help="H100-hours of one run over the horizon")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rollouts = np.arange(0, args.rollouts + 1, args.every)
    horizon = rollouts.size
    t0 = time.perf_counter()
    false_stops = {n: [] for n in SIZES}
    for n in SIZES:
        for p in PS:
            false_stops[n] += [simulate(np.full(horizon, p), n, rollouts, horizon, rng) is not None
                               for _ in range(args.reps)]
        print(f"false_stop_rate_n{n}={np.mean(false_stops[n]):.4f} (runs={len(false_stops[n])})")
    stops: dict[tuple[int, int], list[float]] = {}
    for n in SIZES:
        for at in args.collapse_at:
            got = [simulate(collapse_curve(p, rollouts, args.rollouts, at, args.fall), n, rollouts, horizon, rng)
                   for p in PS for _ in range(args.reps)]
            found = np.array([g for g in got if g is not None])
            stops[(n, at)] = found.tolist()
            delay = found - at
            print(f"collapse_at={at} n={n}: detected={found.size / len(got):.3f} early={np.mean(delay < 0):.3f} "
                  f"delay_median={np.median(delay):.0f} delay_p90={np.quantile(delay, 0.9):.0f} rollouts")
    fpr = float(np.mean(false_stops[SIZES[-1]]))
    for at in args.collapse_at:
        found = np.array(stops[(SIZES[-1], at)])
        stop = float(np.median(found)) if found.size else float(args.rollouts)
        saved = args.collapsing * (1 - stop / args.rollouts) * args.gpu_hours
        print(f"sweep_saving collapse_at={at}: stop_median={stop:.0f} of {args.rollouts} rollouts, "
              f"saved={saved:,.0f} of {args.runs * args.gpu_hours:,.0f} H100-hours "
              f"({saved / (args.runs * args.gpu_hours):.1%}); false stops expected among the "
              f"{args.runs - args.collapsing} others: {fpr * (args.runs - args.collapsing):.2f}")
    print(f"seconds={time.perf_counter() - t0:.0f}")
    print(f"false_stop_rate={max(np.mean(v) for v in false_stops.values()):.4f}")


if __name__ == "__main__":
    main()
