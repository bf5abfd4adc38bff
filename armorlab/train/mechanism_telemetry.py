"""Telemetry that says whether a remedy's mechanism acted: which part of the loss moves the weights
(anchor rows against on-policy rows, the β·KL term against the policy loss) and how many different
correct answers the policy samples per prompt (mode collapse). The trainer calls these; the ratio
side (``obj/widened_frac``, ``obj/narrowed_frac``) is in ``armorlab.algos.loss``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from armorlab.algos.diversity import correct_diversity


def _grads(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """∂loss/∂params, keeping the graph for the trainer's own backward pass (zeros without a graph)."""
    if not loss.requires_grad:
        return [torch.zeros_like(p) for p in params]
    found = torch.autograd.grad(loss, list(params), retain_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.detach() for g, p in zip(found, params, strict=True)]


def _dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return float(sum((x.float() * y.float()).sum() for x, y in zip(a, b, strict=True)))


def gradient_shares(params: Sequence[torch.Tensor], policy_loss: torch.Tensor, anchor_loss: torch.Tensor | None,
                    kl_term: torch.Tensor | None) -> dict[str, float]:
    """The parts of one micro-batch's gradient, by extra backward passes (one for the policy loss, one
    per part given):

    - ``obj/anchor_grad_share`` = ‖g_anchor‖ / (‖g_anchor‖ + ‖g_on‖), where ``anchor_loss`` is the
      anchor rows' part of ``policy_loss`` and g_on = g_policy − g_anchor the on-policy rows' part;
    - ``obj/kl_grad_share`` = ‖g_KL‖ / (‖g_KL‖ + ‖g_policy‖) for the β·KL term ``kl_term``;
    - ``obj/kl_grad_cos`` = ⟨g_KL, g_policy⟩ / (‖g_KL‖·‖g_policy‖): −1 when the penalty pulls straight
      against the policy gradient.

    A share is 0 when its part has no gradient and absent when neither part has one.
    """
    if anchor_loss is None and kl_term is None:
        return {}
    policy = _grads(policy_loss, params)
    out: dict[str, float] = {}
    if anchor_loss is not None:
        anchor = _grads(anchor_loss, params)
        on = [p - a for p, a in zip(policy, anchor, strict=True)]
        norm_a, norm_o = math.sqrt(_dot(anchor, anchor)), math.sqrt(_dot(on, on))
        if norm_a + norm_o > 0:
            out["obj/anchor_grad_share"] = norm_a / (norm_a + norm_o)
    if kl_term is not None:
        penalty = _grads(kl_term, params)
        norm_k, norm_p = math.sqrt(_dot(penalty, penalty)), math.sqrt(_dot(policy, policy))
        if norm_k + norm_p > 0:
            out["obj/kl_grad_share"] = norm_k / (norm_k + norm_p)
        if norm_k > 0 and norm_p > 0:
            out["obj/kl_grad_cos"] = _dot(penalty, policy) / (norm_k * norm_p)
    return out


def rollout_diversity(completion_ids: Sequence[Sequence[int]], lengths: Sequence[int], rewards: Sequence[float],
                      start: int, group_size: int, threshold: float) -> tuple[float, float, float]:
    """(Σ distinct correct completions, Σ their entropy, groups with a correct one) over the whole
    groups among one process's rows (global row index ``start`` + i; groups of ``group_size``
    consecutive rows). A row is correct when its reward is at least ``threshold``; the group's last
    row, where an anchor goes when anchors are on, is left out in every arm, so that runs with and
    without anchors count G − 1 samples alike. Completions compare as their token ids."""
    groups: dict[int, list] = {}
    for i, reward in enumerate(rewards):
        group, slot = divmod(start + i, group_size)
        if slot != group_size - 1:
            ok = not math.isnan(reward) and reward >= threshold
            groups.setdefault(group, []).append((tuple(completion_ids[i][:lengths[i]]), ok))
    return correct_diversity(rows for rows in groups.values() if len(rows) == group_size - 1)
