"""Probability capacity (UP Eq. 11) and ARMOR's trust region (Eq. 6): hand values, the numpy and
torch paths agreeing, and capacity meaning what it says — moving π by exactly the capacity puts
the objective's ratio on its clip boundary."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from armorlab.algos import capacity as cap
from armorlab.algos.loss import capacity_summary, probability_capacity
from armorlab.errors import ArmorLabError

P_OLD = np.array([0.1, 0.5, 0.9, 0.3, 0.6, 0.2])
P_REF = np.array([0.4, 0.5, 0.05, 0.3, 0.1, 0.8])
SIGN = np.array([1, 1, 1, -1, -1, 0])

# By hand, ε = (0.2, 0.28):
#   A > 0 clipped: min(1.28·π_old, 1) − π_old → 0.028, 0.14, 0.1 (1.152 capped at 1)
#   A < 0: 0.2·π_old → 0.06, 0.12;  A = 0: 0
#   up, A > 0: 1 − π_old → 0.9, 0.5, 0.1
#   armor α = 0.5 (ε·(1−α)/α = ε): A > 0: min(1.28·π_old + 0.28·π_ref, 1) − π_old
#       0.128 + 0.112 = 0.24 → 0.14;  0.64 + 0.14 = 0.78 → 0.28;  1.152 + .014 → 1 → 0.1
#     A < 0: π_old − max(0.8·π_old − 0.2·π_ref, 0): 0.3 − (0.24 − 0.06) = 0.12; 0.6 − (0.48 − 0.02) = 0.14
EXPECTED = {
    "dapo": [0.028, 0.14, 0.1, 0.06, 0.12, 0.0],
    "gspo": [0.028, 0.14, 0.1, 0.06, 0.12, 0.0],
    "up": [0.9, 0.5, 0.1, 0.06, 0.12, 0.0],
    "up_gspo": [0.9, 0.5, 0.1, 0.06, 0.12, 0.0],
    "armor": [0.14, 0.28, 0.1, 0.12, 0.14, 0.0],
}


@pytest.mark.parametrize("objective", list(EXPECTED))
def test_token_capacity_by_hand_numpy(objective):
    got = cap.token_capacity(objective, P_OLD, SIGN, p_ref=P_REF, alpha=0.5)
    np.testing.assert_allclose(got, EXPECTED[objective], atol=1e-12)


@pytest.mark.parametrize("objective", list(EXPECTED))
def test_torch_and_numpy_share_the_formula(objective):
    old_logp = torch.tensor(np.log(P_OLD), dtype=torch.float64)[None]
    ref_logp = torch.tensor(np.log(P_REF), dtype=torch.float64)[None]
    # one row per sign: capacity takes the sign of the row's advantage
    rows = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    got = probability_capacity(objective, old_logp.expand(3, -1), rows, torch.ones(3, 6),
                               ref_logp=ref_logp.expand(3, -1), alpha=0.5)
    for i, s in enumerate((1, -1, 0)):
        want = cap.token_capacity(objective, P_OLD, np.full(6, s), p_ref=P_REF, alpha=0.5)
        np.testing.assert_allclose(got[i].numpy(), want, atol=1e-12)


def test_armor_trust_region_is_where_r_mix_hits_the_clip():
    # Eq. 6 solved independently: plugging the bounds into r_mix must give exactly 1 ± ε.
    p_old, p_ref = np.array([0.05, 0.3, 0.7]), np.array([0.6, 0.2, 0.1])
    for alpha in (0.3, 0.8, 1.0):
        lower, upper = cap.armor_trust_region(p_old, p_ref, alpha, eps_low=0.2, eps_high=0.28)

        def r_mix(p, alpha=alpha):
            return (alpha * p + (1 - alpha) * p_ref) / (alpha * p_old + (1 - alpha) * p_ref)

        np.testing.assert_allclose(r_mix(upper), 1.28, rtol=1e-12)
        np.testing.assert_allclose(r_mix(lower), 0.8, rtol=1e-12)
    lo1, hi1 = cap.armor_trust_region(p_old, p_ref, 1.0)
    lo, hi = cap.trust_region(p_old)
    np.testing.assert_array_equal(lo1, lo)
    np.testing.assert_array_equal(hi1, hi)


def test_capacity_is_how_far_pi_moves_before_the_gradient_stops():
    # Move each token's π from π_old by its capacity (A > 0 up, A < 0 down), slightly less and
    # slightly more: just inside, the token still has a gradient; past it, the clip zeroes it.
    from armorlab.algos.loss import policy_loss

    old = torch.tensor([[0.1, 0.3, 0.5], [0.2, 0.4, 0.6]], dtype=torch.float64)
    ref = torch.tensor([[0.3, 0.05, 0.2], [0.5, 0.1, 0.3]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 3)
    for objective, alpha in (("dapo", 1.0), ("armor", 0.6)):
        c = probability_capacity(objective, old.log(), adv, mask, ref_logp=ref.log(), alpha=alpha)
        assert (c > 0).all()
        direction = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
        for factor, has_grad in ((0.99, True), (1.01, False)):
            p = (old + direction * c * factor).log().requires_grad_(True)
            policy_loss(objective, p, old.log(), adv, mask, ref_logp=ref.log(), alpha=alpha).loss.backward()
            assert bool((p.grad != 0).all()) is has_grad, (objective, factor)


def test_up_capacity_reaches_certainty_and_clipped_does_not():
    old = torch.log(torch.tensor([[0.2, 0.5, 0.9]]))
    adv, mask = torch.tensor([1.0]), torch.ones(1, 3)
    up = probability_capacity("up", old, adv, mask)
    dapo = probability_capacity("dapo", old, adv, mask)
    torch.testing.assert_close(up, torch.tensor([[0.8, 0.5, 0.1]]))
    torch.testing.assert_close(dapo, torch.tensor([[0.056, 0.14, 0.1]]))


def test_capacity_zero_where_masked_even_with_nan():
    old = torch.tensor([[-0.5, math.nan, -1.0]])
    ref = torch.tensor([[-0.5, math.inf, math.nan]])
    mask = torch.tensor([[1, 0, 0]])
    got = probability_capacity("armor", old, torch.tensor([1.0]), mask, ref_logp=ref, alpha=0.7)
    assert torch.isfinite(got).all() and got[0, 1:].tolist() == [0.0, 0.0]


def test_capacity_summary_by_hand():
    # Row 0 (A > 0): π_old 0.5, 0.9, 0.1 → dapo capacity 0.14, 0.1 (capped: 1 − 0.9), 0.028;
    # bound before certainty: 0.5 and 0.1 (not 0.9) → pos_bound_frac 2/3, pos_mean 0.268/3.
    # Row 1 (A < 0): 0.2·π_old = 0.06 (π_old 0.3; its 2nd token is masked). Row 2: A = 0, ignored.
    old = torch.log(torch.tensor([[0.5, 0.9, 0.1], [0.3, 0.7, 0.7], [0.4, 0.4, 0.4]], dtype=torch.float64))
    adv = torch.tensor([2.0, -1.0, 0.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 1]])
    c = probability_capacity("dapo", old, adv, mask)
    s = capacity_summary(c, old, adv, mask)
    assert s["pos_mean"] == pytest.approx(0.268 / 3)
    assert s["pos_bound_frac"] == pytest.approx(2 / 3)
    assert s["neg_mean"] == pytest.approx(0.06)
    up = capacity_summary(probability_capacity("up", old, adv, mask), old, adv, mask)
    assert up["pos_bound_frac"] == 0.0 and up["pos_mean"] == pytest.approx((0.5 + 0.1 + 0.9) / 3)


def test_capacity_stats_numpy_ignores_weightless_nan_and_empty_sides():
    c = np.array([0.1, np.nan, 0.3])
    p = np.array([0.5, np.nan, 0.2])
    s = cap.capacity_stats(c, p, np.array([1, 1, 1]), np.array([1.0, 0.0, 1.0]))
    assert s["pos_mean"] == pytest.approx(0.2)
    assert s["pos_bound_frac"] == pytest.approx(1.0)   # 0.1 < 0.5 and 0.3 < 0.8
    assert math.isnan(s["neg_mean"])


def test_capacity_bad_input():
    old = torch.zeros(1, 2)
    with pytest.raises(ArmorLabError, match="ref_logp"):
        probability_capacity("armor", old, torch.ones(1), torch.ones(1, 2))
    with pytest.raises(ArmorLabError, match="objective"):
        probability_capacity("ppo", old, torch.ones(1), torch.ones(1, 2))
    with pytest.raises(ArmorLabError, match="alpha"):
        probability_capacity("armor", old, torch.ones(1), torch.ones(1, 2), ref_logp=old, alpha=0.0)
    with pytest.raises(ValueError, match="objective"):
        cap.token_capacity("ppo", P_OLD, SIGN)
    with pytest.raises(ArmorLabError, match="mask"):
        capacity_summary(old, old, torch.ones(1), torch.ones(2, 2))
