"""Capacity statistics from token samples: hand values, the chunked kernel against the reference
functions (armorlab.algos.capacity, armorlab.algos.kl), and a run's tokens/ parquet."""

import math

import numpy as np
import pandas as pd
import pytest

from armorlab.algos import capacity, kl
from armorlab.analysis import capacity_stats as cs
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir


def capacity_limited_share(cap, p_old, sign, weight, *, p_low=cs.P_LOW):
    """(CL) by capacity.capacity_stats on the tokens with π_old < p_low: the reference for token_kernel's."""
    low = np.asarray(p_old) < p_low
    return capacity.capacity_stats(cap[low], p_old[low], sign[low], weight[low])["pos_bound_frac"]


def test_capacity_by_hand_and_bound_share():
    p_old = np.array([0.5, 0.9, 0.5])
    sign = np.array([1.0, 1.0, -1.0])
    ones = np.ones(3)
    # dapo A>0: min(1.28·π_old, 1) − π_old → 0.14 (bound) and 0.1 = 1 − 0.9 (not bound); A<0: 0.2·0.5
    out = cs.token_kernel(np.log(p_old), np.log(p_old), None, sign, objective="dapo")
    assert out["pos_mean"] == pytest.approx((0.14 + 0.1) / 2)
    assert out["pos_bound_frac"] == pytest.approx(0.5)
    assert out["neg_mean"] == pytest.approx(0.1)
    assert math.isnan(out["reverse_k3"])
    # UP A>0: 1 − π_old, never bound
    up = cs.token_kernel(np.log(p_old), np.log(p_old), None, sign, objective="up")
    assert up["pos_mean"] == pytest.approx((0.5 + 0.1) / 2) and up["pos_bound_frac"] == 0.0
    # ARMOR α = 0.5, π_ref = 0.2, π_old = 0.5: upper = 1.28·0.5 + 0.28·(0.5/0.5)·0.2 = 0.696 → 0.196
    armor = cs.token_kernel(np.log([0.5]), np.log([0.5]), np.log([0.2]), np.array([1.0]), objective="armor",
                            alpha=0.5)
    assert armor["pos_mean"] == pytest.approx(0.196)
    assert capacity.token_capacity("dapo", p_old, sign)[0] == pytest.approx(0.14)
    assert capacity_limited_share(capacity.token_capacity("dapo", p_old, sign), p_old, sign, ones,
                                     p_low=0.6) == 1.0


def test_low_probability_correct_tokens_share():
    p_old = np.array([0.1, 0.15, 0.5, 0.1])
    sign = np.array([1.0, 1.0, 1.0, -1.0])
    logp = np.log(p_old)
    # low-probability A>0 tokens: 0.1 and 0.15; clipped caps both (1.28·π_old < 1), UP frees both
    assert cs.token_kernel(logp, logp, None, sign, objective="dapo")["low_prob_limited"] == 1.0
    assert cs.token_kernel(logp, logp, None, sign, objective="up")["low_prob_limited"] == 0.0
    assert math.isnan(cs.token_kernel(logp, logp, None, -np.abs(sign), objective="dapo")["low_prob_limited"])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("objective", ["armor", "dapo", "up"])
def test_kernel_matches_reference_functions(dtype, objective):
    rng = np.random.default_rng(3)
    n = 10_007                                                # not a multiple of the chunk
    old = np.log(rng.uniform(0.01, 1.0, n)).astype(dtype)
    logp = np.minimum(old + rng.normal(0, 0.05, n), 0).astype(dtype)
    ref = np.minimum(old + rng.normal(0, 0.2, n), 0).astype(dtype)
    adv = rng.normal(0, 1, n).astype(dtype)
    adv[::17] = 0.0
    got = cs.token_kernel(logp, old, ref, adv, objective=objective, alpha=0.7, chunk=1000)
    f64 = [a.astype(np.float64) for a in (logp, old, ref, adv)]
    lp, o, r, a = f64
    p_old, sign, w = np.exp(o), np.sign(a), np.ones(n)
    cap = capacity.token_capacity(objective, p_old, sign, p_ref=np.exp(r), alpha=0.7)
    want = capacity.capacity_stats(cap, p_old, sign, w)
    tol = 1e-4 if dtype == np.float32 else 1e-9
    for key in ("pos_mean", "neg_mean"):
        assert got[key] == pytest.approx(want[key], rel=tol)
    # bound share counts a strict inequality that float32 rounding can flip for a token or two
    assert got["pos_bound_frac"] == pytest.approx(want["pos_bound_frac"], abs=2 / n if dtype == np.float32 else 0)
    assert got["low_prob_limited"] == pytest.approx(capacity_limited_share(cap, p_old, sign, w),
                                                    abs=2 / n if dtype == np.float32 else 1e-12)
    for est in ("k1", "k2", "k3"):
        assert got[f"reverse_{est}"] == pytest.approx(kl.reverse_kl(lp, r, estimator_name=est), rel=tol, abs=1e-7)
    assert got["forward_next_token_on_policy"] == pytest.approx(kl.next_token_forward_kl_is_tokens(lp, r).mean(),
                                                                rel=tol, abs=1e-7)
    assert got["tokens"] == n


def test_kernel_per_token_alpha_and_other_eps_match_capacity_module():
    # the kernel's rearranged formulas (one widened mass for both signs) against
    # capacity.token_capacity with a per-token α and gspo's small ε
    rng = np.random.default_rng(5)
    n = 3001
    old = np.log(rng.uniform(0.01, 1.0, n))
    ref = np.minimum(old + rng.normal(0, 0.3, n), 0)
    adv = rng.normal(0, 1, n)
    adv[::7] = 0.0
    alpha = rng.uniform(0.3, 1.0, n)
    p_old, sign, w = np.exp(old), np.sign(adv), np.ones(n)
    for objective, kw in (("armor", {"alpha": alpha}), ("gspo", {"eps_low": 3e-4, "eps_high": 4e-4})):
        got = cs.token_kernel(old, old, ref, adv, objective=objective, chunk=512, **kw)
        cap = capacity.token_capacity(objective, p_old, sign, p_ref=np.exp(ref), **kw)
        want = capacity.capacity_stats(cap, p_old, sign, w)
        assert got["pos_mean"] == pytest.approx(want["pos_mean"], rel=1e-9)
        assert got["neg_mean"] == pytest.approx(want["neg_mean"], rel=1e-9)
        assert got["pos_bound_frac"] == pytest.approx(want["pos_bound_frac"], abs=1e-12)
        assert got["low_prob_limited"] == pytest.approx(capacity_limited_share(cap, p_old, sign, w), abs=1e-12)
        assert 0 < want["pos_bound_frac"] < 1  # both branches of the A > 0 minimum are exercised


def test_kernel_rejects_mismatched_or_missing_inputs():
    x = np.zeros(3)
    with pytest.raises(ValueError, match="unknown objective 'ppo'"):
        cs.token_kernel(x, x, None, x, objective="ppo")
    with pytest.raises(ValueError, match="one length"):
        cs.token_kernel(x, x[:2], None, x, objective="dapo")
    with pytest.raises(ValueError, match="ref_logp"):
        cs.token_kernel(x, x, None, x, objective="armor")


def test_run_token_sample(tmp_path):
    rd = RunDir.create(tmp_path / "sw", resolve({"objective": "armor", "alpha": 0.6, "seed": 0}))
    rng = np.random.default_rng(0)
    n = 400
    old = np.log(rng.uniform(0.05, 1.0, n))
    df = pd.DataFrame({"logp": old + rng.normal(0, 0.05, n), "old_logp": old,
                       "ref_logp": old + rng.normal(0, 0.2, n), "advantage": rng.normal(size=n),
                       "is_anchor": np.arange(n) % 8 == 0, "step": np.arange(n) // 40})
    rd.tokens_dir.mkdir()
    df.iloc[:200].to_parquet(rd.tokens_dir / "step-0.parquet")
    df.iloc[200:].to_parquet(rd.tokens_dir / "step-5.parquet")
    (rd.tokens_dir / "step-9.parquet").write_bytes(b"half-written")   # skipped, not fatal
    tokens = cs.read_tokens(rd.path)
    assert len(tokens) == n
    got = cs.token_stats(tokens, rd.read_config())
    anchors, policy = df[df["is_anchor"]], df[~df["is_anchor"]]
    assert got["anchor_kl_k3"] == pytest.approx(kl.forward_kl(anchors["logp"], anchors["ref_logp"]))
    assert got["reverse_k3"] == pytest.approx(kl.reverse_kl(policy["logp"], policy["ref_logp"]))
    assert got["tokens"] == len(policy)
    cf = cs.counterfactual_capacity(tokens, rd.read_config())
    pos = policy[policy["advantage"] > 0]
    np.testing.assert_allclose(cf["up"], 1 - np.exp(pos["old_logp"]))
    assert set(cf) == {"up", "dapo", "armor"} and (cf["dapo"] <= cf["armor"] + 1e-12).all()
    assert cs.read_tokens(tmp_path) is None


def test_capacity_parameters_come_from_the_objective_registry():
    # a config that sets no clip gets its objective's: gspo's preset (3e-4, 4e-4), DAPO's 0.2/0.28 otherwise
    gspo, up = cs.objective_params({"objective": "gspo"}), cs.objective_params({"objective": "up"})
    assert (gspo["eps_low"], gspo["eps_high"], up["eps_low"], up["eps_high"]) == (3e-4, 4e-4, 0.2, 0.28)
    # a dapo run (α null, G = 4): ARMOR's counterfactual uses α = 3/4, so β = (1−α)/α = 1/3 and
    # Eq. 6's upper bound is 1.28·π_old + 0.28·β·π_ref: π_old 0.5, π_ref 0.3 → 0.64 + 0.028 = 0.668
    cfg = resolve({"objective": "dapo", "num_generations": 4})
    assert cfg["alpha"] is None
    tokens = pd.DataFrame({"logp": np.log([0.5]), "old_logp": np.log([0.5]), "ref_logp": np.log([0.3]),
                           "advantage": [1.0]})
    cf = cs.counterfactual_capacity(tokens, cfg)
    assert cf["armor"] == pytest.approx([0.668 - 0.5]) and cf["dapo"] == pytest.approx([0.14])
