"""Seeds until resolved, with known truth: does the sequential rule of armorlab.stats.sequential
keep its error rate at α however many looks it takes, what does it buy over a fixed design, how
often does it call a true difference of δ "equivalent", and how often does a baseline that truly
collapses get the verdict "cannot show prevention" (armorlab.stats.margins F1)?

Seed outcomes (one endpoint value per seed, arm and baseline) are drawn from distributions with a
known difference of means: normal; skewed (gamma with shape 2, standardised); heavy-tailed
(Student t with 3 degrees of freedom, standardised); and the demo's own per-seed spread (the
residuals of the 15 demo runs' final val/acc around their group's mean, resampled; DEMO_* below
says where they come from). The first three are scaled to the demo's seed-to-seed sd σ. The
margin δ is declared, as a user declares compare.delta: --delta-over-sigma 1.5 of the demo's σ
(a fixed design with 10 seeds per arm then has ≈ 0.88 power); normal seeds at δ/σ = 2 and 1
show an easier and a harder comparison.

Looks: 3 seeds per arm, then 2 more per look, up to --max-seeds 10 (3, 5, 7, 9, 10), one arm
against its baseline (m = 1), α = 0.05 two-sided. Rules, on the same draws:
    sequential  decide_look's rule (Lan–DeMets O'Brien–Fleming-type spending on the Welch t,
                repeated confidence intervals; stops at better/worse or equivalent within ±δ)
    naive       "add seeds until p < 0.05": Welch p < 0.05 at any of the same looks
    fixed n     one Welch test with n seeds per arm (the peer: what a user would run instead)
Printed per distribution and scale: the false better/worse rate under the null (target ≤ 0.05;
± one Monte Carlo standard error) beside the naive rule's; power at δ beside the fixed design's
with 10 seeds (target ≥ 0.80 where the fixed design has it); expected seeds per arm at δ against
the fixed design of the same power (the fewest seeds whose fixed-design power is at least the
sequential rule's; target ≤ 0.8×); the rate of "equivalent" when the truth is 0 and when it is
δ (target ≤ 0.05 at δ). Then the familywise rate of four arms against one baseline under the global null (Holm over
arms, decide_look itself), and a check that the vectorised simulation below decides exactly as
decide_look does.

Prevention: baseline val curves of K = 24 evals with binomial noise at the demo's val/n = 400 rise
0.60 → 0.70 over the first 9 evals, then either stay at 0.70 (no fall) or fall linearly by D
(0.05, 0.10, 0.15) by the last eval; each seed's curve goes through the report's collapse test
(armorlab.stats.collapse, defaults δ = 0.03, α = 0.04) and the seeds through (F1). Printed per D
and seeds per arm: the rate of "cannot show prevention" (target ≤ 0.05 for a true collapse), and
on the flat curve the rate of "fell" (a false claim that there was something to prevent).
The last lines: the worst null false better/worse rate over every scenario, the worst rate of
"equivalent" at a true difference of δ, the worst rate of "cannot show prevention" at D ≥ 0.10:

    .venv/bin/python benchmarks/sequential_seeds.py [--reps 20000] [--prevention-reps 4000]
        [--demo-runs reports/demo/tables/runs.csv]
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np
from scipy import special

from armorlab.stats import collapse, margins
from armorlab.stats import sequential as S
from armorlab.stats import verdicts as V

# The demo's measured spread: final val/acc (level of the last 3 evals) of the 15 runs of
# `armorlab demo` (armorlab/demo.yaml: 5 objectives × seeds 0–2, 120 steps, 400 greedy val
# prompts; run on this branch, 2026-12-01), as its reports/demo/tables/runs.csv gives them.
# --demo-runs reads another runs.csv instead.
DEMO_FINALS = {
    "dapo": [0.679167, 0.693333, 0.696667],
    "dapo + KL β=0.1": [0.645833, 0.699167, 0.715833],
    "up": [0.671667, 0.603333, 0.705833],
    "armor": [0.626667, 0.6725, 0.646667],
    "gate only (dapo)": [0.611667, 0.630833, 0.644167],
}
DEMO_VAL_N = 400


def demo_spread(finals: dict[str, list[float]]):
    """(residuals, σ): each run's final minus its group's mean, scaled by √(n/(n − 1)) so their
    mean square is the pooled variance; σ their root mean square."""
    res = []
    for vals in finals.values():
        x = np.asarray(vals, dtype=np.float64)
        if x.size > 1:
            res.extend((x - x.mean()) * math.sqrt(x.size / (x.size - 1)))
    res = np.asarray(res)
    return res, float(np.sqrt(np.mean(res ** 2)))


def read_finals(path: Path) -> dict[str, list[float]]:
    """group → finals from a report's tables/runs.csv."""
    out: dict[str, list[float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("final") not in (None, "", "nan"):
                out.setdefault(row["group"], []).append(float(row["final"]))
    return out


def draw(rng: np.random.Generator, dist: str, size, sigma: float, residuals: np.ndarray | None = None):
    """Seed outcomes with mean 0 and sd σ (the demo's residuals: their own scale)."""
    if dist == "normal":
        return sigma * rng.standard_normal(size)
    if dist == "gamma(2)":
        return sigma * (rng.gamma(2.0, 1.0, size) - 2.0) / math.sqrt(2.0)
    if dist == "t(3)":
        return sigma * rng.standard_t(3, size) / math.sqrt(3.0)
    if dist == "demo":
        return rng.choice(residuals, size=size, replace=True)
    raise ValueError(dist)


def welch_rows(x: np.ndarray, y: np.ndarray):
    """verdicts (W1)/(W2) for every row of x against the same row of y."""
    nx, ny = x.shape[1], y.shape[1]
    d = x.mean(1) - y.mean(1)
    ax, ay = x.var(1, ddof=1) / nx, y.var(1, ddof=1) / ny
    se = np.sqrt(ax + ay)
    den = ax * ax / (nx - 1) + ay * ay / (ny - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(den > 0, (ax + ay) ** 2 / den, nx + ny - 2.0)
    return d, se, df


def simulate(x: np.ndarray, y: np.ndarray, schedule: list[int], delta: float, *, alpha: float = 0.05,
             spending: str = "obf") -> dict[str, np.ndarray]:
    """The sequential rule of decide_look for one arm (m = 1), vectorised over rows: at each look
    the Welch t against the boundary (G4/G5) of the looks so far, the repeated interval (G6)
    inside ±δ for equivalence; the last look at t = 1. Also the naive rule at the same looks.
    Returns per row: verdict code (1 better, −1 worse, 2 equivalent, 0 not resolved), seeds
    used per arm, naive rejection."""
    rows, n_max = x.shape[0], schedule[-1]
    verdict = np.zeros(rows, dtype=np.int8)
    used = np.full(rows, n_max)
    naive = np.zeros(rows, dtype=bool)
    going = np.ones(rows, dtype=bool)
    fractions = []
    for n in schedule:
        fractions.append(1.0 if n >= n_max else S.information_fraction(n, n, n_max))
        a = S.nominal_level(S.spending_boundaries(fractions, alpha, spending)[-1])
        d, se, df = welch_rows(x[:, :n], y[:, :n])
        flat = se == 0  # every seed alike (resampled residuals): the difference is exact
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(flat, (d == 0).astype(float), 2 * special.stdtr(df, -np.abs(d) / se))
            bound = special.stdtrit(df, 1 - a / 2)
            half = np.where(flat, 0.0, bound * se)
            reject = going & np.where(flat, d != 0, np.abs(d) / se >= bound)
        naive |= p < alpha
        equivalent = going & ~reject & (-delta < d - half) & (d + half < delta)
        verdict[reject] = np.where(d[reject] > 0, 1, -1)
        verdict[equivalent] = 2
        used[reject | equivalent] = n
        going &= ~(reject | equivalent)
    return {"verdict": verdict, "used": used, "naive": naive}


def fixed_power(x: np.ndarray, y: np.ndarray, n: int, alpha: float = 0.05) -> float:
    """Share of rows in which one Welch test on the first n seeds rejects."""
    d, se, df = welch_rows(x[:, :n], y[:, :n])
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(se == 0, (d == 0).astype(float), 2 * special.stdtr(df, -np.abs(d) / se))
    return float(np.mean(p < alpha))


def mc(p: float, reps: int) -> str:
    return f"{p:.4f} ± {math.sqrt(max(p * (1 - p), 1e-12) / reps):.4f}"


def scenario(dist: str, sigma: float, delta: float, reps: int, schedule: list[int], seed: int,
             residuals: np.ndarray | None) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    n_fixed_max = 3 * schedule[-1]
    out = {}
    for name, effect in (("null", 0.0), ("delta", delta)):
        x = draw(rng, dist, (reps, n_fixed_max), sigma, residuals) + effect
        y = draw(rng, dist, (reps, n_fixed_max), sigma, residuals)
        sim = simulate(x, y, schedule, delta)
        out[f"{name}_decided"] = float(np.mean(np.abs(sim["verdict"]) == 1))
        out[f"{name}_equivalent"] = float(np.mean(sim["verdict"] == 2))
        out[f"{name}_naive"] = float(np.mean(sim["naive"]))
        out[f"{name}_seeds"] = float(np.mean(sim["used"]))
        if name == "delta":
            out["wrong_sign"] = float(np.mean(sim["verdict"] == -1))
            out["fixed_power_max"] = fixed_power(x, y, schedule[-1])
            power = out["delta_decided"]
            n_same = next((n for n in range(2, n_fixed_max + 1) if fixed_power(x, y, n) >= power), math.nan)
            out["fixed_n_same_power"] = n_same
            out["fixed_power_same"] = fixed_power(x, y, n_same) if math.isfinite(n_same) else math.nan
    return out


def familywise(arms: int, sigma: float, delta: float, reps: int, design_kw: dict, seed: int) -> float:
    """Share of runs in which decide_look calls any of ``arms`` arms better or worse than the
    baseline when all are equal (normal seeds), looks as scheduled, resolved arms stopping."""
    rng = np.random.default_rng(seed)
    names = [f"arm{i}" for i in range(arms)]
    design = S.Design(baseline="base", arms=tuple(names), delta=delta, **design_kw)
    n_max = design.max_seeds
    wrong = 0
    for _ in range(reps):
        data = {a: sigma * rng.standard_normal(n_max) for a in ["base", *names]}
        have = {a: design.first_look for a in data}
        looks: list[dict] = []
        while True:
            look = S.decide_look(design, {a: data[a][:have[a]] for a in data}, looks)
            looks.append(look)
            if look["done"]:
                break
            have.update(look["next"])
        verdicts = {c["arm"]: c["verdict"] for c in looks[-1]["comparisons"]}
        wrong += any(v in (V.BETTER, V.WORSE) for v in verdicts.values())
    return wrong / reps


def agreement(sigma: float, delta: float, reps: int, schedule: list[int], design_kw: dict, seed: int) -> int:
    """Rows on which simulate() and decide_look differ (verdict or seeds used); 0 expected."""
    rng = np.random.default_rng(seed)
    x = draw(rng, "normal", (reps, schedule[-1]), sigma) + delta * rng.choice([0.0, 0.5, 1.0, 1.5], (reps, 1))
    y = draw(rng, "normal", (reps, schedule[-1]), sigma)
    sim = simulate(x, y, schedule, delta)
    code = {V.BETTER: 1, V.WORSE: -1, V.EQUIVALENT: 2, V.UNRESOLVED: 0}
    design = S.Design(baseline="b", arms=("a",), delta=delta, **design_kw)
    differ = 0
    for i in range(reps):
        looks: list[dict] = []
        n = design.first_look
        while True:
            look = S.decide_look(design, {"a": x[i, :n], "b": y[i, :n]}, looks)
            looks.append(look)
            if look["done"]:
                break
            n = look["next"]["a"]
        c = look["comparisons"][0]
        differ += (code[c["verdict"]], n) != (int(sim["verdict"][i]), int(sim["used"][i]))
    return differ


PREVENTION_EVALS, PREVENTION_RISE, PREVENTION_DROPS = 24, 9, (0.05, 0.10, 0.15)


def baseline_curve(drop: float, evals: int = PREVENTION_EVALS, rise: int = PREVENTION_RISE) -> np.ndarray:
    """The true val/acc of the prevention scenario: 0.60 → 0.70 over ``rise`` evals, then down by ``drop``."""
    i = np.arange(evals, dtype=np.float64)
    up = 0.60 + 0.10 * np.minimum(i, rise - 1) / (rise - 1)
    return up - drop * np.clip(i - (rise - 1), 0, None) / (evals - rise)


def prevention_rate(drop: float, seeds: int, reps: int, seed: int, val_n: int = DEMO_VAL_N) -> float:
    """Share of ``reps`` baselines of ``seeds`` noisy curves (binomial at val_n) that (F1) finds fell."""
    rng = np.random.default_rng(seed)
    truth = baseline_curve(drop)
    steps, n = np.arange(truth.size) * 10, np.full(truth.size, val_n)
    fell = 0
    for _ in range(reps):
        curves = rng.binomial(val_n, truth, size=(seeds, truth.size)) / val_n
        k = sum(collapse.collapse_step(steps, c, n=n) is not None for c in curves)
        fell += bool(margins.baseline_fell(k, seeds, collapse.ALPHA))
    return fell / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20_000)
    ap.add_argument("--max-seeds", type=int, default=10)
    ap.add_argument("--first-look", type=int, default=3)
    ap.add_argument("--seeds-per-look", type=int, default=2)
    ap.add_argument("--prevention-reps", type=int, default=4000)
    ap.add_argument("--delta-over-sigma", type=float, default=1.5, help="the declared margin in the demo's σ")
    ap.add_argument("--demo-runs", type=Path, help="a demo report's tables/runs.csv (default: DEMO_FINALS)")
    args = ap.parse_args()
    finals = read_finals(args.demo_runs) if args.demo_runs else DEMO_FINALS
    residuals, sigma_demo = demo_spread(finals)
    delta = args.delta_over_sigma * sigma_demo
    design_kw = dict(first_look=args.first_look, seeds_per_look=args.seeds_per_look, max_seeds=args.max_seeds)
    schedule = S.Design(baseline="b", arms=("a",), **design_kw).schedule()
    print(f"looks (seeds per arm): {schedule}; alpha = 0.05 two-sided; {args.reps} runs per scenario")
    print(f"demo: {sum(map(len, finals.values()))} runs in {len(finals)} groups, seed-to-seed sd of final "
          f"val/acc σ = {sigma_demo:.4f}; declared margin δ = {args.delta_over_sigma:g} σ = {delta:.4f}")
    worst = worst_equivalent = 0.0
    seed = 0
    for scale, sigma, dists in (("the demo's σ", sigma_demo, ("normal", "gamma(2)", "t(3)", "demo")),
                                ("an easier σ", delta / 2.0, ("normal",)), ("a harder σ", delta / 1.0, ("normal",))):
        print(f"\n[{scale}: δ/σ = {delta / sigma:.2f}]")
        for dist in dists:
            seed += 1
            r = scenario(dist, sigma, delta, args.reps, schedule, seed, residuals)
            worst = max(worst, r["null_decided"])
            worst_equivalent = max(worst_equivalent, r["delta_equivalent"])
            ratio = r["delta_seeds"] / r["fixed_n_same_power"]
            print(f"{dist:9s} null: false better/worse {mc(r['null_decided'], args.reps)} (naive p<0.05 at "
                  f"the same looks {mc(r['null_naive'], args.reps)}); equivalent {r['null_equivalent']:.3f}; "
                  f"seeds/arm {r['null_seeds']:.2f}")
            print(f"{'':9s} δ:    power {mc(r['delta_decided'], args.reps)} (fixed 10 seeds "
                  f"{r['fixed_power_max']:.3f}; wrong sign {r['wrong_sign']:.4f}); false equivalent "
                  f"{r['delta_equivalent']:.4f}; seeds/arm {r['delta_seeds']:.2f} vs fixed "
                  f"{r['fixed_n_same_power']} (power {r['fixed_power_same']:.3f}) = {ratio:.3f}×")
    fw_reps = max(200, args.reps // 10)
    fw = familywise(4, sigma_demo, delta, fw_reps, design_kw, seed=99)
    print(f"\n4 arms vs one baseline, all equal (normal, demo σ), Holm over arms: familywise false "
          f"better/worse {mc(fw, fw_reps)}")
    worst = max(worst, fw)
    n_check = min(2000, args.reps)
    print(f"decide_look vs this vectorised simulation: {agreement(sigma_demo, delta, n_check, schedule, design_kw, 7)}"
          f" of {n_check} runs differ")
    print(f"\nprevention: {PREVENTION_EVALS} evals at val/n = {DEMO_VAL_N}, rise 0.60 → 0.70 over "
          f"{PREVENTION_RISE} evals, then a linear fall of D; collapse test δ = {collapse.DELTA}, α = "
          f"{collapse.ALPHA}; {args.prevention_reps} baselines per cell")
    worst_missed = 0.0
    for seeds in (3, 5, 10):
        seed += 1
        flat = prevention_rate(0.0, seeds, args.prevention_reps, seed)
        cells = [f"no fall: 'fell' {mc(flat, args.prevention_reps)}"]
        for drop in PREVENTION_DROPS:
            seed += 1
            missed = 1 - prevention_rate(drop, seeds, args.prevention_reps, seed)
            if drop >= 0.10:
                worst_missed = max(worst_missed, missed)
            cells.append(f"D = {drop:.2f}: 'cannot show prevention' {mc(missed, args.prevention_reps)}")
        print(f"{seeds:2d} seeds: " + "; ".join(cells))
    print(f"sequential_type1={worst:.4f}")
    print(f"false_equivalent_at_delta={worst_equivalent:.4f}")
    print(f"cannot_show_prevention_at_true_collapse={worst_missed:.4f}")


if __name__ == "__main__":
    main()
