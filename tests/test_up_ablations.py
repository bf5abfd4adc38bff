"""UP's ablation objectives (arXiv 2607.06987, §5.3 / Fig. 5) against independent statements of
their formulas, loss and gradient bit for bit, on random masked batches with both advantage signs:

- ``up_pure_is``: A > 0 → −A·π_θ/π_old unclipped ("pure IS"); A ≤ 0 → DAPO's clipped surrogate
  with the dual clip, −A·clamp(r, 1 − ε_low, c);
- ``up_self_anchored``: −A·π_θ/sg(π_θ) on both signs, no clip.

The references below are written from the paper's definitions with plain torch ops (min/max form
of the PPO surrogate), token-mean over unmasked tokens; none calls armorlab.
"""

from __future__ import annotations

import math

import pytest
import torch

from armorlab.algos.capacity import token_capacity
from armorlab.algos.loss import policy_loss

EPS_LOW, EPS_HIGH, C = 0.2, 0.28, 3.0


def batch(seed: int, b: int = 10, t: int = 7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3 - 0.02
    logp = (old + torch.randn(b, t, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = 2 * torch.randn(b, generator=g, dtype=torch.float64)
    adv[0] = 0.0
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).double()
    return logp.requires_grad_(True), old, adv, mask


def ref_pure_is(logp, old, adv, mask):
    a = adv[:, None]
    r = torch.exp(logp - old)
    ppo = -torch.min(r * a, torch.clamp(r, 1 - EPS_LOW, 1 + EPS_HIGH) * a)
    dual = torch.min(ppo, -C * a)  # verl's dual clip for A < 0: the loss is capped at −c·A
    per_token = torch.where(a > 0, -a * r, torch.where(a < 0, dual, ppo))
    return (per_token * mask).sum() / mask.sum()


def ref_self_anchored(logp, old, adv, mask):
    r = torch.exp(logp - logp.detach())
    return ((-adv[:, None] * r) * mask).sum() / mask.sum()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name,reference", [("up_pure_is", ref_pure_is), ("up_self_anchored", ref_self_anchored)])
def test_up_ablation_matches_its_formula(name, reference, seed):
    logp, old, adv, mask = batch(seed)
    dual = C if name == "up_pure_is" else None
    ours = policy_loss(name, logp, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip=dual).loss
    theirs = reference(logp, old, adv, mask)
    g_ours, = torch.autograd.grad(ours, logp)
    g_theirs, = torch.autograd.grad(theirs, logp)
    assert torch.equal(ours, theirs) and torch.equal(g_ours, g_theirs)  # bit for bit


def test_the_ablations_differ_where_the_paper_says():
    logp, old, adv, mask = batch(7)
    losses = {name: policy_loss(name, logp, old, adv, mask, dual_clip=C if name != "up_self_anchored" else None)
              for name in ("up", "up_pure_is", "up_self_anchored", "dapo")}
    grads = {k: torch.autograd.grad(v.loss, logp)[0] for k, v in losses.items()}
    pos, neg = (adv > 0)[:, None] & (mask > 0), (adv < 0)[:, None] & (mask > 0)
    r = torch.exp(logp - old).detach()
    # A > 0: pure IS weights UP's gradient by r (no clip), DAPO stops it above 1 + ε_high
    assert torch.allclose(grads["up_pure_is"][pos], (grads["up"] * r)[pos], rtol=1e-12)
    assert bool(((r > 1 + 0.28) & pos).any()) and float(grads["dapo"][(r > 1 + 0.28) & pos].abs().max()) == 0.0
    assert float(grads["up_pure_is"][(r > 1 + 0.28) & pos].abs().min()) > 0.0
    # A < 0: pure IS is UP's (DAPO's) branch; self-anchored drops the ratio: −A·∇log π, never clipped
    assert torch.equal(grads["up_pure_is"][neg], grads["up"][neg])
    n = mask.sum()
    assert torch.allclose(grads["up_self_anchored"][neg], (-adv[:, None] / n).expand_as(logp)[neg], rtol=1e-12)
    assert losses["up_self_anchored"].metrics["clip_frac"] == 0.0


def test_capacities():
    p_old = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    for sign, expected_pure, expected_self in ((1.0, 1 - p_old, 1 - p_old), (-1.0, EPS_LOW * p_old, p_old)):
        s = torch.full_like(p_old, sign)
        assert torch.allclose(token_capacity("up_pure_is", p_old, s, eps_low=EPS_LOW), expected_pure)
        assert torch.allclose(token_capacity("up_self_anchored", p_old, s, eps_low=EPS_LOW), expected_self)
    assert math.isfinite(float(token_capacity("up_self_anchored", p_old, torch.ones(3)).sum()))
