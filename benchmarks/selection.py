"""The kept checkpoint's rule (armorlab.stats.select, S1) on simulated curves with known truth.

Every eval is Binomial(n, p_true)/n, K evals at steps 0, 1, …, K − 1 (step 0, the initial model,
never competes). Two scenarios, p = 0.5:

    flat    p_true constant: every checkpoint is as good as any other, so a rule should pick the
            last one about as often as any other (1/(K − 1)); ``end_share`` above that is the price
            of scoring the last checkpoint by fewer evals, ``optimism`` the selected level minus
            p_true in standard errors SE = sqrt(p(1 − p)/n)
    rising  p_true rises linearly by 4 SE over the run: the last checkpoint is the best;
            ``last_share`` is how often a rule picks it, ``regret`` p_true(last) − p_true(pick) in SE

Rules: ``s1`` (select_checkpoints: the evals around a checkpoint, fewer at the curve's ends) and
``centred`` (the window's middle eval, the rule before issue 40: select_checkpoints(settled=True)
on the whole curve, which leaves out the last checkpoint).

    .venv/bin/python benchmarks/selection.py [--reps 2000]
"""

from __future__ import annotations

import argparse

import numpy as np

from armorlab.stats.select import select_checkpoints

P = 0.5
SIZES = (64, 256, 1024)
N_EVALS = (5, 10, 20)


def pick(values: np.ndarray, rule: str) -> int:
    steps = np.arange(values.size)
    return int(select_checkpoints(steps, values, settled=rule == "centred")[0].step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    worst: dict[str, float] = {}
    for n in SIZES:
        se = np.sqrt(P * (1 - P) / n)
        for k in N_EVALS:
            truth = {"flat": np.full(k, P), "rising": P + 4 * se * np.arange(k) / (k - 1)}
            for scenario, p_true in truth.items():
                draws = rng.binomial(n, p_true, size=(args.reps, k)) / n
                for rule in ("s1", "centred"):
                    picks = np.array([pick(v, rule) for v in draws])
                    at_end = float(np.mean(picks == k - 1))
                    name = f"{scenario}_{rule}_n{n}_k{k}"
                    if scenario == "flat":
                        level = np.array([select_checkpoints(np.arange(k), v, settled=rule == "centred")[0].level
                                          for v in draws[:200]])
                        print(f"{name}_end_share={at_end:.3f} uniform={1 / (k - 1):.3f} "
                              f"optimism_se={np.mean(level - P) / se:.2f}")
                        worst[f"flat_{rule}_end_share_excess"] = max(worst.get(f"flat_{rule}_end_share_excess", -1),
                                                                     at_end - 1 / (k - 1))
                    else:
                        regret = float(np.mean(p_true[-1] - p_true[picks]) / se)
                        print(f"{name}_last_share={at_end:.3f} regret_se={regret:.2f}")
                        worst[f"rising_{rule}_regret_se"] = max(worst.get(f"rising_{rule}_regret_se", 0), regret)
    for key, value in worst.items():
        print(f"{key}={value:.3f}")


if __name__ == "__main__":
    main()
