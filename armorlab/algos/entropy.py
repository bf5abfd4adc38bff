"""Entropy regularisation as TRL 1.16's GRPOTrainer applies it (``entropy_coef``,
``use_adaptive_entropy``, ``top_entropy_quantile``), one equation per function; duck-typed (the
tensors' own methods), no I/O. The trainer (armorlab.train.trainer) holds the controller's state
in TRL's own attributes, so TRL's checkpoint code saves and restores it.
"""

from __future__ import annotations

from typing import Any


def entropy_bonus(entropy: Any, mask: Any, accumulation_steps: float) -> Any:
    """The entropy term H of L = L_policy − c·H (TRL 1.16, documented with ``entropy_coef``): the
    mean per-token entropy over the tokens it acts on (``mask``: the trained tokens, restricted to
    the top ``top_entropy_quantile`` when set), divided by the accumulation steps only — never by
    a loss-specific normaliser, so c means the same for every objective."""
    return (entropy * mask).sum() / mask.sum().clamp(min=1.0) / accumulation_steps


def applied_entropy_coef(coef: float, last_entropy: float, *, adaptive: bool, target: float) -> float:
    """The coefficient applied in this accumulation window: c, or under adaptive control
    (Skywork-OR1, arXiv 2505.22312, §3.2) c only while the last step's entropy is ≤ the target, else 0."""
    if not adaptive:
        return coef
    return coef if last_entropy <= target else 0.0


def next_entropy_coef(coef: float, entropy: float, *, target: float, delta: float, lo: float, hi: float) -> float:
    """Adaptive control's update at an optimiser step (Skywork-OR1 §3.2, as TRL 1.16): c + Δ when the
    window's token-weighted entropy is ≤ the target, c − Δ above it, kept in [lo, hi]."""
    if entropy <= target:
        return min(coef + delta, hi)
    return max(coef - delta, lo)
