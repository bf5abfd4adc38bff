"""Telemetry that says whether a remedy's mechanism acted: which part of the loss pushes the policy
(anchor rows against on-policy rows, the β·KL term against the policy loss) and how many different
correct answers the policy samples per prompt (mode collapse). The trainer calls these; the ratio
side (``obj/widened_frac``, ``obj/narrowed_frac``) is in ``armorlab.algos.loss``.

The gradient shares are taken on the loss's gradient with respect to the trained tokens' log-probs
log π_θ(y_t), not the weights': every part of the loss reaches the weights only through those
log-probs (g_θ = Jᵀ·v with J = ∂log π_θ/∂θ), and differentiating the loss head alone involves no
parameter, no checkpointed layer and no process group, so it means the same and costs next to
nothing under DDP, FSDP, DeepSpeed and gradient checkpointing. Token vectors of different rows and
processes are disjoint, so the step's squared norms are plain sums over micro-batches and processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from armorlab.algos.diversity import correct_diversity


def token_gradient(loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """∂loss/∂log π_θ per token (B, T), keeping the graph for the trainer's own backward (zeros
    where the loss does not depend on ``logp``)."""
    if not loss.requires_grad:
        return torch.zeros_like(logp)
    (grad,) = torch.autograd.grad(loss, logp, retain_graph=True, allow_unused=True)
    return torch.zeros_like(logp) if grad is None else grad.detach()


def share_sums(policy_grad: torch.Tensor, kl_grad: torch.Tensor | None, is_anchor: torch.Tensor) -> torch.Tensor:
    """(‖v_anchor‖², ‖v_on‖², ‖u‖², ⟨u, v⟩) of one micro-batch, float64: v = ∂L_policy/∂log π_θ split
    by row (anchor rows, on-policy rows), u = ∂(β·KL)/∂log π_θ (0 without a KL term). Summed over
    the step's micro-batches and processes they are the step's (``gradient_shares``)."""
    v = policy_grad.double()
    u = torch.zeros_like(v) if kl_grad is None else kl_grad.double()
    anchor = is_anchor.to(v.dtype).reshape(-1)
    row_sq = (v * v).flatten(1).sum(1)
    return torch.stack([row_sq @ anchor, row_sq @ (1 - anchor), (u * u).sum(), (u * v).sum()])


def gradient_shares(sums: Sequence[float], *, anchor: bool, kl: bool) -> dict[str, float]:
    """The step's shares from ``share_sums`` summed over its micro-batches and processes:

    - ``obj/anchor_grad_share`` = ‖v_anchor‖ / (‖v_anchor‖ + ‖v_on‖) (with anchors on);
    - ``obj/kl_grad_share`` = ‖u‖ / (‖u‖ + ‖v‖) (with β ≠ 0), ‖v‖² = ‖v_anchor‖² + ‖v_on‖²;
    - ``obj/kl_grad_cos`` = ⟨u, v⟩ / (‖u‖·‖v‖): −1 when the penalty pulls straight against the policy.

    A share is 0 when its part has no gradient and absent when neither part has one.
    """
    sq_anchor, sq_on, sq_kl, dot = (float(s) for s in sums)
    norm_a, norm_o, norm_k = math.sqrt(sq_anchor), math.sqrt(sq_on), math.sqrt(sq_kl)
    norm_p = math.sqrt(sq_anchor + sq_on)
    out: dict[str, float] = {}
    if anchor and norm_a + norm_o > 0:
        out["obj/anchor_grad_share"] = norm_a / (norm_a + norm_o)
    if kl and norm_k + norm_p > 0:
        out["obj/kl_grad_share"] = norm_k / (norm_k + norm_p)
    if kl and norm_k > 0 and norm_p > 0:
        out["obj/kl_grad_cos"] = dot / (norm_k * norm_p)
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
