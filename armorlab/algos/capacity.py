"""Probability capacity (UP Eq. 11) and ARMOR's widened trust region (Eq. 6), written once.

A token's *probability capacity* is how far its probability can move away from π_old, in the
direction its advantage pushes, before the objective's clip stops the gradient.

Every function here is duck-typed: it uses only arithmetic, comparisons and
``.clip(min=..., max=...)``, which torch tensors and numpy arrays share, and imports neither
library. ``armorlab.algos.loss`` (torch, during training) and ``armorlab.analysis`` (numpy,
offline from ``tokens/`` samples, never torch) therefore compute capacity with the same formulas.

Inputs are probabilities (``p_old = exp(old_logp)``), not log-probabilities, and ``sign`` is the
advantage sign broadcast to the token array (+1, 0 or −1).
"""

from __future__ import annotations

import math
from typing import Any

from armorlab.algos.objectives import objective_spec


def capacity_family(objective: str) -> str:
    """The clip a token of ``objective`` meets (its ``ObjectiveSpec.capacity``): ``clipped`` (the
    plain ratio π/π_old, token-level or, for gspo, the sequence's), ``unbounded_positive`` (π/sg(π)
    for A > 0: capacity reaches certainty) or ``mixed`` (ARMOR's r_mix). ValueError when unknown."""
    try:
        return objective_spec(objective).capacity
    except KeyError as exc:
        raise ValueError(f"probability capacity: {exc.args[0]}") from None


def trust_region(p_old: Any, *, eps_low: float = 0.2, eps_high: float = 0.28) -> tuple[Any, Any]:
    """PPO/DAPO trust region in probability space: ``((1−ε_low)·π_old, (1+ε_high)·π_old)``.

    Solving r = π/π_old = 1 ± ε for π (Schulman et al. 2017, Eq. 7, with DAPO's decoupled ε).
    This is ``armor_trust_region`` at α = 1.
    """
    return (1.0 - eps_low) * p_old, (1.0 + eps_high) * p_old


def armor_trust_region(p_old: Any, p_ref: Any, alpha: Any, *, eps_low: float = 0.2,
                       eps_high: float = 0.28) -> tuple[Any, Any]:
    """ARMOR Eq. 6: the π bounds where r_mix reaches 1 ± ε.

    Solving (α·π + (1−α)·π_ref) / (α·π_old + (1−α)·π_ref) = 1 ± ε for π gives
    π = (1 ± ε)·π_old ± ε·(1−α)/α·π_ref: the plain region widened by ε·(1−α)/α·π_ref on each side.
    Returns ``(lower, upper)``; neither is clipped to [0, 1] here.
    """
    widen_low = eps_low * (1.0 - alpha) / alpha * p_ref
    widen_high = eps_high * (1.0 - alpha) / alpha * p_ref
    return (1.0 - eps_low) * p_old - widen_low, (1.0 + eps_high) * p_old + widen_high


def freed_share(widened: float, plain_clipped: float) -> float:
    """Share of the tokens DAPO's plain clip on π/π_old stops (``plain_clipped``, a count or a token
    share) that the objective lets through (``widened``, the same unit): for ARMOR, the part of the
    plain-clipped tokens its widened region (Eq. 6) frees. r_mix lies between 1 and r, so ARMOR's
    widened tokens are a subset of the plain-clipped ones and the share lies in [0, 1]; NaN when the
    plain clip stopped nothing (nothing to free)."""
    return widened / plain_clipped if plain_clipped > 0 else math.nan


def binary_kl_bounds(p_old: Any, *, delta_low: float, delta_high: float, iterations: int = 60) -> tuple[Any, Any]:
    """DPPO binary-KL (arXiv 2602.04879): the π below and above π_old where verl's binary KL
    π_old·log(π_old/π) + (1−π_old)·log((1−π_old+1e-8)/(1−π+1e-8)) reaches δ_low / δ_high.

    The KL grows monotonically as π leaves π_old on either side, so each bound is found by
    bisection; the test KL ≤ δ is written as a product of powers ≤ e^δ (no log, which numpy arrays
    lack as a method). ``iterations`` halvings of [0, 1] reach the float64 resolution."""
    def inside(p: Any, delta: float) -> Any:
        return (p_old / p) ** p_old * ((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)) ** (1.0 - p_old) <= math.exp(delta)

    below_lo, below_hi = p_old * 0.0, p_old * 1.0        # the bound lies in [0, π_old]
    above_lo, above_hi = p_old * 1.0, p_old * 0.0 + 1.0  # ... and in [π_old, 1]
    for _ in range(iterations):
        mid = (below_lo + below_hi) * 0.5
        ok = inside(mid, delta_low)
        below_lo, below_hi = below_lo * ok + mid * (1 - ok * 1), mid * ok + below_hi * (1 - ok * 1)
        mid = (above_lo + above_hi) * 0.5
        ok = inside(mid, delta_high)
        above_lo, above_hi = mid * ok + above_lo * (1 - ok * 1), above_hi * ok + mid * (1 - ok * 1)
    return below_hi, above_lo


def family_region(family: str, p_old: Any, *, eps_low: float, eps_high: float) -> tuple[Any, Any]:
    """(lower, upper) π bounds of a token under the families that bound π_old alone: ``clipped``
    (PPO's (1 ± ε)·π_old), ``log_clipped`` (GMPO, arXiv 2507.20673: π_old·e^(−ε_low), π_old·e^ε_high),
    ``prob_diff`` (DPPO binary-TV: π_old ∓ δ) and ``binary_kl`` (DPPO binary-KL, ``binary_kl_bounds``)."""
    if family == "log_clipped":
        return math.exp(-eps_low) * p_old, math.exp(eps_high) * p_old
    if family == "prob_diff":
        return p_old - eps_low, p_old + eps_high
    if family == "binary_kl":
        return binary_kl_bounds(p_old, delta_low=eps_low, delta_high=eps_high)
    return trust_region(p_old, eps_low=eps_low, eps_high=eps_high)


def token_capacity(objective: str, p_old: Any, sign: Any, *, p_ref: Any = None, alpha: Any = 1.0,
                   eps_low: float = 0.2, eps_high: float = 0.28) -> Any:
    """UP Eq. 11 per token: the distance π can travel from π_old before the clip stops the gradient.

    A > 0:  clipped   min((1+ε_high)·π_old, 1) − π_old
            up        1 − π_old                                  (π/sg(π) never clips)
            armor     min(Eq. 6 upper bound, 1) − π_old
    A < 0:  clipped   π_old − max((1−ε_low)·π_old, 0) = ε_low·π_old   (up too: its negative branch is dapo's)
            armor     π_old − max(Eq. 6 lower bound, 0)
            unbounded 1 − π_old        (no bound stops the gradient: CISPO's and DPPO's weights are
                                        capped, not zeroed; SAPO's gate decays; GPG, DRO, KL-Cov, VESPO)
            log_clipped, prob_diff, binary_kl: min(family_region upper, 1) − π_old
    A < 0:  unbounded π_old; the other families π_old − max(family_region lower, 0)
    A = 0:  0 (no gradient pushes the token).

    Clip-Cov also stops the gradient of a random few in-range tokens (2e-4 of them by default):
    its capacity is the clipped one, the bound of the other tokens. Sequence-level GMPO and LUSPO
    use the symmetric case below, as gspo.

    Sequence objectives (gspo, up_gspo) clip the geometric-mean ratio s_i of the whole sequence,
    so one token's room depends on how the others move. We use the capacity of the symmetric
    case where every token of the sequence moves by the same factor: then s_i equals each
    token's own ratio, so gspo's capacity is the token formula with gspo's (small) ε, and
    up_gspo's is up's. This keeps capacity a function of (π_old, sign) only, comparable across
    objectives and computable from ``tokens/`` samples without sequence lengths.
    """
    family = capacity_family(objective)
    if family == "mixed":
        if p_ref is None:
            raise ValueError(f"{objective} capacity needs p_ref (the reference policy's probabilities)")
        lower, upper = armor_trust_region(p_old, p_ref, alpha, eps_low=eps_low, eps_high=eps_high)
    else:
        lower, upper = family_region(family, p_old, eps_low=eps_low, eps_high=eps_high)
    pos = 1.0 - p_old if family in ("unbounded_positive", "unbounded") else upper.clip(max=1.0) - p_old
    neg = p_old - p_old * 0.0 if family == "unbounded" else p_old - lower.clip(min=0.0)
    # Multiplying by the boolean masks (not where()) keeps this numpy/torch-agnostic; both
    # capacities are finite for probabilities in [0, 1], so 0·cap never makes NaN.
    return pos * (sign > 0) + neg * (sign < 0)


def capacity_stats(cap: Any, p_old: Any, sign: Any, weight: Any) -> dict[str, float]:
    """Summary of a capacity array: ``pos_mean``, ``pos_bound_frac``, ``neg_mean`` (python floats).

    ``pos_mean`` / ``neg_mean``: weighted mean capacity over tokens with A > 0 / A < 0.
    ``pos_bound_frac``: weighted share of A > 0 tokens whose capacity is below 1 − π_old, i.e.
    the clip binds before the token reaches certainty. Where the clip does not bind, the
    capacity is computed as exactly ``1.0 − p_old`` (same operations), so the strict comparison
    needs no tolerance. Tokens with ``weight`` 0 are ignored even if they hold NaN (they are
    selected out by indexing, not multiplied by 0). A statistic with no tokens is NaN.
    All four arrays must have the same shape.
    """
    live = weight > 0
    pos, neg = live & (sign > 0), live & (sign < 0)
    w_pos, w_neg = weight[pos], weight[neg]
    n_pos, n_neg = float(w_pos.sum()), float(w_neg.sum())
    bound = cap[pos] < 1.0 - p_old[pos]
    return {
        "pos_mean": float((cap[pos] * w_pos).sum()) / n_pos if n_pos > 0 else math.nan,
        "pos_bound_frac": float((bound * w_pos).sum()) / n_pos if n_pos > 0 else math.nan,
        "neg_mean": float((cap[neg] * w_neg).sum()) / n_neg if n_neg > 0 else math.nan,
    }
