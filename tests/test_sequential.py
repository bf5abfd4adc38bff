"""armorlab.stats.sequential: boundaries against published tables and simulation, decide_look
look by look, the looks.json record, and the rates of benchmarks/sequential_seeds.py (loosely)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from armorlab.errors import ArmorLabError
from armorlab.stats import sequential as S
from armorlab.stats import verdicts as V

_spec = importlib.util.spec_from_file_location(
    "sequential_seeds", Path(__file__).parents[1] / "benchmarks" / "sequential_seeds.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

# Jennison & Turnbull (2000), two-sided α = 0.05, K equally spaced looks: Pocock's C_P(K, α) and
# O'Brien & Fleming's C_B(K, α) (the boundary at look k is C_B·√(K/k)), K = 1 … 5
POCOCK = (1.960, 2.178, 2.289, 2.361, 2.413)
OBRIEN_FLEMING = (1.960, 1.977, 2.004, 2.024, 2.040)


def crossing_probabilities(bounds, fractions, drift: float = 0.0) -> list[tuple[float, float]]:
    """(G4) per look, P(stop above c_k) and P(stop below −c_k) for a drift η (E[Z_k] = η√t_k)."""
    walk, out = S._Walk(drift), []
    for c, t in zip(bounds, fractions, strict=True):
        out.append(walk.crossing(c, t))
        walk.advance(c, t)
    return out


def classical_boundaries(looks: int, alpha: float, shape: str) -> tuple[float, ...]:
    """(G8) Pocock's or O'Brien & Fleming's boundaries on equally spaced looks, by (G4)'s integration."""
    from scipy.optimize import brentq

    f = tuple((k + 1) / looks for k in range(looks))
    scale = [1.0 if shape == "pocock" else math.sqrt(looks / (k + 1)) for k in range(looks)]

    def size(c):
        return sum(u + lo for u, lo in crossing_probabilities([c * s for s in scale], f)) - alpha
    c = float(brentq(size, 0.5, 10.0, xtol=1e-10))
    return tuple(c * s for s in scale)


@pytest.mark.parametrize("k", range(1, 6))
def test_classical_constants_match_the_published_tables(k):
    pocock = classical_boundaries(k, 0.05, "pocock")
    assert pocock == pytest.approx((POCOCK[k - 1],) * k, abs=6e-4)
    obf = classical_boundaries(k, 0.05, "obf")
    assert obf[-1] == pytest.approx(OBRIEN_FLEMING[k - 1], abs=6e-4)
    assert obf[0] == pytest.approx(OBRIEN_FLEMING[k - 1] * math.sqrt(k), abs=2e-3)


def test_lan_demets_obrien_fleming_matches_ld98():
    # four equally spaced looks, two-sided 0.05 (α/2 a side): the boundaries Reboussin et al.'s
    # ld98 gives (as the GroupSeq R package's tests quote them)
    got = S.spending_boundaries([0.25, 0.5, 0.75, 1.0], 0.05, "obf")
    assert got == pytest.approx((4.332634, 2.963129, 2.35902, 2.014057), abs=1e-4)


def test_crossing_probabilities_match_ld98_under_a_drift():
    bounds = (4.332634, 2.963129, 2.35902, 2.014057)
    got = crossing_probabilities(bounds, [0.25, 0.5, 0.75, 1.0], drift=0.5)
    upper = (2.226406e-05, 4.516532e-03, 2.356205e-02, 4.300024e-02)
    lower = (2.295776e-06, 4.541068e-04, 2.341142e-03, 4.281890e-03)
    assert [u for u, _ in got] == pytest.approx(upper, rel=2e-3)
    # the lower crossings of looks 3 and 4 there sit 0.5 % and 1.2 % below an 8-million-path
    # simulation (0.0023565 ± 0.000017, 0.004353 ± 0.000023), which the integration here matches
    assert [lo for _, lo in got][:2] == pytest.approx(lower[:2], rel=2e-3)
    assert [lo for _, lo in got][2:] == pytest.approx((0.0023565, 0.004353), abs=4e-5)


@pytest.mark.parametrize("spending", S.SPENDING)
def test_boundaries_spend_alpha_on_simulated_brownian_motion(spending):
    # an independent check of the integration: Brownian motion at the looks, crossings counted
    fractions = np.array([0.3, 0.5, 0.7, 0.9, 1.0])
    bounds = np.array(S.spending_boundaries(fractions, 0.05, spending))
    rng = np.random.default_rng(11)
    reps = 400_000
    s = np.cumsum(rng.standard_normal((reps, fractions.size)) * np.sqrt(np.diff(fractions, prepend=0.0)), axis=1)
    crossed = np.abs(s / np.sqrt(fractions)) >= bounds
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    spent = np.diff([0.0, *[S.spend(t, 0.05, spending) for t in fractions[:-1]], 0.05])
    per_look = np.array([np.mean(first == k) for k in range(fractions.size)])
    assert per_look.sum() == pytest.approx(0.05, abs=3 * math.sqrt(0.05 * 0.95 / reps))
    assert per_look == pytest.approx(spent, abs=0.0015)


def test_spending_functions():
    for spending in S.SPENDING:
        assert S.spend(1.0, 0.05, spending) == pytest.approx(0.05)
        assert S.spend(0.0, 0.05, spending) == 0.0
        ts = np.linspace(0.05, 1, 20)
        assert np.all(np.diff([S.spend(t, 0.05, spending) for t in ts]) > 0)
    # O'Brien–Fleming type spends almost nothing early; Pocock type about a third by t = 0.3
    assert S.spend(0.3, 0.05, "obf") < 1e-4 < 0.3 * 0.05 < S.spend(0.3, 0.05, "pocock")
    with pytest.raises(ValueError):
        S.spending_boundaries([0.5, 0.4], 0.05)
    with pytest.raises(ValueError):
        S.spend(0.5, 0.05, "haybittle")


def test_information_fraction_and_t_boundary():
    assert S.information_fraction(5, 5, 10) == pytest.approx(0.5)
    assert S.information_fraction(3, 6, 10) == pytest.approx((1 / (1 / 3 + 1 / 6)) / 5)
    assert S.information_fraction(12, 12, 10) == 1.0
    from scipy import stats as sps
    c = 2.5
    assert S.t_boundary(c, 7.5) == pytest.approx(sps.t.ppf(sps.norm.cdf(c), 7.5))
    assert S.t_boundary(math.inf, 4) == math.inf


def _design(**kw):
    return S.Design(baseline="dapo", arms=kw.pop("arms", ("armor", "up")), delta=kw.pop("delta", 0.04), **kw)


def test_one_arm_resolves_at_the_first_look_and_another_needs_a_second():
    design = _design()
    assert design.schedule() == [3, 5, 7, 9, 10]
    values = {"dapo": [0.60, 0.61, 0.62], "armor": [0.30, 0.31, 0.29], "up": [0.55, 0.66, 0.60]}
    look1 = S.decide_look(design, values)
    comps = {c["arm"]: c for c in look1["comparisons"]}
    assert comps["armor"]["verdict"] == V.WORSE and comps["armor"]["tested"]
    assert comps["up"]["verdict"] == S.CONTINUE
    # Holm: armor rejected at α/2, so up is tested at α/(2 − 1)
    assert comps["armor"]["level"] == pytest.approx(0.025) and comps["up"]["level"] == pytest.approx(0.05)
    assert look1["next"] == {"up": 5, "dapo": 5} and not look1["done"]
    assert comps["up"]["fraction"] == pytest.approx(0.3)
    look1 = json.loads(json.dumps(look1))       # what looks.json gives back
    values2 = {"dapo": [0.60, 0.61, 0.62, 0.60, 0.61], "armor": values["armor"],
               "up": [0.50, 0.51, 0.50, 0.52, 0.50]}
    look2 = S.decide_look(design, values2, [look1])
    comps2 = {c["arm"]: c for c in look2["comparisons"]}
    assert comps2["armor"]["verdict"] == V.WORSE and comps2["armor"].get("carried")
    assert comps2["up"]["verdict"] == V.WORSE and comps2["up"]["fraction"] == pytest.approx(0.5)
    # the boundary at the second look is spent on the fractions 0.3 and 0.5
    assert comps2["up"]["z_bound"] == pytest.approx(S.spending_boundaries([0.3, 0.5], 0.05)[-1])
    assert look2["done"] and look2["next"] == {}


def test_equivalent_and_not_resolved_at_the_last_look():
    design = _design(arms=("kl",), max_seeds=5, first_look=3, seeds_per_look=2)
    rng = np.random.default_rng(1)
    base = list(0.6 + 0.002 * rng.standard_normal(5))
    same = list(0.6 + 0.002 * rng.standard_normal(5))
    look = S.decide_look(design, {"dapo": base[:3], "kl": same[:3]})
    assert look["comparisons"][0]["verdict"] in (V.EQUIVALENT, S.CONTINUE)
    last = S.decide_look(design, {"dapo": base, "kl": same}, [look] if not look["done"] else [])
    c = last["comparisons"][0]
    assert c["verdict"] == V.EQUIVALENT and c["within_delta"]
    noisy = S.decide_look(design, {"dapo": [0.5, 0.7, 0.6, 0.55, 0.65], "kl": [0.52, 0.72, 0.58, 0.66, 0.6]})
    c = noisy["comparisons"][0]
    assert c["final"] and c["fraction"] == 1.0 and c["verdict"] == V.UNRESOLVED
    sd = math.sqrt((np.var([0.5, 0.7, 0.6, 0.55, 0.65], ddof=1) + np.var([0.52, 0.72, 0.58, 0.66, 0.6], ddof=1)) / 2)
    assert c["seeds_needed"] == V.seeds_for_power(0.04, sd, 0.05)
    assert noisy["done"]


def test_looks_record_round_trip_and_errors(tmp_path):
    design = _design()
    look = S.decide_look(design, {"dapo": [0.6, 0.61, 0.62], "armor": [0.6, 0.58, 0.63], "up": [0.6, 0.6, 0.61]})
    text = json.dumps(S.looks_record(design, [look]), allow_nan=False)   # valid JSON: no NaN, no inf
    got_design, looks = S.read_looks_record(json.loads(text), file="sw/looks.json")
    assert got_design == design and looks == [look]
    assert json.loads(text)["method"].startswith("group-sequential Welch t-test, Lan–DeMets O'Brien–Fleming")
    bad = json.loads(text)
    bad["design"]["max_seeds"] = 2
    with pytest.raises(ArmorLabError, match="max_seeds") as exc:
        S.read_looks_record(bad, file="sw/looks.json")
    assert "sw/looks.json" in str(exc.value)
    with pytest.raises(ArmorLabError, match="version"):
        S.read_looks_record({"version": 99}, file="x")
    with pytest.raises(ArmorLabError, match="looks"):
        S.read_looks_record({**json.loads(text), "looks": [1]}, file="x")
    with pytest.raises(ArmorLabError, match="values"):
        S.decide_look(design, {"dapo": [0.6, 0.7, 0.8]})
    with pytest.raises(ArmorLabError, match="spending"):
        _design(spending="haybittle")


def test_simulated_rates_loosely():
    # the benchmark's exact figures come from 20,000 runs a scenario; here 4,000, loose bounds
    rng = np.random.default_rng(5)
    schedule, reps, delta = [3, 5, 7, 9, 10], 4000, 1.0
    null = bench.simulate(rng.standard_normal((reps, 10)), rng.standard_normal((reps, 10)), schedule, delta)
    assert np.mean(np.abs(null["verdict"]) == 1) < 0.065          # target ≤ 0.05
    assert np.mean(null["naive"]) > 0.09                             # peeking at p < 0.05 inflates it
    alt = bench.simulate(rng.standard_normal((reps, 10)) + 1.5, rng.standard_normal((reps, 10)), schedule, 1.5)
    assert np.mean(alt["verdict"] == 1) > 0.82 and np.mean(alt["used"]) < 8.5
    assert np.mean(alt["verdict"] == 2) < 0.05                     # false equivalence at the margin


def test_prevention_rates_loosely():
    # the true curve: 0.60 → 0.70 by eval 8 (+0.0125 an eval), then down D over the last 15 evals
    assert bench.baseline_curve(0.15)[[0, 4, 8, 9, 23]] == pytest.approx([0.60, 0.65, 0.70, 0.69, 0.55])
    assert bench.baseline_curve(0.0)[8:] == pytest.approx([0.70] * 16)
    # 300 baselines of 3 seeds: a flat one is rarely said to fall, one falling 0.15 (6.5 SE) always is
    assert bench.prevention_rate(0.0, 3, 300, seed=1) < 0.03          # target ≤ 0.05
    assert bench.prevention_rate(0.15, 3, 300, seed=2) > 0.97         # "cannot show prevention" ≤ 0.05


def test_benchmark_simulation_decides_as_decide_look():
    kw = dict(first_look=3, seeds_per_look=2, max_seeds=10)
    assert bench.agreement(0.02, 0.04, 150, [3, 5, 7, 9, 10], kw, seed=3) == 0


def test_latest_comparisons_carry_resolved_arms():
    design = _design()
    look1 = S.decide_look(design, {"dapo": [0.60, 0.61, 0.62], "armor": [0.30, 0.31, 0.29], "up": [0.55, 0.66, 0.6]})
    look2 = S.decide_look(design, {"dapo": [0.60, 0.61, 0.62, 0.6, 0.6], "armor": [0.30, 0.31, 0.29],
                                   "up": [0.55, 0.66, 0.6, 0.6, 0.62]}, [look1])
    latest = S.latest_comparisons([look1, look2])
    assert latest["armor"]["verdict"] == V.WORSE and latest["armor"]["n"] == [3, 3]
    assert latest["up"]["n"] == [5, 5]
    assert S.latest_comparisons([]) == {}


def test_failed_seeds_are_asked_for_again():
    # two of the arm's three runs failed (no value): nothing to test yet, the look asks for 3 again
    design = _design(arms=("kl",), max_seeds=3, first_look=3)
    look = S.decide_look(design, {"dapo": [0.6, 0.61, 0.62], "kl": [0.6, float("nan"), None]})
    c = look["comparisons"][0]
    assert c["verdict"] == S.CONTINUE and not c["tested"] and c["n"] == [1, 3]
    assert look["next"] == {"kl": 3, "dapo": 3} and not look["done"]
