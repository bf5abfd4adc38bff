"""Group advantages as pure torch functions: DAPO/GRPO's group mean and QAE's K-quantile baseline.

TRL computes the group-mean advantage itself; ``advantage_estimator: quantile`` replaces it with
Quantile Advantage Estimation (QAE, Wu et al., arXiv 2509.22611), the second base algorithm of
ARMOR's Table 1. Rewards arrive as a flat vector of whole groups (G consecutive rows per prompt,
anchors included: an anchor's reward is part of its group, exactly as for the mean baseline).
NaN marks an unscorable completion: it is left out of its group's baseline and spread and gets
advantage 0, as TRL does for the mean. No I/O, no trainer: the trainer only calls
``group_advantages``.

Equations (numbered here; QAE's paper states them in prose and in its Sec. 3 definitions):

* (Q1) empirical CDF of a group: F(x) = (1/G)·Σ_j 1{R_j ≤ x}
* (Q2) K-quantile baseline: b = inf{x : F(x) ≥ K}, the right-continuous quantile, i.e. the
  ⌈K·G⌉-th smallest reward (not torch.quantile's linear interpolation: for G = 8, K = 0.4 and
  five correct binary rewards, interpolation gives 0.8 where Q2 gives 1).
* (Q3) advantage: A_i = (R_i − b) / (std(R) + eps), std the group's sample std (Bessel), as
  GRPO/DAPO and TRL's ``scale_rewards: group`` use it; ``scale: none`` drops the division and
  ``scale: batch`` divides by the std of the whole batch, again as TRL does.

For binary rewards with success rate p, Q2 gives b = 0 when p ≤ 1 − K and b = 1 otherwise: on
hard prompts only successes get a (positive) advantage, on easy ones only failures get a
(negative) one.
"""

from __future__ import annotations

import math

import torch

ESTIMATORS = ("group_mean", "quantile")
EPS = 1e-4  # TRL's constant in (R − mean)/(std + 1e-4)


def empirical_cdf(rewards: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Eq. Q1: F(x) = (1/G)·Σ_j 1{R_j ≤ x} per group; ``rewards`` (N, G) without NaN, ``x`` (N, M)."""
    return (rewards.unsqueeze(1) <= x.unsqueeze(2)).float().mean(dim=2)


def quantile_baseline(rewards: torch.Tensor, k: float) -> torch.Tensor:
    """Eq. Q2: b = inf{x : F(x) ≥ K} per group of ``rewards`` (N, G); NaN entries are not counted.

    F only jumps at the observed rewards, so the infimum is the smallest observed reward whose F
    reaches K: with n scorable rewards sorted ascending, the ⌈K·n⌉-th (1-based; the first when
    K·n rounds to 0). A group with no scorable reward gets NaN.
    """
    if not 0.0 < k <= 1.0:
        raise ValueError(f"quantile_k must be in (0, 1], got {k}")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (groups, G), got shape {tuple(rewards.shape)}")
    valid = ~torch.isnan(rewards)
    n = valid.sum(dim=1)
    # NaN sorts last as +inf: the first n sorted entries are the scorable rewards
    ordered = torch.sort(torch.where(valid, rewards, torch.full_like(rewards, math.inf)), dim=1).values
    # ⌈K·n⌉ with a tolerance, so K·n that is an integer up to float error (0.4·5 = 2.0000000000000004)
    # does not round up one rank
    rank = torch.ceil(k * n.to(torch.float64) - 1e-9).clamp(min=1).long()
    idx = (rank - 1).clamp(min=0, max=rewards.size(1) - 1)
    b = ordered.gather(1, idx.unsqueeze(1)).squeeze(1)
    return torch.where(n > 0, b, torch.full_like(b, math.nan))


def _nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sample std (Bessel) ignoring NaN, as trl.trainer.utils.nanstd."""
    mean = torch.nanmean(x, dim=dim, keepdim=dim is not None)
    count = (~torch.isnan(x)).sum(dim=dim) if dim is not None else (~torch.isnan(x)).sum()
    var = torch.nanmean((x - mean) ** 2, dim=dim) * count / (count - 1)
    return torch.sqrt(var)


def group_advantages(rewards: torch.Tensor, group_size: int, *, estimator: str = "group_mean",
                     quantile_k: float = 0.4, scale: str = "group", eps: float = EPS) -> torch.Tensor:
    """Eq. Q3 (or GRPO's mean baseline): advantages (N·G,) of flat ``rewards`` (N·G,) in whole groups.

    ``estimator`` picks the baseline: the group mean or the K-quantile (Eq. Q2); ``scale``
    ("group" | "batch" | "none") the divisor, as TRL's ``scale_rewards``. NaN rewards get 0.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"advantage_estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be a flat vector of whole groups of {group_size}, "
                         f"got shape {tuple(rewards.shape)}")
    grouped = rewards.view(-1, group_size)
    if estimator == "quantile":
        baseline = quantile_baseline(grouped, quantile_k)
    else:
        baseline = torch.nanmean(grouped, dim=1)
    adv = (grouped - baseline.unsqueeze(1)).reshape(-1)
    if scale == "group":
        std = _nanstd(grouped, dim=1) if group_size > 1 else torch.zeros(grouped.size(0), dtype=rewards.dtype)
        adv = adv / (std.repeat_interleave(group_size) + eps)
    elif scale == "batch":
        std = _nanstd(rewards) if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype)
        adv = adv / (std + eps)
    elif scale != "none":
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    return torch.nan_to_num(adv, nan=0.0)
