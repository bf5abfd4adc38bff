"""Invariant 7: hand-computed values on a 2×4 toy batch, every objective × every aggregation.

The batch is built from probabilities chosen so every ratio is a short decimal:

    π_old = [[0.5, 0.4, 0.8, 0.5], [0.5, 0.5, ·, ·]]       A = [+1, −2]
    π     = [[0.5, 0.6, 0.4, 0.6], [0.25, 0.55, ·, ·]]     mask = [[1,1,1,1], [1,1,0,0]]
    π_ref = [[0.5, 0.1, 0.2, 0.3], [0.9, 0.5, ·, ·]]       (· = masked, any value)

so r = π/π_old = [[1, 1.5, 0.5, 1.2], [0.5, 1.1]]. With ε = (0.2, 0.28) the clipped per-token
loss is −A·min(r, 1.28) on row 0 and −A·max(r, 0.8) on row 1:
    [[−1, −1.28, −0.5, −1.2], [2·0.8, 2·1.1]] = [[−1, −1.28, −0.5, −1.2], [1.6, 2.2]].
GSPO: s_0 = (1·1.5·0.5·1.2)^(1/4) = 0.9^(1/4) = 0.97400375 (inside), s_1 = 0.55^(1/2) = 0.74162
(< 0.8, clipped to 0.8) → ℓ = [−0.97400375, 1.6] on every unmasked token of the row.
UP: row 0 (A > 0) is −A = −1 per token; row 1 is dapo's.
ARMOR at α = 0.5: r_mix = (π + π_ref)/(π_old + π_ref) = [[1, 1.4, 0.6, 1.125], [1.15/1.4, 1.05]]
→ [[−1, −1.28 (1.4 clipped), −0.6, −1.125], [2·0.82142857, 2.1]].
Aggregations with row sums S_0, S_1, lengths 4, 2 and max_len 4:
token-mean (S_0+S_1)/6; seq-mean-token-mean and seq-mean (S_0/4 + S_1/2)/2;
seq-mean-token-sum (S_0+S_1)/2; seq-mean-token-sum-norm (S_0+S_1)/(2·4).
The numbers below were worked out from these formulas with a calculator.
"""

from __future__ import annotations

import math

import pytest
import torch

from armorlab.algos.loss import policy_loss

NAN = math.nan
P_OLD = [[0.5, 0.4, 0.8, 0.5], [0.5, 0.5, 0.3, 0.3]]
P = [[0.5, 0.6, 0.4, 0.6], [0.25, 0.55, 0.7, 0.7]]
P_REF = [[0.5, 0.1, 0.2, 0.3], [0.9, 0.5, 0.2, 0.2]]
MASK = [[1, 1, 1, 1], [1, 1, 0, 0]]
ADV = [1.0, -2.0]
G = 0.97400375  # 0.9 ** 0.25

PER_TOKEN = {
    "grpo": [[-1, -1.28, -0.5, -1.2], [1.6, 2.2, 0, 0]],
    "dapo": [[-1, -1.28, -0.5, -1.2], [1.6, 2.2, 0, 0]],
    "dr_grpo": [[-1, -1.28, -0.5, -1.2], [1.6, 2.2, 0, 0]],
    "gspo": [[-G, -G, -G, -G], [1.6, 1.6, 0, 0]],
    "up": [[-1, -1, -1, -1], [1.6, 2.2, 0, 0]],
    "up_gspo": [[-1, -1, -1, -1], [1.6, 1.6, 0, 0]],
    "armor": [[-1, -1.28, -0.6, -1.125], [1.64285714, 2.1, 0, 0]],
}
# (token-mean, seq-mean-token-mean = seq-mean, seq-mean-token-sum, seq-mean-token-sum-norm)
_CLIPPED = (-0.03, 0.4525, -0.09, -0.0225)
LOSSES = {
    "grpo": _CLIPPED,
    "dapo": _CLIPPED,
    "dr_grpo": _CLIPPED,
    "gspo": (-0.11600250, 0.31299813, -0.34800749, -0.08700187),
    "up": (-0.03333333, 0.45, -0.1, -0.025),
    "up_gspo": (-0.13333333, 0.3, -0.4, -0.1),
    "armor": (-0.04369048, 0.43508929, -0.13107143, -0.03276786),
}
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def toy(objective: str, **kwargs):
    logp = torch.tensor(P).log().requires_grad_(True)
    out = policy_loss(objective, logp, torch.tensor(P_OLD).log(), torch.tensor(ADV), torch.tensor(MASK),
                      ref_logp=torch.tensor(P_REF).log(), alpha=0.5, max_len=4, **kwargs)
    out.loss.backward()
    return out, logp.grad


@pytest.mark.parametrize("objective", list(PER_TOKEN))
def test_per_token_losses(objective):
    out, _ = toy(objective)
    assert torch.allclose(out.per_token, torch.tensor(PER_TOKEN[objective]), atol=1e-5)


@pytest.mark.parametrize("objective", list(LOSSES))
@pytest.mark.parametrize("aggregation", AGGREGATIONS + ("seq-mean",))
def test_every_aggregation(objective, aggregation):
    out, _ = toy(objective, aggregation=aggregation)
    index = 1 if aggregation == "seq-mean" else AGGREGATIONS.index(aggregation)
    assert out.loss.item() == pytest.approx(LOSSES[objective][index], abs=1e-6)


@pytest.mark.parametrize("objective, default", [("grpo", 1), ("dapo", 0), ("dr_grpo", 3), ("gspo", 1),
                                                ("up", 0), ("up_gspo", 1), ("armor", 0)])
def test_default_aggregations(objective, default):
    out, _ = toy(objective)
    assert out.loss.item() == pytest.approx(LOSSES[objective][default], abs=1e-6)


# Token-mean gradients, d loss / d log π = −A·(∂ratio/∂log π)/6 where no clip binds, else 0:
# plain ratio ∂r/∂log π = r; ARMOR ∂r_mix/∂log π = α·π/(α·π_old + (1−α)·π_ref) = π/(π_old + π_ref).
GRADS = {
    "dapo": [[-1 / 6, 0, -0.5 / 6, -1.2 / 6], [0, 2 * 1.1 / 6, 0, 0]],
    "up": [[-1 / 6] * 4, [0, 2 * 1.1 / 6, 0, 0]],
    "armor": [[-0.5 / 6, 0, -0.4 / 6, -0.6 / 0.8 / 6], [2 * 0.25 / 1.4 / 6, 2 * 0.55 / 6, 0, 0]],
    # seq-mean: ∂(−A·s_0)/∂log π_t = −A·s_0/4, over 2 rows; row 1 is clipped.
    "gspo": [[-G / 8] * 4, [0, 0, 0, 0]],
}


@pytest.mark.parametrize("objective", list(GRADS))
def test_hand_gradients(objective):
    _, grad = toy(objective)
    assert torch.allclose(grad, torch.tensor(GRADS[objective]), atol=1e-6)


def test_clip_metrics_dapo():
    # r = [[1, 1.5, 0.5, 1.2], [0.5, 1.1]]: 1.5 (A > 0) binds above, 0.5 on row 1 (A < 0) below;
    # 0.5 on row 0 is below 0.8 but A > 0 there, so that side cannot bind.
    out, _ = toy("dapo")
    m = out.metrics
    assert m["clip_frac_high"] == pytest.approx(1 / 6)
    assert m["clip_frac_low"] == pytest.approx(1 / 6)
    assert m["dual_clip_frac"] == 0.0
    assert m["clip_frac"] == pytest.approx(2 / 6)
    assert m["ratio_mean"] == pytest.approx(5.8 / 6, abs=1e-6)       # (1+1.5+0.5+1.2+0.5+1.1)/6
    assert m["approx_kl"] == pytest.approx(0.11719959, abs=1e-6)     # −log(1·1.5·0.5·1.2·0.5·1.1)/6


def test_clip_metrics_armor():
    # r_mix = [[1, 1.4, 0.6, 1.125], [0.8214, 1.05]]: 1.4 binds above; row 1's 0.8214 is inside
    # while its plain ratio 0.5 is clipped → widened. Row 0's plain 1.5 is clipped, r_mix too.
    out, _ = toy("armor")
    m = out.metrics
    assert m["clip_frac_high"] == pytest.approx(1 / 6)
    assert m["clip_frac_low"] == 0.0
    assert m["widened_frac"] == pytest.approx(1 / 6)
    assert m["mix_ratio_mean"] == pytest.approx(0.99940476, abs=1e-6)  # (1+1.4+.6+1.125+1.15/1.4+1.05)/6
    assert m["ratio_mean"] == pytest.approx(5.8 / 6, abs=1e-6)


def test_clip_metrics_gspo_count_tokens():
    # s_1 = 0.7416 < 0.8 with A < 0: both of row 1's tokens are clipped, row 0 is not.
    out, _ = toy("gspo")
    assert out.metrics["clip_frac_low"] == pytest.approx(2 / 6)
    assert out.metrics["clip_frac_high"] == 0.0


def test_dual_clip_caps_negative_advantage_loss():
    # Row 1 token 1 gets r = 4 (π = 0.5·4 > 1 is fine for log-prob arithmetic); with c = 3 its
    # loss −A·r = 8 is capped at −A·c = 6 and its gradient is zero; token 0 keeps 2·0.8 = 1.6.
    p = [row[:] for row in P]
    p[1][1] = 2.0
    logp = torch.tensor(p).log().requires_grad_(True)
    out = policy_loss("dapo", logp, torch.tensor(P_OLD).log(), torch.tensor(ADV), torch.tensor(MASK),
                      dual_clip=3.0)
    out.loss.backward()
    assert out.per_token[1, :2].tolist() == pytest.approx([1.6, 6.0])
    assert logp.grad[1, 1].item() == 0.0
    assert out.metrics["dual_clip_frac"] == pytest.approx(1 / 6)
    assert out.metrics["clip_frac_low"] == pytest.approx(1 / 6)
    assert out.metrics["clip_frac"] == pytest.approx(3 / 6)


def test_the_mixed_policy_is_one_function_for_trainer_and_objective():
    import math

    import torch

    from armorlab.algos import objectives
    from armorlab.train import anchors

    assert anchors.log_mixture is objectives.log_mixture  # anchor rows and ARMOR's ratio share it
    logp, ref = torch.tensor([math.log(0.4)], dtype=torch.float64), torch.tensor([math.log(0.2)], dtype=torch.float64)
    # 0.75·0.4 + 0.25·0.2 = 0.35 (by hand); at α = 1 the policy itself, bit for bit
    assert objectives.log_mixture(logp, ref, 0.75).exp().item() == pytest.approx(0.35, rel=1e-12)
    assert torch.equal(objectives.log_mixture(logp, ref, 1.0), logp)
